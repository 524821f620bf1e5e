"""The deprecated flag spellings, all in one place, until their removal in tff_decorr REMOVED_IN.

Before components declared their own settings (tff_decorr.hparams), bin/train had flat flags
(`--mu`, `--beta`, `--alpha`, ...), and bin/partition `--alpha` / `--classes_per_client`. They
are accepted as aliases of today's component flags, each with a warning naming its replacement,
until release REMOVED_IN; removing them then means deleting `define`, `given` and `translate`'s
callers in tff_decorr/configs/cli.py and bin/partition.py.

What stays after that release, because it concerns runs already written rather than flags: the
tables `ALIASES` and `SAME_KEYS` also describe the flat config.json files of old runs, which
`config.from_dict` migrates, and the flat form over which `config.directory_hash` computes default
run-directory names (so an old command finds its old run).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

from tff_decorr import __version__

REMOVED_IN = '0.3.0'  # The release that drops the aliases (this is __version__'s next minor).

# Old flag -> the component settings it stood for (it sets whichever of them the run uses).
ALIASES: Dict[str, Tuple[str, ...]] = {
    'mu': ('fedprox.mu', 'moon.mu'),
    'temperature': ('moon.temperature',),
    'server_lr': ('fedavgm.server_lr', 'scaffold.server_lr'),
    'server_momentum': ('fedavgm.server_momentum',),
    'coefficient_period': ('fedavg_decomposed.coefficient_period',),
    'beta': ('feddecorr.beta', 'decov.beta'),
    'alpha': ('dirichlet.alpha',),
    'classes_per_client': ('pathological.classes_per_client',),
}
# The old flags' own types (integers for the two counts), so old values keep their type and hash.
INTEGERS = frozenset({'coefficient_period', 'classes_per_client'})
# Old config.json keys that the component flags kept (same spelling, now a component setting);
# not flags of their own, so nothing to deprecate: only config.json migration reads them.
SAME_KEYS = {'fedavgm_form': 'fedavgm.form', 'feduv_lambda': 'feduv.lam', 'feduv_mu': 'feduv.mu'}


def replacements(old: str) -> str:
  """Today's flag(s) for deprecated alias `old`, e.g. '--fedprox_mu / --moon_mu'."""
  return ' / '.join('--' + t.replace('.', '_') for t in ALIASES[old])


def warning(old: str, replacements: str) -> str:
  return (f'warning: --{old} is deprecated and will be removed in tff_decorr {REMOVED_IN} (this '
          f'is {__version__}); use {replacements}.')


def define(fv, flags_module, names=None) -> None:
  """Defines the deprecated aliases (default: every one of ALIASES) in FlagValues `fv`."""
  for old in names or ALIASES:
    define_fn = flags_module.DEFINE_integer if old in INTEGERS else flags_module.DEFINE_float
    define_fn(old, None, f'Deprecated (removed in {REMOVED_IN}), use {replacements(old)}.',
              flag_values=fv)


def given(fv, names=None) -> Dict[str, Any]:
  """{old: value} of the deprecated aliases given on the command line."""
  return {old: fv[old].value for old in names or ALIASES if fv[old].value is not None}


def translate(legacy: Mapping[str, Any], flag_name: Callable[[str, str], str],
              warn=print) -> Dict[str, Dict[str, Any]]:
  """{component: {field: value}} that old spellings `legacy` ({old: value}; also SAME_KEYS)
  stand for, warning once per deprecated alias; `flag_name(component, field)` is today's flag."""
  out: Dict[str, Dict[str, Any]] = {}
  for old, value in legacy.items():
    if value is None:
      continue
    targets = ALIASES.get(old) or (SAME_KEYS[old],)
    if old in ALIASES:
      warn(warning(old, ' / '.join('--' + flag_name(*t.split('.')) for t in targets)))
    for target in targets:
      component, field = target.split('.')
      out.setdefault(component, {})[field] = value
  return out
