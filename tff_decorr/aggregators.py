"""Model aggregation through `tff.aggregators`: what bin/train's `--aggregator` and
`tff_decorr.runtimes.learning.build_process(model_aggregator=...)` share.

- The aggregators bin/train offers, each with its settings declared once (tff_decorr.hparams) and
  turned into `--<aggregator>_<setting>` flags: `mean` (the algorithm's own weighted plain sum, the
  default; no factory), `robust`, `dp`, `compression`, `secure` (TFF's factories).
- Deltas: TFF's factories expect model DELTAS (DP clips them, compression quantises them, robust
  aggregation zeroes large ones). The project's FedAvg family uploads n_i * y_i with weight n_i;
  through a factory a client sends y_i - x (`client_update`) with weight n_i and the server adds x
  back to the aggregated mean (`summed_contribution`): the same average up to float round-off.
  SCAFFOLD and FedNova already upload deltas. `Algorithm.upload` says which form an algorithm has.
- Compatibility rules (`check`), the bytes a factory's wire format sends
  (`upload_bytes_per_client`), and DP accounting (`dp_epsilons`, `dp_aggregator`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, ClassVar, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import hparams as hparams_lib
from tff_decorr.algorithms import base

# ------------------------------------------------------------------------------------------------
# The aggregators of --aggregator
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunShape:
  """What a factory may need to know of the run: DP's denominator and accounting."""
  num_clients: int
  clients_per_round: int
  rounds: int


@dataclasses.dataclass(frozen=True)
class RobustHParams(hparams_lib.HParams):
  """TFF's robust wrappers, shared by robust, compression and secure (their adaptive norms are
  estimated with secure sums under secure)."""
  component: ClassVar[str] = 'robust'
  zeroing: bool = hparams_lib.field(True, 'adaptive zeroing of corrupted (very large) updates.')
  clipping: bool = hparams_lib.field(True, 'adaptive L2 clipping of updates to a moderately high '
                                     'norm (robustness to outliers).')
  weighted: bool = hparams_lib.field(True, "weight the mean by the algorithm's weight (examples); "
                                     'false: uniform over clients.')


@dataclasses.dataclass(frozen=True)
class CompressionHParams(RobustHParams):
  component: ClassVar[str] = 'compression'
  bits: int = hparams_lib.field(8, 'uniform quantisation bit-width of each compressed tensor.',
                                minimum=1, maximum=16)
  threshold: int = hparams_lib.field(20000, 'only tensors with more elements than this are '
                                     'quantised (TFF default 20000; smaller ones go as float32).',
                                     minimum=0)


@dataclasses.dataclass(frozen=True)
class SecureHParams(RobustHParams):
  component: ClassVar[str] = 'secure'


@dataclasses.dataclass(frozen=True)
class DpHParams(hparams_lib.HParams):
  component: ClassVar[str] = 'dp'
  noise_multiplier: float = hparams_lib.field(
      1.0, 'Gaussian noise standard deviation / L2 clip (0: no noise, epsilon = inf).',
      minimum=0.0)
  clip: float = hparams_lib.field(
      0.0, 'fixed L2 clip of each client update; 0: adaptive clipping '
      '(tff.learning.dp_aggregator) where TFF can estimate the clip, i.e. with a noise '
      'multiplier below 0.1 x --clients_per_round, else a fixed clip of 0.1 (the clip TFF\'s '
      'adaptive clipping starts from); the log and summary.json say which ran.', minimum=0.0)
  target_delta: float = hparams_lib.field(
      0.0, 'delta of the reported (epsilon, delta), below 1 / num_clients; 0: 1 / '
      'num_clients^1.1.', minimum=0.0,
      maximum=1.0, max_exclusive=True)
  zeroing: bool = hparams_lib.field(True, 'adaptive zeroing of corrupted updates (adaptive clip '
                                    'only).')


@dataclasses.dataclass(frozen=True)
class Aggregator:
  """A registered aggregator: its settings and `make(hparams, RunShape) -> factory or None`."""
  name: str
  HParams: type
  make: Callable[[Any, RunShape], Optional[tff.aggregators.AggregationFactory]]
  private: bool = False  # DP or secure sums: refused where their guarantee would not hold.
  # Whether it bounds each client's upload on its L2 norm (clips or zeroes it), given its settings.
  bounds_norm: Callable[[Any], bool] = lambda hp: False
  # What a user must know about the guarantee (logged at the start, kept in summary.json).
  note: str = ''


def _compression(hp: CompressionHParams, shape: RunShape):
  del shape
  # tff.learning.compression_aggregator fixes bits=8 and threshold=20000. This is the same
  # composition with them as settings, wrapped in TFF's own default adaptive clipping and zeroing
  # (private helpers of TFF 0.87, its last release, so they cannot change under us).
  from tensorflow_federated.python.learning import model_update_aggregator as mua  # pylint: disable=g-import-not-at-top
  factory = tff.aggregators.EncodedSumFactory.quantize_above_threshold(
      quantization_bits=hp.bits, threshold=hp.threshold)
  factory = (tff.aggregators.MeanFactory(factory) if hp.weighted
             else tff.aggregators.UnweightedMeanFactory(factory))
  if hp.clipping:
    factory = mua._default_clipping(factory)  # pylint: disable=protected-access
  if hp.zeroing:
    factory = mua._default_zeroing(factory)  # pylint: disable=protected-access
  return factory


# --dp_clip=0 where adaptive clipping cannot meet the noise: TFF's adaptive clipping starts from
# this L2 clip (tff.learning.dp_aggregator's initial_l2_norm_clip), so a run falls back to the
# clip an adaptive run would begin with.
FALLBACK_CLIP = 0.1


def adaptive_clipping_possible(noise_multiplier: float, clients_per_round: int) -> bool:
  """Whether tff.learning.dp_aggregator can estimate the clip: it spends part of the noise on the
  estimate, with a count noise of 0.05 x clients per round, and the total must stay below twice
  that (TFF's adaptive_clip_noise_params).

  Args:
    noise_multiplier: the DP noise multiplier (the total, as --dp_noise_multiplier).
    clients_per_round: clients sampled a round.

  Returns:
    True when noise_multiplier < 0.1 x clients_per_round.
  """
  return noise_multiplier < 0.1 * clients_per_round


def _dp(hp: DpHParams, shape: RunShape):
  if hp.target_delta:
    check_delta(hp.target_delta, shape.num_clients)
  clip, fallback = hp.clip or None, None
  if clip is None and not adaptive_clipping_possible(hp.noise_multiplier, shape.clients_per_round):
    clip = FALLBACK_CLIP
    fallback = (f'--dp_clip=0 asks for adaptive clipping, which needs a noise multiplier below '
                f'0.1 x --clients_per_round = {0.1 * shape.clients_per_round:g} (TFF spends part '
                f'of the noise on estimating the clip), and --dp_noise_multiplier is '
                f'{hp.noise_multiplier:g}: a fixed L2 clip of {FALLBACK_CLIP:g} (the clip adaptive '
                'clipping starts from) ran instead; give --dp_clip to choose it, or sample more '
                'clients for adaptive clipping')
  try:
    factory = dp_aggregator(hp.noise_multiplier, shape.clients_per_round, shape.num_clients,
                            target_delta=hp.target_delta or None, max_rounds=shape.rounds,
                            zeroing=hp.zeroing, clip=clip)
  except ValueError as e:
    raise ValueError(f'--aggregator=dp: {e}') from None
  factory.clipping_note = fallback
  return factory


def _robust_bounds(hp: RobustHParams) -> bool:
  return hp.zeroing or hp.clipping


SECURE_NOTE = ('simulated: TFF 0.87\'s runtime has no secure-aggregation protocol, so the '
               'secure sums run as plain sums (bounds, clipping and quantisation are applied; '
               'there is no cryptography and the server sees each client\'s update)')

# What --aggregator=dp's epsilon assumes, and what it does not cover: said in the run's log and
# summary.json (tff_decorr.program.training), as plainly as in docs/tff.md §4.
DP_ASSUMES = (
    'each round samples --clients_per_round of --num_clients clients uniformly without '
    'replacement, and the sample is secret',
    'replace-one neighbours: one client\'s data replaced by another client\'s (--num_clients is '
    'public), user-level: each client sends one clipped update a round',
    'the Gaussian noise is applied to the sum of the clipped updates (noise multiplier '
    '--dp_noise_multiplier; replace-one sensitivity is twice the clip, so the accountant sees '
    'half the multiplier)',
)
DP_NOT_COVERED_ADAPTIVE = (
    'the zeroing threshold and the adaptive clipping norm (--dp_zeroing, --dp_clip=0), released '
    'without noise')
DP_NOT_COVERED = (
    'the seeded client sampling (--seed): uniform only to someone who does not know the seed',
    DP_NOT_COVERED_ADAPTIVE,
    'every metric (train loss and accuracy, regulariser values, bytes, aggregator measurements), '
    'released without noise',
    'evaluation on the test data, and the exported model\'s evaluation',
)

_REGISTRY = hparams_lib.Registry('aggregator')
for _entry in (
    Aggregator('mean', hparams_lib.NoHParams, lambda hp, shape: None),
    Aggregator('robust', RobustHParams, lambda hp, shape: tff.learning.robust_aggregator(
        zeroing=hp.zeroing, clipping=hp.clipping, weighted=hp.weighted),
               bounds_norm=_robust_bounds),
    Aggregator('dp', DpHParams, _dp, private=True, bounds_norm=lambda hp: True),
    Aggregator('compression', CompressionHParams, _compression, bounds_norm=_robust_bounds),
    # Secure sums clip every value to the (estimated) bound of the modular sum.
    Aggregator('secure', SecureHParams, lambda hp, shape: tff.learning.secure_aggregator(
        zeroing=hp.zeroing, clipping=hp.clipping, weighted=hp.weighted), private=True,
               note=SECURE_NOTE, bounds_norm=lambda hp: True),
):
  _REGISTRY.add(_entry.name, _entry)


def names():
  """The registered aggregators' names (bin/train's --aggregator choices).

  Returns:
    A tuple of names: 'mean' (the algorithm's own weighted sum), then the tff.aggregators
    factories ('robust', 'dp', 'compression', 'secure', ...).

  Raises:
    Nothing.
  """
  return _REGISTRY.names()


def hparams_class(name: str) -> type:
  """The HParams class of aggregator `name` (`hparams.NoHParams` for one without settings).

  Args:
    name: a name in `names()`.

  Returns:
    Its `hparams.HParams` subclass.

  Raises:
    ValueError: an unknown aggregator name (the message lists the choices).
  """
  return _REGISTRY.get(name).HParams


def note(name: str) -> str:
  """What the aggregator's guarantee is not ('' when nothing needs saying).

  Args:
    name: a name in `names()`.

  Returns:
    One sentence for the log, or ''.

  Raises:
    ValueError: an unknown aggregator name (the message lists the choices).
  """
  return _REGISTRY.get(name).note


def is_private(name: str) -> bool:
  """Whether aggregator `name` is private (dp, secure): what the algorithms' refusals read.

  Args:
    name: a name in `names()`.

  Returns:
    The registered flag.

  Raises:
    ValueError: an unknown aggregator name (the message lists the choices).
  """
  return _REGISTRY.get(name).private


def build(name: str, hparams: Optional[hparams_lib.HParams], shape: RunShape
          ) -> Optional[tff.aggregators.AggregationFactory]:
  """The factory of aggregator `name` (None for 'mean': the runtimes' plain sum).

  Args:
    name: a name in `names()`.
    hparams: its HParams instance; None: its defaults.
    shape: the run's clients and rounds (what DP accounting and adaptive clipping need).

  Returns:
    A tff.aggregators factory, or None for 'mean'.

  Raises:
    ValueError: an unknown name, or settings the run's shape cannot honour (DP's delta, its
      clients per round).
  """
  entry = _REGISTRY.get(name)
  return entry.make(entry.HParams() if hparams is None else hparams, shape)


def check_algorithm(algorithm_cls: type, aggregator: str,
                    hparams: Optional[hparams_lib.HParams] = None) -> None:
  """Compatibility of --algorithm and --aggregator from their declarations (before anything is
  built): the algorithm's capabilities (base.Algorithm) against the aggregator's properties.

  Args:
    algorithm_cls: the Algorithm subclass.
    aggregator: a name in `names()`.
    hparams: the aggregator's settings (whether it bounds upload norms); None: its defaults.

  Raises:
    ValueError: the combination is refused (the message says why and what to use instead), or
      an unknown aggregator name.
  """
  entry = _REGISTRY.get(aggregator)
  hp = entry.HParams() if hparams is None else hparams
  if aggregator == 'mean':  # The algorithm's own weighted sum: every algorithm has it.
    return
  refusal(algorithm_cls, f'--aggregator={aggregator}', private=entry.private,
          bounds_norm=entry.bounds_norm(hp))


def refusal(algorithm_cls: type, what: str, *, private: bool, bounds_norm: bool,
            state_on_server: bool = False) -> None:
  """Raises one ValueError naming `what` when the algorithm cannot run under an aggregator with
  these properties. `state_on_server`: per-client state is held by the server (the
  LearningProcess: tff.learning has no client-placed state).

  Args:
    algorithm_cls: the Algorithm subclass (its declared capabilities are read).
    what: how the aggregator is named in the message (a flag, a factory).
    private: the aggregator is private (dp, secure).
    bounds_norm: the aggregator clips or zeroes uploads on their L2 norm.
    state_on_server: as above.

  Raises:
    ValueError: the algorithm has no upload a factory takes, or its declarations refuse these
      properties; the message says why and what to use instead.
  """
  name = algorithm_cls.name
  if algorithm_cls.upload is None:
    raise ValueError(
        f'{what}: --algorithm={name} has no upload that tff.aggregators can aggregate (they take '
        'one weighted mean of a model delta); use --aggregator=mean.')
  if private and state_on_server and algorithm_cls.stateful:
    raise ValueError(
        f'{what} cannot be combined with {name!r}: its per-client state (FedBN BN variables, '
        'SCAFFOLD control variates, MOON previous model) is held by the server in this simulation '
        '(tff.learning has no client-placed state), which would void the privacy guarantee. Use '
        "'fedavg', 'fedprox' or 'fedavgm' with a private aggregator.")
  if private and algorithm_cls.exact_keys:
    # Whatever an algorithm declares, an exactly summed key bypasses the private aggregator: its
    # per-client values reach the server in the clear (secure) or un-noised (dp).
    keys = ', '.join(algorithm_cls.exact_keys)
    why = algorithm_cls.private_refusal or (
        f'its upload has exact keys ({keys}), summed outside the aggregator, so each client\'s '
        'values of them would reach the server unprotected')
    raise ValueError(f'{what} cannot be combined with --algorithm={name}: {why}. Use '
                     '--aggregator=mean, or another algorithm.')
  reason = ((private and algorithm_cls.private_refusal)
            or (bounds_norm and algorithm_cls.norm_bound_refusal))
  if reason:
    raise ValueError(f'{what} cannot be combined with --algorithm={name}: {reason}. Use '
                     '--aggregator=mean, or another algorithm.')


# ------------------------------------------------------------------------------------------------
# Deltas
# ------------------------------------------------------------------------------------------------


def check_upload(algorithm: base.Algorithm, what: str = 'model_aggregator') -> None:
  """Refuses an algorithm whose upload no tff.aggregators factory can take.

  Args:
    algorithm: the algorithm instance.
    what: how the aggregator is named in the message.

  Raises:
    ValueError: `algorithm.upload` is neither 'model' nor 'delta'.
  """
  if algorithm.upload not in ('model', 'delta'):
    raise ValueError(f'{what}: algorithm {algorithm.name!r} has no upload that tff.aggregators can '
                     'aggregate (Algorithm.upload is None).')


def client_update(algorithm: base.Algorithm, broadcast, output: base.ClientOutput):
  """What a client sends to a factory: contribution / weight, as a delta (TF ops).

  Args:
    algorithm: the algorithm (its `upload` and `update_reference`).
    broadcast: what the client received.
    output: the client step's ClientOutput (its contribution without the exact keys).

  Returns:
    A nest of the contribution's structure: the delta; zeros for a client of weight 0.
  """
  w = output.weight
  inv = tf.math.divide_no_nan(1.0, w)
  if algorithm.upload == 'delta':
    return tf.nest.map_structure(lambda c: c * inv, output.contribution)
  # A client without data (w = 0) sends a zero delta, not -x.
  return tf.nest.map_structure(
      lambda c, x: tf.where(w > 0, c * inv - x, tf.zeros_like(c)), output.contribution,
      algorithm.update_reference(broadcast))


def summed_contribution(algorithm: base.Algorithm, broadcast, mean_update, total_weight):
  """The aggregated mean delta back in the form `algorithm.server_step` takes: the SUM of
  weighted contributions, given the summed weight.

  Args:
    algorithm: the algorithm (its `upload` and `update_reference`).
    broadcast: the round's broadcast, rebuilt on the server.
    mean_update: the factory's aggregate, a mean delta.
    total_weight: the summed weight (the number of clients under an unweighted factory).

  Returns:
    The summed contribution `algorithm.server_step` expects (TF ops).
  """
  update = mean_update
  if algorithm.upload == 'model':
    update = tf.nest.map_structure(tf.add, mean_update, algorithm.update_reference(broadcast))
  return tf.nest.map_structure(lambda u: u * total_weight, update)


def nonnegative_variances(algorithm: base.Algorithm, weights: list) -> list:
  """BN moving variances clamped at 0: noise (DP) or quantisation can push an averaged variance
  below zero; a variance never is, and this is post-processing (no privacy cost).

  Args:
    algorithm: the algorithm (its model spec).
    weights: the new global weights, in the spec's order.

  Returns:
    The weights, each BN moving variance clamped at 0.
  """
  return base.nonnegative_variances(algorithm.spec, weights)


def create(factory, update_type, weight_type, algorithm: base.Algorithm,
           state_on_server: bool, what: str = 'model_aggregator'
           ) -> tff.templates.AggregationProcess:
  """The factory's AggregationProcess for the algorithm's update, after the compatibility check.

  Args:
    factory: a tff.aggregators factory (weighted or unweighted).
    update_type: the TFF type of a client's update.
    weight_type: the TFF type of its weight (used by a weighted factory).
    algorithm: the algorithm instance.
    state_on_server: per-client state is held by the server (the LearningProcess).
    what: how the aggregator is named in messages.

  Returns:
    The built `tff.templates.AggregationProcess`.

  Raises:
    ValueError: not a factory, an algorithm without a factory upload, a factory that cannot
      aggregate the update's type, or a refused combination (`refusal`).
  """
  check_factory(factory, what)
  check_upload(algorithm, what)
  try:
    if isinstance(factory, tff.aggregators.WeightedAggregationFactory):
      process = factory.create(update_type, weight_type)
    else:
      process = factory.create(update_type)
  except (TypeError, ValueError) as e:
    raise ValueError(f'{what}: {type(factory).__name__} cannot aggregate the update of '
                     f'{algorithm.name!r} ({update_type}): {e}') from e
  check(type(algorithm), factory, process, state_on_server, what)
  return process


def check_factory(factory, what: str = 'model_aggregator') -> None:
  """Refuses anything but a tff.aggregators factory.

  Args:
    factory: the object to check.
    what: how it is named in the message.

  Raises:
    ValueError: `factory` is neither a weighted nor an unweighted aggregation factory.
  """
  if not isinstance(factory, (tff.aggregators.WeightedAggregationFactory,
                              tff.aggregators.UnweightedAggregationFactory)):
    raise ValueError(f'{what} must be a tff.aggregators factory (weighted or unweighted), got '
                     f'{type(factory).__name__}.')


def is_weighted(factory) -> bool:
  """Whether `factory` takes a weight with each value (a WeightedAggregationFactory).

  Args:
    factory: a tff.aggregators factory.

  Returns:
    True for a weighted factory.
  """
  return isinstance(factory, tff.aggregators.WeightedAggregationFactory)


# ------------------------------------------------------------------------------------------------
# Compatibility with privacy
# ------------------------------------------------------------------------------------------------

def check(algorithm_cls: type, factory, process, state_on_server: bool,
          what: str = 'model_aggregator') -> None:
  """Refuses an aggregator where the algorithm's declared capabilities say its result would be
  wrong or its guarantee would not hold (`refusal`), from what the built process contains.

  `state_on_server`: the per-client state (FedBN BN, SCAFFOLD c_i, MOON previous model) is held by
  the server (tff_decorr.runtimes.learning: tff.learning has no client-placed state). bin/train's
  runtime keeps it CLIENTS-placed, where a deployed client would keep it.

  Args:
    algorithm_cls: the Algorithm subclass.
    factory: the factory (its private parts are found by walking it).
    process: the AggregationProcess it built (secure intrinsics, norm bounds are read from it).
    state_on_server: as above.
    what: how the aggregator is named in the message.

  Raises:
    ValueError: the combination is refused (`refusal`).
  """
  private = sorted(set(_private_parts(factory))) + (['secure aggregation intrinsics']
                                                    if _secure_intrinsics(process) else [])
  bounds = bool(private) or _bounds_norm(process)
  label = f'{what} ({", ".join(private)})' if private else what
  refusal(algorithm_cls, label, private=bool(private), bounds_norm=bounds,
          state_on_server=state_on_server)


def _bounds_norm(process) -> bool:
  """Whether the process clips or zeroes uploads on their norm: TFF's robust wrappers
  (clipping_factory, zeroing_factory) keep their norm in state fields named so."""
  def names(t):
    if isinstance(t, tff.FederatedType):
      return names(t.member)
    if isinstance(t, tff.StructType):
      out = []
      for name, child in tff.structure.iter_elements(t):
        out += ([name] if name else []) + names(child)
      return out
    return []
  state_names = set(names(process.initialize.type_signature.result))
  return bool({'clipping_norm', 'zeroing_norm'} & state_names)


def _private_factories():
  return (tff.aggregators.DifferentiallyPrivateFactory, tff.aggregators.SecureSumFactory,
          tff.aggregators.SecureModularSumFactory, AccountedDpFactory)


def _private_parts(factory, seen=None) -> list:
  """Names of the privacy mechanisms (DP, secure sums) inside a factory and its inner factories."""
  seen = set() if seen is None else seen
  if id(factory) in seen:
    return []
  seen.add(id(factory))
  found = [type(factory).__name__] if isinstance(factory, _private_factories()) else []
  # Inner factories are attributes, or (TFF's robust wrappers) closure cells of `create`.
  create_fn = getattr(type(factory), 'create', None)
  cells = [c.cell_contents for c in (getattr(create_fn, '__closure__', None) or ())]
  for value in list(vars(factory).values()) + cells:
    for v in (value if isinstance(value, (list, tuple)) else [value]):
      if isinstance(v, tff.aggregators.AggregationFactory):
        found += _private_parts(v, seen)
  return found


def _secure_intrinsics(process) -> bool:
  return any(isinstance(c, tff.framework.Intrinsic) and 'secure' in c.uri for c in _nodes(process))


# ------------------------------------------------------------------------------------------------
# Bytes on the wire
# ------------------------------------------------------------------------------------------------


def upload_bytes_per_client(aggregation_process: tff.templates.AggregationProcess) -> int:
  """Bytes each client sends in one call of `aggregation_process.next`, from TFF's own types.

  The sum, over every aggregating intrinsic call in the process (federated_sum, _mean, _aggregate,
  secure sums, ...), of the sizes of its CLIENTS-placed tensor arguments. This is the wire format
  the aggregator defines: an encoded (compressed) factory sends its encoded tensors, adaptive
  clipping adds its per-client indicator, a weighted mean adds the weight.

  Args:
    aggregation_process: a built process.

  Returns:
    The bytes, an int.

  Raises:
    ValueError: a CLIENTS-placed tensor of unknown shape.
  """
  total = 0
  for comp in _nodes(aggregation_process):
    if not (isinstance(comp, tff.framework.Call) and isinstance(comp.function,
                                                                tff.framework.Intrinsic)):
      continue
    result = comp.function.type_signature.result
    if not (isinstance(result, tff.FederatedType) and result.placement == tff.SERVER):
      continue
    if comp.argument is None:
      continue
    for t in _flatten_type(comp.argument.type_signature):
      if isinstance(t, tff.FederatedType) and t.placement == tff.CLIENTS:
        total += tensor_bytes(t.member)
  return total


def _nodes(process):
  """Every node of the building block of `process.next` (TFF's compiled form)."""
  stack = [process.next.to_building_block()]
  while stack:
    comp = stack.pop()
    stack.extend(comp.children())
    yield comp


def _flatten_type(t):
  if isinstance(t, tff.StructType):
    out = []
    for child in t.children():
      out.extend(_flatten_type(child))
    return out
  return [t]


def tensor_bytes(t) -> int:
  """Bytes of a TFF type's tensors (structures summed; sequences and functions count 0).

  Args:
    t: a TFF type.

  Returns:
    The bytes, an int.

  Raises:
    ValueError: a tensor of unknown shape.
  """
  if isinstance(t, tff.StructType):
    return sum(tensor_bytes(c) for c in t.children())
  if isinstance(t, tff.TensorType):
    if t.shape is None or any(d is None for d in t.shape):
      raise ValueError(f'cannot count the bytes of a tensor of unknown shape: {t}.')
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
  return 0


def flat_measurements(measurements, prefix: str = 'aggregator') -> dict:
  """A factory's nested measurements as {'aggregator/<path>': float} (scalars only).

  Args:
    measurements: the process's measurements (nested mappings and sequences of values).
    prefix: the first path element.

  Returns:
    {path: float}, one entry per scalar leaf; non-scalar leaves are left out.
  """
  out = {}

  def walk(value, path):
    if isinstance(value, collections.abc.Mapping):
      for k, v in value.items():
        walk(v, f'{path}/{k}')
    elif hasattr(value, '_asdict'):
      walk(value._asdict(), path)
    elif isinstance(value, (list, tuple)):
      for i, v in enumerate(value):
        walk(v, f'{path}/{i}')
    else:
      arr = np.asarray(value)
      if arr.shape == () and arr.dtype.kind in 'fiub':
        out[path] = float(arr)

  walk(measurements, prefix)
  return out


# ------------------------------------------------------------------------------------------------
# Differential privacy: accounting
# ------------------------------------------------------------------------------------------------


def dp_epsilons(noise_multiplier: float, clients_per_round: int, num_clients: int,
                rounds: int, target_delta: float) -> np.ndarray:
  """epsilon after 1..`rounds` rounds of the Gaussian mechanism on clipped client updates.

  Accounting: Renyi DP (dp_accounting, shipped with TFF), one Gaussian event per round on a
  uniform sample of `clients_per_round` of `num_clients` clients without replacement (what
  `tff.program.ClientIdDataSource` and bin/train's sampling draw), replace-one adjacency (a fixed
  denominator, as TFF's DP mean). Under replace-one, swapping one client's clipped update (norm
  <= C) for another moves the sum by up to 2C, while the noise is noise_multiplier x C: in units
  of the sensitivity, which dp_accounting's Gaussian event takes, the multiplier is
  noise_multiplier / 2 (passed whole, it would understate epsilon several times over). RDP
  composes additively, so one round is computed once.

  Args:
    noise_multiplier: the Gaussian noise's std over the clip norm (z); 0 or less: no noise.
    clients_per_round: clients sampled a round.
    num_clients: the population they are sampled from.
    rounds: how many rounds to account.
    target_delta: the delta of (epsilon, delta)-DP.

  Returns:
    float64 array [rounds]: epsilon after round 1, 2, ..., `rounds`; all inf without noise.
  """
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from dp_accounting.rdp import rdp_privacy_accountant as rdp  # pylint: disable=g-import-not-at-top
  if noise_multiplier <= 0:
    return np.full([rounds], np.inf)
  event = dp_accounting.SampledWithoutReplacementDpEvent(
      num_clients, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2.0))
  accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(event)
  # pylint: disable=protected-access
  orders, one_round = accountant._orders, np.asarray(accountant._rdp)
  # pylint: enable=protected-access
  return np.array([rdp.compute_epsilon(orders, r * one_round, target_delta)[0]
                   for r in range(1, rounds + 1)])


def dp_epsilon_of_releases(releases, target_delta: float) -> float:
  """epsilon of every DP release in `releases` together: an iterable of (noise_multiplier,
  clients_per_round, num_clients, count), each a round's Gaussian release as `dp_epsilons`
  accounts it. RDP composes additively across releases with different settings (runs on the same
  client data with other noise, or a round re-run after a crash).

  Args:
    releases: an iterable of (noise_multiplier, clients_per_round, num_clients, count).
    target_delta: the delta of (epsilon, delta)-DP.

  Returns:
    epsilon: 0.0 without a release, inf when one release had no noise.
  """
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from dp_accounting.rdp import rdp_privacy_accountant as rdp  # pylint: disable=g-import-not-at-top
  accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  any_release = False
  for noise_multiplier, clients_per_round, num_clients, count in releases:
    if count <= 0:
      continue
    if noise_multiplier <= 0:
      return float('inf')
    any_release = True
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2.0)),
                       int(count))
  return float(accountant.get_epsilon(target_delta)) if any_release else 0.0


def default_delta(num_clients: int) -> float:
  """delta = 1 / N^1.1: below 1/N, the usual rule (a delta of 1/N or more allows releasing one
  client's data outright). At N = 10 it is 0.079: DP statements need many clients.

  Args:
    num_clients: N, the clients of the population.

  Returns:
    1 / N^1.1.
  """
  return 1.0 / num_clients ** 1.1


def check_delta(target_delta: float, num_clients: int) -> None:
  """Refuses a DP delta outside (0, 1/N).

  Args:
    target_delta: the delta asked for.
    num_clients: N.

  Raises:
    ValueError: naming --dp_target_delta, when delta is not in (0, 1/N).
  """
  if not 0 < target_delta < 1.0 / num_clients:
    raise ValueError(f'--dp_target_delta={target_delta:g}: must be in (0, 1/--num_clients = '
                     f'{1.0 / num_clients:g}); a delta of 1/N or more allows releasing one '
                     'client\'s data outright. Leave it at 0 for 1/N^1.1.')


class AccountedDpFactory(tff.aggregators.UnweightedAggregationFactory):
  """`tff.learning.dp_aggregator` that also reports the privacy spent (`dp_epsilon` measurement).

  TFF's DP factories cannot report epsilon: they know the noise multiplier but not how many
  clients there are (the sampling rate), the accounting delta, or the number of rounds. This one is
  told, and reports epsilon after each round (its state counts rounds, so a resumed run continues
  the count). Build it with `dp_aggregator`.
  """

  def __init__(self, inner: tff.aggregators.UnweightedAggregationFactory, epsilons: np.ndarray,
               target_delta: float, clip: Optional[float] = None):
    self.inner = inner
    self.epsilons = np.asarray(epsilons, np.float64)
    self.target_delta = float(target_delta)
    self.clip = clip  # None: adaptive clipping (TFF's estimate); else the fixed L2 clip.
    self.clipping_note = None  # Why a fixed clip ran where --dp_clip=0 asked for adaptive.

  def clipping(self) -> dict:
    """Which clipping ran, for the log and summary.json: dp_clipping ('adaptive' or 'fixed'),
    dp_clip (the fixed clip) and dp_clipping_note (why a fixed clip replaced adaptive).

    Returns:
      A dict with those keys that apply.
    """
    if self.clip is None:
      return {'dp_clipping': 'adaptive'}
    out = {'dp_clipping': 'fixed', 'dp_clip': float(self.clip)}
    if self.clipping_note:
      out['dp_clipping_note'] = self.clipping_note
    return out

  def not_covered(self) -> list:
    """What the DP guarantee does not cover, for the log and summary.json.

    Returns:
      DP_NOT_COVERED's items, without the adaptive clip's when a fixed clip ran.
    """
    return [item for item in DP_NOT_COVERED
            if self.clip is None or item != DP_NOT_COVERED_ADAPTIVE]

  def create(self, value_type):
    """The inner factory's process, its state counting rounds, reporting `dp_epsilon`.

    Args:
      value_type: the TFF type of a client's value.

    Returns:
      A `tff.templates.AggregationProcess`; its measurements are {'dp': the inner's,
      'dp_epsilon': epsilon after this round (inf past the precomputed table)}.
    """
    inner = self.inner.create(value_type)
    table = self.epsilons
    last = len(table) - 1

    @tff.tensorflow.computation
    def zero_round():
      return tf.constant(0, tf.int32)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          inner=inner.initialize(), round=tff.federated_eval(zero_round, tff.SERVER)))

    @tff.tensorflow.computation(tf.int32)
    def account(round_num):
      # Past the precomputed table: report +inf rather than an understated epsilon.
      known = tf.gather(tf.constant(table, tf.float32), tf.minimum(round_num, last))
      eps = tf.where(round_num > last, tf.constant(np.inf, tf.float32), known)
      return collections.OrderedDict(round=round_num + 1, epsilon=eps)

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      out = inner.next(state.inner, value)
      accounted = tff.federated_map(account, state.round)
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip(collections.OrderedDict(inner=out.state,
                                                          round=accounted.round)),
          result=out.result,
          measurements=tff.federated_zip(collections.OrderedDict(
              dp=out.measurements, dp_epsilon=accounted.epsilon)))

    return tff.templates.AggregationProcess(init_fn, next_fn)


# Seven parameters: TFF's DP factory's settings and the accountant's (clients, delta, rounds).
def dp_aggregator(noise_multiplier: float, clients_per_round: int, num_clients: int,
                  target_delta: Optional[float] = None, max_rounds: int = 10000,
                  zeroing: bool = True, clip: Optional[float] = None) -> AccountedDpFactory:
  """DP-FedAvg aggregation (TFF's own factories) that reports epsilon in its measurements.

  clip=None: `tff.learning.dp_aggregator` (adaptive clipping, its noise_multiplier is the total);
  clip=C: `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed` with L2 clip C.
  target_delta default: 1 / num_clients**1.1 (below 1/N, the usual rule); a delta >= 1/N is
  refused.
  The mean divides by clients_per_round: sample exactly that many clients a round.

  Args:
    noise_multiplier: z, >= 0.
    clients_per_round: clients sampled a round, in [1, num_clients].
    num_clients: N, the population.
    target_delta: the accounting delta; None: `default_delta(num_clients)`.
    max_rounds: rounds of the precomputed epsilon table (past it, epsilon reads inf).
    zeroing: adaptive zeroing of large updates (with clip=None).
    clip: None for adaptive clipping, else the fixed L2 clip.

  Returns:
    An `AccountedDpFactory`.

  Raises:
    ValueError: a negative noise multiplier, clients_per_round outside [1, num_clients], or a
      delta outside (0, 1/N).
  """
  if not noise_multiplier >= 0:
    raise ValueError(f'noise_multiplier must be >= 0, got {noise_multiplier!r}.')
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(f'clients_per_round must be in [1, num_clients={num_clients}], got '
                     f'{clients_per_round!r}.')
  delta = target_delta if target_delta is not None else default_delta(num_clients)
  check_delta(delta, num_clients)
  if clip is None:
    inner = tff.learning.dp_aggregator(noise_multiplier, clients_per_round, zeroing=zeroing)
  else:
    inner = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier, clients_per_round, clip)
  eps = dp_epsilons(noise_multiplier, clients_per_round, num_clients, max_rounds, delta)
  return AccountedDpFactory(inner, eps, delta, clip=clip)
