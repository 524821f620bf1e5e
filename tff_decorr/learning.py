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
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import algorithms
from tff_decorr import regularizers
from tff_decorr.algorithms import base
from tff_decorr.algorithms import fedavg
from tff_decorr.algorithms import fedbn
from tff_decorr.algorithms import fednova
from tff_decorr.algorithms import scaffold
from tff_decorr.algorithms.client_update import ClientConfig, Workspace

PROCESS_ALGORITHMS = ('fedavg', 'fedprox', 'fedavgm', 'fedbn', 'moon', 'scaffold', 'fednova')
# Algorithms whose client keeps state between rounds (held by the server here, see module doc).
STATEFUL_ALGORITHMS = ('fedbn', 'moon', 'scaffold')

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
        return tff_decorr.learning.from_keras_model(make_keras_model(), input_spec,
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

