"""tff_decorr.learning: the VariableModel wrapper under TFF's stock builders, the project's
algorithms as LearningProcesses under train_model, and tff.aggregators in their place."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import algorithms
from tff_decorr import learning
from tff_decorr import regularizers
from tff_decorr import tff_context
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import tf_runtime

DATA = testing.synthetic_clients(sizes=(10, 6, 14))
CLIENTS = ['0', '1', '2']
INPUT_SPEC = (tf.TensorSpec([None] + list(testing.INPUT_SHAPE), tf.float32),
              tf.TensorSpec([None], tf.int32))


def plain_model(seed: int = 0) -> tf.keras.Model:
  """A user's Keras model: one output (logits), no BatchNorm, representation layer 'pool'."""
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)
  inputs = tf.keras.Input(testing.INPUT_SHAPE)
  x = tf.keras.layers.Conv2D(8, 3, padding='same', activation='relu', kernel_initializer=init(1),
                             name='conv')(inputs)
  x = tf.keras.layers.GlobalAveragePooling2D(name='pool')(x)
  logits = tf.keras.layers.Dense(testing.NUM_CLASSES, kernel_initializer=init(2), name='head')(x)
  return tf.keras.Model(inputs, logits)


def dict_model(seed: int = 0) -> tf.keras.Model:
  """The same model with the project's dict outputs (same layers, same initial weights)."""
  return learning.as_dict_model(plain_model(seed), representation_layer='pool')


def _model_weights(model: tf.keras.Model, flat):
  """tff ModelWeights from a flat list in model.weights order."""
  index = {v.ref(): i for i, v in enumerate(model.weights)}
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(flat[index[v.ref()]]) for v in model.trainable_weights],
      non_trainable=[np.asarray(flat[index[v.ref()]]) for v in model.non_trainable_weights])


def _running(pid: int) -> bool:
  """True while process `pid` exists and is not a zombie waiting to be reaped."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split()[2] != 'Z'
  except FileNotFoundError:
    return False


def setUpModule():
  tff_context.install()


def tearDownModule():
  """Every worker_binary this test file started is gone."""
  pids = tff_context.worker_pids()
  tff_context.stop_all()
  left = [p for p in pids if _running(p)]
  assert not left, f'worker_binary processes still running: {left}'


class WrapperTest(tf.test.TestCase):

  def test_stock_fed_avg_with_wrapper_equals_project_fedavg_feddecorr(self):
    lr, beta = 0.05, 0.1
    fn = testing.make_client_dataset_fn(DATA, batch_size=4)
    # Project: FedAvg + FedDecorr, plain SGD (momentum 0, weight decay 0), in-process runtime.
    alg = algorithms.build('fedavg', dict_model,
                           algorithms.ClientConfig(local_epochs=1, lr=lr, momentum=0.0,
                                                   weight_decay=0.0),
                           regularizer=regularizers.get('feddecorr', beta=beta))
    runtime = tf_runtime.TfRuntime(alg, fn)
    state = runtime.initialize()
    for r in range(2):
      state, _, _ = runtime.run_round(state, [(c, r) for c in CLIENTS],
                                      [base_state() for _ in CLIENTS])
    expected = _model_weights(dict_model(), state['weights']).trainable

    # Stock TFF: build_weighted_fed_avg over the wrapper, a user's plain Keras model.
    def model_fn():
      return learning.from_keras_model(plain_model(), INPUT_SPEC, 'feddecorr',
                                       representation_layer='pool', beta=beta)
    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
    tff_state = process.initialize()
    tff_state = process.set_model_weights(
        tff_state, _model_weights(dict_model(), alg.initial_weights()))
    datasets = [fn(tf.constant(c), tf.constant(0, tf.int64)) for c in CLIENTS]
    for _ in range(2):
      out = process.next(tff_state, datasets)
      tff_state = out.state
    got = process.get_model_weights(tff_state).trainable
    # TFF sums n_i (y_i - x) in its worker (another TF build, another summation order) and adds x
    # back; the project sums n_i y_i. Float32 round-off of both, through 2 rounds: 1e-5.
    for g, e in zip(got, expected):
      self.assertAllClose(g, e, atol=1e-5, rtol=1e-5)
    self.assertNotAllClose(got[0], _model_weights(dict_model(), alg.initial_weights()).trainable[0])
    train = out.metrics['client_work']['train']
    self.assertGreater(train['regularizer'], 0.0)
    self.assertEqual(train['num_examples'], 30)


  def test_stock_builders_and_optimizers_run_with_a_batchnorm_model(self):
    # The project's BN model (dict outputs): TFF's builders and optimizers take the wrapper as is.
    def model_fn():
      return learning.from_keras_model(testing.tiny_model(), INPUT_SPEC, 'feddecorr', beta=0.1)
    sgdm = tff.learning.optimizers.build_sgdm(0.05, momentum=0.9)
    adam = tff.learning.optimizers.build_adam(0.01)
    processes = {
        'weighted': tff.learning.algorithms.build_weighted_fed_avg(
            model_fn, client_optimizer_fn=sgdm, server_optimizer_fn=adam),
        'unweighted': tff.learning.algorithms.build_unweighted_fed_avg(
            model_fn, client_optimizer_fn=adam, server_optimizer_fn=sgdm),
        'fed_prox': tff.learning.algorithms.build_weighted_fed_prox(
            model_fn, proximal_strength=0.01, client_optimizer_fn=sgdm,
            server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0)),
    }
    fn = testing.make_client_dataset_fn(DATA, batch_size=4)
    datasets = [fn(tf.constant(c), tf.constant(0, tf.int64)) for c in CLIENTS]
    for name, process in processes.items():
      with self.subTest(name):
        state = process.initialize()
        before = process.get_model_weights(state)
        out = process.next(state, datasets)
        after = process.get_model_weights(out.state)
        self.assertNotAllClose(after.trainable[0], before.trainable[0])
        # What docs/tff.md states: stock TFF leaves BN moving mean and variance at their initial
        # values (it aggregates trainable variables only).
        for a, b in zip(after.non_trainable, before.non_trainable):
          self.assertAllEqual(a, b)
        train = out.metrics['client_work']['train']
        self.assertGreater(train['regularizer'], 0.0)
        self.assertTrue(np.isfinite(train['loss']))


def base_state():
  return algorithms.base.NO_CLIENT_STATE


class WrapperErrorsTest(tf.test.TestCase):

  def test_missing_representation_layer_names_the_argument(self):
    with self.assertRaisesRegex(ValueError, r"representation_layer='fc'.*no layer.*conv, pool"):
      learning.from_keras_model(plain_model(), INPUT_SPEC, representation_layer='fc')

  def test_plain_model_without_representation_layer(self):
    with self.assertRaisesRegex(ValueError, 'representation_layer is required'):
      learning.from_keras_model(plain_model(), INPUT_SPEC)

  def test_unknown_regularizer_names_the_argument(self):
    with self.assertRaisesRegex(ValueError, r"regularizer='decorr' is unknown.*feddecorr"):
      learning.from_keras_model(dict_model(), INPUT_SPEC, regularizer='decorr')


if __name__ == '__main__':
  absltest.main()
