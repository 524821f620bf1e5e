"""tff_decorr.runtimes.learning: the VariableModel wrapper under TFF's stock builders, the project's
algorithms as LearningProcesses under train_model, and tff.aggregators in their place."""

import asyncio
import contextlib
import functools
import io
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import algorithms
from tff_decorr import regularizers
from tff_decorr.worker import tff_context
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import learning
from tff_decorr.runtimes import tf_runtime

DATA = testing.synthetic_clients(sizes=(10, 6, 14))
CLIENTS = ['0', '1', '2']
FN = testing.make_client_dataset_fn(DATA, batch_size=4)
FN2 = testing.make_client_dataset_fn(DATA, batch_size=4, epochs=2)  # 2 local epochs
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
    fn = FN
    # Project: FedAvg + FedDecorr, plain SGD (momentum 0, weight decay 0), in-process runtime.
    alg = algorithms.build('fedavg', dict_model,
                           algorithms.SGDHParams(lr=lr, momentum=0.0,
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
    datasets = [FN(tf.constant(c), tf.constant(0, tf.int64)) for c in CLIENTS]
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


BN_MODEL = functools.partial(testing.tiny_model, representation_dim=8)
CFG = algorithms.SGDHParams(lr=0.02, momentum=0.9, weight_decay=1e-3)


def wide_model(seed: int = 0) -> tf.keras.Model:
  """A 25,000-weight dense layer: TFF's compression_aggregator quantises tensors above 20,000."""
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)
  inputs = tf.keras.Input(testing.INPUT_SHAPE)
  x = tf.keras.layers.Flatten()(inputs)
  x = tf.keras.layers.Dense(500, activation='relu', kernel_initializer=init(1), name='fc')(x)
  logits = tf.keras.layers.Dense(testing.NUM_CLASSES, kernel_initializer=init(2), name='head')(x)
  return tf.keras.Model(inputs, logits)


def _flat(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


class ProcessAggregationTest(tf.test.TestCase):
  """build_process under the synchronous context: results against the project's TF runtime."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tff_context.install()
    cls.alg = algorithms.build('fedavg', BN_MODEL, CFG, regularizer=regularizers.get('feddecorr'))
    cls.runtime = tf_runtime.TfRuntime(cls.alg, FN2)

  def _process_weights(self, factory, rounds):
    process = learning.build_process('fedavg', BN_MODEL, FN2, optimizer=CFG,
                                     model_aggregator=factory)
    state = process.initialize()
    for clients in rounds:
      out = process.next(state, clients)
      state = out.state
    mw = process.get_model_weights(state)
    return learning_flat(self.alg, mw), out.metrics

  def test_weighted_mean_equals_tf_runtime(self):
    rounds = [['0', '1'], ['1', '2', '0']]
    got, metrics = self._process_weights(None, rounds)
    state = self.runtime.initialize()
    for r, clients in enumerate(rounds):
      state, _, _ = self.runtime.run_round(state, [(c, r) for c in clients],
                                           [base_state()] * len(clients))
    # Clients send y_i - x and the server adds x back to TFF's weighted mean; the runtime sums
    # n_i y_i. Float32 round-off through two rounds of 2 local epochs with momentum: 1e-5.
    for g, e in zip(got, state['weights']):  # every weight, BN statistics included
      self.assertAllClose(g, e, atol=1e-5, rtol=1e-5)
    n = 10 + 6 + 14
    self.assertEqual(metrics['client_work']['train']['num_examples'], 2 * n)  # 2 local epochs
    params = sum(w.size for w in got)
    self.assertEqual(metrics['aggregator']['bytes_up_float32'], 3 * 4 * params)
    self.assertEqual(metrics['aggregator']['bytes_up'], 3 * 4 * (params + 1))  # + the weight

  def test_dp_with_zero_noise_and_huge_clip_is_the_unweighted_mean(self):
    clients = ['0', '1', '2']
    factory = learning.dp_aggregator(0.0, clients_per_round=3, num_clients=3, clip=1e6)
    got, metrics = self._process_weights(factory, [clients])
    # Independent: each client's model after one round alone (a one-client FedAvg round returns
    # that client's y_i), then the plain mean over clients.
    state0 = self.runtime.initialize()
    ys = [self.runtime.run_round(state0, [(c, 0)], [base_state()])[0]['weights'] for c in clients]
    expected = [np.mean(ws, axis=0) for ws in zip(*ys)]
    for g, e in zip(got, expected):
      self.assertAllClose(g, e, atol=1e-5, rtol=1e-5)
    weighted = [sum(n * y for n, y in zip((10, 6, 14), ws)) / 30 for ws in zip(*ys)]
    self.assertGreater(max(np.abs(g - w).max() for g, w in zip(got, weighted)), 1e-3)
    self.assertEqual(metrics['aggregator']['measurements']['dp_epsilon'], np.inf)  # no noise

  def test_compression_shrinks_the_bytes_sent(self):
    process = learning.build_process('fedavg', wide_model, FN2, optimizer=CFG,
                                     representation_layer='fc',
                                     model_aggregator=tff.learning.compression_aggregator())
    out = process.next(process.initialize(), ['0', '1'])
    agg = out.metrics['aggregator']
    raw = agg['bytes_up_float32']
    self.assertEqual(raw, 2 * 4 * (50 * 500 + 500 + 500 * 3 + 3))
    # TFF's wire format, per client: the 25,000-weight kernel quantised to 8 bits and bit-packed
    # 28 bits per int32 (ceil(25,000 * 8 / 28) int32) plus its min and max; the small tensors as
    # float32; the weight; zeroing's and clipping's int32 counts and their adaptive-norm estimates
    # (two float32 pairs).
    per_client = (4 * int(np.ceil(25000 * 8 / 28)) + 4 * 2 + 4 * (500 + 500 * 3 + 3) + 4
                  + 4 * 2 + 4 * 2 * 2)
    self.assertEqual(agg['bytes_up'], 2 * per_client)
    self.assertLess(agg['bytes_up'], 0.35 * raw)
    self.assertTrue(all(np.isfinite(w).all() for w in _flat(process.get_model_weights(out.state))))


def learning_flat(alg, model_weights):
  """Flat weights in model.weights order from tff ModelWeights (inverse of _model_weights)."""
  model = alg.model_fn()
  index = {v.ref(): i for i, v in enumerate(model.weights)}
  flat = [None] * len(model.weights)
  for v, w in zip(model.trainable_weights, model_weights.trainable):
    flat[index[v.ref()]] = np.asarray(w)
  for v, w in zip(model.non_trainable_weights, model_weights.non_trainable):
    flat[index[v.ref()]] = np.asarray(w)
  return flat


class TrainModelTest(tf.test.TestCase):
  """Every project algorithm as a LearningProcess under tff.learning.programs.train_model."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    learning.install_program_context()

  @classmethod
  def tearDownClass(cls):
    tff_context.install()
    super().tearDownClass()

  def _train(self, process, directory, rounds):
    metrics = tff.program.MemoryReleaseManager()
    models = tff.program.MemoryReleaseManager()
    asyncio.run(tff.learning.programs.train_model(
        train_process=process, train_data_source=tff.program.ClientIdDataSource(CLIENTS),
        train_per_round_clients=3, train_total_rounds=rounds,
        program_state_manager=tff.program.FileProgramStateManager(directory),
        model_output_manager=models, train_metrics_manager=metrics, evaluation_manager=None,
        evaluation_periodicity=1))
    return dict(metrics.values()), dict(models.values())

  def test_every_algorithm_runs_two_rounds_and_resumes(self):
    hparams = {'fedavgm': {'server_momentum': 0.5}, 'fedprox': {'mu': 0.01}}
    for name in learning.process_algorithms():
      with self.subTest(name):
        process = learning.build_process(name, BN_MODEL, FN, optimizer=CFG, client_ids=CLIENTS,
                                         **hparams.get(name, {}))
        straight, resumed = tempfile.mkdtemp(), tempfile.mkdtemp()
        metrics, models = self._train(process, straight, 2)
        self.assertEqual(sorted(metrics), [1, 2])
        self.assertGreater(metrics[2]['model_metrics']['regularizer'], 0.0)
        final = models['training_checkpoint_round_2']
        self._train(process, resumed, 1)
        metrics_b, models_b = self._train(process, resumed, 2)  # a new run: resumes at round 1
        self.assertEqual(sorted(metrics_b), [2])
        self.assertEqual(sorted(os.listdir(resumed)),
                         ['program_state_0', 'program_state_1', 'program_state_2'])
        resumed_final = models_b['training_checkpoint_round_2']
        # All 3 clients each round: the runs differ only in client order (summation order).
        for a, b in zip(_flat(resumed_final), _flat(final)):
          self.assertAllClose(a, b, atol=1e-5, rtol=1e-5)
        self.assertEqual(final.client_work['round'], 2)
        if algorithms.algorithm_class(name).stateful:
          # Every client trained in both rounds: each one's row of the state table moved.
          initial = asyncio.run(_materialize(process.initialize))
          for new, old in zip(_flat(final.client_work['states']),
                              _flat(initial.client_work['states'])):
            for i in range(len(CLIENTS)):
              self.assertGreater(np.abs(new[i] - old[i]).max(), 0.0, f'client {i}')


async def _materialize(computation):
  # The program context runs computations as tasks of the running event loop.
  return await tff.program.materialize_value(computation())


class ProcessErrorsTest(tf.test.TestCase):

  def test_dp_with_per_client_state_names_model_aggregator(self):
    for name in ('scaffold', 'fedbn', 'moon'):
      with self.subTest(name), self.assertRaisesRegex(
          ValueError, r'model_aggregator \(.*DifferentiallyPrivateFactory.*\) cannot be combined '
          r'with .*privacy guarantee'):
        learning.build_process(name, BN_MODEL, FN, client_ids=CLIENTS,
                               model_aggregator=tff.learning.dp_aggregator(0.1, 3))

  def test_a_norm_bounding_factory_refuses_fednova(self):
    # Read from the built process (TFF's clipping/zeroing wrappers), not from the factory's name.
    with self.assertRaisesRegex(ValueError, 'model_aggregator cannot be combined with '
                                '--algorithm=fednova: its upload carries the normaliser a_i'):
      learning.build_process('fednova', BN_MODEL, FN, model_aggregator=tff.aggregators.
                             zeroing_factory(1e3, tff.aggregators.MeanFactory()))
    learning.build_process('fednova', BN_MODEL, FN, model_aggregator=tff.learning.
                           robust_aggregator(zeroing=False, clipping=False))  # No bound: allowed.

  def test_not_a_factory_names_model_aggregator(self):
    with self.assertRaisesRegex(ValueError, 'model_aggregator must be a tff.aggregators factory'):
      learning.build_process('fedavg', BN_MODEL, FN, model_aggregator=tf.add)

  def test_stateful_without_client_ids(self):
    with self.assertRaisesRegex(ValueError, "client_ids is required for 'scaffold'"):
      learning.build_process('scaffold', BN_MODEL, FN)

  def test_unknown_regularizer_and_algorithm(self):
    with self.assertRaisesRegex(ValueError, r"regularizer='decorr' is unknown"):
      learning.build_process('fedavg', BN_MODEL, FN, regularizer='decorr')
    with self.assertRaisesRegex(ValueError, r"name='fedavg_decomposed': no LearningProcess form"):
      learning.build_process('fedavg_decomposed', BN_MODEL, FN)

  def test_missing_representation_layer(self):
    with self.assertRaisesRegex(ValueError, r"representation_layer='nope'.*no layer"):
      learning.build_process('fedavg', plain_model, FN, representation_layer='nope')

  def test_a_data_function_capturing_eager_tensors_is_explained(self):
    # A researcher's first try: tensors made outside, captured by the data function. TFF's own
    # error is "RuntimeError: Attempting to capture an EagerTensor without building a function".
    images = tf.random.stateless_normal([8] + list(testing.INPUT_SHAPE), seed=[0, 1])
    labels = tf.zeros([8], tf.int32)
    captured = lambda client_id, seed: tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
    with self.assertRaisesRegex(ValueError, r'client_dataset_fn uses a TensorFlow tensor created '
                                r'outside it .* Keep data made outside as NumPy arrays'):
      learning.build_process('fedprox', plain_model, captured, representation_layer='pool',
                             mu=0.01)
    # The fix the message gives (the same data as NumPy arrays) builds.
    x, y = images.numpy(), labels.numpy()
    fixed = lambda client_id, seed: tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    learning.build_process('fedprox', plain_model, fixed, representation_layer='pool', mu=0.01)
    with self.assertRaisesRegex(TypeError, 'must return a batched tf.data.Dataset of .*; it '
                                'returned tuple'):
      learning.build_process('fedprox', plain_model, lambda client_id, seed: (x, y),
                             representation_layer='pool', mu=0.01)


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


class DocsExamplesTest(tf.test.TestCase):
  """The worked examples of docs/tff.md run as written."""

  def test_examples_run(self):
    # realpath: under Bazel __file__ is a runfiles symlink; docs/ is beside it in the source tree.
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), 'docs',
                        'tff.md')
    with open(path) as f:
      blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
    self.assertLen(blocks, 3)
    self.assertLessEqual(len(blocks[0].strip().splitlines()), 22)  # incl. data and imports
    outputs = []
    for block in blocks:
      out = io.StringIO()
      with contextlib.redirect_stdout(out):
        code = compile(block, path, 'exec')
        exec(code, {'__name__': 'docs_example'})  # pylint: disable=exec-used
      outputs.append(out.getvalue())
    self.assertGreater(float(outputs[0]), 0.0)  # the regulariser's value
    self.assertIn('model_metrics/regularizer', outputs[1])  # train_model's released metrics
    epsilons = [float(x) for x in outputs[2].split()]
    self.assertLen(epsilons, 2)
    self.assertLess(epsilons[0], epsilons[1])
    tff_context.install()  # example 2 left the program context installed


if __name__ == '__main__':
  absltest.main()
