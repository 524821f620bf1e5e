"""The algorithm seam: what every federated algorithm provides to the runtimes.

An algorithm is written once, as TensorFlow code over explicit nested structures of tensors:
- `initial_server_state(weights)`, `initial_client_state(weights)`: NumPy structures. Stateless
  algorithms use `NO_CLIENT_STATE`, a scalar int32 zero (a TFF value needs a type; an empty
  struct is awkward to place at CLIENTS), passed through unchanged;
- `broadcast(server_state)`: what each sampled client receives (TF ops);
- `make_client_step(workspace)` -> tf.function (broadcast, dataset, client_state) -> ClientOutput;
- `server_step(server_state, summed_contribution, summed_weight)` -> new server state (TF ops);
- `server_metrics(server_state, summed_contribution, summed_weight, new_state)` -> the scalars of
  that step a researcher plots (FedExP's eta_g, an adaptive optimiser's update norm), which the
  runtimes report every round as `server/<name>` beside the clients' metrics (TF ops; default
  none).
The runtimes aggregate by a plain SUM of contributions and of weights (`tff.federated_sum` in TFF,
`tf.add_n` in-process); each client multiplies its contribution by its own aggregation weight, so
the weighting of every algorithm is visible in its own code.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_decorr import hparams as hparams_lib
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms import workspace
from tff_decorr.algorithms.client_update import SGDHParams
from tff_decorr.algorithms.workspace import ModelSpec, Workspace

NO_CLIENT_STATE = np.int32(0)


class ClientOutput(NamedTuple):
  contribution: Any  # structure already multiplied by the client's aggregation weight
  weight: tf.Tensor  # float32 scalar aggregation weight
  client_state: Any  # new state of this client (same structure as its input)
  metrics: dict  # sums; aggregated by summing


def num_elements(structure) -> int:
  """The number of scalars in a nested structure of tensors or arrays.

  Args:
    structure: a nest (tf.nest) of tensors or arrays with static shapes.

  Returns:
    The sum of their sizes.
  """
  return int(sum(int(np.prod(t.shape)) for t in tf.nest.flatten(structure)))


class Algorithm:
  """Base class. Subclasses implement `_client_step` and `server_step` (+ state builders)."""

  name = 'base'
  num_models = 1  # Keras models in the client workspace (MOON needs 3).
  projection_head = False  # Whether a task's --projection_dim default applies (MOON: yes).
  requires_decomposed = False  # Whether the model must be filter-decomposed (--decomposed).
  # ---- Capabilities: what the round composer, the aggregator checks and the LearningProcess read
  # (no list of algorithm names anywhere; a new algorithm states them on its class). ----
  # Keeps per-client state between rounds (`initial_client_state` is not NO_CLIENT_STATE): the
  # runtimes carry it CLIENTS-placed, the LearningProcess in a table keyed by client id.
  stateful = False
  # The constructor needs the total number of clients N (keyword `num_clients`; SCAFFOLD's c).
  needs_num_clients = False
  # The constructor needs the local epochs a client's dataset holds (keyword `local_epochs`;
  # FedLC's class sizes are its dataset's label counts divided by them).
  needs_local_epochs = False
  # How a tff.aggregators factory can aggregate the upload (--aggregator,
  # tff_decorr.runtimes.learning): those factories expect model DELTAS (DP clips them, compression
  # quantises them). 'model': contribution / weight is (part of) a model, sent as its difference
  # from `update_reference(broadcast)`; 'delta': contribution / weight is already a delta; None:
  # no such form (the plain sum only).
  upload: Optional[str] = None
  # Keys of the contribution (a dict) summed exactly, outside the factory: never clipped, zeroed,
  # noised or quantised (SCAFFOLD's control-variate deltas, so that c stays the clients' mean).
  exact_keys: tuple = ()
  # Why the algorithm is refused under an aggregator that bounds each upload's L2 norm (clips or
  # zeroes it: robust, compression, dp, secure), or that is private (dp, secure); None: allowed.
  norm_bound_refusal: Optional[str] = None
  private_refusal: Optional[str] = None
  # The algorithm's own hyper-parameters (a frozen dataclass, tff_decorr.hparams): declared once,
  # validated there, turned into --<name>_<field> flags by bin/train.
  HParams = hparams_lib.NoHParams

  def __init__(self, model_fn: Callable[[], tf.keras.Model], optimizer: SGDHParams = SGDHParams(),
               regularizer: Optional[client_update.RegularizerFn] = None,
               hparams: Optional[hparams_lib.HParams] = None, *,
               num_clients: Optional[int] = None, local_epochs: int = 1):
    if not callable(model_fn):
      raise ValueError('model_fn must be a callable returning a Keras model with dict outputs.')
    if not isinstance(optimizer, SGDHParams):
      raise ValueError(f'optimizer must be an SGDHParams, got {type(optimizer).__name__}.')
    if regularizer is not None and not callable(regularizer):
      raise ValueError('regularizer must be None or a callable (representation, logits) -> scalar.')
    hparams = self.HParams() if hparams is None else hparams
    if not isinstance(hparams, self.HParams):
      raise ValueError(f'hparams of {self.name} must be a {self.HParams.__name__}, got '
                       f'{type(hparams).__name__}.')
    self.model_fn = model_fn
    self.optimizer = optimizer
    self.regularizer = regularizer
    self.hparams = hparams
    self.num_clients = num_clients  # Total clients N; only SCAFFOLD needs it.
    if int(local_epochs) != local_epochs or local_epochs < 1:
      raise ValueError(f'local_epochs must be an integer >= 1, got {local_epochs!r}.')
    # Passes over its examples a client's dataset holds (tasks/client_data.py). FedLC divides the
    # label counts of the dataset by it to get the client's class sizes.
    self.local_epochs = int(local_epochs)
    model = model_fn()
    self.spec: ModelSpec = workspace.model_spec(model)
    self._initial_weights = [v.numpy() for v in model.weights]

  @property
  def config(self) -> SGDHParams:
    """`optimizer`'s name before 0.4.0 (a DeprecationWarning)."""
    warnings.warn('Algorithm.config is deprecated and will be removed in 0.4.0; it is '
                  'Algorithm.optimizer, the client optimiser\'s settings.', DeprecationWarning,
                  stacklevel=2)
    return self.optimizer

  # ---- state ----
  def initial_weights(self) -> list:
    """Weights of the model built by model_fn() at construction (seed Keras first to fix them).

    Returns:
      A new list of NumPy arrays, in `model.weights` order.
    """
    return [np.array(w) for w in self._initial_weights]

  def initial_server_state(self, weights: Sequence) -> dict:
    """The server state before round 1; an algorithm with server state of its own overrides it.

    Args:
      weights: the global model's starting weights (`initial_weights()`'s list).

    Returns:
      A nest of NumPy arrays; the base's is {'weights': [arrays]}.
    """
    return {'weights': [np.asarray(w) for w in weights]}

  def initial_client_state(self, weights: Sequence) -> Any:
    """A client's state before its first round (a `stateful` algorithm overrides it).

    Args:
      weights: the global model's starting weights.

    Returns:
      A nest of NumPy arrays, the same structure for every client; `NO_CLIENT_STATE` here.
    """
    del weights
    return NO_CLIENT_STATE

  def global_weights(self, server_state) -> list:
    """The global model's flat weights (for evaluation / export).

    Args:
      server_state: a state `initial_server_state` or `server_step` made.

    Returns:
      The weights in `model.weights` order (arrays or tensors, as the state holds them).
    """
    return list(server_state['weights'])

  @property
  def personalized(self) -> bool:
    """True when part of each client's model never leaves the client (FedBN's BN variables), so
    the model a client deploys is `client_weights(...)`, not the global model, and test accuracy
    is measured per client (docs/algorithms.md, "What is evaluated").

    Returns:
      False here; True for an algorithm whose `client_weights` differ from the global model's.
    """
    return False

  def client_weights(self, server_state, client_state) -> list:
    """The flat weights of the model client `client_state` would deploy after this round.

    Args:
      server_state: the server state after the round.
      client_state: that client's state after the round.

    Returns:
      The weights in `model.weights` order; the global model's unless `personalized`.
    """
    del client_state
    return self.global_weights(server_state)

  # ---- TF pieces ----
  def broadcast(self, server_state):
    """What each sampled client receives from the server (TF ops).

    Args:
      server_state: the server state at the round's start.

    Returns:
      A nest of tensors, the same structure every round; the base's is {'weights': [...]}.
    """
    return {'weights': list(server_state['weights'])}

  def update_reference(self, broadcast) -> list:
    """With upload == 'model': what a client's contribution / weight is measured from (the
    broadcast weights it uploads; TF ops).

    Args:
      broadcast: what `broadcast` sent the client.

    Returns:
      A list of tensors, one per tensor of the contribution a factory aggregates.
    """
    return list(broadcast['weights'])

  def make_client_step(self, ws: Workspace):
    """The client step as a tf.function bound to workspace `ws`.

    The step adds the metrics every client reports: `bytes_up` (unless the algorithm reports
    it), `bytes_down` and `clients`.

    Args:
      ws: the workspace (Keras models and optimiser variables) the step trains in.

    Returns:
      A tf.function (broadcast, dataset, client_state) -> ClientOutput, the weight float32.
    """
    @tf.function
    def client_step(broadcast, dataset, client_state):
      out = self._client_step(ws, broadcast, dataset, client_state)
      metrics = dict(out.metrics)
      if 'bytes_up' not in metrics:  # Algorithms that send a varying part report it themselves.
        metrics['bytes_up'] = tf.constant(4.0 * num_elements(out.contribution), tf.float32)
      metrics['bytes_down'] = tf.constant(4.0 * num_elements(broadcast), tf.float32)
      metrics['clients'] = tf.constant(1.0, tf.float32)
      return ClientOutput(out.contribution, tf.cast(out.weight, tf.float32), out.client_state,
                          metrics)

    return client_step

  def _client_step(self, ws: Workspace, broadcast, dataset, client_state) -> ClientOutput:
    raise NotImplementedError

  def server_step(self, server_state, contribution, weight):
    """The round's new server state from the clients' summed uploads (TF ops; subclasses).

    Args:
      server_state: the server state at the round's start.
      contribution: the sum over clients of their `ClientOutput.contribution`.
      weight: the sum of their aggregation weights (float32 scalar; 0 when no client trained).

    Returns:
      The new server state, of `server_state`'s structure.
    """
    raise NotImplementedError

  def server_metrics(self, server_state, contribution, weight, new_state) -> dict:
    """{name: scalar} of the round's server step (TF ops), from the state before it, what
    `server_step` was given and the state it made (after the round's variance clamp); the
    runtimes release them as metrics.csv / TensorBoard columns `server/<name>`. Kept out of the
    server state, so checkpoints keep their structure. Default: none.

    Args:
      server_state: the state before the step.
      contribution: what `server_step` was given, summed over clients.
      weight: the summed aggregation weight.
      new_state: the state `server_step` made.

    Returns:
      {name: scalar tensor}; {} here.
    """
    del server_state, contribution, weight, new_state
    return {}

  # ---- helpers ----
  def _train(self, ws, start_weights, dataset, **hooks):
    """Local training with the run's optimiser and regulariser; `hooks`: client_update.LocalHooks'
    fields (extra_loss, grad_correction, logit_adjustment, sam_rho)."""
    return client_update.local_train(ws, start_weights, dataset, self.optimizer, self.regularizer,
                                     client_update.LocalHooks(**hooks))


def weighted(values, weight):
  """Each value times the (float32) weight, in the value's own float type.

  Args:
    values: a list of tensors or arrays.
    weight: a scalar (the client's aggregation weight).

  Returns:
    A list of tensors, each `weight * value` cast to the value's dtype.
  """
  values = [tf.convert_to_tensor(v) for v in values]
  return [tf.cast(weight, v.dtype) * v for v in values]


def safe_average(summed, weight, fallback):
  """summed / weight, or `fallback` when no client contributed (weight == 0).

  Args:
    summed: a list of summed, weighted tensors.
    weight: their summed weight (scalar).
    fallback: a list of the same structure (the previous values, typically).

  Returns:
    A list of tensors: each summed / weight, or its fallback when weight is not positive.
  """
  return [tf.where(weight > 0, s / tf.maximum(tf.cast(weight, s.dtype), 1e-30),
                   tf.convert_to_tensor(f)) for s, f in zip(summed, fallback)]


def l2_norm(tensors) -> tf.Tensor:
  """The L2 norm of a whole list of tensors, as one vector (TF ops).

  Args:
    tensors: a non-empty list of tensors (any float dtype).

  Returns:
    A float32 scalar tensor.
  """
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors]))


def step_norms(server_state, new_state, delta) -> dict:
  """A server optimiser's two norms over the whole model state (BN statistics included):
  `update_norm` = |x_new - x|, the step the server applied to the global model, and
  `pseudo_gradient_norm` = |delta|, the aggregate it stepped from (Reddi et al.'s pseudo-gradient,
  delta = the clients' example-weighted mean model minus x). TF ops.

  Args:
    server_state: the state before the step ({'weights': [...], ...}).
    new_state: the state after it.
    delta: the list of tensors the server stepped from.

  Returns:
    {'update_norm': float32 scalar, 'pseudo_gradient_norm': float32 scalar}.
  """
  step = [tf.convert_to_tensor(a) - tf.convert_to_tensor(b)
          for a, b in zip(new_state['weights'], server_state['weights'])]
  return {'update_norm': l2_norm(step), 'pseudo_gradient_norm': l2_norm(delta)}


def nonnegative_variances(spec: ModelSpec, weights) -> list:
  """BN moving variances clamped at 0 (every other weight unchanged; TF ops). A server rule that
  can extrapolate a statistic (momentum, an adaptive optimiser, FedExp's eta_g >= 1, noise) would
  otherwise be able to push a variance below zero, and the model's normalisation would divide by
  the square root of a negative number. 0 is safe: BN adds its epsilon before the square root.

  Args:
    spec: the model's ModelSpec (names, BN and trainable flags per weight).
    weights: the flat weights, in the spec's order.

  Returns:
    A list of tensors: the weights, each non-trainable BN moving variance clamped at 0.
  """
  return [tf.maximum(w, tf.zeros_like(w)) if b and not t and 'moving_variance' in n else w
          for w, n, b, t in zip(weights, spec.names, spec.batchnorm, spec.trainable)]
