"""Reliability through the binaries (subprocesses, embedded digits task): recovery as the messages
say, one run per directory, one line and a documented exit code for every failure a user meets
(docs/reliability.md). Faster in-process cases are in reliability_test.py."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import testutil

_TINY = ['--task=digits', '--num_clients=4', '--local_epochs=1', '--batch_size=64',
         '--regularizer=none', '--runtime=tf', '--seed=5']


def _final_logits(run_dir):
  loaded = tf.saved_model.load(os.path.join(run_dir, 'export', 'saved_model'))
  x = tf.constant(np.random.RandomState(0).normal(size=(16, 8, 8, 1)), tf.float32)
  return loaded.signatures['serving_default'](images=x)['logits'].numpy()


def _summary(run_dir):
  with open(os.path.join(run_dir, 'summary.json')) as f:
    return json.load(f)


def _tree(path):
  """{relative path: bytes} of every file under `path` but the lock (each start writes its PID)."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      if name != '.lock':
        with open(os.path.join(root, name), 'rb') as f:
          out[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return out


@contextlib.contextmanager
def _tmpfs(test, size):
  """A small tmpfs (a real full or read-only disk); skips when this machine cannot mount."""
  path = tempfile.mkdtemp()
  proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', path],
                        capture_output=True, text=True)
  if proc.returncode != 0:
    test.skipTest(f'cannot mount a tmpfs here ({proc.stderr.strip()}); needs root.')
  try:
    yield path
  finally:
    subprocess.run(['umount', '-l', path], check=False)


class ReliabilityCliTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.cache = os.path.join(cls.tmp, 'cache')
    # Uninterrupted SCAFFOLD, 2 of 4 clients a round: client states (c_i) decide the result.
    cls.scaffold = ['--algorithm=scaffold', '--clients_per_round=2', '--rounds=3']
    cls.ref = os.path.join(cls.tmp, 'ref')
    cls.train(cls.scaffold + [f'--output_dir={cls.ref}'])

  @classmethod
  def train(cls, args, check=True, module='bin.train'):
    full = (_TINY + [f'--cache_dir={cls.cache}'] if module == 'bin.train' else []) + list(args)
    proc = testutil.run_module(module, *full)
    if check and proc.returncode != 0:
      raise AssertionError(f'{module} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n'
                           f'{proc.stderr[-3000:]}')
    return proc

  def assert_one_line(self, proc, code, *needles):
    self.assertEqual(proc.returncode, code, proc.stderr[-2000:])
    self.assertNotIn('Traceback', proc.stderr)
    errors = [l for l in proc.stderr.splitlines() if ': error: ' in l or 'interrupted' in l]
    self.assertLen(errors, 1, proc.stderr[-2000:])
    for n in needles:
      self.assertIn(n, errors[0])
    return errors[0]

  def test_corrupt_newest_checkpoint_recovers_as_the_message_says(self):
    out = os.path.join(self.tmp, 'corrupt')
    self.train(self.scaffold + [f'--output_dir={out}'])
    newest = os.path.join(out, 'checkpoints', 'round_3')
    for name in os.listdir(newest):
      if os.path.isfile(os.path.join(newest, name)):
        with open(os.path.join(newest, name), 'wb') as f:
          f.write(b'garbage')
    line = self.assert_one_line(self.train(self.scaffold + [f'--output_dir={out}'], check=False),
                                2, 'resume from round 2')
    path = re.search(r'remove (\S+) ', line).group(1)
    self.assertEqual(path, newest)
    shutil.rmtree(path)  # Follow the printed advice, nothing more.
    resumed = self.train(self.scaffold + [f'--output_dir={out}'])
    self.assertIn('Resuming', resumed.stdout)
    np.testing.assert_allclose(_final_logits(out), _final_logits(self.ref), rtol=1e-6, atol=1e-6)
    self.assertEqual(_summary(out)['final_test_accuracy'],
                     _summary(self.ref)['final_test_accuracy'])

  def test_overwrite_moves_aside_a_run_whose_every_checkpoint_is_unreadable(self):
    out = os.path.join(self.tmp, 'all_corrupt')
    shutil.copytree(self.ref, out)
    ckpt = os.path.join(out, 'checkpoints')
    rounds = sorted(n for n in os.listdir(ckpt) if n.startswith('round_'))
    self.assertEqual(rounds, ['round_2', 'round_3'])
    for r in rounds:
      for root, _, files in os.walk(os.path.join(ckpt, r)):
        for name in files:
          with open(os.path.join(root, name), 'wb') as f:
            f.write(b'garbage')
    before = _tree(out)
    args = self.scaffold + [f'--output_dir={out}']
    self.assert_one_line(self.train(args, check=False), 2, 'no kept checkpoint can be read',
                         'with --overwrite')
    self.assertEqual(_tree(out), before)  # Nothing changed.
    proc = self.train(args + ['--overwrite'])
    self.assertIn('--overwrite: the checkpoint of', proc.stdout)
    (aside,) = [n for n in os.listdir(self.tmp) if n.startswith('all_corrupt.replaced-')]
    self.assertEqual(_tree(os.path.join(self.tmp, aside)), before)  # Moved whole, never deleted.
    self.assertNotIn('resuming', proc.stdout)  # Never said before the move, nor after.
    self.assertEqual(_summary(out)['final_round'], 3)
    self.assertEqual(_summary(out)['final_test_accuracy'],
                     _summary(self.ref)['final_test_accuracy'])
    # --overwrite on a readable, finished run of the same configuration keeps it: it is complete.
    again = self.train(args + ['--overwrite'])
    self.assertIn('is already complete', again.stdout)
    self.assertLen([n for n in os.listdir(self.tmp) if n.startswith('all_corrupt.replaced-')], 1)

  def test_deleted_checkpoints_restart_with_one_warning_and_keep_the_old_results(self):
    out = os.path.join(self.tmp, 'no_checkpoints')
    shutil.copytree(self.ref, out)
    shutil.rmtree(os.path.join(out, 'checkpoints'))
    old_summary = _summary(out)
    old_logits = _final_logits(out)
    proc = self.train(self.scaffold + [f'--output_dir={out}'])
    warnings = [l for l in proc.stdout.splitlines() + proc.stderr.splitlines()
                if 'warning' in l.lower() and 'checkpoint' in l]
    self.assertLen(warnings, 1, proc.stdout)
    self.assertIn('no checkpoint in', warnings[0])
    self.assertIn('metrics.csv up to round 3, summary.json of round 3, export/', warnings[0])
    self.assertIn('starting from round 1', warnings[0])
    self.assertNotIn('Resuming', proc.stdout)  # Said once, and not contradicted.
    self.assertIn('Starting a new run', proc.stdout)
    aside = re.search(r'moved to (\S+)\.$', warnings[0]).group(1)
    self.assertEqual(os.path.dirname(aside), out)
    self.assertEqual(_summary(aside), old_summary)  # The old results are kept as they were.
    np.testing.assert_array_equal(_final_logits(aside), old_logits)
    with open(os.path.join(aside, 'metrics.csv')) as f:
      self.assertLen(f.read().strip().splitlines(), 4)  # header + rounds 1-3
    # The new run is a whole run of the same configuration.
    self.assertEqual(_summary(out)['final_test_accuracy'], old_summary['final_test_accuracy'])
    with open(os.path.join(out, 'metrics.csv')) as f:
      self.assertEqual([l.split(',')[0] for l in f.read().strip().splitlines()[1:]],
                       ['1', '2', '3'])

  def test_corrupt_client_state_is_one_line(self):
    out = os.path.join(self.tmp, 'bad_state')
    shutil.copytree(self.ref, out)
    states = os.path.join(out, 'client_states')
    npz = sorted(os.path.join(r, f) for r, _, fs in os.walk(states) for f in fs
                 if f.endswith('.npz'))
    with open(npz[-1], 'wb') as f:
      f.write(b'not a zip file')
    self.assert_one_line(self.train(self.scaffold[:-1] + ['--rounds=4', f'--output_dir={out}'],
                                    check=False), 2, 'cannot be read')

  def test_second_run_is_refused_and_ctrl_c_is_one_line(self):
    out = os.path.join(self.tmp, 'busy')
    cmd = [testutil.PYTHON, '-m', 'bin.train', *_TINY, f'--cache_dir={self.cache}', '--rounds=60',
           f'--output_dir={out}']
    first = subprocess.Popen(cmd, cwd=testutil.REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
      for line in first.stdout:
        if line.startswith('round 1/60'):
          break
      second = self.train(['--rounds=60', f'--output_dir={out}'], check=False)
      self.assert_one_line(second, 2, f'in use by another run (PID {first.pid})')
      first.send_signal(signal.SIGINT)
      _, err = first.communicate(timeout=120)
    finally:
      if first.poll() is None:
        first.kill()
    self.assertEqual(first.returncode, 130, err[-2000:])
    self.assertNotIn('Traceback', err)
    done = int(re.search(r'interrupted after round (\d+); re-run the same command to resume',
                         err).group(1))
    self.assertGreaterEqual(done, 1)
    with open(os.path.join(out, 'metrics.csv')) as f:
      rounds = [l.split(',')[0] for l in f.read().strip().splitlines()[1:]]
    self.assertEqual(len(rounds), len(set(rounds)))  # No round written twice.

  def test_bad_values_exit_2_naming_the_flag(self):
    cases = {'--client_lr=inf': '--client_lr', '--seed=-1': '--seed',
             '--workers=localhost:9': '--workers', '--num_atoms=4': '--num_atoms'}
    for flag, name in cases.items():
      proc = self.train([flag, '--rounds=1', f'--output_dir={self.tmp}/bad'], check=False)
      self.assert_one_line(proc, 2, name)
    self.assertFalse(os.path.exists(f'{self.tmp}/bad'))

  def test_non_finite_training_exits_3_without_exporting(self):
    out = os.path.join(self.tmp, 'nan')
    proc = self.train(['--client_lr=1e6', '--rounds=2', f'--output_dir={out}'], check=False)
    self.assert_one_line(proc, 3, 'non-finite', '--client_lr')
    self.assertFalse(os.path.exists(os.path.join(out, 'export')))
    self.assertFalse(os.path.exists(os.path.join(out, 'summary.json')))

  def test_a_failed_start_does_not_block_the_corrected_command(self):
    out = os.path.join(self.tmp, 'failed_start')
    self.assert_one_line(self.train(['--partition=domain', '--rounds=1', f'--output_dir={out}'],
                                    check=False), 2, '--partition')
    self.train(['--rounds=1', f'--output_dir={out}'])
    self.assertEqual(_summary(out)['final_round'], 1)

  def test_fewer_rounds_than_done_warns_and_keeps_the_summary(self):
    out = os.path.join(self.tmp, 'fewer')
    shutil.copytree(self.ref, out)
    before = _summary(out)
    proc = self.train(self.scaffold[:-1] + ['--rounds=2', f'--output_dir={out}'])
    self.assertIn('already completed 3 rounds, more than --rounds=2', proc.stdout)
    self.assertEqual(_summary(out), before)

  def test_output_dir_under_a_file(self):
    blocker = os.path.join(self.tmp, 'a_file')
    with open(blocker, 'w') as f:
      f.write('x')
    self.assert_one_line(self.train(['--rounds=1', f'--output_dir={blocker}/run'], check=False),
                         2, blocker)

  def test_evaluate_bad_batch_size_and_a_file_instead_of_a_model(self):
    for bad in ('0', '-1'):
      self.assert_one_line(self.train([f'--saved_model={self.ref}', f'--batch_size={bad}'],
                                      check=False, module='bin.evaluate'), 2, '--batch_size')
    a_file = os.path.join(self.tmp, 'model.txt')
    with open(a_file, 'w') as f:
      f.write('x')
    self.assert_one_line(self.train([f'--saved_model={a_file}'], check=False,
                                    module='bin.evaluate'), 2, 'is a file, not a SavedModel')

  def test_read_only_output_for_train_evaluate_and_analyze(self):
    with _tmpfs(self, '1m') as ro:
      subprocess.run(['mount', '-o', 'remount,ro', ro], check=True)
      self.assert_one_line(self.train(['--rounds=1', f'--output_dir={ro}/run'], check=False),
                           2, 'read-only')
      self.assert_one_line(self.train([f'--saved_model={self.ref}', f'--output_dir={ro}/eval'],
                                      check=False, module='bin.evaluate'), 2, 'read-only')
      self.assert_one_line(self.train([f'--saved_model={self.ref}', '--task=digits',
                                       f'--output_dir={ro}/analysis'], check=False,
                                      module='bin.analyze'), 2, 'read-only')

  def test_full_disk_exits_3_and_resumes_to_the_same_result(self):
    with _tmpfs(self, '500k') as disk:
      out = os.path.join(disk, 'run')
      args = self.scaffold + [f'--output_dir={out}']
      self.assert_one_line(self.train(args, check=False), 3, 'no space left', 're-run')
      subprocess.run(['mount', '-o', 'remount,size=20m', disk], check=True)
      self.train(args)
      np.testing.assert_allclose(_final_logits(out), _final_logits(self.ref), rtol=1e-6,
                                 atol=1e-6)
      self.assertEqual(_summary(out)['final_test_accuracy'],
                       _summary(self.ref)['final_test_accuracy'])
      leftovers = [n for n in os.listdir(os.path.join(out, 'checkpoints')) if '_temp' in n]
      self.assertEqual(leftovers, [])

  def test_analyze_with_a_missing_dataset_is_one_line(self):
    from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
    from tff_decorr import models  # pylint: disable=g-import-not-at-top
    model_fn = lambda: models.build('small_cnn', num_classes=10, input_shape=(32, 32, 3))
    saved = os.path.join(self.tmp, 'cifar_model')
    export.export_saved_model(model_fn, model_fn().get_weights(), saved, {
        'task': 'cifar10', 'model': 'small_cnn', 'model_kwargs': {}})
    proc = self.train([f'--saved_model={saved}', '--task=cifar10',
                       f'--data_dir={self.tmp}/no_data', f'--output_dir={self.tmp}/an'],
                      check=False, module='bin.analyze')
    self.assert_one_line(proc, 2, '--data_dir')

  def test_each_configuration_stops_its_tff_worker_before_the_next(self):
    out = os.path.join(self.tmp, 'two_configs')
    proc = self.train(['--runtime=tff', '--regularizer=none,feddecorr', '--rounds=1',
                       f'--output_dir={out}'])
    lines = proc.stdout.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith('=== ')]
    stops = [i for i, l in enumerate(lines) if l.startswith('stopped the TFF worker')]
    self.assertLen(starts, 2)
    self.assertLen(stops, 2)
    self.assertLess(stops[0], starts[1])  # Stopped before the second configuration began.
    pids = [re.search(r'PID (\d+)', lines[i]).group(1) for i in stops]
    self.assertNotEqual(pids[0], pids[1])
    for reg in ('none', 'feddecorr'):  # No worker of this run outlives it (others may run).
      self.assertEqual(testutil.processes_holding(os.path.join(out, reg, 'tff_worker.log')), [])


if __name__ == '__main__':
  absltest.main()
