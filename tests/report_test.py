"""bin/report over one tiny real study on the embedded digits task (tff_decorr/studies/report.py).

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

from absl.testing import absltest
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
import numpy as np
import tensorflow as tf

from tests import testutil

_CHROMIUM_NAMES = ('chromium', 'chromium-browser', 'google-chrome')
# Headless Chromium that reaches nothing but this machine: no background services, and every host
# name but 127.0.0.1 fails to resolve (the page is a file:// URL and fetches nothing anyway).
_CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                   '--no-first-run', '--disable-background-networking', '--disable-sync',
                   '--disable-component-update', '--disable-default-apps',
                   '--disable-extensions', '--disable-domain-reliability',
                   '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1']

_TINY = ['--num_clients=4', '--local_epochs=1', '--batch_size=64', '--rounds=2', '--runtime=tf']


def _effective_rank(saved_model, images):
  """Independently of tff_decorr.collapse.analysis: numpy covariance, eigenvalues, exp(entropy)."""
  fn = tf.saved_model.load(saved_model).signatures['serving_default']
  z = fn(images=tf.constant(images))['representation'].numpy().astype(np.float64)
  eig = np.clip(np.linalg.eigvalsh(np.cov(z, rowvar=False, bias=True)), 0, None)
  p = eig[eig > 0] / eig.sum()
  return float(np.exp(-np.sum(p * np.log(p))))


class ReportTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.study_dir = os.path.join(cls.tmp, 'study')
    common = [f'--study_dir={cls.study_dir}', '--regularizer=none,feddecorr', *_TINY,
              f'--cache_dir={os.path.join(cls.tmp, "cache")}']
    testutil.check(testutil.run_module('bin.study', *common, '--seed=0,1'), 'bin/study')
    plan = testutil.check(testutil.run_module('bin.study', *common, '--seed=0,1,2',
                                              '--print_plan'),
                          'bin/study --print_plan').stdout.splitlines()
    assert len(plan) == 2, plan  # Seed 2's two runs; the four finished ones are not printed.
    # Seed 2 with no regulariser, stopped after round 1 (a later --rounds wins in absl).
    testutil.check(subprocess.run(plan[0] + ' --rounds=1', shell=True, capture_output=True,
                                  text=True), 'the first planned run')
    cls.out = os.path.join(cls.tmp, 'report')
    cls.proc = testutil.check(testutil.run_module(
        'bin.report', f'--study_dir={cls.study_dir}', f'--output_dir={cls.out}', '--latex'),
        'bin/report')
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
    from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
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

  def test_figures_in_three_formats(self):
    for name in ('curves', 'spectra'):
      with open(os.path.join(self.out, f'{name}.svg'), 'rb') as f:
        self.assertIn(b'<svg', f.read(4000))
      with open(os.path.join(self.out, f'{name}.pdf'), 'rb') as f:
        self.assertEqual(f.read(5), b'%PDF-')
      for fmt in ('png', 'svg', 'pdf'):
        self.assertIn(f'wrote {name}_{fmt}: {os.path.join(self.out, f"{name}.{fmt}")}',
                      self.proc.stdout)

  def test_latex_table_bolds_the_best_mean(self):
    with open(os.path.join(self.out, 'table.tex')) as f:
      tex = f.read()
    for rule in (r'\toprule', r'\midrule', r'\bottomrule', r'\begin{tabular}'):
      self.assertIn(rule, tex)
    # The best final accuracy, from the runs' own summary.json files, not from the report.
    means = {reg: np.mean([s['final_test_accuracy'] for _, s in self._finished(reg)])
             for reg in ('none', 'feddecorr')}
    best = max(means, key=means.get)
    line = next(l for l in tex.splitlines() if l.startswith(best + ' &'))
    self.assertIn(rf'\textbf{{{100 * means[best]:.2f} $\pm$', line)
    other = next(l for l in tex.splitlines() if l.startswith(
        ('feddecorr' if best == 'none' else 'none') + ' &'))
    if f'{100 * means["none"]:.2f}' != f'{100 * means["feddecorr"]:.2f}':  # Not a printed tie.
      self.assertNotIn(rf'\textbf{{{100 * means[best]:.2f}', other)

  def test_report_renders_in_chromium(self):
    """report.html in a real browser: every figure decodes (naturalWidth > 0) and the page's
    screenshot is not blank."""
    chromium = next(filter(None, map(shutil.which, _CHROMIUM_NAMES)), None)
    if chromium is None:
      self.skipTest(f'no Chromium ({", ".join(_CHROMIUM_NAMES)}) on PATH; `make test` installs '
                    'it (make test-system-packages: apt-get install chromium)')
    page = os.path.join(self.out, 'report.html')
    with open(page) as f:
      html = f.read()
    n_images = html.count('<img ')
    self.assertEqual(n_images, 2)
    # A copy of the page with a script that reports each image's decoded size in the title
    # (the report itself has no script).
    probe = os.path.join(self.tmp, 'probe.html')
    with open(probe, 'w') as f:
      f.write(html.replace('</body>', '<script>window.addEventListener("load", () => {'
                           'document.title = "sizes:" + Array.from(document.images, i => '
                           'i.complete ? i.naturalWidth + "x" + i.naturalHeight : "0x0")'
                           '.join(",");});</script></body>'))
    profile = os.path.join(self.tmp, 'chromium-profile')
    run = lambda *args: subprocess.run(
        [chromium, *_CHROMIUM_FLAGS, f'--user-data-dir={profile}', '--virtual-time-budget=5000',
         *args], capture_output=True, text=True, timeout=120)
    proc = run('--dump-dom', f'file://{probe}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    title = re.search(r'<title>sizes:([^<]*)</title>', proc.stdout)
    self.assertIsNotNone(title, proc.stdout[:500])
    sizes = [tuple(map(int, s.split('x'))) for s in title.group(1).split(',')]
    self.assertLen(sizes, n_images)
    for width, height in sizes:
      self.assertGreater(width, 300)  # Decoded: a broken image has naturalWidth 0.
      self.assertGreater(height, 200)
    shot = os.path.join(self.tmp, 'report.png')
    proc = run(f'--screenshot={shot}', '--window-size=1400,900', f'file://{page}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    pixels = tf.io.decode_png(open(shot, 'rb').read(), channels=3).numpy().astype(np.float64)
    self.assertEqual(pixels.shape[:2], (900, 1400))
    self.assertGreater(pixels.std(), 10)  # Not one colour: the table and figures are drawn.
    self.assertGreater(np.mean(pixels.mean(-1) < 128), 0.005)  # Some dark ink (text, lines).

  def test_tensorboard_hparams(self):
    """`tensorboard --logdir=<study_dir>`: the study's experiment at the root, each run's hparams
    and final metrics in its tensorboard/, read back from the event files."""
    experiments = testutil.hparams_events(self.study_dir)['experiment']
    self.assertLen(experiments, 1)  # The last bin/study invocation's: seeds 0, 1, 2.
    infos = {h.name: sorted(testutil.hparam_value(v) for v in h.domain_discrete.values)
             for h in experiments[0].hparam_infos}
    self.assertEqual(infos, {'regularizer': ['feddecorr', 'none'], 'seed': [0, 1, 2]})
    self.assertIn('final_test_accuracy', [m.name.tag for m in experiments[0].metric_infos])
    for name, config, summary in self.runs:
      events = testutil.hparams_events(os.path.join(self.study_dir, 'runs', name, 'tensorboard'))
      self.assertNotEmpty(events['session_start'], name)
      values = {k: testutil.hparam_value(v)
                for k, v in events['session_start'][0].hparams.items()}
      for key in ('regularizer', 'seed', 'algorithm', 'num_clients'):
        self.assertEqual(values[key], config[key], (name, key))
      self.assertAlmostEqual(values['client_lr'], config['hparams']['sgd']['lr'])
      if config['regularizer'] == 'feddecorr':
        self.assertAlmostEqual(values['feddecorr_beta'], config['hparams']['feddecorr']['beta'])
      self.assertAlmostEqual(values['dirichlet_alpha'], config['hparams']['dirichlet']['alpha'])
      self.assertEqual(events['session_start'][0].group_name, name)
      if summary is not None:  # Finished (also the one stopped after 1 of 2 rounds).
        step, value = events['scalars']['final_test_accuracy'][-1]
        self.assertEqual(step, summary['final_round'])
        self.assertAlmostEqual(value, summary['final_test_accuracy'], places=6)
        self.assertAlmostEqual(events['scalars']['best_test_accuracy'][-1][1],
                               summary['best_test_accuracy'], places=6)
      else:
        self.assertNotIn('final_test_accuracy', events['scalars'])

  def test_without_spectra(self):
    out = os.path.join(self.tmp, 'nospectra')
    proc = testutil.check(testutil.run_module(
        'bin.report', f'--study_dir={self.study_dir}', f'--output_dir={out}', '--nospectra'),
        'bin/report')
    self.assertNotIn('spectrum of', proc.stdout)
    self.assertFalse(os.path.exists(os.path.join(out, 'spectra.png')))
    with open(os.path.join(out, 'report.html')) as f:
      self.assertEqual(f.read().count('data:image/png;base64,'), 1)
    with open(os.path.join(out, 'table.csv'), newline='') as f:
      rows = list(csv.DictReader(f))
    self.assertEqual([r['final_test_accuracy_mean'] for r in rows],
                     [self.rows[r['regularizer']]['final_test_accuracy_mean'] for r in rows])

  def test_report_of_run_directories(self):
    """The study's bin/train run directories given as --run_dir and as arguments, without the
    study: a row per configuration over seeds, numbers from the runs' own summary.json files.
    Seed 2's run without a regulariser was run with --rounds=1: finished, a configuration of its
    own."""
    runs_dir = os.path.join(self.study_dir, 'runs')
    paths = [os.path.join(runs_dir, n) for n, _, _ in self.runs]
    out = os.path.join(self.tmp, 'runs_report')
    proc = testutil.check(testutil.run_module(
        'bin.report', f'--run_dir={",".join(paths[:2])}', *paths[2:], f'--output_dir={out}'),
        'bin/report --run_dir')
    with open(os.path.join(out, 'table.csv'), newline='') as f:
      rows = {(r['rounds'], r['regularizer']): r for r in csv.DictReader(f)}
    self.assertEqual(set(rows), {('2', 'none'), ('2', 'feddecorr'), ('1', 'none')})
    for reg in ('none', 'feddecorr'):
      row, finished = rows['2', reg], self._finished(reg)
      self.assertEqual((row['n_done'], row['n_runs'], row['seeds_done']), ('2', '2', '0 1'))
      values = np.array([s['final_test_accuracy'] for _, s in finished])
      self.assertAlmostEqual(float(row['final_test_accuracy_mean']), values.mean(), places=12)
      self.assertAlmostEqual(float(row['final_test_accuracy_std']), values.std(ddof=1),
                             places=12)
      # The same effective rank as the study's report of the same runs.
      self.assertAlmostEqual(float(row['effective_rank_mean']),
                             float(self.rows[reg]['effective_rank_mean']), places=9)
    (one_round,) = [s for _, c, s in self.runs if c['rounds'] == 1]
    self.assertAlmostEqual(float(rows['1', 'none']['final_test_accuracy_mean']),
                           one_round['final_test_accuracy'], places=12)
    for name in ('report.html', 'curves.png', 'curves.svg', 'spectra.png', 'table.md'):
      self.assertTrue(os.path.exists(os.path.join(out, name)), name)
    with open(os.path.join(out, 'report.html')) as f:
      self.assertEqual(f.read().count('data:image/png;base64,'), 2)  # Curves and spectra.
    self.assertIn('| algorithm | regularizer | rounds |', proc.stdout)

  def test_report_of_one_run_given_as_study_dir(self):
    """What a user tries first after bin/train: --study_dir=<run> reports that run, in
    <run>/report."""
    name, _, summary = next((n, c, s) for n, c, s in self.runs
                            if c['regularizer'] == 'none' and c['seed'] == 0)
    run = os.path.join(self.tmp, 'one_run')
    shutil.copytree(os.path.join(self.study_dir, 'runs', name), run)
    testutil.check(testutil.run_module('bin.report', f'--study_dir={run}', '--nospectra'),
                   'bin/report --study_dir=<run>')
    out = os.path.join(run, 'report')
    with open(os.path.join(out, 'table.csv'), newline='') as f:
      (row,) = list(csv.DictReader(f))
    self.assertEqual((row['algorithm'], row['regularizer'], row['n_done']), ('fedavg', 'none', '1'))
    self.assertAlmostEqual(float(row['final_test_accuracy_mean']),
                           summary['final_test_accuracy'], places=12)
    self.assertTrue(os.path.exists(os.path.join(out, 'curves.png')))
    with open(os.path.join(out, 'report.html')) as f:
      page = f.read()
    self.assertIn(f'Run {os.path.basename(run)}', page)
    self.assertNotIn('Δ final vs none', page)  # One regulariser: nothing to compare with.
    with open(os.path.join(out, 'table.md')) as f:
      self.assertIn(f'{100 * summary["final_test_accuracy"]:.2f}', f.read())

  def test_bad_run_dir_is_one_line(self):
    missing = os.path.join(self.tmp, 'missing_run')
    for args, line in (
        ([f'--run_dir={missing}'], f'report: error: --run_dir={missing} does not exist; give a '
         'run directory bin/train wrote (it holds config.json).'),
        ([f'--run_dir={self.study_dir}'], f'report: error: --run_dir={self.study_dir} is a '
         f'bin/study directory; give --study_dir={self.study_dir}.'),
        ([os.path.join(self.study_dir, 'runs', self.runs[0][0]),
          os.path.join(self.study_dir, 'runs', self.runs[1][0])],
         'report: error: --output_dir is required with 2 run directories: where their report '
         'goes (e.g. --output_dir=reports/<name>).')):
      proc = testutil.run_module('bin.report', *args)
      self.assertEqual(proc.returncode, 2, proc.stderr)
      self.assertEqual(proc.stderr.strip().splitlines()[-1], line)
    self.assertFalse(os.path.exists(missing))

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
    from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
    return aggregate.Run(name=f'r{len(flags)}{seed}{final}', path='', rounds=2, status=status,
                      rounds_done=2 if status == 'done' else 1, log='',
                      flags={'dirichlet_alpha': alpha, **flags, 'seed': str(seed)},
                      summary={'final_test_accuracy': final, 'best_test_accuracy': final + 0.1}
                      if status == 'done' else None)

  def test_each_setting_of_a_regulariser_is_compared_with_its_baseline(self):
    from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
    from tff_decorr.studies import figures  # pylint: disable=g-import-not-at-top
    runs = [self._run(0, 0.50, regularizer='none'), self._run(1, 0.60, regularizer='none'),
            self._run(2, 0.99, regularizer='none', status='incomplete'),
            self._run(0, 0.70, regularizer='feddecorr', feddecorr_beta='0.05'),
            self._run(1, 0.80, regularizer='feddecorr', feddecorr_beta='0.05'),
            self._run(0, 0.40, regularizer='feddecorr', feddecorr_beta='0.1'),
            self._run(0, 0.20, regularizer='none', alpha='0.5')]
    rows = aggregate.group(runs, ['dirichlet_alpha', 'regularizer', 'feddecorr_beta', 'seed'])
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
    self.assertEqual(figures._curve_axes(['dirichlet_alpha', 'regularizer', 'feddecorr_beta',
                                         'seed']),
                     (['regularizer', 'feddecorr_beta'], ['dirichlet_alpha']))


class FiguresTest(testutil.ClassTempDir, absltest.TestCase):
  """bin/report's figures and LaTeX from runs built here: 2 algorithms x 2 regularisers x 2
  --dirichlet_alpha x 2 seeds, with curves and spectra of very different scales."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
    from tff_decorr.studies import figures  # pylint: disable=g-import-not-at-top
    cls.axes = ['dirichlet_alpha', 'algorithm', 'regularizer', 'fedprox_mu', 'seed']
    rng = np.random.default_rng(0)
    runs = []
    for alpha in ('0.1', '0.5'):
      for algorithm in ('fedavg', 'fedprox'):
        for regularizer in ('none', 'feddecorr'):
          for seed in (0, 1):
            flags = {'dirichlet_alpha': alpha, 'algorithm': algorithm, 'regularizer': regularizer,
                     'seed': str(seed)}
            if algorithm == 'fedprox':
              flags['fedprox_mu'] = '0.01'
            path = os.path.join(cls.tmp, f'run{len(runs)}')
            os.makedirs(path)
            acc = np.sort(rng.uniform(0.1, 0.6, 5))
            with open(os.path.join(path, 'metrics.csv'), 'w') as f:
              f.write('round,test_accuracy\n' + ''.join(f'{r + 1},{a}\n' for r, a in
                                                         enumerate(acc)))
            run = aggregate.Run(name=f'run{len(runs)}', path=path, flags=flags, rounds=5,
                             status='done', rounds_done=5, log='',
                             summary={'final_test_accuracy': acc[-1],
                                      'best_test_accuracy': acc.max()})
            # Scales from 1e3 down to 1e-80 of the largest: the raw log axis would span 83 decades.
            run.spectrum = 1e3 * np.geomspace(1, 1e-80, 64) * rng.uniform(0.5, 2)
            runs.append(run)
    cls.rows = aggregate.group(runs, cls.axes)
    cls.curves = figures.curves(cls.rows, cls.axes)
    cls.spectra = figures.spectra_panels(cls.rows, cls.axes)

  @staticmethod
  def _drawn(fig):
    """{label: hex colour} of the lines of every axes, after drawing."""
    FigureCanvasAgg(fig).draw()
    out = {}
    for ax in fig.axes:
      for line in ax.get_lines():
        if not line.get_label().startswith('_'):
          color = mcolors.to_hex(line.get_color())
          assert out.setdefault(line.get_label(), color) == color, line.get_label()
    return out

  def test_short_labels_name_only_what_differs(self):
    labels = {c['label'] for curves in self.curves.values() for c in curves}
    self.assertEqual(labels, {'fedavg + none', 'fedavg + feddecorr', 'fedprox + none',
                              'fedprox + feddecorr'})
    self.assertEqual(list(self.curves), ['dirichlet_alpha=0.1', 'dirichlet_alpha=0.5'])
    self.assertEqual(list(self.spectra), list(self.curves))  # The same panels.

  def test_one_colour_per_configuration_in_every_figure(self):
    from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
    curves = self._drawn(plots.curves_figure(self.curves))
    spectra = self._drawn(plots.spectra_figure(self.spectra))
    self.assertEqual(curves, spectra)
    self.assertLen(set(curves.values()), 4)  # Four configurations, four colours.

  def test_spectra_are_relative_and_cut_at_the_floor(self):
    from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
    fig = plots.spectra_figure(self.spectra)
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
      low, high = ax.get_ylim()
      self.assertGreaterEqual(low, plots.RELATIVE_FLOOR)
      self.assertLessEqual(high, 10)
      for line in ax.get_lines():
        y = np.asarray(line.get_ydata(), dtype=np.float64)
        y = y[np.isfinite(y)]
        self.assertAlmostEqual(y.max(), 1.0)
        self.assertGreaterEqual(y.min(), plots.RELATIVE_FLOOR)

  def test_legends_are_outside_the_axes(self):
    from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
    for fig in (plots.curves_figure(self.curves), plots.spectra_figure(self.spectra)):
      renderer = FigureCanvasAgg(fig).get_renderer()
      fig.draw(renderer)
      self.assertLen(fig.legends, 1)
      self.assertEqual([ax.get_legend() for ax in fig.axes], [None] * len(fig.axes))
      legend = fig.legends[0].get_window_extent(renderer)
      for ax in fig.axes:
        self.assertFalse(legend.overlaps(ax.get_window_extent(renderer)),
                         (legend, ax.get_window_extent(renderer)))
      # And inside what is saved (bbox_inches='tight'): not cut off.
      saved = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
      self.assertTrue(saved.x1 >= legend.x1 and saved.y0 <= legend.y0, (saved, legend))

  def test_latex_bolds_each_columns_best(self):
    from tff_decorr.studies import tables  # pylint: disable=g-import-not-at-top
    tex = tables.latex(self.rows, self.axes, spectra=False)
    self.assertIn(r'\toprule', tex)
    self.assertIn(r'\bottomrule', tex)
    self.assertIn(r'dirichlet\_alpha', tex)  # Escaped.
    body = tex.split('\\midrule\n')[1].split('\\bottomrule')[0].splitlines()
    self.assertLen(body, len(self.rows))
    # The best final accuracy computed here from the runs' summaries, grouped by hand.
    means = {}
    for row in self.rows:
      means[row.label] = np.mean([r.summary['final_test_accuracy'] for r in row.runs])
    best_label = max(means, key=means.get)
    best_row = next(i for i, row in enumerate(self.rows) if row.label == best_label)
    final_cells = [line.split(' & ')[len(self.axes)] for line in body]  # After axes and seeds.
    self.assertEqual(final_cells[best_row], rf'\textbf{{{100 * means[best_label]:.2f} $\pm$ '
                     rf'{100 * np.std([r.summary["final_test_accuracy"] for r in self.rows[best_row].runs], ddof=1):.2f}}}')
    self.assertLen([c for c in final_cells if c.startswith(r'\textbf')], 1)


if __name__ == '__main__':
  absltest.main()
