"""The project's FedProx, MOON, FedNova, SCAFFOLD and FedBN against what the reference or the papers
compute, in float64.

FedProx, MOON and FedNova: against the PyTorch reference's own `approach/*.py` classes, run by
bench/reference/reference_fixtures_algorithms.py (fixtures: tests/testdata/reference/algorithms/;
that script's docstring says what each file holds) on ResNet20 from the same weights, with three
clients of 97, 64 and 30 CIFAR-10 images (batch 32, one epoch, SGD lr 0.01, momentum 0.9, weight
decay 1e-5, FedDecorr 0.1). Both sides are float64 and compute the same thing, so weights agree to
rounding (~1e-12 here) and are compared to 1e-7 (tests/reference_equivalence_test.py explains the
chaos that bounds how many steps that holds for). Where the reference is defective
(docs/reference.md §5) the fixture is the reference with its defect repaired from
outside, and what is pinned is the paper's formula:
- FedProx: the reference's proximal term is always zero (its `global_weight_collector` holds the
  parameters being trained, so it compares the weights with themselves). The fixture repairs only
  that list (detached copies of the broadcast weights); its own loop then adds the paper's
  (mu/2) ||w - w_global||^2. The unrepaired reference is FedAvg (docs/reference.md §5); the
  project's round is checked to be far from it.
- MOON: the reference never divides the similarities by the temperature. The fixture makes the
  reference's cosine similarity return sim / T, i.e. the paper's exp(sim / T) logits; the
  project's contrastive loss is also compared with that formula written here in NumPy on the
  similarities the reference computed.
- FedNova: the reference's own rule for the weights. For the BN running statistics the project
  deliberately differs (docs/algorithms.md: the clients' example-weighted mean, where the
  reference extrapolates through the normalised update); the test derives that mean from the
  reference's own clients.
The one quantity Keras computes differently in float64 is the BN running variance (biased batch
variance in the non-fused float64 kernel, PyTorch's is unbiased; tests/reference_equivalence_test
checks the float32 kernel, which is unbiased): it is compared loosely, and where it feeds the
computation (MOON evaluates the global and previous models in inference mode) the reference's
values are put into the project's state between rounds.

Partial participation (PartialParticipationTest): FedAvg, FedProx (repaired), MOON (T = 0.5) and
FedNova with 3 of 5 label-skewed clients a round, 2 local epochs, 3 rounds, FedDecorr 0.1
(fixtures <run>_partial); the other algorithms' such cases are in
tests/reference_optimizers_test.py (FedAvg's client rounds without FedDecorr there:
fedoptim_*_partial's `round{r}/averaged`). The reference's FedNova fails under partial
participation (docs/reference.md §5: its tau_eff takes p_i by party id from a list over the
round's parties); the fixture repairs that index from outside, as FedProx's.

SCAFFOLD and FedBN (absent from the reference): against NumPy written here from the papers'
pseudo-code (Karimireddy et al. 2020, Algorithm 1 with option II; Li et al. 2021, Algorithm 1) on
a tiny dense model with BatchNorm whose gradients are written out by hand, over three rounds.
"""

import json
import os

from absl import logging
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import testutil
from tff_decorr import algorithms
from tff_decorr import regularizers
from tff_decorr.algorithms import base
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms import testing as algo_testing
from tff_decorr.models import torch_import
from tff_decorr.runtimes import tf_runtime

DATA = os.path.join(os.path.dirname(os.path.realpath(__file__)), 'testdata', 'reference')
ALG_DATA = os.path.join(DATA, 'algorithms')
# As tests/reference_equivalence_test.py (a test module is not a dependency of another under
# Bazel, so the few helpers are repeated here): the reference's CIFAR-10 normalisation, its client
# SGD, its batch size.
CONFIG = client_update.SGDHParams(lr=0.01, momentum=0.9, weight_decay=1e-5)
BATCH = 32
BN_MOMENTUM = 0.9  # PyTorch's momentum 0.1: s <- 0.9 s + 0.1 batch statistic.
TOL = 1e-7
# Biased vs unbiased batch variance over N*H*W >= 64 values, in the batch part of the statistic.
VAR_TOL = 3e-2









class _Fixture:
  cache = {}

  @classmethod
  def load(cls, name, directory=ALG_DATA):
    if (directory, name) not in cls.cache:
      cls.cache[directory, name] = dict(np.load(os.path.join(directory, f'{name}.npz')))
    return cls.cache[directory, name]


def _init_state(dtype=np.float64):
  """The reference's initial ResNet20 state_dict (resnet20.npz,
  bench/reference/reference_fixtures.py)."""
  fx = _Fixture.load('resnet20', DATA)
  return {k[len('init/'):]: fx[k].astype(dtype) for k in fx if k.startswith('init/')}


def _keys(fx, name='keys'):
  return json.loads(str(fx[name]))


def _project_key(key):
  """The reference's MOON wraps ResNet20 as `features` (its classifier replaced by its own)."""
  return key[len('features.'):] if key.startswith('features.') else key


def _stats(fx, entry):
  """A `.../stats` entry split back into {project key: array}."""
  shapes = {k: v.shape for k, v in _init_state().items()}
  out, flat, at = {}, fx[entry], 0
  for key in _keys(fx, 'stat_keys'):
    shape = shapes[_project_key(key)]
    size = int(np.prod(shape))
    out[_project_key(key)] = flat[at:at + size].reshape(shape)
    at += size
  assert at == flat.size, entry
  return out


class _Run:
  """One of the project's algorithms on a fixture's clients, ResNet20 in float64, TF runtime."""

  def __init__(self, name, fx, regularizer, init=None, epochs=1, **hparams):
    self.state = _init_state()
    self.state.update({k: np.asarray(v, np.float64) for k, v in (init or {}).items()})
    self.model = testutil.resnet20_f64(self.state)
    b = _Fixture.load('batches', DATA)
    indices = [fx[f'client{i}/indices'] for i in range(sum(k.endswith('/indices') for k in fx))]
    data = [(testutil.normalise(b['images'][ix], np.float64), b['labels'][ix].astype(np.int32))
            for ix in indices]
    with testutil.Float64Scope():
      self.alg = algorithms.build(name, lambda: testutil.resnet20_f64(self.state), CONFIG,
                                  regularizer, local_epochs=epochs, **hparams)
      self.runtime = tf_runtime.TfRuntime(
          self.alg, algo_testing.make_client_dataset_fn(data, batch_size=BATCH, epochs=epochs))
      self.server = self.runtime.initialize()
    # Every client's state, sampled or not (MOON's previous local model).
    self.clients = [self.alg.initial_client_state(self.server['weights']) if self.alg.stateful
                    else base.NO_CLIENT_STATE for _ in data]

  def round(self, sampled=None):
    """One round of the clients `sampled` (default: all); the others' states stay."""
    sampled = range(len(self.clients)) if sampled is None else sampled
    with testutil.Float64Scope():
      self.server, states, metrics = self.runtime.run_round(
          self.server, [(str(i), 0) for i in sampled], [self.clients[i] for i in sampled])
    for i, st in zip(sampled, states):
      self.clients[i] = st
    return metrics

  def torch_state(self, weights=None):
    for v, x in zip(self.model.weights, self.server['weights'] if weights is None else weights):
      v.assign(x)
    return torch_import.to_torch_layout(self.model, self.state)

  def with_running_var(self, weights, stats):
    """`weights` with their BN running variances replaced by `stats`'."""
    sd = self.torch_state(weights)
    sd.update({k: v for k, v in stats.items() if k.endswith('running_var')})
    torch_import.assign_torch_state(self.model, sd)
    return [v.numpy() for v in self.model.weights]


def _weights(fx, sampled):
  """p_i: the sampled clients' example weights (dataset sizes), normalised over them."""
  n = np.array([len(fx[f'client{i}/indices']) for i in sampled], np.float64)
  return n / n.sum()


def _log_worst(fixture, worst):
  """The largest differences over a run's rounds, for the record (docs/algorithms.md's tables)."""
  logging.info('%s: largest relative differences over %d rounds: %s', fixture, len(worst),
               {k: f'{max(w[k] for w in worst):.1e}' for k in worst[0]})


def _feddecorr():
  return regularizers.get('feddecorr', beta=0.1)


class _ReferenceBase(parameterized.TestCase):
  """The comparisons with the reference's fixtures, shared by the test classes below."""

  def assert_state(self, got, fx, entry, trainable_only=False):
    """got: {project key: array}; fx[entry]: the reference's fingerprints. Running variances
    loosely (module docstring), from `entry/stats` when the fixture has them. Returns the largest
    differences (weights, running means, running variances) for the record."""
    worst = {'weights': 0.0, 'running_mean': 0.0, 'running_var': 0.0}
    for key, ref in zip(_keys(fx), fx[entry]):
      if 'running' in key and trainable_only:
        continue
      v = got[_project_key(key)]
      kind = key.split('.')[-1] if 'running' in key else 'weights'
      if kind == 'running_var':
        if f'{entry}/stats' in fx:
          d = testutil.relative_difference(v, _stats(fx, f'{entry}/stats')[_project_key(key)])
          self.assertLess(d, VAR_TOL, f'{entry}: {key}')
          worst[kind] = max(worst[kind], d)
        continue
      d = testutil.relative_difference(testutil.fingerprint(key, v), ref)
      self.assertLess(d, TOL, f'{entry}: {key}')
      worst[kind] = max(worst[kind], d)
    return worst

  def distance(self, got, fx, entry):
    """The largest relative difference of the project's trainable weights `got` from the
    fixture's fingerprints `fx[entry]`."""
    return max(testutil.relative_difference(testutil.fingerprint(key, got[_project_key(key)]), fp)
               for key, fp in zip(_keys(fx), fx[entry]) if 'running' not in key)

  def rounds(self, name, fixture, **hparams):
    """The project's `name` (FedDecorr 0.1, `hparams`) through the fixture's rounds and party
    list, each global model against the reference's. Returns the run."""
    fx = _Fixture.load(fixture)
    participation, epochs = testutil.reference_schedule(fx)
    run = _Run(name, fx, _feddecorr(), epochs=epochs, **hparams)
    worst = []
    for r, sampled in enumerate(participation, 1):
      run.round(sampled)
      worst.append(self.assert_state(run.torch_state(), fx, f'global{r}'))
    _log_worst(fixture, worst)
    return run

  def moon_rounds(self, fixture, temperature, after_round=lambda r, run: None):
    """The project's MOON (mu 1, `temperature`) through the fixture's rounds and party list: each
    global model against the reference's, and the contrastive loss (`extra_sum`) against the
    paper's formula on the similarities the reference computed. A client's previous local model
    is its own last one (the initial global model until it first trains). `after_round(r, run)`
    runs after the checks of round r."""
    fx = _Fixture.load(fixture)
    participation, epochs = testutil.reference_schedule(fx)
    init = {k: fx[f'init/{k}'] for k in ('classifier.weight', 'classifier.bias')}
    run = _Run('moon', fx, _feddecorr(), init=init, epochs=epochs, mu=1.0,
               temperature=temperature)
    worst = []
    for r, sampled in enumerate(participation, 1):
      metrics = run.round(sampled)
      worst.append(self.assert_state(run.torch_state(), fx, f'global{r}'))
      after_round(r, run)
      # The paper's loss on the reference's similarities, in NumPy: for each example
      # -log(e^{s_g/T} / (e^{s_g/T} + e^{s_p/T})), times mu = 1; `extra_sum` holds each step's
      # batch mean times the batch size, so the sum over every example of every step.
      expected = 0.0
      for i in sampled:
        sims = fx[f'round{r}/client{i}/sims'] / temperature  # [examples x epochs, 2]
        expected += np.sum(np.logaddexp(sims[:, 0], sims[:, 1]) - sims[:, 0])
      self.assertAlmostEqual(float(metrics['extra_sum']), expected, delta=1e-5 * expected)
      if r == 1:  # Every previous model is the global one, z_prev = z_global: log 2 an example.
        n = epochs * sum(len(fx[f'client{i}/indices']) for i in sampled)
        self.assertAlmostEqual(float(metrics['extra_sum']), n * np.log(2),
                               delta=1e-6 * n)  # metrics are float32
      # The running variances the reference's eval-mode forwards use (module docstring): the
      # global model's, and the previous local model's of each client that trained.
      run.server = dict(run.server, weights=run.with_running_var(
          run.server['weights'], _stats(fx, f'global{r}/stats')))
      for i in sampled:
        run.clients[i] = dict(run.clients[i], previous=run.with_running_var(
            run.clients[i]['previous'], _stats(fx, f'round{r}/client{i}/stats')))
    _log_worst(fixture, worst)

  def fednova_rounds(self, fixture):
    """The project's FedNova through the fixture's rounds and party list: the weights against the
    reference's rule, a_i and tau_eff against the reference's, and the BN statistics against the
    sampled clients' example-weighted mean derived from the reference's clients."""
    fx = _Fixture.load(fixture)
    participation, epochs = testutil.reference_schedule(fx)
    run = _Run('fednova', fx, _feddecorr(), epochs=epochs)
    expected = _stats(fx, 'global0/stats')  # the project's statistics, from the same start
    worst = []
    for r, sampled in enumerate(participation, 1):
      run.round(sampled)
      got = run.torch_state()
      worst.append(self.assert_state(got, fx, f'global{r}', trainable_only=True))
      p = _weights(fx, sampled)
      steps = [int(fx[f'round{r}/client{i}/steps']) for i in sampled]
      a = np.array([float(fx[f'round{r}/client{i}/a']) for i in sampled])
      ours = client_update.effective_steps(tf.constant(steps), CONFIG.momentum, tf.float64)
      np.testing.assert_allclose(ours.numpy(), a, rtol=1e-14)
      # tau_eff = sum_i p_i a_i from the project's a_i, against the reference's.
      self.assertAlmostEqual(float(fx[f'round{r}/tau_eff']), p @ ours.numpy(), delta=1e-12)
      x_ref = _stats(fx, f'global{r - 1}/stats')
      clients = [_stats(fx, f'round{r}/client{i}/stats') for i in sampled]
      # The project's rule on the same clients: each client's statistic is 0.9^k times its start
      # plus what its batches added, which the start does not change (train-mode forwards use
      # batch statistics), so from the project's start it is y_i + 0.9^k_i (ours - reference's).
      expected = {key: sum(pi * (c[key] + BN_MOMENTUM**k * (expected[key] - x_ref[key]))
                           for pi, c, k in zip(p, clients, steps)) for key in x_ref}
      for key, v in expected.items():
        kind = key.split('.')[-1]
        d = testutil.relative_difference(got[key], v)
        self.assertLess(d, VAR_TOL if kind == 'running_var' else TOL, f'round {r}: {key}')
        worst[-1][kind] = max(worst[-1][kind], d)
      expected = {k: (got[k] if k.endswith('running_var') else v) for k, v in expected.items()}
    _log_worst(fixture, worst)


class ReferenceTest(_ReferenceBase):

  def test_fedprox_round_equals_reference_with_proximal_term_repaired(self):
    run = self.rounds('fedprox', 'fedprox_fixed', mu=1.0)
    # The term acts: the project's round is far from the unrepaired reference's, which is FedAvg's
    # (docs/reference.md §5): FedAvg in FedProx's place fails here.
    self.assertGreater(self.distance(run.torch_state(), _Fixture.load('fedprox_asis'), 'global1'),
                       1e3 * TOL)

  @parameterized.named_parameters(('paper_temperature', 'moon_t0.5', 0.5),
                                  ('reference_as_is', 'moon_asis', 1.0))
  def test_moon_two_rounds(self, run_name, temperature):
    """T = 0.5 against the reference with the temperature applied as the paper (exp(sim / T));
    T = 1 against the unmodified reference (its missing temperature is then T = 1). Round 1's
    previous model is the initial global one, so round 2 is where the contrastive term acts."""

    def temperature_acts(r, run):
      if temperature != 1.0:  # The temperature acts, in round 2 only (round 1's previous model
        # is the global one: z_prev = z_global, the contrastive gradient is 0 at any T): the
        # project's round against the reference's at T = 1.
        moved = self.distance(run.torch_state(), _Fixture.load('moon_asis'), f'global{r}')
        if r == 1:
          self.assertLess(moved, TOL)
        else:
          self.assertGreater(moved, 1e3 * TOL)

    self.moon_rounds(run_name, temperature, temperature_acts)

  def test_fednova_three_rounds_with_bn_statistics(self):
    self.fednova_rounds('fednova')


class PartialParticipationTest(_ReferenceBase):
  """FedAvg, FedProx, MOON and FedNova with partial participation: 3 of 5 label-skewed clients
  sampled in each of 3 rounds (a different 3 each round), 2 local epochs, from the reference's
  weights; fixtures <run>_partial (bench/reference/reference_fixtures_algorithms.py,
  PARTIAL_RUNS; FedDecorr 0.1 as in their full-participation runs). A client's example weight is
  its dataset size, over the sampled clients only. SCAFFOLD's is PaperTest's (3 of 4 clients)."""

  def test_fedavg_three_rounds(self):
    """FedAvg + FedDecorr 0.1 against the reference's FedAvg class (fixture fedavg_partial); its
    full-participation round is tests/reference_equivalence_test.py's."""
    self.rounds('fedavg', 'fedavg_partial')

  def test_fedprox_three_rounds(self):
    """Against the reference with its proximal term repaired (fixture fedprox_fixed_partial)."""
    self.rounds('fedprox', 'fedprox_fixed_partial', mu=1.0)

  def test_moon_three_rounds(self):
    """T = 0.5 against the reference with the temperature applied (fixture moon_t0.5_partial).
    Clients 3 and 4 first train in round 2, from the initial global model as their previous
    model; client 0's previous model in round 3 is its own of round 1."""
    self.moon_rounds('moon_t0.5_partial', 0.5)

  def test_fednova_three_rounds(self):
    """Against the reference with its party index repaired (fixture fednova_fixed_partial: its
    tau_eff took p_i by party id from a list over the round's parties). Round 2's clients take
    the same number of steps (a_i equal), rounds 1 and 3's do not."""
    self.fednova_rounds('fednova_fixed_partial')


# SCAFFOLD and FedBN: a tiny model, x -> Dense(5) -> BatchNorm -> ReLU (representation) -> Dense(3),
# trained in float64 by the project and by NumPy below.
D_IN, HIDDEN, CLASSES, EPS = 6, 5, 3, 1e-5
TRAINABLE = ('dense/kernel', 'dense/bias', 'bn/gamma', 'bn/beta', 'head/kernel', 'head/bias')
BN = ('bn/gamma', 'bn/beta', 'bn/moving_mean', 'bn/moving_variance')


def _dense_bn_model():
  with testutil.Float64Scope():
    init = lambda i: tf.keras.initializers.GlorotUniform(seed=i)
    inputs = tf.keras.Input((D_IN,))
    h = tf.keras.layers.Dense(HIDDEN, kernel_initializer=init(1), bias_initializer='zeros',
                              name='dense')(inputs)
    h = tf.keras.layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=EPS, name='bn')(h)
    rep = tf.keras.layers.ReLU()(h)
    logits = tf.keras.layers.Dense(CLASSES, kernel_initializer=init(2), name='head')(rep)
    return tf.keras.Model(inputs, {'representation': rep, 'logits': logits})


def _names(model):
  return [v.name.split(':')[0] for v in model.weights]


def _as_dict(model, weights):
  return dict(zip(_names(model), [np.asarray(w, np.float64) for w in weights]))


def _clients(sizes, seed):
  """Per-client (x, y), each client's features shifted and scaled differently."""
  rng = np.random.RandomState(seed)
  return [(rng.normal(0.4 * i, 1.0 + 0.5 * i, (n, D_IN)),
           rng.randint(0, CLASSES, n).astype(np.int32)) for i, n in enumerate(sizes)]


def _np_gradients(w, x, y):
  """Mean cross-entropy's gradients for the model above in training mode (batch statistics,
  biased batch variance as BatchNorm normalises), and the batch mean and variance."""
  a = x @ w['dense/kernel'] + w['dense/bias']
  mean, var = a.mean(0), a.var(0)
  inv = 1.0 / np.sqrt(var + EPS)
  xhat = (a - mean) * inv
  h = w['bn/gamma'] * xhat + w['bn/beta']
  r = np.maximum(h, 0.0)
  logits = r @ w['head/kernel'] + w['head/bias']
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  n = len(y)
  dlogits = (p - np.eye(CLASSES)[y]) / n
  dh = (dlogits @ w['head/kernel'].T) * (h > 0)
  dxhat = dh * w['bn/gamma']
  da = inv / n * (n * dxhat - dxhat.sum(0) - xhat * (dxhat * xhat).sum(0))
  grads = {'head/kernel': r.T @ dlogits, 'head/bias': dlogits.sum(0),
           'bn/gamma': (dh * xhat).sum(0), 'bn/beta': dh.sum(0),
           'dense/kernel': x.T @ da, 'dense/bias': da.sum(0)}
  return grads, mean, var


def _np_local_sgd(w, data, cfg, batch, correction=None):
  """One epoch of SGD over `data` in order: g (+ correction) + wd w, momentum, step; the BN moving
  statistics s <- s - (s - batch statistic) * 0.1 (batch mean, biased batch variance), as Keras'
  float64 kernel computes it: with its 0.1 = 1 - momentum made a float32 constant (0.1 + 1.5e-9)."""
  decay = float(np.float32(1.0 - BN_MOMENTUM))
  w = {k: v.copy() for k, v in w.items()}
  buf = {k: np.zeros_like(w[k]) for k in TRAINABLE}
  x, y = data
  steps = 0
  for s in range(0, len(y), batch):
    grads, mean, var = _np_gradients(w, x[s:s + batch], y[s:s + batch])
    w['bn/moving_mean'] = w['bn/moving_mean'] - (w['bn/moving_mean'] - mean) * decay
    w['bn/moving_variance'] = w['bn/moving_variance'] - (w['bn/moving_variance'] - var) * decay
    for k in TRAINABLE:
      g = grads[k] + (correction[k] if correction else 0.0) + cfg.weight_decay * w[k]
      buf[k] = cfg.momentum * buf[k] + g
      w[k] = w[k] - cfg.lr * buf[k]
    steps += 1
  return w, steps


class PaperTest(parameterized.TestCase):
  """SCAFFOLD and FedBN, which the reference lacks, against NumPy from the papers' pseudo-code."""

  def assert_close(self, got, want, what):
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=f'{what}: {k}')

  def _runtime(self, name, data, cfg, **hparams):
    alg = algorithms.build(name, _dense_bn_model, cfg, None, **hparams)
    with testutil.Float64Scope():
      runtime = tf_runtime.TfRuntime(alg, algo_testing.make_client_dataset_fn(data, batch_size=4))
      return alg, runtime, runtime.initialize()

  def test_numpy_gradients_are_the_models(self):
    """The hand-written gradients above against TensorFlow's (so the tests below compare
    algorithms, not differentiation)."""
    model = _dense_bn_model()
    x, y = _clients([7], seed=3)[0]
    with tf.GradientTape() as tape:
      logits = model(x, training=True)['logits']
      loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                            from_logits=True))
    tf_grads = dict(zip([v.name.split(':')[0] for v in model.trainable_weights],
                        tape.gradient(loss, model.trainable_weights)))
    grads, _, _ = _np_gradients(_as_dict(model, model.weights), x, y)
    self.assert_close({k: g.numpy() for k, g in tf_grads.items()}, grads, 'gradient')

  @parameterized.named_parameters(('paper_sgd', 0.0), ('momentum', 0.9))
  def test_scaffold_three_rounds_partial_participation(self, momentum):
    """Karimireddy et al. 2020, Algorithm 1, option II, N = 4 clients, 3 sampled per round:
      client i from y_i = x, each step y_i <- y_i - lr (g_i(y_i) + c - c_i);
      c_i+ = c_i - c + (x - y_i) / (K lr);  uploads (y_i - x, c_i+ - c_i);
      x <- x + eta_g mean_S (y_i - x);  c <- c + (1/N) sum_S (c_i+ - c_i).
    The whole state moves with y_i - x (BN moving statistics too; they have no control variate).
    With momentum rho (not in the paper) the project divides by a_K lr instead of K lr,
    a_K = (K - rho (1 - rho^K) / (1 - rho)) / (1 - rho) (docs/algorithms.md), written here from
    that formula; rho = 0 is the paper exactly."""
    cfg = client_update.SGDHParams(lr=0.1, momentum=momentum, weight_decay=1e-3)
    data = _clients((10, 6, 14, 8), seed=0)
    alg, runtime, server = self._runtime('scaffold', data, cfg, num_clients=4, server_lr=0.8)
    model = _dense_bn_model()
    x = _as_dict(model, server['weights'])
    c = {k: np.zeros_like(x[k]) for k in TRAINABLE}
    ci = [dict(c) for _ in data]
    states = [alg.initial_client_state(server['weights']) for _ in data]
    for sampled in ([0, 1, 2], [1, 2, 3], [0, 2, 3]):
      with testutil.Float64Scope():
        server, new_states, _ = runtime.run_round(server, [(str(i), 0) for i in sampled],
                                                  [states[i] for i in sampled])
      for i, st in zip(sampled, new_states):
        states[i] = st
      dy, dc = [], []
      for i in sampled:
        correction = {k: c[k] - ci[i][k] for k in TRAINABLE}
        y, k_steps = _np_local_sgd(x, data[i], cfg, 4, correction)
        a_k = k_steps if momentum == 0 else (
            (k_steps - momentum * (1 - momentum**k_steps) / (1 - momentum)) / (1 - momentum))
        new_ci = {k: ci[i][k] - c[k] + (x[k] - y[k]) / (a_k * cfg.lr) for k in TRAINABLE}
        dy.append({k: y[k] - x[k] for k in x})
        dc.append({k: new_ci[k] - ci[i][k] for k in TRAINABLE})
        ci[i] = new_ci
      x = {k: x[k] + 0.8 * np.mean([d[k] for d in dy], 0) for k in x}
      c = {k: c[k] + np.sum([d[k] for d in dc], 0) / 4 for k in TRAINABLE}
      self.assert_close(_as_dict(model, server['weights']), x, f'{sampled}: x')
      order = [v.name.split(':')[0] for v in model.trainable_weights]
      self.assert_close(dict(zip(order, server['control'])), c, f'{sampled}: c')
      for i in range(len(data)):
        self.assert_close(dict(zip(order, states[i]['control'])), ci[i], f'c_{i}')

  def test_fedbn_three_rounds(self):
    """Li et al. 2021, Algorithm 1: each client keeps its BatchNorm parameters and statistics
    (gamma, beta, moving mean and variance) and trains from the global other weights with them;
    the server averages only the non-BN weights. The clients hold equal numbers of examples, where
    the paper's mean over clients and the project's example-weighted mean (FedAvg's) coincide."""
    cfg = client_update.SGDHParams(lr=0.1, momentum=0.9, weight_decay=1e-3)
    data = _clients((12, 12, 12), seed=1)
    alg, runtime, server = self._runtime('fedbn', data, cfg)
    model = _dense_bn_model()
    x = _as_dict(model, server['weights'])
    start_bn = {k: x[k] for k in BN}
    local_bn = [dict(start_bn) for _ in data]
    states = [alg.initial_client_state(server['weights']) for _ in data]
    bn_index = [i for i, n in enumerate(_names(model)) if n in BN]
    for r in range(3):
      with testutil.Float64Scope():
        server, states, _ = runtime.run_round(server, [(str(i), 0) for i in range(3)], states)
      ys = []
      for i in range(3):
        y, _ = _np_local_sgd(dict(x, **local_bn[i]), data[i], cfg, 4)
        local_bn[i] = {k: y[k] for k in BN}
        ys.append(y)
      x = {k: (x[k] if k in BN else np.mean([y[k] for y in ys], 0)) for k in x}
      got = _as_dict(model, server['weights'])
      self.assert_close(got, x, f'round {r + 1}: server')
      self.assert_close({k: got[k] for k in BN}, start_bn, 'server BN never changes')
      for i in range(3):
        own = dict(zip([_names(model)[j] for j in bn_index], states[i]['bn']))
        self.assert_close(own, local_bn[i], f'round {r + 1}: client {i} BN')
        personal = _as_dict(model, alg.client_weights(server, states[i]))
        self.assert_close(personal, dict(x, **local_bn[i]), f'client {i} model')


if __name__ == '__main__':
  absltest.main()
