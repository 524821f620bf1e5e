"""bin/report over one tiny real study on the embedded digits task (tff_decorr/run/report.py).

The study: regularisers none and feddecorr x seeds 0, 1 finished through bin/study; seed 2 planned
(--print_plan) with its none run stopped after 1 of 2 rounds and its feddecorr run never started,
so each row has two finished runs and one that must not be averaged in.
"""

import base64
import csv
import json
import os
import re
import shutil
import subprocess
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import testutil

_TINY = ['--num_clients=4', '--local_epochs=1', '--batch_size=64', '--rounds=2', '--runtime=tf']


def _check(proc, what):
  if proc.returncode != 0:
    raise AssertionError(f'{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n'
                         f'{proc.stderr[-3000:]}')
  return proc


def _effective_rank(saved_model, images):
  """Independently of tff_decorr.collapse.analysis: numpy covariance, eigenvalues, exp(entropy)."""
  fn = tf.saved_model.load(saved_model).signatures['serving_default']
  z = fn(images=tf.constant(images))['representation'].numpy().astype(np.float64)
  eig = np.clip(np.linalg.eigvalsh(np.cov(z, rowvar=False, bias=True)), 0, None)
  p = eig[eig > 0] / eig.sum()
  return float(np.exp(-np.sum(p * np.log(p))))


class ReportTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.study_dir = os.path.join(cls.tmp, 'study')
    common = [f'--study_dir={cls.study_dir}', '--regularizer=none,feddecorr', *_TINY,
              f'--cache_dir={os.path.join(cls.tmp, "cache")}']
    _check(testutil.run_module('bin.study', *common, '--seed=0,1'), 'bin/study')
    plan = _check(testutil.run_module('bin.study', *common, '--seed=0,1,2', '--print_plan'),
                  'bin/study --print_plan').stdout.splitlines()
    assert len(plan) == 2, plan  # Seed 2's two runs; the four finished ones are not printed.
    # Seed 2 with no regulariser, stopped after round 1 (a later --rounds wins in absl).
    _check(subprocess.run(plan[0] + ' --rounds=1', shell=True, capture_output=True, text=True),
           'the first planned run')
    cls.out = os.path.join(cls.tmp, 'report')
    cls.proc = _check(testutil.run_module('bin.report', f'--study_dir={cls.study_dir}',
                                          f'--output_dir={cls.out}'), 'bin/report')
    with open(os.path.join(cls.out, 'table.csv'), newline='') as f:
      cls.rows = {r['regularizer']: r for r in csv.DictReader(f)}
    # The runs as their own files say, not as the report read them.
    cls.runs = []
    runs_dir = os.path.join(cls.study_dir, 'runs')
    for name in sorted(os.listdir(runs_dir)):
      with open(os.path.join(runs_dir, name, 'config.json')) as f:
        config = json.load(f)
      summary_path = os.path.join(runs_dir, name, 'summary.json')
      summary = None
      if os.path.exists(summary_path):
        with open(summary_path) as f:
          summary = json.load(f)
      cls.runs.append((name, config, summary))

  def _finished(self, regularizer):
    return [(n, s) for n, c, s in self.runs
            if c['regularizer'] == regularizer and s is not None and s['final_round'] == 2]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_table_mean_and_std_over_the_runs_own_summaries(self):
    self.assertEqual(set(self.rows), {'none', 'feddecorr'})
    means = {}
    for reg, row in self.rows.items():
      finished = self._finished(reg)
      self.assertLen(finished, 2)
      self.assertEqual(row['n_done'], '2')
      self.assertEqual(row['n_runs'], '3')
      self.assertEqual(row['seeds_done'], '0 1')
      for metric in ('final_test_accuracy', 'best_test_accuracy'):
        values = np.array([s[metric] for _, s in finished])
        self.assertAlmostEqual(float(row[f'{metric}_mean']), values.mean(), places=12)
        self.assertAlmostEqual(float(row[f'{metric}_std']), values.std(ddof=1), places=12)
        means[reg, metric] = values.mean()
    self.assertAlmostEqual(float(self.rows['feddecorr']['final_test_accuracy_delta_vs_none']),
                           means['feddecorr', 'final_test_accuracy'] -
                           means['none', 'final_test_accuracy'], places=12)
    self.assertEqual(self.rows['none']['final_test_accuracy_delta_vs_none'], '')
    with open(os.path.join(self.out, 'table.md')) as f:
      md = f.read()
    row = self.rows['feddecorr']
    shown = (f'{100 * float(row["final_test_accuracy_mean"]):.2f} ± '
             f'{100 * float(row["final_test_accuracy_std"]):.2f}')
    self.assertRegex(md, rf'\| feddecorr \| 2/3 \| {re.escape(shown)} \|')
    self.assertIn('| regularizer | seeds done | final acc. (%) |', md)

  def test_unfinished_runs_are_listed_never_averaged_in(self):
    # Seed 2 of none has a summary.json, after 1 round of 2: listed, not in the mean (checked
    # above against the two finished runs only).
    partial = [s for n, c, s in self.runs if c['regularizer'] == 'none' and c['seed'] == 2]
    self.assertLen(partial, 1)
    self.assertEqual(partial[0]['final_round'], 1)
    self.assertEqual(self.rows['none']['not_done'], 'seed=2: incomplete (1/2 rounds)')
    self.assertEqual(self.rows['feddecorr']['not_done'], 'seed=2: not started')
    with open(os.path.join(self.out, 'table.md')) as f:
      md = f.read()
    self.assertIn('seed=2: incomplete (1/2 rounds)', md)
    self.assertIn('6 runs (4 done, 1 incomplete, 1 not started)', md)

  def test_effective_rank_against_numpy(self):
    from tasks import registry  # pylint: disable=g-import-not-at-top
    images = np.concatenate([x.numpy() for x, _ in registry.get('digits').test_dataset(None)])
    for reg, row in self.rows.items():
      ranks = [_effective_rank(os.path.join(self.study_dir, 'runs', n, 'export', 'saved_model'),
                               images) for n, _ in self._finished(reg)]
      self.assertAlmostEqual(float(row['effective_rank_mean']), np.mean(ranks), places=6)
      self.assertAlmostEqual(float(row['effective_rank_std']), np.std(ranks, ddof=1), places=6)

  def test_html_is_one_self_contained_page_with_the_figures(self):
    with open(os.path.join(self.out, 'report.html')) as f:
      page = f.read()
    self.assertTrue(page.startswith('<!DOCTYPE html>'))
    sources = re.findall(r'src="([^"]*)"', page)
    self.assertLen(sources, 2)  # Curves and spectra.
    for src in sources:
      self.assertTrue(src.startswith('data:image/png;base64,'), src[:40])
      png = base64.b64decode(src.split(',', 1)[1])
      self.assertEqual(png[:8], b'\x89PNG\r\n\x1a\n')
      self.assertGreater(len(png), 5000)
    self.assertNotRegex(page, r'https?://|<script|<link|href=')  # Nothing fetched from anywhere.
    self.assertIn('<td>feddecorr</td>', page)
    self.assertIn('seed=2: incomplete (1/2 rounds)', page)
    for name in ('curves.png', 'spectra.png', 'table.md', 'table.csv'):
      self.assertTrue(os.path.exists(os.path.join(self.out, name)), name)
    self.assertIn(f'wrote html: {os.path.join(self.out, "report.html")}', self.proc.stdout)

  def test_without_spectra(self):
    out = os.path.join(self.tmp, 'nospectra')
    proc = _check(testutil.run_module('bin.report', f'--study_dir={self.study_dir}',
                                      f'--output_dir={out}', '--nospectra'), 'bin/report')
    self.assertNotIn('spectrum of', proc.stdout)
    self.assertFalse(os.path.exists(os.path.join(out, 'spectra.png')))
    with open(os.path.join(out, 'report.html')) as f:
      self.assertEqual(f.read().count('data:image/png;base64,'), 1)
    with open(os.path.join(out, 'table.csv'), newline='') as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['final_test_accuracy_mean'] for r in rows],
                     [self.rows[r['regularizer']]['final_test_accuracy_mean'] for r in rows])

  def test_bad_study_dir_is_one_line(self):
    missing = os.path.join(self.tmp, 'missing')
    proc = testutil.run_module('bin.report', f'--study_dir={missing}')
    self.assertEqual(proc.returncode, 2)
    self.assertEqual(proc.stderr.strip().splitlines()[-1],
                     f'report: error: --study_dir={missing} does not exist; give the --study_dir '
                     'of a bin/study run.')
    self.assertFalse(os.path.exists(missing))
    proc = testutil.run_module('bin.report', f'--study_dir={self.tmp}')
    self.assertEqual(proc.returncode, 2)
    self.assertIn(f'report: error: --study_dir={self.tmp} has no study.json', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)


class GroupTest(absltest.TestCase):
  """Rows and differences from runs built here (no study needed)."""

  @staticmethod
  def _run(seed, final, alpha='0.1', status='done', **flags):
    from tff_decorr.run import report  # pylint: disable=g-import-not-at-top
    return report.Run(name=f'r{len(flags)}{seed}{final}', path='', rounds=2, status=status,
                      rounds_done=2 if status == 'done' else 1, log='',
                      flags={'dirichlet_alpha': alpha, **flags, 'seed': str(seed)},
                      summary={'final_test_accuracy': final, 'best_test_accuracy': final + 0.1}
                      if status == 'done' else None)

  def test_each_setting_of_a_regulariser_is_compared_with_its_baseline(self):
    from tff_decorr.run import report  # pylint: disable=g-import-not-at-top
    runs = [self._run(0, 0.50, regularizer='none'), self._run(1, 0.60, regularizer='none'),
            self._run(2, 0.99, regularizer='none', status='incomplete'),
            self._run(0, 0.70, regularizer='feddecorr', feddecorr_beta='0.05'),
            self._run(1, 0.80, regularizer='feddecorr', feddecorr_beta='0.05'),
            self._run(0, 0.40, regularizer='feddecorr', feddecorr_beta='0.1'),
            self._run(0, 0.20, regularizer='none', alpha='0.5')]
    rows = report.group(runs, ['dirichlet_alpha', 'regularizer', 'feddecorr_beta', 'seed'])
    stats = {r.label: r.stats for r in rows}
    self.assertEqual(list(stats), [
        'dirichlet_alpha=0.1 regularizer=none',
        'dirichlet_alpha=0.1 regularizer=feddecorr feddecorr_beta=0.05',
        'dirichlet_alpha=0.1 regularizer=feddecorr feddecorr_beta=0.1',
        'dirichlet_alpha=0.5 regularizer=none'])
    none, beta05, beta1, _ = stats.values()
    self.assertAlmostEqual(none['final_test_accuracy_mean'], 0.55)  # Not the incomplete 0.99.
    self.assertAlmostEqual(none['final_test_accuracy_std'], np.std([0.5, 0.6], ddof=1))
    self.assertEqual(none['not_done'], ['seed=2: incomplete (1/2 rounds)'])
    self.assertAlmostEqual(beta05['final_test_accuracy_delta_vs_none'], 0.75 - 0.55)
    self.assertAlmostEqual(beta1['best_test_accuracy_delta_vs_none'], 0.5 - 0.65)
    self.assertTrue(np.isnan(beta1['final_test_accuracy_std']))  # One run: no std.
    # Curves: a panel per --dirichlet_alpha; --feddecorr_beta is the regulariser's own setting.
    self.assertEqual(report._curve_axes(['dirichlet_alpha', 'regularizer', 'feddecorr_beta',
                                         'seed']),
                     (['regularizer', 'feddecorr_beta'], ['dirichlet_alpha']))


if __name__ == '__main__':
  absltest.main()
