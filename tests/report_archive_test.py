"""bin/report's collapse measures over rounds and its archive (tff_decorr/studies/run_spectra.py,
archive.py), over a tiny real study on the embedded digits task.

The study exports the global model every round and client 0's local model of round 2
(--export_every=1 --save_local_models=0 --save_local_rounds=2). The measures are checked against
NumPy on the exported SavedModels themselves; the archive is read back by bin/report with no
SavedModel left to load.
"""

import csv
import json
import os

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import testutil

_TINY = ['--num_clients=4', '--local_epochs=1', '--batch_size=64', '--rounds=2', '--runtime=tf',
         '--export_every=1', '--save_local_models=0', '--save_local_rounds=2']


def _eigenvalues(saved_model, images):
  """Independently of tff_decorr.collapse.analysis: the population covariance's eigenvalues."""
  fn = tf.saved_model.load(saved_model).signatures['serving_default']
  z = fn(images=tf.constant(images))['representation'].numpy().astype(np.float64)
  return np.sort(np.clip(np.linalg.eigvalsh(np.cov(z, rowvar=False, bias=True)), 0, None))[::-1]


def _effective_rank(eig):
  p = eig[eig > 0] / eig.sum()
  return float(np.exp(-np.sum(p * np.log(p))))


class ArchiveTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.archive = os.path.join(cls.tmp, 'archive')
    # Two sittings, as on two machines: each a study of one seed, archived into one directory.
    cls.study_dirs = [os.path.join(cls.tmp, f'study{seed}') for seed in (0, 1)]
    outputs = []
    for seed, study_dir in enumerate(cls.study_dirs):
      testutil.check(testutil.run_module(
          'bin.study', f'--study_dir={study_dir}', '--regularizer=none,feddecorr', *_TINY,
          f'--cache_dir={os.path.join(cls.tmp, "cache")}', f'--seed={seed}'), 'bin/study')
      outputs.append(testutil.check(testutil.run_module(
          'bin.report', f'--study_dir={study_dir}', f'--archive_dir={cls.archive}'), 'archive'))
    cls.second = outputs[1]
    cls.out = os.path.join(cls.tmp, 'report')
    cls.proc = testutil.check(testutil.run_module(
        'bin.report', f'--study_dir={cls.archive}', f'--output_dir={cls.out}',
        '--thresholds=20,95'), 'bin/report on the archive')
    from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
    cls.images = np.concatenate([x.numpy() for x, _ in registry.get('digits').test_dataset(None)])

  def _runs(self):
    return sorted(n for d in self.study_dirs for n in os.listdir(os.path.join(d, 'runs')))

  def _run_dir(self, name):
    return next(os.path.join(d, 'runs', name) for d in self.study_dirs
                if os.path.isdir(os.path.join(d, 'runs', name)))

  def test_archive_holds_small_files_only(self):
    self.assertLen(self._runs(), 4)
    for name in self._runs():
      files = sorted(os.listdir(os.path.join(self.archive, 'runs', name)))
      self.assertEqual(files, ['config.json', 'metrics.csv', 'spectra.json', 'summary.json'])
      size = sum(os.path.getsize(os.path.join(self.archive, 'runs', name, f)) for f in files)
      self.assertLess(size, 64 * 1024)
    with open(os.path.join(self.archive, 'study.json')) as f:
      manifest = json.load(f)
    self.assertEqual(sorted(c['name'] for c in manifest['cells']), self._runs())
    self.assertIn('archived 2 finished run(s)', self.second.stdout)  # Seed 1's two.

  def test_spectra_against_numpy_on_the_exports(self):
    for name in self._runs():
      run = self._run_dir(name)
      with open(os.path.join(self.archive, 'runs', name, 'spectra.json')) as f:
        measures = json.load(f)
      self.assertEqual(sorted(measures['global']), ['1', '2'])
      for r in (1, 2):
        expected = _eigenvalues(os.path.join(run, 'export', f'round_{r}'), self.images)
        np.testing.assert_allclose(measures['global'][str(r)], expected, rtol=1e-6, atol=1e-9)
      self.assertLen(measures['local'], 1)
      local = measures['local'][0]
      self.assertEqual((local['client'], local['round']), ('0', 2))
      sv_local = _eigenvalues(os.path.join(run, 'local_models', 'round_2', 'client_0'),
                              self.images)
      np.testing.assert_allclose(local['sv'], sv_local, rtol=1e-6, atol=1e-9)
      # R = mean_k log(lambda_k local / lambda_k global), both floored at 1e-12 of the larger top.
      sv_global = np.asarray(measures['global']['2'])
      eps = 1e-12 * max(sv_local[0], sv_global[0])
      r_value = np.mean(np.log(np.maximum(sv_local, eps)) - np.log(np.maximum(sv_global, eps)))
      self.assertAlmostEqual(local['gap'], r_value, places=5)

  def test_report_from_the_archive_alone(self):
    with open(os.path.join(self.out, 'table.md')) as f:
      md = f.read()
    self.assertIn('## Collapse by round', md)
    self.assertIn('effective rank, round 1', md)
    self.assertIn('gap R local-global (client 0, round 2)', md)
    self.assertIn('## Rounds to reach a test accuracy', md)
    self.assertTrue(os.path.exists(os.path.join(self.out, 'spectra_by_round.png')))
    with open(os.path.join(self.out, 'table.csv'), newline='') as f:
      rows = {r['regularizer']: r for r in csv.DictReader(f)}
    for reg, row in rows.items():
      self.assertEqual(row['n_done'], '2')
      ranks = []
      for name in self._runs():
        run = self._run_dir(name)
        with open(os.path.join(run, 'config.json')) as f:
          if json.load(f)['regularizer'] != reg:
            continue
        ranks.append(_effective_rank(_eigenvalues(os.path.join(run, 'export', 'saved_model'),
                                                  self.images)))
      self.assertLen(ranks, 2)
      self.assertAlmostEqual(float(row['effective_rank_mean']), np.mean(ranks), places=5)

  def test_rounds_to_reach_from_the_runs_metrics(self):
    with open(os.path.join(self.out, 'table.md')) as f:
      md = f.read()
    section = md.split('## Rounds to reach a test accuracy')[1].split('##')[0]
    for reg in ('none', 'feddecorr'):
      firsts = {20: [], 95: []}
      for name in self._runs():
        run = self._run_dir(name)
        with open(os.path.join(run, 'config.json')) as f:
          if json.load(f)['regularizer'] != reg:
            continue
        with open(os.path.join(run, 'metrics.csv'), newline='') as f:
          curve = [(int(r['round']), float(r['test_accuracy'])) for r in csv.DictReader(f)]
        for t in firsts:
          hit = [r for r, a in curve if a >= t / 100]
          if hit:
            firsts[t].append(hit[0])
      line = next(l for l in section.splitlines() if l.startswith(f'| {reg} |'))
      cells = [c.strip() for c in line.strip('|').split('|')]
      for t, cell in zip((20, 95), cells[1:]):
        reached = len(firsts[t])
        self.assertTrue(cell.endswith(f'({reached}/2 runs)'), (reg, t, cell))
        if reached:
          self.assertTrue(cell.startswith(f'{np.mean(firsts[t]):.2f}'), (reg, t, cell))
        else:
          self.assertTrue(cell.startswith('not reached'), cell)

  def test_archiving_again_keeps_what_the_running_sitting_recorded(self):
    from tff_decorr.studies import archive  # pylint: disable=g-import-not-at-top
    path = os.path.join(self.archive, 'study.json')
    with open(path) as f:
      before = {c['name']: c for c in json.load(f)['cells']}
    seed0 = sorted(os.listdir(os.path.join(self.study_dirs[0], 'runs')))
    for name in seed0:
      self.assertEqual(before[name]['exit_code'], 0)
      self.assertGreater(before[name]['wall_time_s'], 0)
    # The study's manifest as a later sitting may leave it (the runs finished earlier, so it
    # recorded no exit code or wall time for them); archiving the same runs again keeps the
    # archive's.
    manifest_path = os.path.join(self.study_dirs[0], 'study.json')
    with open(manifest_path) as f:
      manifest = json.load(f)
    for cell in manifest['cells']:
      cell.pop('exit_code', None)
      cell.pop('wall_time_s', None)
    with open(manifest_path, 'w') as f:
      json.dump(manifest, f)
    self.assertEqual(sorted(archive.archive(self.study_dirs[0], self.archive, log=lambda _: None)),
                     seed0)
    with open(path) as f:
      after = {c['name']: c for c in json.load(f)['cells']}
    self.assertEqual(after, before)

  def test_bad_threshold_is_one_line(self):
    proc = testutil.run_module('bin.report', f'--study_dir={self.archive}', '--thresholds=120')
    self.assertEqual(proc.returncode, 2, proc.stderr)
    self.assertIn('--thresholds', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)


if __name__ == '__main__':
  absltest.main()
