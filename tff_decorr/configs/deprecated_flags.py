"""The deprecated flag spellings, all in one place, until their removal in tff_decorr REMOVED_IN.

Before components declared their own settings (tff_decorr.hparams), bin/train had flat flags
(`--mu`, `--beta`, `--alpha`, ...), and bin/partition `--alpha` / `--classes_per_client`. They
are accepted as aliases of today's component flags, each with a warning naming its replacement,
until release REMOVED_IN; removing them then means deleting `define`, `given`, `translate` and
`translate_flags`' callers in tff_decorr/configs/ (cli, config.resolve) and bin/partition.py.

Translation is step 2 of the path from flags to Configs (tff_decorr/configs/cli.py:
resolve_configs, docs/DESIGN.md): after the flags are parsed and before any component is resolved,
and once. It returns the warnings as data and calls nothing of the other steps (no callback into
the command line or the registries): the flag a warning names is `<component>_<field>` of its
target, which no alias target renames.

What stays after that release, because it concerns runs already written rather than flags: the
tables `ALIASES` and `SAME_KEYS` also describe the flat config.json files of old runs, which
`config.from_dict` migrates, and the flat form over which `config.directory_hash` computes default
run-directory names (so an old command finds its old run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Tuple

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


@dataclasses.dataclass(frozen=True)
class Translation:
  """What old spellings stand for in today's terms."""
  settings: Dict[str, Dict[str, Any]]  # {component: {field: value}} the old spellings set
  warnings: Tuple[str, ...]  # one line per deprecated alias given, in the order given
  # translate_flags: the given flags other than the old spellings ({flag: value}).
  values: Dict[str, Any] = dataclasses.field(default_factory=dict)


def translate(legacy: Mapping[str, Any]) -> Translation:
  """What old spellings `legacy` ({old: value}: ALIASES, also SAME_KEYS) stand for, and one warning
  per deprecated alias given (SAME_KEYS are no flags of their own: no warning)."""
  settings: Dict[str, Dict[str, Any]] = {}
  warnings = []
  for old, value in legacy.items():
    if value is None:
      continue
    targets = ALIASES.get(old) or (SAME_KEYS[old],)
    if old in ALIASES:
      warnings.append(warning(old, replacements(old)))
    for target in targets:
      component, field = target.split('.')
      settings.setdefault(component, {})[field] = value
  return Translation(settings=settings, warnings=tuple(warnings))


def translate_flags(values: Mapping[str, Any]) -> Translation:
  """Step 2 of resolve_configs: the given flags `values` ({flag: value}, step 1's) split into
  today's spellings (`values` of the result) and what the deprecated ones among them stand for,
  warned of in ALIASES' order (as their flags are defined)."""
  legacy = {old: values[old] for old in ALIASES if values.get(old) is not None}
  translation = translate(legacy)
  return dataclasses.replace(translation,
                             values={k: v for k, v in values.items() if k not in ALIASES})
