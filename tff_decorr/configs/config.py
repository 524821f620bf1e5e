"""A run's configuration: generic settings plus the settings of its chosen components.

`Config` holds what every run has (task, model, clients, rounds, seed, runtime, paths). The chosen
algorithm, regulariser, partition and aggregator, and the client optimiser every run has (the
reference's SGD, 'sgd'), each own their settings, declared once as a frozen dataclass in their
module (tff_decorr.hparams); `Config.hparams` holds the run's components' complete, validated
settings by component name, as those typed objects (`FedProx.HParams(mu=0.001)`,
`SGDHParams(lr=0.01, ...)`, ...); config.json holds their plain form, e.g.
`{'fedprox': {'mu': 0.001}, 'dirichlet': {'alpha': 0.5}, 'mean': {}, 'sgd': {'lr': 0.01, ...}}`.
The client optimiser's flags keep the names they had as generic settings (`--client_lr`,
`--momentum`, `--weight_decay`), and so do the keys of a task's defaults that set them.

Resolution is explicit > the task's paper defaults (keyed `'<component>.<field>'`) > the
component's own defaults. From flags (tff_decorr/configs/cli.py: resolve_configs) it is steps 2 to
4 of four, each a function here called once: `resolve_components` (the settings of each
regulariser's run, over the registries), `build` (one validated Config per regulariser) and
`set_output_dirs`; the flags were read (step 1, cli) before, and none of these calls cli back.
`resolve` is steps 2 and 3 for code with values instead of flags, `make` for keywords. Default
run-directory names are hashed over the flat form configurations had before component settings
existed (`directory_hash`), so a run directory keeps its name from release to release.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, TYPE_CHECKING

if TYPE_CHECKING:  # Imported lazily below: they import TensorFlow, config stays cheap to import.
  from tff_decorr.algorithms.client_update import SGDHParams
  from tff_decorr.hparams import HParams

RUNTIMES = ('tff', 'tf')
RUNTIME_CHOICES = ('auto',) + RUNTIMES  # 'auto': resolved by choose_runtime, never stored

# The component settings that had flat keys of their own before components declared their settings
# (0.1; the client optimiser's until 0.3.0): `directory_hash` hashes them under those keys (each
# flat key, filled from one of its components), so a default run directory keeps its name. Every
# other setting is hashed as '<component>_<field>'.
_FLAT_KEYED = frozenset({
    'fedprox.mu', 'moon.mu', 'moon.temperature', 'fedavgm.server_lr', 'scaffold.server_lr',
    'fedavgm.server_momentum', 'fedavg_decomposed.coefficient_period', 'feddecorr.beta',
    'decov.beta', 'dirichlet.alpha', 'pathological.classes_per_client', 'fedavgm.form',
    'feduv.lam', 'feduv.mu', 'sgd.lr', 'sgd.momentum', 'sgd.weight_decay'})

# Keys that may differ when a run is resumed: where things are, how they are executed or shown,
# and how long to go on. Everything else changes the result, so a mismatch is refused (run_dir's
# config comparison), and none of these is part of a default run directory's name (directory_hash).
RESUMABLE_KEYS = frozenset({
    'output_dir', 'data_dir', 'runtime', 'rounds', 'eval_every', 'workers',
    'max_concurrent_computation_calls', 'overwrite', 'export_every', 'track_collapse',
    'save_local_models', 'save_local_rounds', 'cache_dir',
})


@dataclasses.dataclass
class Config:
  """Every setting of a run. Component settings live in `hparams` (see the module docstring).

  Made by `make`, `resolve`, `from_dict` or bin/train's flags, which resolve and validate it; one
  built by hand is checked by `validate` when it is trained (program/experiment.py).

  Args:
    task: the task's name (tasks.registry: 'digits', 'cifar10', ...).
    model: the model's name ('' : the task's default model).
    algorithm: the algorithm's name (algorithms.names()).
    regularizer: the regulariser's name (regularizers.names()).
    partition: the partition's name (partitions.names()).
    aggregator: the aggregator's name (aggregators.names()).
    num_clients: the clients the train split is divided among.
    clients_per_round: the clients sampled each round.
    rounds: the rounds to train.
    local_epochs: passes over its data a client makes each round.
    batch_size: the clients' batch size.
    seed: the run's seed (partition, sampling, data order, initialisation).
    projection_dim: width of a projection head (MOON), 0 for none.
    decomposed: filter-decomposed convolutions.
    num_atoms: atoms of decomposed convolutions (0: k*k).
    init: the weights' initialisation ('' : the model's reference one).
    precision: 'float32' or 'mixed_bfloat16'.
    runtime: 'auto', 'tff' or 'tf'.
    eval_every: evaluate every this many rounds.
    export_every: export a SavedModel every this many rounds (0: at the end).
    data_dir: the TFDS data directory ('' : TFDS' default).
    cache_dir: where client datasets are written ('' : beside the run).
    output_dir: the run directory.
    workers: remote TFF workers (host:port, comma-separated), '' for a local one.
    max_concurrent_computation_calls: the TFF worker's limit (-1: none).
    track_collapse: measure the global model's spectrum during training.
    hparams: {component name: its HParams, or a plain {field: value} mapping}; the client
      optimiser's under 'sgd' (`client_optimizer`).

  Raises:
    ValueError: a component setting in `hparams` out of its range or unknown (naming its flag).
  """
  task: str = 'digits'
  model: str = ''
  algorithm: str = 'fedavg'
  regularizer: str = 'feddecorr'
  partition: str = 'dirichlet'
  aggregator: str = 'mean'
  num_clients: int = 10
  clients_per_round: int = 10
  rounds: int = 10
  local_epochs: int = 1
  batch_size: int = 64
  seed: int = 0
  projection_dim: int = 0
  decomposed: bool = False
  num_atoms: int = 0
  # Initialisation of the model's weights: '' resolves to the model's own (the PyTorch code it
  # ports: models.default_init), or 'torch' | 'kaiming_normal' | 'keras' (models/common.py).
  init: str = ''
  # 'float32', or 'mixed_bfloat16': layers compute in bfloat16, weights stay float32
  # (tff_decorr/models/precision.py).
  precision: str = 'float32'
  # 'auto' (resolved by `resolve`: config.json records the runtime that ran), 'tff' or 'tf'.
  runtime: str = 'auto'
  eval_every: int = 1
  export_every: int = 0
  data_dir: str = ''
  cache_dir: str = ''
  output_dir: str = ''
  workers: str = ''
  max_concurrent_computation_calls: int = -1
  track_collapse: bool = False
  # {component name: its HParams}. Plain mappings (config.json, code building a Config by hand)
  # are turned into the chosen components' HParams, validated, when the Config is made.
  hparams: Dict[str, 'HParams'] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.hparams = dict(self.hparams)
    for kind, name in self.components().items():
      value = self.hparams.get(name)
      if isinstance(value, Mapping) and _known_component(kind, name):  # (registry: lazily)
        self.hparams[name] = hparams_class(kind, name).from_mapping(value)

  def to_dict(self) -> dict:
    """The plain form config.json holds (each HParams as {field: value})."""
    return dataclasses.asdict(self)

  def components(self) -> Dict[str, str]:
    """{kind: component name} of the run's components, the client optimiser's included."""
    return {**{kind: getattr(self, kind) for kind in KINDS}, **FIXED_COMPONENTS}

  def component_hparams(self, kind: str) -> 'HParams':
    """The HParams of the run's 'algorithm', 'regularizer', 'partition', 'aggregator' or
    'client_optimizer' (its defaults when the Config holds none for it)."""
    name = self.components()[kind]
    value = self.hparams.get(name)
    if value is None or isinstance(value, Mapping):
      return hparams_class(kind, name).from_mapping(value or {})
    return value

  @property
  def client_optimizer(self) -> 'SGDHParams':
    """The client optimiser's settings (the reference's SGD), `hparams['sgd']`."""
    return self.component_hparams('client_optimizer')


def registry(kind: str):
  """The module holding the registry of components of `kind`."""
  # Imported here: the registries import TensorFlow, and config must stay cheap to import.
  if kind == 'algorithm':
    from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
    return algorithms
  if kind == 'regularizer':
    from tff_decorr import regularizers  # pylint: disable=g-import-not-at-top
    return regularizers
  if kind == 'partition':
    from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
    return partitions
  if kind == 'aggregator':
    from tff_decorr import aggregators  # pylint: disable=g-import-not-at-top
    return aggregators
  raise ValueError(f'unknown component kind {kind!r}.')


def hparams_class(kind: str, name: str) -> type:
  """The HParams class of component `name` of `kind` (KINDS, or 'client_optimizer')."""
  if kind == 'client_optimizer':
    # Imported here: client_update imports TensorFlow, and config must stay cheap to import.
    from tff_decorr.algorithms import client_update  # pylint: disable=g-import-not-at-top
    return client_update.SGDHParams
  return registry(kind).hparams_class(name)


def _known_component(kind: str, name: str) -> bool:
  return FIXED_COMPONENTS.get(kind) == name or (kind in KINDS and name in registry(kind).names())


def _models():
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  return models


KINDS = ('algorithm', 'regularizer', 'partition', 'aggregator')
# Kinds no flag chooses, each with the one component every run has: {kind: component name}.
FIXED_COMPONENTS = {'client_optimizer': 'sgd'}
# The client optimiser's settings as 0.2.0 and 0.3.0 wrote them, generic: {key: its field}.
_FLAT_CLIENT_OPTIMIZER = {'client_lr': 'lr', 'momentum': 'momentum',
                          'weight_decay': 'weight_decay'}
# Kinds added after runs were first written: a config.json without one means its default.
_LATER_KINDS = {'aggregator': 'mean'}
# Component settings added after runs were first written, with the value those runs used: a
# config.json without one means that value, and at that value it stays out of directory names.
_LATER_FIELDS = {'fedavgm.bn': 'ema', 'fedexp.evaluate': 'last'}
# Values of a component setting that stay out of directory names: the value runs had before the
# setting existed, and a default changed later (fedavgm.bn: 'ema' at first, 'average' since;
# fedexp.evaluate: the last iterate before the setting existed, the average of the last two since).
# An old command then finds its old run, and config comparison refuses to resume it under the new
# default with a message naming the setting (as for `init`); --fedavgm_bn=ema resumes it.
_NAME_NEUTRAL_VALUES = {'fedavgm.bn': ('ema', 'average'),
                        'fedexp.evaluate': ('last', 'average_last_two')}


def component_flag_specs():
  """(kind, component, hparams.FlagSpec) for every setting of every registered component and of
  the client optimiser: what bin/train defines as flags and what `make` accepts as keywords."""
  from tff_decorr import hparams  # pylint: disable=g-import-not-at-top
  for kind in KINDS:
    for name in registry(kind).names():
      for spec in hparams.flag_specs(registry(kind).hparams_class(name)):
        yield kind, name, spec
  for kind, name in FIXED_COMPONENTS.items():
    for spec in hparams.flag_specs(hparams_class(kind, name)):
      yield kind, name, spec


GENERIC_FIELDS = tuple(f.name for f in dataclasses.fields(Config) if f.name != 'hparams')


def validate(c: Config) -> None:
  """Checks the generic settings (each component validates its own). Errors name the flag."""
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr import models  # pylint: disable=g-import-not-at-top

  def bad(flag, msg):
    raise ValueError(f'--{flag}: {msg}')
  if c.task not in task_registry.names():
    bad('task', f'unknown task {c.task!r}; choose one of {", ".join(task_registry.names())}.')
  if c.model and c.model not in models.names():
    bad('model', f'unknown model {c.model!r}; choose one of {", ".join(models.names())}.')
  if c.init and c.init not in models.INITS:
    bad('init', f'unknown initialisation {c.init!r}; choose one of {", ".join(models.INITS)} '
        '(or leave it out: the model\'s reference initialisation).')
  if c.precision not in models.PRECISIONS:
    bad('precision', f'unknown precision {c.precision!r}; choose one of '
        f'{", ".join(models.PRECISIONS)}.')
  for kind in KINDS:
    names = registry(kind).names()
    if getattr(c, kind) not in names:
      bad(kind, f'unknown {kind} {getattr(c, kind)!r}; choose one of {", ".join(names)}.')
  for kind in c.components():
    c.component_hparams(kind)  # Validates the component's settings (errors name their flags).
  if c.runtime not in RUNTIME_CHOICES:
    bad('runtime', f'unknown runtime {c.runtime!r}; choose auto (tf, or tff where only it '
        'runs), tff (TFF C++ runtime, CPU, remote workers) or tf (in-process, uses a GPU).')
  runtime = choose_runtime(c.runtime, c.workers, c.aggregator)[0]
  for flag in ('num_clients', 'clients_per_round', 'rounds', 'local_epochs', 'batch_size',
               'eval_every'):
    if int(getattr(c, flag)) < 1:
      bad(flag, f'must be >= 1, got {getattr(c, flag)}.')
  if c.clients_per_round > c.num_clients:
    bad('clients_per_round', f'{c.clients_per_round} is more than --num_clients='
        f'{c.num_clients}; sample at most every client.')
  if c.export_every < 0:
    bad('export_every', f'must be >= 0, got {c.export_every}.')
  if not 0 <= int(c.seed) < 2 ** 32:
    bad('seed', f'must be an integer in [0, 2^32) (NumPy seeds), got {c.seed}.')
  if c.projection_dim < 0:
    bad('projection_dim', f'must be >= 0 (0: no projection head), got {c.projection_dim}.')
  if c.workers and runtime != 'tff':
    bad('workers', f'TFF workers run only under --runtime=tff, not --runtime={runtime}; drop '
        '--workers or use --runtime=tff.')
  if c.num_atoms and not c.decomposed:
    bad('num_atoms', 'sets the atoms of filter-decomposed convolutions; pass --decomposed too, '
        'or drop --num_atoms.')
  if registry('algorithm').algorithm_class(c.algorithm).requires_decomposed and not c.decomposed:
    bad('decomposed', f'--algorithm={c.algorithm} averages atoms and coefficients of '
        'filter-decomposed convolutions; pass --decomposed.')
  if c.aggregator != 'mean':
    if runtime != 'tff':
      bad('aggregator', f'{c.aggregator} is a tff.aggregators factory, which runs only under '
          f'--runtime=tff (--runtime={runtime} sums in TensorFlow); use --runtime=tff or '
          '--aggregator=mean.')
    registry('aggregator').check_algorithm(registry('algorithm').algorithm_class(c.algorithm),
                                           c.aggregator, c.component_hparams('aggregator'))


def choose_runtime(requested: str, workers: str = '',
                   aggregator: str = 'mean') -> Tuple[str, str]:
  """(runtime, why) for `--runtime=requested`. 'auto' is the in-process runtime ('tf') for the
  plain mean: on a GPU (TFF 0.87's worker_binary is CPU-only), and on a CPU, where it trains one
  client per core at once and a whole run is faster than under TFF's runtime (docs/benchmarks.md
  §2); no worker process is started. Settings only TFF's runtime executes (--workers, a
  tff.aggregators factory) make 'auto' choose 'tff', GPU or not."""
  if requested != 'auto':
    return requested, f'--runtime={requested}'
  if workers:
    return 'tff', 'auto: --workers run under TFF\'s runtime'
  if aggregator != 'mean':
    return 'tff', f'auto: --aggregator={aggregator} runs only under TFF\'s runtime'
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (config stays cheap to import)
  gpus = tf.config.list_physical_devices('GPU')
  if gpus:
    return 'tf', (f'auto: TensorFlow sees {len(gpus)} GPU(s), '
                  f'{", ".join(g.name for g in gpus)}')
  cores = len(os.sched_getaffinity(0))
  return 'tf', (f'auto: no GPU; the plain mean runs fastest in this process, {cores} client(s) at '
                f'a time on {cores} CPU core(s) (--runtime=tff for TFF\'s worker)')


@dataclasses.dataclass(frozen=True)
class Resolution:
  """Step 2's result: every setting of each regulariser's run, before any Config is made."""
  task: Any
  values: Dict[str, Any]  # the generic settings: explicit > task default > Config's default
  regularizers: List[str]
  # Per regulariser: {component: {field: value}} of its chosen components, complete (explicit >
  # task default > the component's default), not yet validated (step 3 does it).
  settings: List[Dict[str, Dict[str, Any]]]


def resolve(task, generic: Mapping[str, Any], components: Mapping[str, Mapping[str, Any]],
            regularizers: Sequence[str]) -> List[Config]:
  """One Config per regulariser, from explicitly given values: steps 2 and 3 of bin/train's path
  (tff_decorr/configs/cli.py: resolve_configs) for code without flags.

  Resolution is explicit > the task's default > the component's default. The Configs' output_dir
  is left empty (the caller sets it).

  Args:
    task: the task, a `tasks.registry.Task` (its `defaults` are the paper's settings).
    generic: explicitly given generic settings {Config field: value}; None means not given.
    components: explicitly given component settings {component: {field: value}} (what the
      `--<component>_<field>` flags set); a setting of a component the run does not use is an
      error.
    regularizers: the regularisers' names, one Config each.

  Returns:
    A list of validated Configs, one per regulariser, in the order given.

  Raises:
    ValueError: an unknown component or setting, a value out of its range, a setting of a
      component the run does not use, or an empty `regularizers`; the message names the flag.
  """
  # The arguments' own errors first (bin/train checks --regularizer as it parses it, and its
  # --algorithm is one of the registered).
  registry('algorithm').algorithm_class(generic_values(task, generic)['algorithm'])
  if not regularizers:
    raise ValueError('--regularizer: empty; give none, feddecorr, feduv or decov.')
  return build(_resolve(task, generic, components, regularizers))


def resolve_components(task, values: Mapping[str, Any],
                       regularizers: Sequence[str]) -> Resolution:
  """Step 2 of resolve_configs: the given flags `values` ({flag: value}; names that are no
  setting, the training program's own flags, are left out) resolved: explicit > the task's default >
  the default."""
  generic, components, _ = _split_settings(values)
  return _resolve(task, generic, components, regularizers)


def _split_settings(values: Mapping[str, Any]):
  """(generic {field: value}, components {component: {field: value}}, the other names) of values
  named as flags: generic fields by name, component settings by flag name (`fedprox_mu`)."""
  generic = {k: v for k, v in values.items() if k in GENERIC_FIELDS}
  components: Dict[str, Dict[str, Any]] = {}
  named = set(generic)
  for _, name, spec in component_flag_specs():
    named.add(spec.name)
    if spec.name in values:
      components.setdefault(name, {})[spec.field] = values[spec.name]
  return generic, components, [k for k in values if k not in named]


def _resolve(task, generic, components, regularizers) -> Resolution:
  """Step 2 over settings already told apart (generic, {component: {field: value}})."""
  defaults = dict(task.defaults)
  defaults.setdefault('partition', task.default_partition)
  values = generic_values(task, generic)
  values['model'] = values['model'] or task.default_model
  # The runtime that runs is what config.json records ('runtime' may differ on resume, so a run
  # started on a CPU machine resumes on a GPU one; directory names never include it).
  values['runtime'] = choose_runtime(values['runtime'], values['workers'], values['aggregator'])[0]
  if not values['init'] and values['model'] in _models().names():
    values['init'] = _models().default_init(values['model'])
  if generic.get('clients_per_round') is None:
    values['clients_per_round'] = defaults.get('clients_per_round', values['num_clients'])
  algorithm_cls = registry('algorithm').algorithm_class(values['algorithm'])
  if generic.get('projection_dim') is None and not algorithm_cls.projection_head:
    values['projection_dim'] = 0  # The task's head width is a setting of algorithms that use one.
  explicit: Dict[str, Dict[str, Any]] = {}
  for component, fields in components.items():
    for field, value in fields.items():
      if value is not None:
        explicit.setdefault(component, {})[field] = value
  chosen_all = {values['algorithm'], values['partition'], values['aggregator'], *regularizers,
                *FIXED_COMPONENTS.values()}
  for component in components:
    if component not in chosen_all and any(v is not None for v in components[component].values()):
      given = ', '.join(f'--{_flag(component, f)}' for f, v in components[component].items()
                        if v is not None)
      raise ValueError(f'{given}: set(s) {component}, which this run does not use (--algorithm='
                       f'{values["algorithm"]}, --regularizer={",".join(regularizers)}, '
                       f'--partition={values["partition"]}, --aggregator='
                       f'{values["aggregator"]}); drop it or choose {component}.')
  settings = []
  for reg in regularizers:
    chosen = {**{kind: reg if kind == 'regularizer' else values[kind] for kind in KINDS},
              **FIXED_COMPONENTS}
    settings.append({name: _component_settings(kind, name, explicit, defaults)
                     for kind, name in chosen.items() if _known_component(kind, name)})
  return Resolution(task=task, values=values, regularizers=list(regularizers), settings=settings)


def build(resolution: Resolution) -> List[Config]:
  """Step 3 of resolve_configs: one Config per regulariser, each validated (its components'
  settings as it is made, errors naming their flags, then the generic ones: `validate`)."""
  configs = []
  for reg, settings in zip(resolution.regularizers, resolution.settings):
    c = Config(**{**resolution.values, 'regularizer': reg, 'hparams': settings})
    validate(c)
    configs.append(c)
  return configs


def set_output_dirs(configs: Sequence[Config], resolution: Resolution, output_dir: str,
                    runs_dir: str) -> None:
  """Step 4 of resolve_configs: each Config's run directory. `output_dir` (absolute; one
  sub-directory per regulariser when there are several), or by default
  `runs_dir`/<task>-<algorithm>-<regularizer>-<directory_hash>."""
  for c in configs:
    if output_dir:
      c.output_dir = os.path.join(output_dir, c.regularizer) if len(configs) > 1 else output_dir
    else:
      c.output_dir = os.path.join(runs_dir, f'{c.task}-{c.algorithm}-{c.regularizer}-'
                                  f'{directory_hash(c, resolution.task)}')


def generic_values(task, generic: Mapping[str, Any]) -> Dict[str, Any]:
  """The generic settings as `resolve` takes them: explicit > the task's default > Config's. (Also
  how bin/study tells which algorithm, partition and aggregator a grid cell uses.)"""
  defaults = dict(task.defaults)
  defaults.setdefault('partition', task.default_partition)
  values = {f: defaults.get(f, getattr(Config, f)) for f in GENERIC_FIELDS}
  values.update({k: v for k, v in generic.items() if v is not None and k in GENERIC_FIELDS})
  return values


def _flag(component: str, field: str) -> str:
  for _, name, spec in component_flag_specs():
    if (name, spec.field) == (component, field):
      return spec.name
  return f'{component}_{field}'


def _component_settings(kind, name, explicit, task_defaults) -> Dict[str, Any]:
  """Explicit > task default > the component's own default, as {field: value} (the Config
  validates it when it is made). A task's default is keyed '<name>.<field>', or, for a setting
  whose flag has no component prefix (the client optimiser's), by its flag ('client_lr')."""
  cls = hparams_class(kind, name)
  given = explicit.get(name, {})

  def task_default(f):
    if cls.flag_prefix == '':
      return task_defaults.get(f'{name}.{f.name}', task_defaults.get(cls.flag_name(f.name),
                                                                     f.default))
    return task_defaults.get(f'{name}.{f.name}', f.default)
  return {f.name: given.get(f.name, task_default(f)) for f in dataclasses.fields(cls)}


class OldConfigError(ValueError):
  """A config.json in a form this release no longer reads; the message says what to do."""


# What a run directory whose config.json predates component settings is told (one line).
_FLAT_FORM = ('its config.json was written before tff_decorr 0.2.0 (flat settings such as mu, beta, '
              'alpha), a form 0.3.0 no longer reads; re-run with --overwrite to start again (the '
              'old run is moved aside), or finish it with tff_decorr 0.2.0')


def from_dict(d: Mapping[str, Any]) -> Config:
  """A Config from config.json's contents, validated component by component.

  Settings added to the library after the file was written get the value its run used (the
  aggregator 'mean', `init` 'keras', `precision` 'float32', ...), so a run directory of an earlier
  release whose config.json has component settings (`hparams`) reads as it was written.

  Args:
    d: config.json's contents, a mapping as `Config.to_dict()` returns (unknown keys are ignored).

  Returns:
    The Config (its components' HParams typed and validated; generic settings as written, not
    validated: `validate` checks them).

  Raises:
    OldConfigError: `d` has the flat form of before tff_decorr 0.2.0 (no `hparams`), which this
      release no longer reads.
    ValueError: a component setting is out of its range or unknown (the message names its flag).
  """
  return Config(**_known(migrate_dict(d)))


def _known(d: Mapping[str, Any]) -> dict:
  known = {f.name for f in dataclasses.fields(Config)}
  return {k: v for k, v in d.items() if k in known}


def migrate_dict(d: Mapping[str, Any]) -> dict:
  """config.json's contents completed to today's form: a setting added since the file was written
  gets the value its run used (e.g. the aggregator, which was the plain mean), and the client
  optimiser's generic keys of 0.2.0 and 0.3.0 (`client_lr`, ...) move into `hparams['sgd']`.
  Raises OldConfigError for the flat form of before 0.2.0 (no `hparams`)."""
  if 'hparams' not in d:
    raise OldConfigError(_FLAT_FORM)
  return _add_later_kinds(_nest_client_optimizer(_add_later_generic(dict(d))))


def _nest_client_optimizer(d: dict) -> dict:
  # 0.2.0 and 0.3.0 wrote the client optimiser's settings as generic ones (client_lr, ...).
  flat = {field: d.pop(key) for key, field in _FLAT_CLIENT_OPTIMIZER.items() if key in d}
  if flat:
    d['hparams'] = {**d['hparams'], FIXED_COMPONENTS['client_optimizer']: flat}
  return d


def _add_later_generic(d: dict) -> dict:
  # Runs written before `init` existed built every model with Keras' initialisation: resuming one
  # with today's default (the model's reference initialisation) is refused as a different
  # configuration, never mixed into it silently.
  d.setdefault('init', 'keras')
  d.setdefault('precision', 'float32')  # Runs written before `precision` computed in float32.
  return d


def _add_later_kinds(d: dict) -> dict:
  hparams = dict(d.get('hparams', {}))
  for kind, default in _LATER_KINDS.items():
    if kind not in d:
      d[kind] = default
      hparams.setdefault(default, registry(kind).hparams_class(default)().to_dict())
  for target, value in _LATER_FIELDS.items():
    component, field = target.split('.')
    if component in hparams:
      hparams[component] = {field: value, **hparams[component]}
  d['hparams'] = hparams
  return d


def directory_hash(config: Config, task) -> str:
  """The 8-hex-digit hash in default run-directory names.

  Computed over the flat form configurations had before component settings existed (every flat
  key, each with the value the old resolution gave it), so a command finds the run it wrote in
  every release since; settings with no flat key (a newer component's) are added under
  '<component>_<field>'. tests/config_test.py pins known names.

  Args:
    config: the resolved Config.
    task: its task (`tasks.registry.get(config.task)`), whose defaults fill the flat keys of
      components the run does not use.

  Returns:
    Eight lowercase hexadecimal digits.

  Raises:
    KeyError: `config` lacks a generic setting (not made by this library's resolution).
  """
  defaults = dict(task.defaults)

  def setting(component, field, fallback):
    if component in config.hparams:
      return getattr(config.hparams[component], field)
    return defaults.get(f'{component}.{field}', fallback)

  flat = {k: v for k, v in config.to_dict().items() if k != 'hparams'}
  optimizer = config.client_optimizer.to_dict()
  flat.update({key: optimizer[field] for key, field in _FLAT_CLIENT_OPTIMIZER.items()})
  # `init` came later: its default for the model keeps the name (a run written before, with Keras'
  # initialisation, is then refused by config comparison, see _add_later_generic); another value is hashed.
  if config.model in _models().names() and flat['init'] == _models().default_init(config.model):
    del flat['init']
  if flat['precision'] == 'float32':  # `precision` came later: float32 runs keep their names.
    del flat['precision']
  for kind, default in _LATER_KINDS.items():
    if flat[kind] == default:  # Runs from before the kind existed keep their names.
      del flat[kind]
  flat.update({
      'beta': setting('decov' if config.regularizer == 'decov' else 'feddecorr', 'beta', 0.1),
      'feduv_lambda': setting('feduv', 'lam', 2.5), 'feduv_mu': setting('feduv', 'mu', 0.5),
      'alpha': setting('dirichlet', 'alpha', 0.5),
      'classes_per_client': setting('pathological', 'classes_per_client', 2),
      'mu': setting('moon' if config.algorithm == 'moon' else 'fedprox', 'mu',
                    1.0 if config.algorithm == 'moon' else 1e-3),
      'temperature': setting('moon', 'temperature', 0.5),
      'server_lr': setting('scaffold' if config.algorithm == 'scaffold' else 'fedavgm',
                           'server_lr', 1.0),
      'server_momentum': setting('fedavgm', 'server_momentum', 0.9),
      'fedavgm_form': setting('fedavgm', 'form', 'reference'),
      'coefficient_period': setting('fedavg_decomposed', 'coefficient_period', 1),
  })
  for component, fields in config.to_dict()['hparams'].items():
    for field, value in fields.items():
      key = f'{component}.{field}'
      if key in _FLAT_KEYED or value in _NAME_NEUTRAL_VALUES.get(key, ()):
        continue
      flat[f'{component}_{field}'] = value
  d = {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS}
  return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def make(**values) -> Config:
  """A validated Config from keywords, for code that has no flags, resolved as bin/train does.

  Args:
    **values: generic fields by name (`task='digits'`, `rounds=5`, `output_dir=...`) and component
      settings by their flag names (`dirichlet_alpha=0.5`, `feddecorr_beta=0.1`,
      `fedprox_mu=1e-3`); everything else comes from the task's and the components' defaults.

  Returns:
    The Config (one regulariser: `regularizer`, default 'feddecorr'; `output_dir` as given, ''
    when not).

  Raises:
    ValueError: an unknown keyword (never ignored), an unknown task or component, a value out of
      range, or a setting of a component the run does not use; the message names the flag.
  """
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  task = task_registry.get(values.get('task', Config.task))
  generic, components, unknown = _split_settings(values)
  if unknown:
    raise ValueError(f'make: unknown setting(s) {", ".join(sorted(unknown))}; give generic fields '
                     'or component settings by flag name (e.g. dirichlet_alpha).')
  # One Config: a task's list of regularisers (digits: 'none,feddecorr') is bin/train's business.
  regularizer = generic.pop('regularizer', Config.regularizer)
  output_dir = generic.pop('output_dir', '')
  c = resolve(task, generic, components, [regularizer])[0]
  c.output_dir = output_dir
  return c
