"""Paired comparison of two methods over seeds: the statistics a reviewer asks of a claim.

Each seed runs both methods on the same partition, data order and initial model, so the seeds'
differences are the sample, and the question is whether their mean is away from zero.
bench/accuracy/reproduction.py's `--figures` reports these for docs/reproduction.md and the README.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence, Tuple

import numpy as np
from scipy import stats


@dataclasses.dataclass(frozen=True)
class PairedEffect:
  """The effect of method B over method A, paired by seed.

  Attributes:
    differences: B - A, one per seed, in the order given.
    mean: the mean difference.
    std: the differences' sample standard deviation (ddof 1; nan for one seed).
    t: the paired t statistic, mean / (std / sqrt(n)) (nan for fewer than two seeds, inf when
      every difference is the same nonzero value).
    p_t: two-sided p-value of the paired t-test with n - 1 degrees of freedom.
    ci95: the 95 % confidence interval of the mean difference from Student's t.
    p_sign_flip: two-sided p-value of the exact sign-flip (permutation) test: the share of the
      2**n sign patterns of the differences whose mean is at least as far from zero. It assumes
      only that each difference is symmetric about zero under the null, not normality.
    wins: seeds on which B is above A.
  """
  differences: Tuple[float, ...]
  mean: float
  std: float
  t: float
  p_t: float
  ci95: Tuple[float, float]
  p_sign_flip: float
  wins: int

  @property
  def n(self) -> int:
    return len(self.differences)


def paired_effect(a: Sequence[float], b: Sequence[float]) -> PairedEffect:
  """B's effect over A from per-seed values in the same seed order.

  Args:
    a: method A's value on each seed.
    b: method B's value on each seed, in the same order.

  Returns:
    The PairedEffect of B - A.

  Raises:
    ValueError: if the sequences differ in length, are empty, or hold a non-finite value.
  """
  a = np.asarray(a, dtype=np.float64)
  b = np.asarray(b, dtype=np.float64)
  if a.shape != b.shape or a.ndim != 1 or not a.size:
    raise ValueError(f'paired_effect needs two equal-length, non-empty sequences; got shapes '
                     f'{a.shape} and {b.shape}.')
  if not (np.isfinite(a).all() and np.isfinite(b).all()):
    raise ValueError('paired_effect: every value must be finite.')
  d = b - a
  n = d.size
  mean = float(d.mean())
  if n < 2:
    return PairedEffect(tuple(d.tolist()), mean, math.nan, math.nan, math.nan,
                        (math.nan, math.nan), math.nan, int((d > 0).sum()))
  std = float(d.std(ddof=1))
  se = std / math.sqrt(n)
  df = n - 1
  if se > 0:
    t = mean / se
    p_t = float(2 * stats.t.sf(abs(t), df))
  else:  # Every seed moved by the same amount: no spread to test against.
    t = math.copysign(math.inf, mean) if mean else math.nan
    p_t = 0.0 if mean else 1.0
  half = float(stats.t.ppf(0.975, df)) * se
  # Exact over all 2**n sign patterns (64 at six seeds); a small tolerance so that patterns whose
  # mean equals the observed one in exact arithmetic are counted despite rounding.
  observed = abs(d.sum())
  extreme = sum(abs(float(np.dot(signs, d))) >= observed - 1e-12 * max(1.0, observed)
                for signs in itertools.product((1.0, -1.0), repeat=n))
  return PairedEffect(tuple(d.tolist()), mean, std, t, p_t, (mean - half, mean + half),
                      extreme / 2 ** n, int((d > 0).sum()))
