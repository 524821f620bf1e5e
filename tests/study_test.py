"""bin/study: grid expansion, checks before anything runs, the plan's commands, and a tiny real
study on the embedded digits task, killed and resumed (tff_decorr/studies/study.py,
bin/study.py)."""

import json
import os
import re
import shlex
import signal
import subprocess
import time
from unittest import mock

from absl.testing import absltest
import numpy as np

from tff_decorr.tasks import client_data
from tests import testutil
from tff_decorr.studies import study

# The smallest bin/train settings that still train (tests/train_test.py uses the same); tf runtime:
# no TFF worker to start per run.
_TINY = ['--num_clients=4', '--local_epochs=1', '--batch_size=64', '--rounds=2', '--runtime=tf']
_NOISE = ('cuda', 'cuDNN', 'cuFFT', 'cuBLAS', 'TensorRT')


def _plan(**given):
  order = study.grid_flag_names(study.new_train_flags())
  return study.make_plan(study.build_grid(given, order))


def _mtimes(path):
  """Every file and directory under `path` with its modification time (ns)."""
  out = {}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      p = os.path.join(root, name)
      out[os.path.relpath(p, path)] = os.stat(p).st_mtime_ns
  return out


class GridTest(absltest.TestCase):

  def test_grid_expansion(self):
    plan = _plan(algorithm='fedavg,fedprox', fedprox_mu='0.01,0.1', regularizer='none',
                 seed='0,1', rounds='2')
    self.assertEqual(plan.errors, [])
    # Seeds vary fastest; --fedprox_mu goes only to FedProx, so FedAvg runs once per seed.
    expected = [
        ({'algorithm': 'fedavg', 'regularizer': 'none', 'rounds': '2', 'seed': '0'},
         ['--fedprox_mu=0.01']),
        ({'algorithm': 'fedavg', 'regularizer': 'none', 'rounds': '2', 'seed': '1'},
         ['--fedprox_mu=0.01']),
        ({'algorithm': 'fedprox', 'regularizer': 'none', 'rounds': '2', 'fedprox_mu': '0.01',
          'seed': '0'}, []),
        ({'algorithm': 'fedprox', 'regularizer': 'none', 'rounds': '2', 'fedprox_mu': '0.01',
          'seed': '1'}, []),
        ({'algorithm': 'fedprox', 'regularizer': 'none', 'rounds': '2', 'fedprox_mu': '0.1',
          'seed': '0'}, []),
        ({'algorithm': 'fedprox', 'regularizer': 'none', 'rounds': '2', 'fedprox_mu': '0.1',
          'seed': '1'}, []),
    ]
    self.assertEqual([(c.flags, c.not_applied) for c in plan.cells], expected)
    self.assertEqual([list(c.flags) for c in plan.cells], [list(f) for f, _ in expected])
    self.assertEqual(plan.axes, ['algorithm', 'fedprox_mu', 'seed'])
    self.assertLen({c.name for c in plan.cells}, 6)
    for c in plan.cells:
      self.assertRegex(c.name, rf'^digits-{c.flags["algorithm"]}-none-[0-9a-f]{{8}}$')
      self.assertEqual(c.rounds, 2)
    self.assertTrue(any('--fedprox_mu applies only to cells that use fedprox: given to 4 of 6'
                        in n for n in plan.notes), plan.notes)
    self.assertTrue(any('2 grid combination(s) are the same run' in n for n in plan.notes))

  def test_without_regularizer_each_run_has_the_tasks_regularisers(self):
    plan = _plan(seed='0,1')
    self.assertEqual([(c.flags['regularizer'], c.flags['seed']) for c in plan.cells],
                     [('none', '0'), ('feddecorr', '0'), ('none', '1'), ('feddecorr', '1')])
    self.assertEqual(plan.axes, ['seed', 'regularizer'])

  def test_study_file_values_and_lists(self):
    tmp = self.create_tempdir()
    path = os.path.join(tmp, 'study.json')
    with open(path, 'w') as f:
      json.dump({'algorithm': ['fedavg', 'fedprox'], 'seed': [0, 1], 'decomposed': False,
                 'rounds': 3}, f)
    order = study.grid_flag_names(study.new_train_flags())
    grid = study.build_grid(study.read_study_file(path, order), order)
    self.assertEqual(grid, {'algorithm': ['fedavg', 'fedprox'], 'rounds': ['3'],
                            'decomposed': ['false'], 'seed': ['0', '1']})
    self.assertEqual(list(grid), ['algorithm', 'rounds', 'decomposed', 'seed'])  # bin/train's order.
    with open(path, 'w') as f:
      json.dump({'algoritm': ['fedavg']}, f)
    with self.assertRaisesRegex(study.StudyError, r"--study_file=.*'algoritm' not bin/train"):
      study.read_study_file(path, order)
    with self.assertRaisesRegex(study.StudyError, '--seed: empty value'):
      study.build_grid({'seed': ' , '}, order)

  def test_a_setting_no_run_uses_is_an_error(self):
    plan = _plan(algorithm='fedavg', fedprox_mu='0.1', regularizer='none')
    self.assertEqual(plan.errors, ['--fedprox_mu: sets fedprox, which no run of this grid uses; '
                                   'drop it or add fedprox to the grid.'])

  def test_a_grid_over_rounds_names_each_directory(self):
    # --rounds is not in bin/train's hash (a run may be extended), so two values would share one
    # run directory; the study names them apart.
    plan = _plan(regularizer='none', rounds='2,3')
    self.assertEqual([c.rounds for c in plan.cells], [2, 3])
    self.assertTrue(plan.cells[0].name.endswith('-rounds2'), plan.cells[0].name)
    self.assertTrue(plan.cells[1].name.endswith('-rounds3'), plan.cells[1].name)

  def test_runs_started_together_share_the_client_data_cache(self):
    # Two runs of one partition (bin/study --jobs=2) both write the cache; the one renaming its
    # shards into place second finds the first one's there and uses them.
    tmp = self.create_tempdir().full_path
    images = np.arange(6 * 4, dtype=np.uint8).reshape(6, 2, 2, 1)
    labels = np.arange(6) % 2
    parts = [np.arange(3), np.arange(3, 6)]
    directory = os.path.join(tmp, 'shards')
    real_replace = os.replace
    raced = []

    def replace(src, dst):
      if dst == directory and not raced:
        raced.append(True)
        with mock.patch.object(client_data.os, 'getpid', lambda: 1):  # The other process.
          client_data.write_client_shards(images, labels, parts, directory)
      return real_replace(src, dst)

    with mock.patch.object(client_data.os, 'replace', replace):
      client_data.write_client_shards(images, labels, parts, directory)
    self.assertTrue(raced)
    self.assertEqual(sorted(os.listdir(tmp)), ['shards'])  # No temporary directory left.
    client_data.check_shards(directory, ['0', '1'])


class StudyCliTest(testutil.ClassTempDir, absltest.TestCase):
  """bin/study as a user runs it: one tiny study (2 regularisers x 2 seeds) for all cases."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cache = os.path.join(cls.tmp, 'cache')
    cls.study_dir = os.path.join(cls.tmp, 'study')
    cls.args = [f'--study_dir={cls.study_dir}', '--regularizer=none,feddecorr', '--seed=0,1',
                *_TINY, f'--cache_dir={cls.cache}']
    # The first invocation is killed (SIGKILL) while its second run trains.
    cls.first = subprocess.Popen(
        [testutil.PYTHON, '-m', 'bin.study', *cls.args], cwd=testutil.REPO_ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cls.first_lines = []
    started = 0
    for line in cls.first.stderr:
      cls.first_lines.append(line)
      if ' started ' in line:
        started += 1
        if started == 2:
          cls.second_pid = int(re.search(r'PID (\d+)', line).group(1))
          cls.second_name = re.search(r' started (\S+) ', line).group(1)
          time.sleep(6)  # Into its start-up or first round.
          cls.first.send_signal(signal.SIGKILL)
          break
    cls.first.wait(timeout=60)
    cls.first.stderr.close()
    cls.first_name = re.search(r' finished (\S+) ', ''.join(cls.first_lines)).group(1)
    cls.first_mtimes = _mtimes(os.path.join(cls.study_dir, 'runs', cls.first_name))
    with open(os.path.join(cls.study_dir, 'study.json')) as f:
      cls.manifest_after_kill = json.load(f)
    time.sleep(1)  # Distinct mtimes, should anything be rewritten.
    # A tampered manifest (docs/security.md): its command strings are for people to read; the
    # resume builds each run's command from its flags and must not run these.
    cls.marker = os.path.join(cls.tmp, 'manifest_command_ran')
    tampered = dict(cls.manifest_after_kill)
    tampered['cells'] = [dict(c, command=f'touch {cls.marker}') for c in tampered['cells']]
    with open(os.path.join(cls.study_dir, 'study.json'), 'w') as f:
      json.dump(tampered, f)
    cls.second = testutil.run_module('bin.study', *cls.args)

  def test_killed_study_resumes_and_skips_finished_runs(self):
    self.assertEqual(self.first.returncode, -signal.SIGKILL)
    self.assertEqual(self.second.returncode, 0, self.second.stderr[-3000:])
    # The killed study's running child died with it (it would hold the run's lock otherwise).
    self.assertFalse(os.path.exists(f'/proc/{self.second_pid}'))
    self.assertIn('4 runs', self.second.stderr)
    self.assertIn('1 already finished (skipped)', self.second.stderr)
    self.assertNotIn(f'started {self.first_name}', self.second.stderr)
    self.assertEqual(_mtimes(os.path.join(self.study_dir, 'runs', self.first_name)),
                     self.first_mtimes)
    # The interrupted run was started again (two attempts in its log) and finished.
    with open(os.path.join(self.study_dir, 'logs', f'{self.second_name}.log')) as f:
      self.assertEqual(f.read().count('bin/study: '), 2)
    self.assertIn('all 4 runs done', self.second.stderr)
    self.assertFalse(os.path.exists(self.marker))  # the manifest's commands never ran
    self.assertRegex(self.second.stderr, r'\[\d/4 done, \d running, \d left, ETA \d+:\d\d:\d\d\]')

  def test_manifest(self):
    self.assertEqual({c['status'] for c in self.manifest_after_kill['cells']},
                     {'done', 'running', 'pending'})
    with open(os.path.join(self.study_dir, 'study.json')) as f:
      manifest = json.load(f)
    self.assertEqual(manifest['grid']['regularizer'], ['none', 'feddecorr'])
    self.assertEqual(manifest['grid']['seed'], ['0', '1'])
    self.assertEqual(manifest['axes'], ['regularizer', 'seed'])
    self.assertLen(manifest['cells'], 4)
    for cell in manifest['cells']:
      self.assertEqual(cell['status'], 'done')
      run = os.path.join(self.study_dir, cell['run_dir'])
      with open(os.path.join(run, 'summary.json')) as f:
        summary = json.load(f)
      self.assertEqual(summary['final_round'], 2)
      self.assertEqual(summary['config']['regularizer'], cell['flags']['regularizer'])
      self.assertEqual(str(summary['config']['seed']), cell['flags']['seed'])
      self.assertTrue(os.path.isdir(os.path.join(run, 'export', 'saved_model')))
      self.assertTrue(os.path.exists(os.path.join(self.study_dir, cell['log'])))
    # The run finished before the kill was skipped by the later sitting(s): the exit code and wall
    # time that the first sitting recorded stay.
    first = next(c for c in self.manifest_after_kill['cells'] if c['name'] == self.first_name)
    now = next(c for c in manifest['cells'] if c['name'] == self.first_name)
    self.assertEqual(first['exit_code'], 0)
    self.assertGreater(first['wall_time_s'], 0)
    self.assertEqual((now['exit_code'], now['wall_time_s']),
                     (first['exit_code'], first['wall_time_s']))

  def test_finished_study_runs_nothing(self):
    before = _mtimes(os.path.join(self.study_dir, 'runs'))
    proc = testutil.run_module('bin.study', *self.args)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn('4 already finished (skipped)', proc.stderr)
    self.assertNotIn(' started ', proc.stderr)
    self.assertEqual(_mtimes(os.path.join(self.study_dir, 'runs')), before)

  def test_print_plan(self):
    plan_dir = os.path.join(self.tmp, 'plan')
    args = [f'--study_dir={plan_dir}', '--algorithm=fedavg,fedprox', '--fedprox_mu=0.01',
            '--regularizer=none', '--seed=0,1', *_TINY, f'--cache_dir={self.cache}']
    proc = testutil.run_module('bin.study', *args, '--print_plan')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    self.assertLen(lines, 4)
    with open(os.path.join(plan_dir, 'study.json')) as f:
      manifest = json.load(f)
    self.assertEqual(lines, [c['command'] for c in manifest['cells']])
    self.assertEqual({c['status'] for c in manifest['cells']}, {'planned'})
    self.assertFalse(os.path.exists(os.path.join(plan_dir, 'runs')))  # Nothing ran.
    self.assertIn('--fedprox_mu applies only to cells that use fedprox', proc.stderr)
    for line, cell in zip(lines, manifest['cells']):
      words = shlex.split(line)
      self.assertEqual(words[:3], ['cd', testutil.REPO_ROOT, '&&'])
      self.assertEqual(words[4:6], ['-m', 'tff_decorr.bin.train'])
      self.assertEqual(words[-1], f'--output_dir={os.path.join(plan_dir, "runs", cell["name"])}')
      # (study.json sorts keys; the command keeps bin/train's flag order.)
      self.assertCountEqual(words[6:-1], [f'--{k}={v}' for k, v in cell['flags'].items()])
      self.assertEqual('--fedprox_mu=0.01' in words, cell['flags']['algorithm'] == 'fedprox')
    # A finished run is left out of the plan: the tiny study's runs, planned in its directory.
    proc = testutil.run_module('bin.study', *self.args, '--print_plan')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertEqual(proc.stdout, '')
    self.assertIn('4 already finished (not printed)', proc.stderr)

  def test_bad_configurations_are_all_reported_before_anything_runs(self):
    out = os.path.join(self.tmp, 'bad')
    proc = testutil.run_module('bin.study', f'--study_dir={out}', '--algorithm=fedavg,fedfoo',
                               '--client_lr=0.1,-1', '--regularizer=none', '--seed=0', *_TINY)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    errors = [l for l in proc.stderr.splitlines() if l.startswith('study: error:')]
    self.assertLen(errors, 4)  # Three bad cells (of four) and the count.
    self.assertIn('cell 2 of 4 (--algorithm=fedavg ', errors[0])
    self.assertIn(' --client_lr=-1 ', errors[0])
    self.assertTrue(errors[0].endswith('): --client_lr: must be > 0.0, got -1.0.'), errors[0])
    for line in errors[1:3]:
      self.assertIn('--algorithm=fedfoo', line)
      self.assertIn('flag --algorithm=fedfoo: value should be one of', line)
    self.assertIn('3 problem(s) above', errors[3])
    self.assertNotIn('Traceback', proc.stderr)
    self.assertFalse(os.path.exists(out))  # Nothing ran, nothing was written.
    proc = testutil.run_module('bin.study', f'--study_dir={out}', '--jobs=0')
    self.assertEqual(proc.returncode, 2)
    self.assertIn('study: error: --jobs must be >= 1, got 0.', proc.stderr)

  def test_a_failed_run_is_reported_and_the_others_run(self):
    out = os.path.join(self.tmp, 'failing')
    args = [f'--study_dir={out}', '--regularizer=none', '--seed=0,1', *_TINY,
            f'--cache_dir={self.cache}', '--rounds=1']
    plan = _plan(regularizer='none', seed='0,1', num_clients='4', local_epochs='1',
                 batch_size='64', rounds='1', runtime='tf')
    # A file where the first run's directory should be: bin/train refuses it (exit 2).
    bad = os.path.join(out, 'runs', plan.cells[0].name)
    os.makedirs(os.path.dirname(bad))
    with open(bad, 'w') as f:
      f.write('not a run directory\n')
    proc = testutil.run_module('bin.study', *args)
    self.assertEqual(proc.returncode, 3, proc.stderr[-3000:])
    log = os.path.join(out, 'logs', f'{plan.cells[0].name}.log')
    self.assertIn(f'FAILED {plan.cells[0].name} (exit 2): train: error: --output_dir={bad} is a '
                  f'file; give a directory. [log: {log}]', proc.stderr)
    self.assertIn(f'finished {plan.cells[1].name}', proc.stderr)
    self.assertIn('study: error: 1 of 2 runs did not finish', proc.stderr)
    with open(os.path.join(out, 'study.json')) as f:
      cells = json.load(f)['cells']
    self.assertEqual([c['status'] for c in cells], ['failed', 'done'])
    self.assertEqual(cells[0]['exit_code'], 2)
    self.assertIn('is a file', cells[0]['error'])
    with open(bad) as f:
      self.assertEqual(f.read(), 'not a run directory\n')  # Never removed.


if __name__ == '__main__':
  absltest.main()
