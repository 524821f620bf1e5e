"""bench/accuracy/paired.py against SciPy's paired t-test, Student's table and hand counts."""

import math

from absl.testing import absltest
import numpy as np
from scipy import stats

from bench.accuracy import paired


class PairedEffectTest(absltest.TestCase):

  def test_matches_scipy_ttest_rel(self):
    rng = np.random.default_rng(0)
    for n in (2, 3, 6, 9):
      a = rng.normal(30, 2, n)
      b = a + rng.normal(1, 2, n)
      e = paired.paired_effect(a, b)
      ref = stats.ttest_rel(b, a)
      self.assertAlmostEqual(e.t, ref.statistic, places=10)
      self.assertAlmostEqual(e.p_t, ref.pvalue, places=10)
      self.assertEqual(e.n, n)

  def test_readme_three_seeds(self):
    # The three seeds' gains over rounds 21-30 that docs/reproduction.md reported: t 1.74, p 0.22.
    d = [3.46, -0.10, 2.05]
    e = paired.paired_effect([0.0, 0.0, 0.0], d)
    self.assertAlmostEqual(e.mean, 1.80333333, places=6)
    self.assertAlmostEqual(e.t, 1.74, places=2)
    self.assertAlmostEqual(e.p_t, 0.22, places=2)
    # Student's t table: t_{0.975, 2} = 4.302652729911275.
    half = 4.302652729911275 * np.std(d, ddof=1) / math.sqrt(3)
    self.assertAlmostEqual(e.ci95[0], e.mean - half, places=9)
    self.assertAlmostEqual(e.ci95[1], e.mean + half, places=9)
    # Of the 8 sign patterns, |sum| >= 5.41 for (+,-,+), (+,+,+) and their negations: 4 of 8.
    self.assertEqual(e.p_sign_flip, 0.5)
    self.assertEqual(e.wins, 2)

  def test_sign_flip_all_positive_six_seeds(self):
    # Six positive differences: only all-plus and all-minus reach the observed |sum|: 2/64.
    e = paired.paired_effect(np.zeros(6), [1.0, 2.0, 0.5, 3.0, 1.5, 0.25])
    self.assertAlmostEqual(e.p_sign_flip, 2 / 64)
    self.assertEqual(e.wins, 6)
    self.assertGreater(e.ci95[0], 0)

  def test_one_seed_has_no_spread(self):
    e = paired.paired_effect([1.0], [2.0])
    self.assertEqual(e.differences, (1.0,))
    self.assertTrue(math.isnan(e.p_t))
    self.assertTrue(math.isnan(e.ci95[0]))

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'equal-length'):
      paired.paired_effect([1.0, 2.0], [1.0])
    with self.assertRaisesRegex(ValueError, 'finite'):
      paired.paired_effect([1.0, math.nan], [1.0, 2.0])


if __name__ == '__main__':
  absltest.main()
