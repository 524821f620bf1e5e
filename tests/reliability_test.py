"""Reliability of the run loop and the run directory, in-process (docs/reliability.md).

The round loop (tff_decorr.program.round_loop) is driven by a stub runtime whose rounds are cheap
and scriptable (a NaN in round k, a Ctrl-C in round k), with the real checkpoint manager,
client-state store and run-directory code. End-to-end cases through bin/train are in
reliability_cli_test.py.
"""

import asyncio
import contextlib
import csv
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr.tasks import client_data
from tff_decorr.run_files import checkpoint_files
from tff_decorr.configs import cli
from tff_decorr.configs import config as config_lib
from tff_decorr.run_files import client_state
from tff_decorr.program import round_loop
from tff_decorr.run_files import metrics_log
from tff_decorr.run_files import run_dir
from tff_decorr.run_files import run_directory
from tests import testutil


class StubAlgorithm:
  personalized = False

  def global_weights(self, server_state):
    return list(server_state['weights'])

  def initial_client_state(self, weights):
    del weights
    return {'visits': np.int32(0)}


class StubRuntime:
  """Round r adds 1 to the weights and to each sampled client's visit count; accuracies are
  fractions with long binary expansions (k/90) so float32 storage would change them."""

  def __init__(self, nan_in_round=None, inf_weights_in_round=None, interrupt_in_round=None):
    self.nan_in_round = nan_in_round
    self.inf_weights_in_round = inf_weights_in_round
    self.interrupt_in_round = interrupt_in_round
    self.rounds_run = []

  def initialize(self):
    return {'weights': [np.zeros(3, np.float32)]}

  def run_round(self, server_state, client_inputs, client_states):
    r = int(server_state['weights'][0][0]) + 1
    self.rounds_run.append(r)
    if r == self.interrupt_in_round:
      raise KeyboardInterrupt
    w = server_state['weights'][0] + 1
    if r == self.inf_weights_in_round:
      w = w * np.inf
    loss = np.nan if r == self.nan_in_round else 1.0
    states = [{'visits': np.int32(s['visits'] + 1)} for s in client_states]
    return {'weights': [w]}, states, {'loss_sum': loss * 10, 'examples': 10.0}


class LoopConfigTest(absltest.TestCase):

  def test_the_loops_settings_are_the_configs(self):
    c = config_lib.make(task='digits', num_clients=6, clients_per_round=3, seed=7, eval_every=2,
                        export_every=4, rounds=9)
    loop = round_loop.LoopConfig.from_config(c)
    self.assertEqual((loop.num_clients, loop.clients_per_round, loop.seed, loop.eval_every,
                      loop.export_every, loop.overlap_evaluation), (6, 3, 7, 2, 4, True))
    # Each round's clients: 3 distinct of the 6, each with the seed its id and round give.
    inputs = loop.client_inputs(5)
    ids = [int(cid) for cid, _ in inputs]
    self.assertEqual((len(set(ids)), ids), (3, sorted(ids)))
    self.assertTrue(all(0 <= i < 6 for i in ids))
    self.assertEqual([s for _, s in inputs], [round_loop.client_seed(7, 5, i) for i in ids])
    self.assertNotEqual(inputs, loop.client_inputs(6))


class ProgramTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()

  def run_program(self, runtime, rounds, check_clients=None, clients_per_round=2, log=None,
                  evaluate=None, before_round=None):
    directory = run_directory.RunDirectory(self.dir, rounds, log=log or (lambda s: None))
    store = directory.open_client_states(True, lambda: {'visits': np.int32(0)})
    loop = round_loop.LoopConfig(num_clients=4, clients_per_round=clients_per_round, seed=0)
    evaluate = evaluate or (lambda state, r: {'test_accuracy': (22 + r) / 90})
    exported = []
    hooks = round_loop.RoundHooks(evaluate=evaluate,
                                  export=lambda w, d, meta: exported.append(d),
                                  check_clients=check_clients, before_round=before_round)
    summary = round_loop.train_rounds(runtime, StubAlgorithm(), loop, directory, hooks)
    return summary, store

  def metrics_rows(self):
    with open(os.path.join(self.dir, 'metrics.csv'), newline='') as f:
      return list(csv.DictReader(f))

  def test_removing_a_damaged_newest_checkpoint_resumes_from_the_previous_one(self):
    # Partial participation: round 3's clients leave newer versions than round 2's manifest names.
    self.run_program(StubRuntime(), rounds=3)
    ckpt = os.path.join(self.dir, 'checkpoints')
    self.assertEqual(sorted(os.listdir(ckpt)),
                     ['client_states_2.json', 'client_states_3.json', 'round_2', 'round_3'])
    for name in os.listdir(os.path.join(ckpt, 'round_3')):
      path = os.path.join(ckpt, 'round_3', name)
      if os.path.isfile(path):
        with open(path, 'wb') as f:
          f.write(b'garbage')
    with self.assertRaises(run_directory.CheckpointError) as cm:
      self.run_program(StubRuntime(), rounds=3)
    advice = str(cm.exception)
    self.assertIn(f'remove {ckpt}/round_3', advice)
    self.assertIn('resume from round 2', advice)
    shutil.rmtree(os.path.join(ckpt, 'round_3'))  # Exactly what the message says.
    runtime = StubRuntime()
    summary, store = self.run_program(runtime, rounds=3)
    self.assertEqual(runtime.rounds_run, [3])
    self.assertEqual(summary['final_round'], 3)
    # Client states are those of an uninterrupted run.
    ref_dir, self.dir = self.dir, tempfile.mkdtemp()
    _, ref_store = self.run_program(StubRuntime(), rounds=3)
    for c in '0123':
      self.assertEqual(int(store.load(c)['visits']), int(ref_store.load(c)['visits']), c)
    del ref_dir

  def test_non_finite_loss_stops_and_keeps_the_last_finite_checkpoint(self):
    with self.assertRaisesRegex(round_loop.NonFiniteError, 'round 3: the training loss'):
      self.run_program(StubRuntime(nan_in_round=3), rounds=5)
    saved = run_directory.load_checkpoint(self.dir, StubRuntime().initialize())
    self.assertEqual(int(saved['round']), 2)
    np.testing.assert_array_equal(saved['server_state']['weights'][0], [2, 2, 2])

  def test_non_finite_weights_stop(self):
    with self.assertRaisesRegex(round_loop.NonFiniteError, 'round 2: the global model weights'):
      self.run_program(StubRuntime(inf_weights_in_round=2), rounds=3)
    self.assertEqual(
        int(run_directory.load_checkpoint(self.dir, StubRuntime().initialize())['round']), 1)

  def test_ctrl_c_reports_the_last_completed_round(self):
    with self.assertRaises(round_loop.Interrupted) as cm:
      self.run_program(StubRuntime(interrupt_in_round=3), rounds=5)
    self.assertEqual(cm.exception.completed_round, 2)
    runtime = StubRuntime()
    self.run_program(runtime, rounds=5)
    self.assertEqual(runtime.rounds_run, [3, 4, 5])

  def test_evaluation_overlaps_the_next_round_and_checkpoints_name_their_own_states(self):
    started = {}  # round -> Event set when the runtime starts that round
    event = lambda r: started.setdefault(r, threading.Event())

    class Runtime(StubRuntime):

      def run_round(self, server_state, client_inputs, client_states):
        event(int(server_state['weights'][0][0]) + 1).set()
        return super().run_round(server_state, client_inputs, client_states)

    overlapped = {}

    def evaluate(state, r):
      del state
      # In the evaluation thread, round r's evaluation finishes only once round r+1 has started.
      in_thread = threading.current_thread() is not threading.main_thread()
      overlapped[r] = in_thread and event(r + 1).wait(timeout=60)
      return {'test_accuracy': (22 + r) / 90}

    summary, _ = self.run_program(Runtime(), rounds=4, evaluate=evaluate)
    # Only the last round's evaluation, with no round after it, runs in the loop's thread.
    self.assertEqual(overlapped, {1: True, 2: True, 3: True, 4: False})
    self.assertEqual(summary['final_test_accuracy'], 26 / 90)
    ckpt = os.path.join(self.dir, 'checkpoints')
    # Round 3 was committed after round 4 trained: its manifest still names round 3's states.
    third = client_state.ClientStateStore.read_manifest(os.path.join(ckpt, 'client_states_3.json'))
    fourth = client_state.ClientStateStore.read_manifest(os.path.join(ckpt, 'client_states_4.json'))
    self.assertEqual(max(third.values()), 3)
    self.assertEqual(max(fourth.values()), 4)
    self.assertEqual([int(r['round']) for r in self.metrics_rows()], [1, 2, 3, 4])
    self.assertEqual([float(r['test_accuracy']) for r in self.metrics_rows()],
                     [23 / 90, 24 / 90, 25 / 90, 26 / 90])

  def test_a_before_round_hook_keeps_the_overlap_only_if_it_does_not_share_the_evaluator(self):
    for shares, expected in ((False, {1: True, 2: True, 3: False}), (True, {1: 0, 2: 0, 3: 0}),
                             (None, {1: 0, 2: 0, 3: 0})):
      self.dir = tempfile.mkdtemp()
      threads = {}

      def evaluate(state, r):
        del state
        threads[r] = threading.current_thread() is not threading.main_thread()
        return {'test_accuracy': (22 + r) / 90}

      def hook(round_num, server_state, client_inputs, client_states):
        del round_num, server_state, client_inputs, client_states
        return {}

      if shares is not None:
        hook.shares_evaluator = shares
      self.run_program(StubRuntime(), rounds=3, evaluate=evaluate, before_round=hook)
      # In the evaluation thread exactly when overlapped (the last round has no round after it).
      self.assertEqual(threads, {r: bool(v) for r, v in expected.items()}, shares)

  def test_resumed_summary_equals_the_uninterrupted_one_exactly(self):
    uninterrupted, _ = self.run_program(StubRuntime(), rounds=3)
    self.dir = tempfile.mkdtemp()
    self.run_program(StubRuntime(), rounds=1)
    resumed, _ = self.run_program(StubRuntime(), rounds=3)
    for key in ('final_test_accuracy', 'best_test_accuracy', 'final_round', 'best_round'):
      self.assertEqual(resumed[key], uninterrupted[key], key)
    self.assertEqual(resumed['final_test_accuracy'], 25 / 90)  # Not its float32 rounding.

  def test_fewer_rounds_than_completed_trains_and_writes_nothing(self):
    self.run_program(StubRuntime(), rounds=3)
    runtime = StubRuntime()
    summary, _ = self.run_program(runtime, rounds=2)
    self.assertIsNone(summary)
    self.assertEqual(runtime.rounds_run, [])

  def test_sampled_clients_are_checked_before_each_round(self):
    seen = []

    def check(ids):
      seen.append(list(ids))
      if len(seen) == 2:
        raise client_data.ShardError('client 1 missing')

    runtime = StubRuntime()
    with self.assertRaisesRegex(client_data.ShardError, 'client 1'):
      self.run_program(runtime, rounds=3, check_clients=check, clients_per_round=4)
    self.assertEqual(seen, [['0', '1', '2', '3']] * 2)
    self.assertEqual(runtime.rounds_run, [1])  # Round 2 never started.


  def test_a_cut_metrics_row_is_rebuilt_from_tensorboard(self):
    self.run_program(StubRuntime(), rounds=3)
    before = self.metrics_rows()
    path = os.path.join(self.dir, 'metrics.csv')
    with open(path) as f:
      text = f.read()
    with open(path, 'w') as f:  # Round 3's row cut mid-line (it is checkpointed).
      f.write(text[:text.rindex('\n', 0, len(text) - 1) + 12])
    logged = []
    self.run_program(StubRuntime(), rounds=4, log=logged.append)
    warnings = [l for l in logged if l.startswith('warning:')]
    self.assertLen(warnings, 1)
    self.assertIn(f'{path} has cut or unreadable rows for round(s) 3 of the 3 completed',
                  warnings[0])
    self.assertIn('rebuilt round(s) 3 from', warnings[0])
    after = self.metrics_rows()
    self.assertEqual([r['round'] for r in after], ['1', '2', '3', '4'])
    self.assertEqual(after[:2], before[:2])  # Whole rows are kept as written.
    self.assertEqual(set(after[2]), set(before[2]))
    for key, value in before[2].items():  # TensorBoard holds float32: equal at that precision.
      self.assertEqual(np.float32(after[2][key]), np.float32(value), key)
    self.assertTrue(all(v != '' for row in after for v in row.values()))

  def test_a_deleted_metrics_csv_is_rebuilt_or_its_lost_rounds_named(self):
    self.run_program(StubRuntime(), rounds=3)
    before = self.metrics_rows()
    os.remove(os.path.join(self.dir, 'metrics.csv'))
    logged = []
    self.run_program(StubRuntime(), rounds=4, log=logged.append)
    (warning,) = [l for l in logged if l.startswith('warning:')]
    self.assertIn('metrics.csv does not exist for round(s) 1-3 of the 3 completed', warning)
    self.assertIn('rebuilt round(s) 1-3', warning)
    after = self.metrics_rows()
    self.assertEqual([r['round'] for r in after], ['1', '2', '3', '4'])
    for old, new in zip(before, after):
      self.assertEqual({k: np.float32(v) for k, v in old.items()},
                       {k: np.float32(v) for k, v in new.items()})
    # With tensorboard/ gone too, nothing can rebuild them: the rounds lost are named.
    os.remove(os.path.join(self.dir, 'metrics.csv'))
    shutil.rmtree(os.path.join(self.dir, 'tensorboard'))
    logged = []
    runtime = StubRuntime()
    self.run_program(runtime, rounds=5, log=logged.append)
    (warning,) = [l for l in logged if l.startswith('warning:')]
    self.assertIn('the metrics of round(s) 1-4 are lost', warning)
    self.assertNotIn('rebuilt', warning)
    self.assertEqual(runtime.rounds_run, [5])  # The run itself resumed from its checkpoint.
    self.assertEqual([r['round'] for r in self.metrics_rows()], ['5'])

  def test_disk_full_while_checkpointing_keeps_the_previous_round(self):
    savez = np.savez

    def full_at_round_3(file, **arrays):
      if os.path.basename(os.path.dirname(getattr(file, 'name', ''))).startswith('round_3_temp'):
        file.write(b'PK')  # Some bytes got out before the disk filled up.
        raise OSError(errno.ENOSPC, 'No space left on device')
      return savez(file, **arrays)

    with mock.patch.object(checkpoint_files.np, 'savez', full_at_round_3):
      with self.assertRaises(run_directory.DiskFullError) as cm:
        self.run_program(StubRuntime(), rounds=4)
    self.assertEqual(str(cm.exception),
                     f'no space left on the device while writing {self.dir}/checkpoints/round_3; '
                     'the checkpoint of round 2 (the last completed round) is kept. Free some '
                     'space and re-run the same command to resume.')
    saved = run_directory.load_checkpoint(self.dir, StubRuntime().initialize())
    self.assertEqual(int(saved['round']), 2)
    np.testing.assert_array_equal(saved['server_state']['weights'][0], [2, 2, 2])
    self.assertEqual(sorted(n for n in os.listdir(os.path.join(self.dir, 'checkpoints'))
                            if n.startswith('round_')), ['round_1', 'round_2'])  # no temp left
    runtime = StubRuntime()
    summary, _ = self.run_program(runtime, rounds=4)
    self.assertEqual((runtime.rounds_run, summary['final_round']), ([3, 4], 4))

  def test_tensorflows_disk_full_is_one_line_naming_the_run_file_and_exit_3(self):
    release = metrics_log.Metrics.release
    tf_error = tf.errors.ResourceExhaustedError(
        None, None, '{{function_node __wrapped__SaveV2_dtypes_1_device_/job:localhost}} '
        f'{self.dir}/x/variables_temp/part-00000-of-00001; No space left on device [Op:SaveV2]')

    def full_at_round_2(metrics, values, round_num):
      if round_num == 2:
        raise tf_error
      return release(metrics, values, round_num)

    with mock.patch.object(metrics_log.Metrics, 'release', full_at_round_2):
      stderr = io.StringIO()
      with contextlib.redirect_stderr(stderr):
        code = cli.run_guarded('train', lambda: self.run_program(StubRuntime(), rounds=3))
    self.assertEqual(code, cli.EXIT_RUN_FAILED)
    errors = [l for l in stderr.getvalue().splitlines() if 'error' in l.lower()]
    self.assertEqual(errors, [f'train: error: no space left on the device while writing {self.dir}/'
                              'metrics.csv; the checkpoint of round 1 (the last completed round) '
                              'is kept. Free some space and re-run the same command to resume.'])
    self.assertEqual(
        int(run_directory.load_checkpoint(self.dir, StubRuntime().initialize())['round']), 1)
    # A GPU out of memory is also a ResourceExhaustedError, and is not a full disk.
    oom = tf.errors.ResourceExhaustedError(None, None, 'OOM when allocating tensor')
    self.assertFalse(run_directory.is_disk_full(oom))
    self.assertFalse(run_directory.is_disk_full(RuntimeError('wrapped')))
    try:
      try:
        raise tf_error
      except tf.errors.OpError as e:
        raise RuntimeError('an executor wrapped it') from e
    except RuntimeError as wrapped:
      self.assertTrue(run_directory.is_disk_full(wrapped))


class CheckpointFilesTest(absltest.TestCase):
  """checkpoint_files: one .npz a round, read back bit for bit, damage detected, old runs read."""

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    rng = np.random.default_rng(0)
    self.state = {'round': 3, 'best_accuracy': np.float64(1 / 3), 'best_round': 2,
                  'last_accuracy': np.float64(-1.0),
                  'server_state': {'weights': [rng.standard_normal((4, 3)).astype(np.float32),
                                               np.arange(5, dtype=np.int64)],
                                   'momentum': [np.float32(0.25) * np.ones(7, np.float32)]}}

  def assert_same(self, loaded, expected):
    flat_loaded, flat_expected = tf.nest.flatten(loaded), tf.nest.flatten(expected)
    self.assertLen(flat_loaded, len(flat_expected))
    for a, b in zip(flat_loaded, flat_expected):
      self.assertEqual(np.asarray(a).tobytes(), np.asarray(b).tobytes())

  def test_round_trip_is_exact_and_keeps_the_two_newest(self):
    manager = run_directory.checkpoint_manager(self.dir)
    for version in (1, 2, 3):
      asyncio.run(manager.save(self.state, version))
    ckpt = os.path.join(self.dir, 'checkpoints')
    self.assertEqual(sorted(os.listdir(ckpt)), ['round_2', 'round_3'])
    self.assertEqual(os.listdir(os.path.join(ckpt, 'round_3')), ['state.npz'])
    loaded = run_directory.load_checkpoint(self.dir, self.state['server_state'])
    self.assert_same(loaded, self.state)
    self.assertEqual(loaded['best_accuracy'].dtype, np.float64)
    self.assertEqual(loaded['server_state']['weights'][0].dtype, np.float32)
    self.assertEqual(run_directory.newest_checkpoint_round(self.dir), 3)
    with self.assertRaises(tff.program.ProgramStateExistsError):
      asyncio.run(manager.save(self.state, 3))

  def test_a_changed_byte_is_refused_not_loaded(self):
    asyncio.run(run_directory.checkpoint_manager(self.dir).save(self.state, 1))
    path = os.path.join(self.dir, 'checkpoints', 'round_1', 'state.npz')
    with open(path, 'rb') as f:
      data = bytearray(f.read())
    weights = self.state['server_state']['weights'][0].tobytes()
    at = data.index(weights) + 5  # inside the stored weights, not the zip's headers
    data[at] ^= 0x01
    with open(path, 'wb') as f:
      f.write(bytes(data))
    with self.assertRaisesRegex(run_directory.CheckpointError, 'round_1, cannot be read'):
      run_directory.newest_checkpoint_round(self.dir)
    with self.assertRaises(run_directory.CheckpointError):
      run_directory.load_checkpoint(self.dir, self.state['server_state'])

  def test_another_models_state_is_refused_with_the_reason(self):
    asyncio.run(run_directory.checkpoint_manager(self.dir).save(self.state, 1))
    other = dict(self.state, server_state={'weights': [np.zeros((4, 4), np.float32),
                                                       np.arange(5)],
                                           'momentum': [np.zeros(7, np.float32)]})
    with self.assertRaisesRegex(run_directory.CheckpointError, 'written by another model or task'):
      run_directory.load_checkpoint(self.dir, other['server_state'])

  def test_bytes_round_trip_exactly_and_values_that_need_pickle_are_refused(self):
    # An aggregator's state can hold bytes (--aggregator=dp's does): trailing zeros included.
    state = dict(self.state, server_state=dict(self.state['server_state'],
                                               aggregator=b'\x00dp\x00state\x00\x00'))
    asyncio.run(run_directory.checkpoint_manager(self.dir).save(state, 1))
    loaded = run_directory.load_checkpoint(self.dir, state['server_state'])
    self.assertEqual(loaded['server_state']['aggregator'], b'\x00dp\x00state\x00\x00')
    self.assert_same(loaded['server_state']['weights'], state['server_state']['weights'])
    bad = dict(self.state, best_round={'a': np.array([b'a', b'bc'], dtype=object)})
    with self.assertRaisesRegex(TypeError, 'value 1 .ndarray. is not bytes or an array of '
                                'numbers or text'):
      asyncio.run(run_directory.checkpoint_manager(self.dir).save(bad, 2))
    self.assertEqual(sorted(os.listdir(os.path.join(self.dir, 'checkpoints'))), ['round_1'])

  def test_a_run_checkpointed_as_saved_models_resumes_and_goes_on_in_the_new_format(self):
    # What tff_decorr wrote before checkpoint_files: TFF's own manager, one SavedModel a round.
    old = tff.program.FileProgramStateManager(os.path.join(self.dir, 'checkpoints'),
                                              prefix='round_', keep_total=2, keep_first=False)
    asyncio.run(old.save(self.state, 1))
    self.assertTrue(os.path.exists(os.path.join(self.dir, 'checkpoints', 'round_1',
                                                'saved_model.pb')))
    self.assertEqual(run_directory.newest_checkpoint_round(self.dir), 1)
    loaded = run_directory.load_checkpoint(self.dir, self.state['server_state'])
    for a, b in zip(tf.nest.flatten(loaded), tf.nest.flatten(self.state)):
      np.testing.assert_array_equal(a, b)
    manager = run_directory.checkpoint_manager(self.dir)
    asyncio.run(manager.save(self.state, 2))
    self.assert_same(run_directory.load_checkpoint(self.dir, self.state['server_state']),
                     self.state)
    asyncio.run(manager.save(self.state, 3))  # The old version is removed as any other.
    self.assertEqual(sorted(os.listdir(os.path.join(self.dir, 'checkpoints'))),
                     ['round_2', 'round_3'])


class ShardTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = os.path.join(tempfile.mkdtemp(), 'shards')
    rng = np.random.RandomState(0)
    self.images = rng.randint(0, 255, (30, 4, 4, 1)).astype(np.uint8)
    self.labels = rng.randint(0, 3, 30)
    self.parts = [np.arange(0, 12), np.arange(12, 30)]
    client_data.write_client_shards(self.images, self.labels, self.parts, self.dir,
                                    log=lambda s: None)

  def _records(self, cid):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    path = os.path.join(self.dir, f'{cid}.tfrecord')
    return list(tf.data.TFRecordDataset(path).as_numpy_iterator())

  def test_a_shard_truncated_at_a_record_boundary_is_detected_and_rewritten(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    records = self._records(1)
    with tf.io.TFRecordWriter(os.path.join(self.dir, '1.tfrecord')) as w:
      for r in records[:-3]:  # A valid file with 3 examples fewer.
        w.write(r)
    self.assertLen(self._records(1), 15)
    with self.assertRaisesRegex(client_data.ShardError, r'client\(s\) 1 .*re-run the same command'):
      client_data.check_shards(self.dir, ['0', '1'])
    logged = []
    client_data.write_client_shards(self.images, self.labels, self.parts, self.dir,
                                    log=logged.append)
    self.assertIn('rewriting', logged[0])
    self.assertLen(self._records(1), 18)
    client_data.check_shards(self.dir, ['0', '1'])

  def test_a_deleted_shard_is_reported(self):
    os.remove(os.path.join(self.dir, '0.tfrecord'))
    with self.assertRaisesRegex(client_data.ShardError, r'client\(s\) 0 '):
      client_data.check_shards(self.dir, ['0'])


class RunDirTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tempfile.mkdtemp()
    self.out = os.path.join(self.root, 'run')

  def tearDown(self):
    for d in list(run_dir._LOCKS):  # pylint: disable=protected-access
      run_dir.unlock(d)
    super().tearDown()

  def test_a_directory_locked_by_another_process_is_refused_naming_its_pid(self):
    os.makedirs(self.out)
    code = ('import sys, time; sys.path.insert(0, sys.argv[1]); '
            'from tff_decorr.run_files import run_dir; run_dir.lock(sys.argv[2]); '
            'print("locked", flush=True); time.sleep(60)')
    holder = subprocess.Popen([sys.executable, '-c', code, testutil.REPO_ROOT, self.out],
                              stdout=subprocess.PIPE, text=True)
    try:
      self.assertEqual(holder.stdout.readline().strip(), 'locked')
      with self.assertRaisesRegex(run_dir.RunDirError,
                                  f'in use by another run \\(PID {holder.pid}\\)'):
        run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    finally:
      holder.send_signal(signal.SIGKILL)
      holder.wait()
    # The kernel released the dead holder's lock: the directory is usable again.
    self.assertFalse(run_dir.prepare(self.out, {'a': 1}, log=lambda s: None))

  def test_overwrites_in_the_same_second_get_distinct_names_and_never_nest(self):
    run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    run_dir.write_config(self.out, {'a': 1})
    for value in (2, 3):
      run_dir.prepare(self.out, {'a': value}, overwrite=True, log=lambda s: None)
      run_dir.write_config(self.out, {'a': value})
    aside = sorted(n for n in os.listdir(self.root) if '.replaced-' in n)
    self.assertLen(aside, 2)
    configs = []
    for name in aside:  # Each holds exactly one run at its top level, nothing nested.
      self.assertEqual(sorted(os.listdir(os.path.join(self.root, name))), ['.lock', 'config.json'])
      with open(os.path.join(self.root, name, 'config.json')) as f:
        configs.append(json.load(f)['a'])
    self.assertCountEqual(configs, [1, 2])

  def test_overwrite_moves_aside_a_run_with_an_unreadable_config_json(self):
    run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    with open(run_dir.config_path(self.out), 'w') as f:
      f.write('{"a": ')  # cut mid-write
    run_dir.unlock(self.out)
    with self.assertRaisesRegex(run_dir.RunDirError, 'unreadable config.json.*pass --overwrite'):
      run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    run_dir.unlock(self.out)
    logged = []
    self.assertFalse(run_dir.prepare(self.out, {'a': 1}, overwrite=True, log=logged.append))
    self.assertIn('unreadable config.json', logged[0])
    (aside,) = [n for n in os.listdir(self.root) if '.replaced-' in n]
    with open(os.path.join(self.root, aside, 'config.json')) as f:
      self.assertEqual(f.read(), '{"a": ')  # moved, never deleted
    self.assertEqual(os.listdir(self.out), ['.lock'])

  def test_overwrite_with_the_same_configuration_resumes(self):
    run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    run_dir.write_config(self.out, {'a': 1})
    logged = []
    self.assertTrue(run_dir.prepare(self.out, {'a': 1}, overwrite=True, log=logged.append))
    # Nothing said yet: bin/train says 'resuming' once its checkpoint is read (the CLI test
    # test_overwrite_moves_aside_a_run_whose_every_checkpoint_is_unreadable checks the line).
    self.assertEqual(logged, [])
    self.assertEqual([n for n in os.listdir(self.root) if '.replaced-' in n], [])

  def test_a_failed_start_leaves_nothing_behind(self):
    self.assertFalse(run_dir.prepare(self.out, {'a': 1}, log=lambda s: None))
    run_dir.unlock(self.out, remove_if_unused=True)  # What bin/train does when a check fails.
    self.assertFalse(os.path.exists(self.out))
    # A directory the user made stays.
    os.makedirs(self.out)
    run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    run_dir.unlock(self.out, remove_if_unused=True)
    self.assertTrue(os.path.isdir(self.out))

  def test_leftovers_of_interrupted_writes_are_removed_at_start(self):
    run_dir.prepare(self.out, {'a': 1}, log=lambda s: None)
    run_dir.write_config(self.out, {'a': 1})
    run_dir.unlock(self.out)
    keep = [os.path.join(self.out, 'checkpoints', 'round_3'),
            os.path.join(self.out, 'export', 'saved_model')]
    leftovers = [os.path.join(self.out, 'checkpoints', 'round_4_temp1234'),
                 os.path.join(self.out, 'export', 'saved_model.tmp-4321'),
                 os.path.join(self.out, 'export', 'clients', '0', 'saved_model.tmp-99')]
    for d in keep + leftovers:
      os.makedirs(d)
    files = [os.path.join(self.out, n) for n in ('summary.json.tmp-77', 'metrics.csv.tmp-78',
                                                  'metrics.csv_temp1234')]
    for path in files:
      with open(path, 'w') as f:
        f.write('{')
    self.assertTrue(run_dir.prepare(self.out, {'a': 1}, log=lambda s: None))
    for d in leftovers + files:
      self.assertFalse(os.path.exists(d), d)
    for d in keep:
      self.assertTrue(os.path.isdir(d), d)


if __name__ == '__main__':
  absltest.main()
