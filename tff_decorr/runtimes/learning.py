"""tff_decorr for people who already write tff.learning code (docs/tff.md).

Two entry points:

- `from_keras_model(keras_model, input_spec, regularizer='feddecorr', **coefficients)`: a
  `tff.learning.models.VariableModel` whose loss is cross-entropy plus a representation regulariser
  (FedDecorr by default). It plugs into TFF's own builders unchanged
  (`tff.learning.algorithms.build_weighted_fed_avg`, `build_unweighted_fed_avg`,
  `build_weighted_fed_prox`, with `tff.learning.optimizers`), so FedDecorr is one line in an
  existing TFF program.
- `build_process(name, model_fn, client_dataset_fn, ...)`: the project's algorithms (the same
  client and server steps the project's runtimes run) as a `tff.learning.templates.LearningProcess`
  that `tff.learning.programs.train_model` drives, with any `tff.aggregators` factory in place of
  the plain sum (`model_aggregator=`).

Why build_process is not `compose_learning_process`: TFF's composer and its `ClientWorkProcess`
accept only client data that is a structure of datasets. The project's algorithms need to know
WHICH client runs (FedBN's BN variables, SCAFFOLD's c_i and MOON's previous model persist per
client), and the project builds each client's dataset inside the computation from its id (tasks'
`client_dataset_fn(client_id, seed)`, files on disk). So the process takes client ids
(`tff.program.ClientIdDataSource`) and is built as a `LearningProcess` directly, with the composer's
state (`LearningAlgorithmState`: global_model_weights, distributor, client_work, aggregator,
finalizer) and metrics (`distributor`, `client_work/train`, `aggregator`, `finalizer`) contract, and
its aggregator is a real `tff.templates.AggregationProcess` built from the factory.

Per-client state: tff.learning has no client-placed state (docs/reference.md §8). It is kept in the
client-work state on the server, one row per client id (`client_ids=`), so train_model's program
state checkpoints it and a resumed run continues it. That is a simulation device: the server holds
what a deployed client would keep private. build_process therefore refuses those algorithms with
privacy aggregators (DP, secure aggregation), whose guarantee it would void.
"""

from __future__ import annotations

import collections
import types
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import algorithms
from tff_decorr import regularizers
from tff_decorr.algorithms import base
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms.client_update import SGDHParams
from tff_decorr import aggregators
from tff_decorr.worker import tff_context
from tff_decorr.runtimes import federated_round
from tff_decorr.runtimes import tff_runtime



def process_algorithms() -> tuple:
  """The registered algorithms with a LearningProcess form (`build_process`'s names).

  Returns:
    A tuple of names: those whose upload a tff.aggregators factory can aggregate
    (`Algorithm.upload`; fedavg_decomposed has none).

  Raises:
    Nothing.
  """
  return tuple(n for n in algorithms.names() if algorithms.algorithm_class(n).upload is not None)

RegularizerArg = Union[str, regularizers.Regularizer, Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
                       None]


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


def as_dict_model(keras_model: tf.keras.Model,
                  representation_layer: Optional[str] = None) -> tf.keras.Model:
  """The model with dict outputs {'representation', 'logits'} that the project's code trains.

  A model that already returns that dict (every `tff_decorr.models` builder) is returned as is.
  Otherwise `representation_layer` names the layer whose output is the representation (flattened
  to [N, d]) and the model's single output is the logits. The returned model shares the layers, and
  so the variables, of `keras_model`: training one trains the other.

  Args:
    keras_model: a Keras model: with the dict outputs already, or a functional or Sequential model
      with one output (the logits).
    representation_layer: the name of the layer whose output is the representation; needed unless
      the model returns the dict already.

  Returns:
    A Keras model whose call returns {'representation': [N, d], 'logits': [N, classes]}.

  Raises:
    ValueError: not a Keras model, no `representation_layer` for a model without the dict
      outputs, a subclassed model (no graph to find the layer in), a layer name the model lacks
      (the message lists its layers), or several outputs.
  """
  if not isinstance(keras_model, tf.keras.Model):
    raise ValueError(f'keras_model must be a tf.keras.Model, got {type(keras_model).__name__}.')
  outputs = getattr(keras_model, 'output', None) if keras_model.built else None
  is_dict = isinstance(outputs, dict) and {'representation', 'logits'} <= set(outputs)
  if representation_layer is None:
    if is_dict:
      return keras_model
    raise ValueError(
        'representation_layer is required: keras_model does not return a dict with '
        "'representation' and 'logits'; name the layer whose output is the representation, e.g. "
        "representation_layer='fc'.")
  if not keras_model.built or not getattr(keras_model, 'inputs', None):
    raise ValueError('keras_model must be a functional or Sequential model built on tf.keras.Input '
                     'so representation_layer can be located (subclassed models have no graph).')
  try:
    layer = keras_model.get_layer(representation_layer)
  except ValueError:
    names = ', '.join(l.name for l in keras_model.layers)
    raise ValueError(f'representation_layer={representation_layer!r}: keras_model has no layer of '
                     f'that name; its layers are: {names}.') from None
  if is_dict:
    logits = outputs['logits']
  elif isinstance(outputs, (list, tuple, dict)):
    raise ValueError('keras_model has several outputs; it must have one output (the logits) or a '
                     "dict output with 'logits'.")
  else:
    logits = outputs
  representation = layer.output
  if len(representation.shape) != 2:  # The regularisers take [N, d].
    representation = tf.keras.layers.Flatten(name=f'{representation_layer}_flat')(representation)
  return tf.keras.Model(keras_model.inputs, {'representation': representation, 'logits': logits})


def _regularizer(regularizer: RegularizerArg, coefficients: dict):
  if regularizer is None:
    if coefficients:
      raise ValueError(f'regularizer=None takes no coefficients, got {sorted(coefficients)}.')
    return regularizers.get('none')
  if isinstance(regularizer, str):
    if regularizer not in regularizers.names():
      raise ValueError(f'regularizer={regularizer!r} is unknown; choose one of '
                       f'{", ".join(regularizers.names())}.')
    unknown = set(coefficients) - {'beta', 'lam', 'mu'}
    if unknown:
      raise ValueError(f'unknown regularizer coefficients {sorted(unknown)}; regularizers.get '
                       'takes beta (FedDecorr, DeCov), lam and mu (FedUV).')
    return regularizers.get(regularizer, **coefficients)
  if callable(regularizer):
    if coefficients:
      raise ValueError('coefficients are for a regularizer given by name; a callable regularizer '
                       'already includes its coefficient.')
    return regularizer
  raise ValueError(f'regularizer must be a name ({", ".join(regularizers.names())}), a '
                   'callable (representation, logits) -> scalar, or None; got '
                   f'{type(regularizer).__name__}.')


def _metric_sum(name):
  return tf.Variable(0.0, trainable=False, dtype=tf.float32, name=name)


class RegularizedKerasModel(tff.learning.models.VariableModel):
  """A Keras model as a VariableModel: loss = mean cross-entropy + regulariser(representation).

  Build it with `from_keras_model`. Its variables are the Keras model's (trainable and
  non-trainable, BatchNorm statistics included); its local variables are metric sums.
  """

  def __init__(self, keras_model: tf.keras.Model, dict_model: tf.keras.Model, input_spec,
               regularizer, from_logits: bool = True):
    self._keras_model = keras_model
    self._dict_model = dict_model
    self._input_spec = input_spec
    self._regularizer = regularizer
    self._from_logits = from_logits
    self._sums = collections.OrderedDict(
        (n, _metric_sum(n)) for n in ('loss', 'cross_entropy', 'regularizer', 'correct',
                                      'num_examples', 'num_batches'))

  @property
  def keras_model(self) -> tf.keras.Model:
    return self._keras_model

  @property
  def trainable_variables(self):
    return self._keras_model.trainable_variables

  @property
  def non_trainable_variables(self):
    return self._keras_model.non_trainable_variables

  @property
  def local_variables(self):
    return list(self._sums.values())

  @property
  def input_spec(self):
    return self._input_spec

  @tf.function
  def predict_on_batch(self, x, training=True):
    return self._dict_model(x, training=training)['logits']

  def _split(self, batch_input):
    if isinstance(batch_input, collections.abc.Mapping):
      return batch_input['x'], batch_input.get('y')
    return batch_input[0], batch_input[1]

  @tf.function
  def forward_pass(self, batch_input, training=True):
    x, y = self._split(batch_input)
    outputs = self._dict_model(x, training=training)
    logits = outputs['logits']
    n = tf.shape(logits)[0]
    nf = tf.cast(n, tf.float32)
    labels = tf.cast(tf.reshape(y, [-1]), tf.int32)
    ce = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=self._from_logits))
    reg = tf.cast(self._regularizer(outputs['representation'], logits), tf.float32)
    loss = ce + reg
    if self._keras_model.losses:  # Keras kernel regularisers, if the user's model has any.
      loss += tf.add_n(self._keras_model.losses)
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.cast(tf.argmax(logits, axis=-1), tf.int32), labels), tf.float32))
    for name, value in (('loss', loss * nf), ('cross_entropy', ce * nf),
                        ('regularizer', reg * nf), ('correct', correct), ('num_examples', nf),
                        ('num_batches', 1.0)):
      self._sums[name].assign_add(value)
    return tff.learning.models.BatchOutput(loss=loss, predictions=logits, num_examples=n)

  @tf.function
  def report_local_unfinalized_metrics(self):
    # Each metric travels as (sum, examples) so the server can form example-weighted means.
    examples = self._sums['num_examples'].read_value()
    out = collections.OrderedDict()
    for name, key in (('loss', 'loss'), ('cross_entropy', 'cross_entropy'),
                      ('regularizer', 'regularizer'), ('accuracy', 'correct')):
      out[name] = [self._sums[key].read_value(), examples]
    out['num_examples'] = [examples]
    out['num_batches'] = [self._sums['num_batches'].read_value()]
    return out

  def metric_finalizers(self):
    mean = tf.function(lambda v: tf.math.divide_no_nan(v[0], v[1]))
    total = tf.function(lambda v: v[0])
    return collections.OrderedDict(
        loss=mean, cross_entropy=mean, regularizer=mean, accuracy=mean, num_examples=total,
        num_batches=total)

  @tf.function
  def reset_metrics(self):
    for v in self._sums.values():
      v.assign(0.0)


def from_keras_model(keras_model: tf.keras.Model, input_spec,
                     regularizer: RegularizerArg = 'feddecorr', *,
                     representation_layer: Optional[str] = None, from_logits: bool = True,
                     **coefficients) -> tff.learning.models.VariableModel:
  """A `tff.learning.models.VariableModel` whose loss adds a representation regulariser.

  Call it inside the `model_fn` you give to a TFF builder (TFF builds the model in its own graphs):

      def model_fn():
        return tff_decorr.runtimes.learning.from_keras_model(make_keras_model(), input_spec,
                                                             representation_layer='fc', beta=0.1)
      process = tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, tff.learning.optimizers.build_sgdm(0.01))

  Loss per batch = mean sparse cross-entropy(labels, logits) + regulariser(representation, logits)
  + the Keras model's own `losses`. Metrics (example-weighted over clients): loss, cross_entropy,
  regularizer (the regulariser's value, already times its coefficient), accuracy, num_examples,
  num_batches.

  BatchNormalization: accepted. TFF's stock algorithms train and aggregate the TRAINABLE variables
  only, so BN moving mean and variance stay at their initial values on the server (measured with
  TFF 0.87, docs/reference.md §8) and the global model evaluates with statistics it never learned.
  `build_process('fedavg', ...)` in this module averages them as the reference does; `'fedbn'`
  keeps them per client.

  Args:
    keras_model: a functional or Sequential Keras model, not compiled. Either the project's dict
      outputs {'representation', 'logits'} or one output (the logits) with `representation_layer`.
    input_spec: the element spec of a client's batches, (x, y) or {'x': ..., 'y': ...}; labels are
      integer class ids.
    regularizer: a name in `tff_decorr.regularizers.names()`, a callable
      (representation, logits) -> scalar already times its coefficient, or None (plain CE).
    representation_layer: the name of the layer whose output is the representation (flattened).
    from_logits: False when the model's output is already a softmax.
    **coefficients: regulariser coefficients for `regularizers.get` (beta; lam, mu for FedUV).

  Returns:
    The `tff.learning.models.VariableModel` (a RegularizedKerasModel) over `keras_model`.

  Raises:
    ValueError: an unknown regulariser or coefficient, a `representation_layer` the model does not
      have (or none given for a one-output model), a compiled model, or an `input_spec` that is
      not (x, y) or {'x', 'y'}.
  """
  reg = _regularizer(regularizer, coefficients)
  dict_model = as_dict_model(keras_model, representation_layer)
  if getattr(keras_model, '_is_compiled', False):
    raise ValueError('keras_model must not be compiled: TFF trains it with its own optimizers.')
  if isinstance(input_spec, collections.abc.Mapping):
    if 'x' not in input_spec or 'y' not in input_spec:
      raise ValueError("input_spec as a mapping needs keys 'x' (inputs) and 'y' (labels).")
  elif len(input_spec) != 2:
    raise ValueError('input_spec must have two elements, (x, y): the inputs and the labels.')
  return RegularizedKerasModel(keras_model, dict_model, input_spec, reg, from_logits)


# ------------------------------------------------------------------------------------------------
# The project's algorithms as LearningProcesses
# ------------------------------------------------------------------------------------------------

# Aggregation pieces shared with bin/train's --aggregator live in tff_decorr.aggregators;
# these names stay here for code written against this module.
upload_bytes_per_client = aggregators.upload_bytes_per_client
dp_epsilons = aggregators.dp_epsilons
AccountedDpFactory = aggregators.AccountedDpFactory
dp_aggregator = aggregators.dp_aggregator


def _algorithm_regularizer(regularizer):
  if isinstance(regularizer, str):
    return _regularizer(regularizer, {})
  if regularizer is not None and not callable(regularizer):
    raise ValueError(f'regularizer must be a name ({", ".join(regularizers.names())}), a '
                     'callable (representation, logits) -> scalar, or None; got '
                     f'{type(regularizer).__name__}.')
  return regularizer


def _checked_arguments(name, model_fn, client_dataset_fn, client_ids) -> Optional[list[str]]:
  """build_process's argument checks; returns client_ids as a list of strings (or None)."""
  if name not in process_algorithms():
    raise ValueError(f'name={name!r}: no LearningProcess form; choose one of '
                     f'{", ".join(process_algorithms())}.')
  if not callable(model_fn):
    raise ValueError('model_fn must be a no-arg callable returning a Keras model.')
  if not callable(client_dataset_fn):
    raise ValueError('client_dataset_fn must be a callable (client_id, seed) -> tf.data.Dataset '
                     'built from TF ops.')
  if client_ids is not None:
    client_ids = [str(c) for c in client_ids]
    if not client_ids or len(set(client_ids)) != len(client_ids):
      raise ValueError('client_ids must be a non-empty list of distinct client ids.')
  if algorithms.algorithm_class(name).stateful and client_ids is None:
    raise ValueError(f'client_ids is required for {name!r}: its per-client state is kept in the '
                     'server state, one row per client id.')
  return client_ids


# Ten parameters: the public API mirrors tff.learning.algorithms' builders, one keyword per choice.
def build_process(name: str, model_fn: Callable[[], tf.keras.Model],
                  client_dataset_fn: Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset], *,
                  optimizer: SGDHParams = SGDHParams(),
                  regularizer: RegularizerArg = 'feddecorr',
                  client_ids: Optional[Sequence[str]] = None,
                  model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
                  representation_layer: Optional[str] = None, seed: int = 0,
                  initial_weights: Optional[Sequence[np.ndarray]] = None,
                  **hparams) -> tff.learning.templates.LearningProcess:
  """Project algorithm `name` as a `tff.learning.templates.LearningProcess` (docs/tff.md).

  `next(state, client_ids@CLIENTS)` takes client ids (strings), e.g. from
  `tff.program.ClientIdDataSource(client_ids)`, and builds each client's dataset inside the
  computation with `client_dataset_fn(client_id, seed)` (TF ops; a task's
  `client_dataset_fn(shard_dir, batch_size)`), `seed` a stateless function of (`seed`, round, id).
  The client work is the project's own local training (`algorithms.build(...).make_client_step`),
  the server step the algorithm's `server_step`, as in `runtimes/tff_runtime.py`.

  State: `tff.learning.templates.LearningAlgorithmState`; global_model_weights is a
  `tff.learning.models.ModelWeights` (all weights, BN statistics included, which every algorithm
  here aggregates except FedBN's), client_work holds the round number and, for fedbn / moon /
  scaffold, every client's state (one row per id in `client_ids`), finalizer the algorithm's other
  server state (FedAvgM momentum, SCAFFOLD's c), aggregator the aggregation process's state.
  Metrics: client_work/train (loss, cross_entropy, regularizer, algorithm_loss, accuracy,
  num_examples, num_steps, clients), aggregator (the factory's measurements; bytes_up: bytes the
  aggregator's wire format sends, all clients; bytes_up_float32: the update as plain float32),
  distributor (bytes_down).

  Args:
    name: one of process_algorithms().
    model_fn: no-arg callable returning a Keras model: the project's dict outputs, or one output
      (logits) with `representation_layer`.
    client_dataset_fn: (client_id tf.string, seed tf.int64) -> batched (x, y) tf.data.Dataset,
      built from TF ops inside the function (it is traced into a TFF computation: data made
      outside it must be NumPy arrays or files, not tensors).
    optimizer: local SGD's settings (SGDHParams: lr, momentum, weight_decay; local epochs are
      part of the client dataset). The keyword `config`, its name before 0.4.0, still works with
      a DeprecationWarning.
    regularizer: name in regularizers.names() (default coefficients), a
      `regularizers.get(name, beta=...)`, a callable, or None.
    client_ids: every client id. Required for fedbn, moon and scaffold (their per-client state).
    model_aggregator: any tff.aggregators factory, weighted or unweighted. Default: the weighted
      mean (`tff.aggregators.MeanFactory()`), today's runtime result up to float round-off.
      Clients send deltas; an unweighted factory averages them uniformly.
    representation_layer: see `as_dict_model`.
    seed: base seed of the client datasets.
    initial_weights: flat weights in model.weights order (default: the model's initialisation).
    **hparams: the algorithm's (fedprox mu, fedavgm server_momentum/form/server_lr, moon mu /
      temperature, scaffold server_lr / num_clients (default len(client_ids)), fedlc tau /
      local_epochs (the passes client_dataset_fn's datasets hold, default 1), fedrs alpha,
      fedsam rho).

  Returns:
    The `tff.learning.templates.LearningProcess` (initialize, next, get_model_weights,
    set_model_weights), to run in a TFF execution context (`tff_context.install()`).

  Raises:
    ValueError: an algorithm without a LearningProcess form, a model_fn or client_dataset_fn that
      is not callable, client_ids missing (fedbn, moon, scaffold) or repeated, an unknown
      regulariser or setting, a model_aggregator that is no factory or cannot be combined with the
      algorithm, a `representation_layer` the model lacks, or a client_dataset_fn that captures
      tensors created outside it (the message says why and what to do).
    TypeError: client_dataset_fn returns something other than a tf.data.Dataset.
  """
  client_ids = _checked_arguments(name, model_fn, client_dataset_fn, client_ids)
  optimizer = client_update.optimizer_argument(optimizer, hparams, 'build_process')
  if (algorithms.algorithm_class(name).needs_num_clients and 'num_clients' not in hparams
      and client_ids is not None):
    hparams['num_clients'] = len(client_ids)
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  aggregators.check_factory(model_aggregator)  # Before anything is built.
  dict_model_fn = lambda: as_dict_model(model_fn(), representation_layer)
  alg = algorithms.build(name, dict_model_fn, optimizer, _algorithm_regularizer(regularizer),
                         **hparams)
  return _ProcessBuilder(alg, client_dataset_fn, client_ids, model_aggregator, seed,
                         initial_weights).build()


def install_program_context(max_concurrent_computation_calls: int = -1,
                            log_path: Optional[str] = None, timeout: float = 60.0) -> None:
  """Sets a `tff.program.NativeFederatedContext` as TFF's default context (train_model needs one)
  on the project's own worker (`tff_context.install_program`)."""
  tff_context.install_program(max_concurrent_computation_calls, log_path, timeout)


_constant = tff_runtime.constant_structure


def _client_dataset(dataset_fn, client_id: tf.Tensor, seed: tf.Tensor) -> tf.data.Dataset:
  """`dataset_fn(client_id, seed)` as traced into the client computation, its two usual mistakes
  said in terms of build_process's argument rather than TensorFlow's."""
  try:
    dataset = dataset_fn(client_id, seed)
  except RuntimeError as e:
    if 'capture an EagerTensor' not in str(e):
      raise
    # TFF traces client_dataset_fn into a graph (a tff.tensorflow.computation), which cannot hold
    # a tensor made eagerly outside it: TensorFlow says only "Attempting to capture an EagerTensor".
    raise ValueError(
        'client_dataset_fn uses a TensorFlow tensor created outside it (an eager tensor, e.g. '
        'x = tf.constant(...), or a dataset\'s tensors captured from the enclosing scope); TFF '
        'traces client_dataset_fn into a graph computation, which cannot capture it. Keep data '
        'made outside as NumPy arrays (x.numpy()) or read it inside the function (files by '
        'client id, tf.data ops), so that client_dataset_fn(client_id, seed) builds the client\'s '
        f'dataset from TF ops alone. (TensorFlow: {e})') from None
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError('client_dataset_fn(client_id, seed) must return a batched tf.data.Dataset of '
                    f'(x, y); it returned {type(dataset).__name__}.')
  return dataset


class _ProcessBuilder:
  """Builds the computations of one LearningProcess (kept apart from build_process's checks)."""

  def __init__(self, alg, client_dataset_fn, client_ids, factory, seed, initial_weights):
    self.alg = alg
    self.client_dataset_fn = client_dataset_fn
    self.client_ids = client_ids
    # The round is the runtimes' (client work, aggregation, server update); this class only
    # places it in tff.learning's state: client state in a server-held table keyed by client id.
    self.round = federated_round.Round(alg, factory, state_on_server=True, what='model_aggregator')
    self.seed = int(seed)
    self.stateful = alg.stateful
    weights = alg.initial_weights() if initial_weights is None else list(initial_weights)
    if len(weights) != alg.spec.num_weights:
      raise ValueError(f'initial_weights has {len(weights)} arrays; the model has '
                       f'{alg.spec.num_weights} (model.weights order).')
    self.weights = weights
    model = alg.model_fn()
    index = {v.ref(): i for i, v in enumerate(model.weights)}
    self.trainable_idx = [index[v.ref()] for v in model.trainable_weights]
    self.non_trainable_idx = [index[v.ref()] for v in model.non_trainable_weights]

  # ---- flat weights <-> ModelWeights ----
  def to_model_weights(self, flat):
    return tff.learning.models.ModelWeights(trainable=[flat[i] for i in self.trainable_idx],
                                            non_trainable=[flat[i] for i in self.non_trainable_idx])

  def from_model_weights(self, mw):
    flat = [None] * self.alg.spec.num_weights
    for i, w in zip(self.trainable_idx, mw.trainable):
      flat[i] = w
    for i, w in zip(self.non_trainable_idx, mw.non_trainable):
      flat[i] = w
    return flat

  def build(self) -> tff.learning.templates.LearningProcess:
    init = self._initial_computations()
    mw_type, extras_type, work_type = (init.model_weights.type_signature.result,
                                       init.finalizer.type_signature.result,
                                       init.work.type_signature.result)

    @tff.tensorflow.computation(mw_type, extras_type, work_type)
    def to_clients_tf(mw, extras, work):
      out = collections.OrderedDict(broadcast=self.alg.broadcast(self._server_state(mw, extras)),
                                    round=work['round'])
      if self.stateful:
        out['states'] = work['states']
      return out

    client_tf = self._client_computation(to_clients_tf.type_signature.result)
    out_type = client_tf.type_signature.result
    agg = self.round.aggregation_process(out_type['update'], out_type['weight'])
    server_tf = self._server_computation(mw_type, extras_type, out_type, init.extras0)
    collect = self._state_collection(out_type, work_type, init.work0.get('states'))
    metrics_tf = self._metrics_computation(out_type, agg)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
          global_model_weights=tff.federated_eval(init.model_weights, tff.SERVER),
          distributor=tff.federated_value((), tff.SERVER),
          client_work=tff.federated_eval(init.work, tff.SERVER),
          aggregator=agg.initialize(),
          finalizer=tff.federated_eval(init.finalizer, tff.SERVER)))

    state_type = init_fn.type_signature.result

    @tff.federated_computation(state_type, tff.FederatedType(np.str_, tff.CLIENTS))
    def next_fn(state, client_ids):
      to_clients = tff.federated_map(
          to_clients_tf, (state.global_model_weights, state.finalizer, state.client_work))
      outputs = tff.federated_map(client_tf, (tff.federated_broadcast(to_clients), client_ids))
      agg_out, exact, total = self.round.aggregate(agg, state.aggregator, outputs)
      server_out = tff.federated_map(
          server_tf, (state.global_model_weights, state.finalizer, agg_out.result, exact, total))
      new_work = collect(state.client_work, outputs)
      reported = tff.federated_map(metrics_tf, tff.federated_sum(outputs.metrics))
      communication = reported.communication
      new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
          global_model_weights=server_out.model_weights, distributor=state.distributor,
          client_work=new_work, aggregator=agg_out.state, finalizer=server_out.extras))
      metrics = tff.federated_zip(collections.OrderedDict(
          distributor=collections.OrderedDict(bytes_down=communication.bytes_down),
          client_work=collections.OrderedDict(train=reported.train),
          aggregator=collections.OrderedDict(
              measurements=agg_out.measurements, bytes_up=communication.bytes_up,
              bytes_up_float32=communication.bytes_up_float32),
          finalizer=tff.federated_value((), tff.SERVER)))
      return tff.learning.templates.LearningProcessOutput(new_state, metrics)

    get_model_weights, set_model_weights = self._weights_accessors(state_type.member)
    return tff.learning.templates.LearningProcess(init_fn, next_fn, get_model_weights,
                                                  set_model_weights)

  def _initial_computations(self) -> types.SimpleNamespace:
    """The server's initial values (extras0, work0) and the no-arg computations returning them."""
    alg = self.alg
    server_state0 = alg.initial_server_state(self.weights)
    extras0 = collections.OrderedDict((k, v) for k, v in server_state0.items() if k != 'weights')
    work0 = collections.OrderedDict(round=np.int64(0))
    if self.stateful:
      client0 = alg.initial_client_state(self.weights)
      n = len(self.client_ids)
      work0['states'] = tf.nest.map_structure(lambda x: np.stack([np.asarray(x)] * n), client0)

    @tff.tensorflow.computation
    def model_weights_init():
      return self.to_model_weights(_constant(self.weights))

    @tff.tensorflow.computation
    def finalizer_init():
      return _constant(extras0)

    @tff.tensorflow.computation
    def work_init():
      return _constant(work0)

    return types.SimpleNamespace(extras0=extras0, work0=work0, model_weights=model_weights_init,
                                 finalizer=finalizer_init, work=work_init)

  def _server_state(self, mw, extras):
    """The algorithm's server state from tff.learning's ModelWeights and the finalizer's extras."""
    state = dict(extras)
    state['weights'] = self.from_model_weights(mw)
    return state

  def _server_computation(self, mw_type, extras_type, out_type, extras0):
    """(model weights, extras, aggregate, exact, total weight) -> the server update's new state."""

    @tff.tensorflow.computation(mw_type, extras_type, out_type['update'], out_type['exact'],
                                tf.float32)
    def server_tf(mw, extras, aggregate, exact, total_weight):
      new_state = self.round.server_update(self._server_state(mw, extras), aggregate, exact,
                                           total_weight)
      extras_out = collections.OrderedDict((k, new_state[k]) for k in extras0)
      return collections.OrderedDict(model_weights=self.to_model_weights(new_state['weights']),
                                     extras=extras_out)

    return server_tf

  def _metrics_computation(self, out_type, agg):
    """Summed client metrics -> the process's train and communication metrics."""
    bytes_per_client = self.round.upload_bytes_per_client(agg, out_type['exact'])
    float_bytes = (aggregators.tensor_bytes(out_type['update'])
                   + aggregators.tensor_bytes(out_type['exact']))

    @tff.tensorflow.computation(out_type['metrics'])
    def metrics_tf(m):
      ex = m['examples']
      mean = lambda k: tf.math.divide_no_nan(m[k], ex)
      train = collections.OrderedDict(
          loss=mean('loss_sum'), cross_entropy=mean('ce_sum'), regularizer=mean('reg_sum'),
          algorithm_loss=mean('extra_sum'), accuracy=mean('correct'), num_examples=ex,
          num_steps=m['steps'], clients=m['clients'])
      communication = collections.OrderedDict(
          bytes_up=m['clients'] * float(bytes_per_client),
          bytes_up_float32=m['clients'] * float(float_bytes), bytes_down=m['bytes_down'])
      return collections.OrderedDict(train=train, communication=communication)

    return metrics_tf

  @staticmethod
  def _weights_accessors(member):
    """The LearningProcess's get_model_weights and set_model_weights for state type `member`."""

    @tff.tensorflow.computation(member)
    def get_model_weights(state):
      return state.global_model_weights

    @tff.tensorflow.computation(member, member.global_model_weights)
    def set_model_weights(state, model_weights):
      return tff.learning.templates.LearningAlgorithmState(
          global_model_weights=model_weights, distributor=state.distributor,
          client_work=state.client_work, aggregator=state.aggregator, finalizer=state.finalizer)

    return get_model_weights, set_model_weights

  def _client_computation(self, to_clients_type):
    ids, stateful = self.client_ids, self.stateful
    base_seed = self.seed
    dataset_fn = self.client_dataset_fn
    round_ = self.round

    @tff.tensorflow.computation(to_clients_type, tf.string)
    def client_tf(to_clients, client_id):
      work = round_.client_work(round_.new_workspace())
      if stateful:
        match = tf.equal(tf.constant(ids), client_id)
        found = tf.debugging.assert_equal(
            tf.reduce_any(match), True,
            message='client id not in build_process(client_ids=...): pass every client id')
        with tf.control_dependencies([found]):
          index = tf.argmax(tf.cast(match, tf.int32), output_type=tf.int32)
        state = tf.nest.map_structure(lambda t: tf.gather(t, index), to_clients['states'])
      else:
        index = tf.constant(-1, tf.int32)
        state = tf.constant(base.NO_CLIENT_STATE)
      pair = tf.random.experimental.stateless_fold_in(
          tf.stack([tf.constant(base_seed, tf.int64), to_clients['round']]),
          tf.strings.to_hash_bucket_fast(client_id, 2**31 - 1))
      out = work(to_clients['broadcast'], _client_dataset(dataset_fn, client_id, pair[0]), state)
      return collections.OrderedDict(update=out['update'], exact=out['exact'],
                                     weight=out['weight'], one=out['one'], index=index,
                                     state=out['client_state'], metrics=out['metrics'])

    return client_tf

  def _state_collection(self, out_type, work_type, work0_states):
    """fn(work_state@SERVER, client outputs@CLIENTS) -> new work state@SERVER.

    The sampled clients' new states are scattered into the table (federated_aggregate whose
    accumulator is the table and a mask of who reported), the rest keep theirs; round += 1.
    """
    if not self.stateful:
      @tff.tensorflow.computation(work_type)
      def advance(work):
        return collections.OrderedDict(round=work['round'] + 1)
      return lambda work, outputs: tff.federated_map(advance, work)

    n = len(self.client_ids)

    @tff.tensorflow.computation
    def zero():
      return collections.OrderedDict(
          states=_constant(tf.nest.map_structure(np.zeros_like, work0_states)),
          mask=tf.zeros([n], tf.float32))

    acc_type = zero.type_signature.result
    # A Python container on the type, so the body receives a dict whose state keeps its own
    # container (tf.nest needs it to match the accumulator's).
    item_type = tff.StructWithPythonType([('index', np.int32), ('state', out_type['state'])],
                                         collections.OrderedDict)

    @tff.tensorflow.computation(acc_type, item_type)
    def accumulate(acc, item):
      at = tf.reshape(item['index'], [1, 1])
      states = tf.nest.map_structure(
          lambda t, v: tf.tensor_scatter_nd_update(t, at, tf.expand_dims(v, 0)),
          acc['states'], item['state'])
      mask = tf.tensor_scatter_nd_add(acc['mask'], at, [1.0])
      return collections.OrderedDict(states=states, mask=mask)

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      return tf.nest.map_structure(tf.add, a, b)

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return acc

    @tff.tensorflow.computation(work_type, acc_type)
    def apply(work, acc):
      twice = tf.debugging.assert_less_equal(
          acc['mask'], 1.0, message='a client id was sampled twice in one round')
      with tf.control_dependencies([twice]):
        seen = acc['mask'] > 0

      def pick(new, old):
        shape = tf.concat([[n], tf.ones([tf.rank(old) - 1], tf.int32)], 0)
        return tf.where(tf.reshape(seen, shape), new, old)

      return collections.OrderedDict(
          round=work['round'] + 1,
          states=tf.nest.map_structure(pick, acc['states'], work['states']))

    def collect(work, outputs):
      items = tff.federated_zip(collections.OrderedDict(index=outputs.index,
                                                        state=outputs.state))
      acc = tff.federated_aggregate(items, zero(), accumulate, merge, report)
      return tff.federated_map(apply, (work, acc))

    return collect
