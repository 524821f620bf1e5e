"""bin/train's --aggregator: tff.aggregators factories inside the project's TFF runtime, checked
against the in-process TF runtime (the plain sum) and NumPy, and end to end through the training
program (metrics, DP epsilon, resume)."""

import csv
import functools
import json
import os
import shutil
import sys
import tempfile
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr.tasks import registry as task_registry
from tests import testutil
from tff_decorr import aggregators
from tff_decorr import algorithms
from tff_decorr.configs import config
from tff_decorr import regularizers
from tff_decorr.worker import tff_context
from tff_decorr.program import training
from tff_decorr.run_files import metrics_log
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import tf_runtime
from tff_decorr.runtimes import tff_runtime

SIZES = (10, 6, 14, 8)
DATA = testing.synthetic_clients(sizes=SIZES)
FN = testing.make_client_dataset_fn(DATA, batch_size=4, epochs=2)
MODEL = functools.partial(testing.tiny_model, representation_dim=8)
CFG = algorithms.SGDHParams(lr=0.02, momentum=0.9, weight_decay=1e-3)
ROUNDS = [['0', '1', '3'], ['2', '0', '1']]  # partial participation; client 0 twice (its state)


def setUpModule():
  tff_context.install()


def tearDownModule():
  tff_context.stop_all()


def _run(runtime, alg, rounds=ROUNDS):
  """Runs `rounds` (lists of client ids); returns (server state, client states, metrics)."""
  states = {c: alg.initial_client_state(alg.initial_weights()) for c in '0123'}
  server = runtime.initialize()
  metrics = []
  for r, clients in enumerate(rounds):
    server, new, m = runtime.run_round(server, [(c, 100 + r) for c in clients],
                                       [states[c] for c in clients])
    states.update(zip(clients, new))
    metrics.append(m)
  return server, states, metrics


class RuntimeAggregatorTest(tf.test.TestCase):

  def test_weighted_mean_factory_equals_the_plain_sum(self):
    # FedAvg (model upload), FedBN (non-BN part; BN stays CLIENTS-placed), SCAFFOLD (deltas with
    # control variates). Clients send deltas and the server adds the reference back: float32
    # round-off through two rounds of two local epochs, hence 1e-5.
    for name in ('fedavg', 'fedbn', 'scaffold'):
      with self.subTest(name):
        alg = algorithms.build(name, MODEL, CFG, regularizers.get('feddecorr'), num_clients=4)
        got, got_states, metrics = _run(
            tff_runtime.TffRuntime(alg, FN, aggregator=tff.aggregators.MeanFactory()), alg)
        want, want_states, plain = _run(tf_runtime.TfRuntime(alg, FN), alg)
        self.assertIn('aggregator', got)
        for g, w in zip(alg.global_weights(got), alg.global_weights(want)):
          self.assertAllClose(g, w, atol=1e-5, rtol=1e-5)
        for key in ('control',) if name == 'scaffold' else ():
          for g, w in zip(got[key], want[key]):
            self.assertAllClose(g, w, atol=1e-5, rtol=1e-5)
        for c in '0123':
          tf.nest.map_structure(lambda g, w: self.assertAllClose(g, w, atol=1e-5, rtol=1e-5),
                                got_states[c], want_states[c])
        self.assertAllClose(metrics[-1]['loss_sum'], plain[-1]['loss_sum'], rtol=1e-5)
        # The plain float32 upload, and the wire format: the update plus the weight (float32).
        self.assertEqual(metrics[-1]['bytes_up_float32'], plain[-1]['bytes_up'])
        self.assertEqual(metrics[-1]['bytes_up'], plain[-1]['bytes_up'] + 3 * 4)

  def test_server_metrics_under_a_factory_equal_the_plain_sums(self):
    # The server step's scalars (server/...) come from the aggregate the factory returns, turned
    # back into the summed contribution: under the weighted mean they are the plain sum's.
    for name in ('fedadam', 'fedexp'):
      with self.subTest(name):
        alg = algorithms.build(name, MODEL, CFG, regularizers.get('feddecorr'))
        _, _, metrics = _run(
            tff_runtime.TffRuntime(alg, FN, aggregator=tff.aggregators.MeanFactory()), alg)
        _, _, plain = _run(tf_runtime.TfRuntime(alg, FN), alg)
        keys = sorted(k for k in plain[-1] if k.startswith('server/'))
        self.assertIn('server/update_norm', keys)
        for got, want in zip(metrics, plain):
          self.assertEqual(sorted(k for k in got if k.startswith('server/')), keys)
          for k in keys:
            self.assertAllClose(got[k], want[k], rtol=1e-4, msg=k)

  def test_scaffold_control_variate_stays_the_clients_mean_under_clipping(self):
    # Clipping must not reach SCAFFOLD's control variates. A clip of 1e-3 bounds every model delta
    # hard; the control-variate deltas are summed exactly (Scaffold.exact_keys), so the server's c
    # stays what SCAFFOLD defines: with c and every c_i starting at 0, c = (1/N) sum over ALL N
    # clients of c_i.
    clip = 1e-3
    alg = algorithms.build('scaffold', MODEL, CFG, regularizers.get('none'), num_clients=4)
    factory = tff.aggregators.clipping_factory(clip, tff.aggregators.MeanFactory())
    server, states, _ = _run(tff_runtime.TffRuntime(alg, FN, aggregator=factory), alg)
    expected_c = [np.mean(cs, axis=0) for cs in zip(*[states[c]['control'] for c in '0123'])]
    for got, want in zip(server['control'], expected_c):
      self.assertAllClose(got, want, atol=1e-6, rtol=1e-5)
    self.assertGreater(max(np.abs(c).max() for c in expected_c), 1e-2)  # c_i moved
    # The model delta was clipped: two rounds move x by at most 2 x clip (server_lr 1).
    x0 = alg.initial_weights()
    moved = np.sqrt(sum(np.sum((g - w) ** 2) for g, w in zip(alg.global_weights(server), x0)))
    self.assertLessEqual(moved, 2 * clip * (1 + 1e-4))

  def test_dp_without_noise_is_the_unweighted_mean_of_the_clients_models(self):
    alg = algorithms.build('fedavg', MODEL, CFG, regularizers.get('none'))
    factory = aggregators.dp_aggregator(0.0, clients_per_round=3, num_clients=4, clip=1e6)
    got, _, metrics = _run(tff_runtime.TffRuntime(alg, FN, aggregator=factory), alg,
                           rounds=[['0', '1', '2']])
    # Independent: each client's model after a round alone (one-client FedAvg returns y_i), then
    # NumPy's plain mean; the example-weighted mean differs.
    plain = tf_runtime.TfRuntime(alg, FN)
    ys = [plain.run_round(plain.initialize(), [(c, 100)], [alg.initial_client_state(None)])[0]
          ['weights'] for c in '012']
    for g, e in zip(alg.global_weights(got), [np.mean(ws, axis=0) for ws in zip(*ys)]):
      self.assertAllClose(g, e, atol=1e-5, rtol=1e-5)
    weighted = [sum(n * y for n, y in zip(SIZES, ws)) / sum(SIZES[:3]) for ws in zip(*ys)]
    self.assertGreater(max(np.abs(g - w).max()
                           for g, w in zip(alg.global_weights(got), weighted)), 1e-3)
    self.assertEqual(metrics[0]['aggregator/dp_epsilon'], np.inf)  # no noise, no privacy

  def test_compression_sends_fewer_bytes_and_still_averages(self):
    alg = algorithms.build('fedavg', MODEL, CFG, regularizers.get('none'))
    factory = aggregators.build('compression', aggregators.CompressionHParams(
        threshold=10, zeroing=False, clipping=False), aggregators.RunShape(4, 4, 1))
    got, _, metrics = _run(tff_runtime.TffRuntime(alg, FN, aggregator=factory), alg,
                           rounds=[['0', '1', '2', '3']])
    params = sum(np.asarray(w).size for w in alg.initial_weights())
    m = metrics[0]
    self.assertEqual(m['bytes_up_float32'], 4 * 4 * params)
    self.assertLess(m['bytes_up'], 0.6 * m['bytes_up_float32'])
    want, _, _ = _run(tf_runtime.TfRuntime(alg, FN), alg, rounds=[['0', '1', '2', '3']])
    # 8-bit uniform quantisation of each delta tensor over its [min, max]: the mean moves by at
    # most one quantisation step of the widest tensor.
    step = max(float(np.ptp(np.asarray(w) - np.asarray(x))) for w, x in
               zip(alg.global_weights(want), alg.initial_weights())) / 255
    for g, w in zip(alg.global_weights(got), alg.global_weights(want)):
      self.assertAllClose(g, w, atol=2 * step + 1e-6)

  def test_secure_aggregation_runs_in_the_simulation(self):
    # TFF's C++ runtime has no secure-sum protocol; the project's context simulates it as TFF's
    # test context does. Without clipping/zeroing the secure sum is the weighted mean up to its
    # integer quantisation (bounds +-50 at first, 2^20-level weights).
    alg = algorithms.build('fedavg', MODEL, CFG, regularizers.get('none'))
    factory = tff.learning.secure_aggregator(zeroing=False, clipping=False)
    got, _, metrics = _run(tff_runtime.TffRuntime(alg, FN, aggregator=factory), alg,
                           rounds=[['0', '1', '2']])
    want, _, _ = _run(tf_runtime.TfRuntime(alg, FN), alg, rounds=[['0', '1', '2']])
    for g, w in zip(alg.global_weights(got), alg.global_weights(want)):
      self.assertAllClose(g, w, atol=1e-3)
    self.assertIn('aggregator/mean_value/secure_upper_threshold', metrics[0])

  def test_an_incompatible_factory_names_the_flag(self):
    alg = algorithms.build('fednova', MODEL, CFG, regularizers.get('none'))
    with self.assertRaisesRegex(ValueError, r"--aggregator \(.*DifferentiallyPrivateFactory.*\) "
                                'cannot be combined with --algorithm=fednova'):
      tff_runtime.TffRuntime(alg, FN, aggregator=aggregators.dp_aggregator(
          0.5, 3, 4, clip=1.0))
    decomposed = algorithms.build('fedavg_decomposed', testing.tiny_decomposed_model, CFG,
                                  regularizers.get('none'))
    with self.assertRaisesRegex(ValueError, 'has no upload that tff.aggregators can aggregate'):
      tff_runtime.TffRuntime(decomposed, FN, aggregator=tff.aggregators.MeanFactory())


class TrainWithAggregatorTest(tf.test.TestCase):
  """The training program with --aggregator=dp: epsilon per round, resumed, in the summary."""

  def setUp(self):
    super().setUp()
    # Each test's privacy ledgers in a folder of its own (they are kept by the data, in the
    # user's data folder: the tests share the digits data).
    testutil.isolated_data_home(self.create_tempdir().full_path, self.addCleanup)

  def test_dp_reports_epsilon_its_assumptions_and_every_release_on_the_data(self):
    out = tempfile.mkdtemp()
    settings = dict(task='digits', num_clients=4, clients_per_round=2, local_epochs=1,
                    batch_size=64, regularizer='feddecorr', aggregator='dp',
                    dp_noise_multiplier=0.8, dp_clip=1.0, cache_dir=os.path.join(out, 'cache'))
    run = os.path.join(out, 'run')

    def train(rounds, **kwargs):
      c = config.make(rounds=rounds, **settings)
      c.output_dir = run
      lines = []
      summary = training.train(c, log=lines.append, **kwargs)
      return summary, '\n'.join(lines)

    delta = 1 / 4 ** 1.1
    reference = lambda releases: testutil.dp_epsilon_reference([(0.8, 2, 4, releases)], delta)
    _, log = train(2)
    self.assertIn('Privacy: --aggregator=dp\'s epsilon assumes each round samples '
                  '--clients_per_round of --num_clients clients uniformly without replacement, '
                  'and the sample is secret', log)
    self.assertIn('it does not cover the seeded client sampling', log)
    self.assertNotIn('released on this data before', log)
    summary, log = train(3)  # resumes after round 2
    with open(os.path.join(run, 'metrics.csv')) as f:
      rows = list(csv.DictReader(f))
    got = [float(r['aggregator/dp_epsilon']) for r in rows]
    # Round by round and across the resume, against the accountant written in testutil from the
    # papers (equal to it at this large epsilon: privacy_test).
    self.assertAllClose(got, [reference(r) for r in (1, 2, 3)], rtol=1e-5)  # float32 metrics
    self.assertAllClose(summary['dp_epsilon'], reference(3), rtol=1e-9)
    self.assertAllClose(summary['dp_delta'], delta)
    self.assertEqual(summary['dp_releases_on_data'], 3)  # a resume releases nothing twice
    self.assertAllClose(summary['dp_epsilon_all_releases'], reference(3), rtol=1e-9)
    self.assertNotIn('dp_note', summary)
    self.assertIn('uniformly without replacement', ' '.join(summary['dp_assumes']))
    self.assertIn('evaluation on the test data', ' '.join(summary['dp_not_covered']))
    with open(os.path.join(run, 'summary.json')) as f:
      self.assertEqual(json.load(f)['dp_releases_on_data'], 3)
    self.assertTrue(all(float(r['bytes_up']) > 0 for r in rows))

    # Deleted checkpoints: the run starts again on the same clients, and the 3 earlier releases
    # are counted with its own 3 (the model's own epsilon stays that of its 3 rounds).
    shutil.rmtree(os.path.join(run, 'checkpoints'))
    summary, log = train(3)
    self.assertIn('Privacy: 3 DP rounds were released on this data before this start', log)
    self.assertEqual(summary['dp_releases_on_data'], 6)
    self.assertAllClose(summary['dp_epsilon'], reference(3), rtol=1e-9)
    self.assertAllClose(summary['dp_epsilon_all_releases'], reference(6), rtol=1e-9)
    self.assertIn('6 DP rounds were released on this data, 3 of them in this run',
                  summary['dp_note'])
    self.assertIn('Privacy: 6 DP rounds were released', log)

    # --overwrite with other noise: the old run is moved aside, its releases still count.
    settings['dp_noise_multiplier'] = 1.6
    summary, log = train(1, overwrite=True)
    self.assertIn('6 DP rounds were released on this data before', log)
    self.assertEqual(summary['dp_releases_on_data'], 7)
    self.assertAllClose(summary['dp_epsilon_all_releases'], testutil.dp_epsilon_reference(
        [(0.8, 2, 4, 6), (1.6, 2, 4, 1)], delta), rtol=1e-9)

  def test_a_dp_round_re_run_after_a_crash_counts_twice(self):
    # A crash after round 2's noised aggregate exists but before its checkpoint: the resumed run
    # computes round 2 again with fresh noise, so the data has had 3 releases, not 2.
    out = tempfile.mkdtemp()
    c = config.make(task='digits', num_clients=4, clients_per_round=2, local_epochs=1, rounds=2,
                    batch_size=64, regularizer='none', aggregator='dp', dp_noise_multiplier=0.8,
                    dp_clip=1.0, cache_dir=os.path.join(out, 'cache'))
    c.output_dir = os.path.join(out, 'run')
    release = metrics_log.Metrics.release

    def crash_in_round_2(metrics, values, round_num):
      if round_num == 2:
        raise RuntimeError('simulated crash')
      return release(metrics, values, round_num)

    with mock.patch.object(metrics_log.Metrics, 'release', crash_in_round_2):
      with self.assertRaisesRegex(RuntimeError, 'simulated crash'):
        training.train(c, log=lambda s: None)
    summary = training.train(c, log=lambda s: None)
    delta = 1 / 4 ** 1.1
    self.assertEqual(summary['dp_releases_on_data'], 3)
    self.assertAllClose(summary['dp_epsilon'],
                        testutil.dp_epsilon_reference([(0.8, 2, 4, 2)], delta), rtol=1e-9)
    self.assertAllClose(summary['dp_epsilon_all_releases'],
                        testutil.dp_epsilon_reference([(0.8, 2, 4, 3)], delta), rtol=1e-9)
    self.assertIn('3 DP rounds were released on this data, 2 of them in this run',
                  summary['dp_note'])

  def test_dp_with_its_defaults_builds_on_every_tasks_default_clients_per_round(self):
    for name in task_registry.names():
      with self.subTest(task=name):
        c = config.make(task=name, aggregator='dp', regularizer='none')
        factory = aggregators.build('dp', c.component_hparams('aggregator'), aggregators.RunShape(
            num_clients=c.num_clients, clients_per_round=c.clients_per_round, rounds=c.rounds))
        clipping = factory.clipping()
        # Noise 1.0 with at most 10 clients a round: TFF cannot estimate the clip.
        self.assertLessEqual(c.clients_per_round, 10)
        self.assertEqual((clipping['dp_clipping'], clipping['dp_clip']),
                         ('fixed', aggregators.FALLBACK_CLIP))
        self.assertIn(f'0.1 x --clients_per_round = {0.1 * c.clients_per_round:g}',
                      clipping['dp_clipping_note'])
        self.assertNotIn(aggregators.DP_NOT_COVERED_ADAPTIVE, factory.not_covered())
    # Where the noise allows it, --dp_clip=0 is adaptive; a given --dp_clip is fixed, no note.
    adaptive = aggregators.build('dp', aggregators.DpHParams(noise_multiplier=0.1),
                                 aggregators.RunShape(num_clients=4, clients_per_round=2, rounds=2))
    self.assertEqual(adaptive.clipping(), {'dp_clipping': 'adaptive'})
    self.assertIn(aggregators.DP_NOT_COVERED_ADAPTIVE, adaptive.not_covered())
    fixed = aggregators.build('dp', aggregators.DpHParams(clip=2.0),
                              aggregators.RunShape(num_clients=4, clients_per_round=2, rounds=2))
    self.assertEqual(fixed.clipping(), {'dp_clipping': 'fixed', 'dp_clip': 2.0})

  def test_dp_with_its_defaults_trains_and_says_which_clipping_ran(self):
    out = tempfile.mkdtemp()
    c = config.make(task='digits', aggregator='dp', regularizer='none', rounds=1, local_epochs=1,
                    batch_size=64, cache_dir=os.path.join(out, 'cache'))
    self.assertEqual((c.num_clients, c.clients_per_round), (10, 10))  # the task's defaults
    c.output_dir = os.path.join(out, 'run')
    lines = []
    summary = training.train(c, log=lines.append)
    log = '\n'.join(lines)
    self.assertIn('Privacy: fixed L2 clip 0.1 (--dp_clip=0 asks for adaptive clipping, which '
                  'needs a noise multiplier below 0.1 x --clients_per_round = 1', log)
    self.assertEqual(summary['dp_clipping'], 'fixed')
    self.assertEqual(summary['dp_clip'], 0.1)
    self.assertIn('a fixed L2 clip of 0.1', summary['dp_clipping_note'])
    self.assertTrue(np.isfinite(summary['dp_epsilon']))
    with open(os.path.join(c.output_dir, 'summary.json')) as f:
      self.assertEqual(json.load(f)['dp_clipping'], 'fixed')

  def test_dp_lists_raw_per_client_outputs_as_not_covered(self):
    # --save_local_models and --track_collapse write clients' un-noised local models and spectra:
    # listed in dp_not_covered and in the log, not refused (Experiment.dp_not_covered says why).
    out = tempfile.mkdtemp()
    c = config.make(task='digits', num_clients=4, clients_per_round=2, rounds=1, local_epochs=1,
                    batch_size=64, regularizer='none', aggregator='dp', dp_clip=1.0,
                    dp_noise_multiplier=0.8, track_collapse=True,
                    cache_dir=os.path.join(out, 'cache'))
    c.output_dir = os.path.join(out, 'run')
    lines = []
    summary = training.train(c, log=lines.append, save_local_models=['0', '1', '2', '3'],
                             save_local_rounds=[1])
    not_covered = ' '.join(summary['dp_not_covered'])
    self.assertIn('--save_local_models=0,1,2,3: those clients\' local models, exported '
                  'un-noised and unclipped under local_models/', not_covered)
    self.assertIn('--track_collapse: the representation spectrum of one sampled client\'s local '
                  'model', not_covered)
    (line,) = [l for l in lines if l.startswith('Privacy: it does not cover')]
    self.assertIn('--save_local_models=0,1,2,3', line)
    self.assertIn('--track_collapse', line)
    self.assertTrue(os.path.isdir(os.path.join(c.output_dir, 'local_models', 'round_1')))
    # Without them, neither is listed; nor is the adaptive clip's item under a fixed clip.
    c.output_dir = os.path.join(out, 'plain')
    c.track_collapse = False
    summary = training.train(c, log=lambda s: None)
    self.assertNotIn('local', ' '.join(summary['dp_not_covered']))
    self.assertNotIn(aggregators.DP_NOT_COVERED_ADAPTIVE, summary['dp_not_covered'])

  def test_secure_says_it_is_simulated_in_the_log_and_the_summary(self):
    out = tempfile.mkdtemp()
    c = config.make(task='digits', num_clients=4, clients_per_round=2, rounds=1, local_epochs=1,
                    aggregator='secure', regularizer='none', cache_dir=os.path.join(out, 'cache'))
    c.output_dir = os.path.join(out, 'run')
    lines = []
    summary = training.train(c, log=lines.append)
    self.assertIn('Note: --aggregator=secure is simulated: ', '\n'.join(lines))
    self.assertIn('no cryptography', summary['aggregator_note'])
    with open(os.path.join(c.output_dir, 'summary.json')) as f:
      self.assertEqual(json.load(f)['aggregator_note'], summary['aggregator_note'])

  def test_dp_delta_of_one_over_n_or_more_is_refused_naming_the_flag(self):
    c = config.make(task='digits', num_clients=4, clients_per_round=2, aggregator='dp',
                    dp_noise_multiplier=0.5, dp_clip=1.0, dp_target_delta=0.25,
                    regularizer='none')
    c.output_dir = os.path.join(tempfile.mkdtemp(), 'run')
    with self.assertRaisesRegex(ValueError, r'^--dp_target_delta=0.25: must be in \(0, '
                                r'1/--num_clients = 0.25\)'):
      training.train(c, log=lambda s: None)
    self.assertFalse(os.path.exists(c.output_dir))


if __name__ == '__main__':
  absltest.main()
