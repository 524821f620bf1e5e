"""A longer reproduction (--rounds=50) continues the 30-round runs, and its window table.

The window table is checked against means computed here by hand from the same curves and against
scipy's paired t-test; the continuation against the files it copies and the runs it must refuse.
"""

import collections
import json
import os
import shutil

from absl import app
from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np
from scipy import stats

from bench.accuracy import reproduction

Run = collections.namedtuple('Run', 'path flags')


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _curve(path, accuracies, losses=None):
  losses = [0.5] * len(accuracies) if losses is None else losses
  rows = ['round,test_accuracy,train_loss'] + [
      f'{i},{a},{l}' for i, (a, l) in enumerate(zip(accuracies, losses), 1)]
  _write(os.path.join(path, 'metrics.csv'), '\n'.join(rows) + '\n')


class WindowsTest(absltest.TestCase):

  def test_window_means_and_paired_test(self):
    tmp = self.create_tempdir().full_path
    rng = np.random.default_rng(0)
    curves = {}
    runs = []
    for seed in ('0', '1', '2'):
      for method in reproduction.METHODS:
        acc = rng.uniform(0.1, 0.4, size=25)
        curves[method, seed] = acc
        path = os.path.join(tmp, f'{method}-{seed}')
        _curve(path, acc)
        runs.append(Run(path, {'regularizer': method, 'seed': seed}))
    text = reproduction.windows_markdown(runs, width=10)
    rows = [l for l in text.splitlines() if l.startswith('| ') and l[2].isdigit()]
    self.assertEqual([r.split(' | ')[0] for r in rows], ['| 1-10', '| 11-20', '| 21-25'])
    for row, (lo, hi) in zip(rows, ((0, 10), (10, 20), (20, 25))):
      base = [100 * curves['none', s][lo:hi].mean() for s in ('0', '1', '2')]
      other = [100 * curves['feddecorr', s][lo:hi].mean() for s in ('0', '1', '2')]
      d = np.subtract(other, base)
      cells = row.split(' | ')
      self.assertEqual(cells[1], f'{np.mean(base):.2f} ± {np.std(base, ddof=1):.2f}')
      self.assertEqual(cells[3], f'{d.mean():+.2f}')
      self.assertEqual(cells[5], f'{stats.ttest_rel(other, base).pvalue:.3f}')
      self.assertEqual(cells[8].rstrip(' |'), ', '.join(f'{x:+.2f}' for x in d))

  def test_seed_without_its_pair_is_left_out(self):
    tmp = self.create_tempdir().full_path
    runs = []
    for seed, methods in (('0', reproduction.METHODS), ('1', ('none',))):
      for method in methods:
        _curve(os.path.join(tmp, f'{method}-{seed}'), [0.2] * 12)
        runs.append(Run(os.path.join(tmp, f'{method}-{seed}'), {'regularizer': method,
                                                                'seed': seed}))
    text = reproduction.windows_markdown(runs)
    self.assertIn('seeds 0 (n = 1)', text)


class FirstRoundsTest(absltest.TestCase):

  def test_counts_equal_rounds_and_the_largest_difference(self):
    tmp = self.create_tempdir().full_path
    rng = np.random.default_rng(1)
    base, archived = {}, {}
    for m in reproduction.METHODS:
      for s in ('5', '6'):
        archived[m, s] = (rng.uniform(0.1, 0.4, size=30), rng.uniform(0.5, 2, size=30))
        base[m, s] = os.path.join(tmp, 'base', f'{m}-{s}')
        _curve(base[m, s], *archived[m, s])
    longer = {}
    def run(method, seed, accuracy, loss, status=''):
      path = os.path.join(tmp, 'longer', f'{method}-{seed}')
      _curve(path, accuracy, loss)
      longer[method, seed] = (path, status)
    # Seed 5's FedAvg trained rounds 1-30 as the archive did, then 20 more.
    acc, loss = archived['none', '5']
    run('none', '5', np.concatenate([acc, rng.uniform(size=20)]),
        np.concatenate([loss, rng.uniform(size=20)]))
    # Seed 5's FedAvg + FedDecorr parts from round 7 on; its test accuracy happens to agree again
    # at round 20, its training loss never does.
    acc, loss = (v.copy() for v in archived['feddecorr', '5'])
    acc[6:] += rng.normal(scale=0.01, size=24)
    acc[19] = archived['feddecorr', '5'][0][19]
    loss[6:] += 1e-9
    run('feddecorr', '5', acc, loss)
    # Seed 6's FedAvg is still training, 12 rounds in; its pair has not started.
    run('none', '6', *(v[:12] for v in archived['none', '6']), ' (training: 12/50 rounds)')
    # A seed the archive never ran is left out.
    run('none', '9', rng.uniform(size=30), rng.uniform(size=30))
    rows = [l.split(' | ') for l in reproduction.first_rounds_markdown(longer, base).splitlines()
            if l.startswith('| ') and l[2].isdigit()]
    self.assertEqual([r[:2] for r in rows], [['| 5', 'FedAvg'], ['| 5', 'FedAvg + FedDecorr'],
                                            ['| 6', 'FedAvg (training: 12/50 rounds)']])
    self.assertEqual(rows[0][2:], ['1-30', '30 of 30', '0.00', '30 of 30 |'])
    largest = 100 * np.max(np.abs(acc - archived['feddecorr', '5'][0]))
    self.assertEqual(rows[1][2:], ['1-30', '7 of 30', f'{largest:.2f}', '6 of 30 |'])
    self.assertEqual(rows[2][2:], ['1-12', '12 of 12', '0.00', '12 of 12 |'])

  def test_nothing_to_compare(self):
    self.assertIn('No run', reproduction.first_rounds_markdown({}, {}))


class FromScratchFlagTest(absltest.TestCase):

  def test_refused_without_a_longer_variant(self):
    for rounds in ('30', '20'):
      with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['reproduction', '--from_scratch', f'--rounds={rounds}'])
        with self.assertRaisesRegex(app.UsageError, f'--from_scratch .*--rounds={rounds}.*'
                                    '--rounds=50'):
          reproduction.main([])


class ContinueFromBaseTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['reproduction_longer_test', '--rounds=50'])

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path
    self.base = os.path.join(self.tmp, 'alpha0.05', 'study')
    cells = []
    for seed in ('5', '6'):
      for method in reproduction.METHODS:
        name = f'cifar10-fedavg-{method}-s{seed}'
        cells.append({'name': name, 'flags': {'seed': seed, 'regularizer': method}})
        run = os.path.join(self.base, 'runs', name)
        _write(os.path.join(run, 'checkpoints', 'round_30', 'state.npz'), f'{name} 30')
        if seed == '5':  # Seed 6's FedAvg + FedDecorr run never finished.
          _write(os.path.join(run, 'summary.json'), '{}')
        elif method == 'none':
          _write(os.path.join(run, 'summary.json'), '{}')
    _write(os.path.join(self.base, 'study.json'), json.dumps({'cells': cells}))
    self.runs = os.path.join(self.tmp, 'alpha0.05-r50', 'study', 'runs')

  def test_names_the_longer_variant(self):
    self.assertEqual(reproduction.variant(), 'alpha0.05-r50')
    self.assertEqual(reproduction.base_variant(), 'alpha0.05')

  def test_copies_both_runs_of_the_seed_once(self):
    reproduction.continue_from_base('5', self.base, self.runs)
    self.assertEqual(sorted(os.listdir(self.runs)),
                     ['cifar10-fedavg-feddecorr-s5', 'cifar10-fedavg-none-s5'])
    state = os.path.join(self.runs, 'cifar10-fedavg-none-s5', 'checkpoints', 'round_30',
                         'state.npz')
    with open(state) as f:
      self.assertEqual(f.read(), 'cifar10-fedavg-none-s5 30')
    _write(state, 'trained on')  # The longer study's own progress is never overwritten.
    reproduction.continue_from_base('5', self.base, self.runs)
    with open(state) as f:
      self.assertEqual(f.read(), 'trained on')

  def test_refuses_a_seed_whose_run_did_not_finish(self):
    with self.assertRaisesRegex(SystemExit, r'seed 6, FedAvg \+ FedDecorr: no finished 30-round'):
      reproduction.continue_from_base('6', self.base, self.runs)

  def test_refuses_a_seed_the_machine_no_longer_has(self):
    with self.assertRaisesRegex(SystemExit, 'seed 0, FedAvg: .*--from_scratch.*leave it out of '
                                '--seeds'):
      reproduction.continue_from_base('0', self.base, self.runs)

  def test_a_finished_run_without_checkpoints_is_not_continued(self):
    # What restore_archived puts back: a finished run's archived files, no checkpoint.
    shutil.rmtree(os.path.join(self.base, 'runs', 'cifar10-fedavg-none-s5', 'checkpoints'))
    with self.assertRaisesRegex(SystemExit, 'seed 5, FedAvg: no finished 30-round'):
      reproduction.continue_from_base('5', self.base, self.runs)
    self.assertFalse(reproduction.continue_from_base('5', self.base, self.runs, from_scratch=True))

  def test_from_scratch_copies_nothing_of_a_seed_without_both_runs(self):
    self.assertFalse(reproduction.continue_from_base('0', self.base, self.runs, from_scratch=True))
    # Seed 6's FedAvg run finished, but its pair did not: neither is copied, so both runs of the
    # seed train the same way.
    self.assertFalse(reproduction.continue_from_base('6', self.base, self.runs, from_scratch=True))
    self.assertFalse(os.path.exists(self.runs))

  def test_from_scratch_still_continues_a_seed_the_machine_has(self):
    self.assertTrue(reproduction.continue_from_base('5', self.base, self.runs, from_scratch=True))
    self.assertEqual(len(os.listdir(self.runs)), 2)


if __name__ == '__main__':
  absltest.main()
