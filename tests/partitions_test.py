"""Client partitions: Dirichlet bit-exact with the reference algorithm, pathological, IID, domain."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_decorr import partitions

# Frozen output of dirichlet_partition(np.arange(1000) % 10, 10, alpha=0.5, seed=0): any change to
# the order of random draws changes these numbers and breaks comparability with the papers' splits.
_GOLDEN = [[0, 5, 0, 0, 59, 23, 0, 14, 0, 0], [6, 7, 0, 26, 2, 2, 22, 1, 6, 44],
           [11, 42, 7, 1, 1, 24, 0, 21, 0, 0], [0, 0, 1, 14, 11, 12, 16, 1, 4, 44],
           [1, 7, 0, 3, 1, 13, 1, 1, 3, 2], [0, 9, 53, 1, 2, 19, 0, 12, 32, 0],
           [16, 2, 1, 28, 1, 1, 1, 2, 35, 5], [2, 0, 1, 0, 3, 4, 56, 14, 10, 5],
           [0, 3, 31, 7, 19, 2, 4, 33, 10, 0], [64, 25, 6, 20, 1, 0, 0, 1, 0, 0]]


def _reference_dirichlet(labels, n_parties, beta, seed, min_require_size=10, num_classes=None):
  """Independent transcription of the published algorithm (docs/reference.md §3), global RNG."""
  np.random.seed(seed)
  n = labels.shape[0]
  min_size = 0
  while min_size < min_require_size:
    idx_batch = [[] for _ in range(n_parties)]
    for k in range(num_classes or int(labels.max()) + 1):
      idx_k = np.where(labels == k)[0]
      np.random.shuffle(idx_k)
      proportions = np.random.dirichlet(np.repeat(beta, n_parties))
      proportions = np.array([p * (len(idx_j) < n / n_parties)
                              for p, idx_j in zip(proportions, idx_batch)])
      proportions = proportions / proportions.sum()
      proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
      idx_batch = [idx_j + idx.tolist()
                   for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
      min_size = min(len(idx_j) for idx_j in idx_batch)
  out = []
  for j in range(n_parties):
    np.random.shuffle(idx_batch[j])
    out.append(idx_batch[j])
  return out


class DirichletTest(parameterized.TestCase):

  def test_golden_counts(self):
    labels = np.arange(1000) % 10
    parts = partitions.dirichlet_partition(labels, 10, 0.5, seed=0)
    self.assertEqual(partitions.class_count_matrix(labels, parts, 10).tolist(), _GOLDEN)

  @parameterized.parameters((0.05, 10, 0), (0.1, 10, 1), (0.5, 20, 2), (5.0, 7, 3))
  def test_bit_exact_with_reference(self, alpha, clients, seed):
    labels = np.random.RandomState(99).randint(0, 10, size=3000)
    ours = partitions.dirichlet_partition(labels, clients, alpha, seed=seed)
    ref = _reference_dirichlet(labels, clients, alpha, seed)
    self.assertLen(ours, clients)
    for a, b in zip(ours, ref):
      np.testing.assert_array_equal(a, np.asarray(b))

  def test_absent_classes_still_consume_draws(self):
    # The reference loops over k = 0..K-1 with K fixed by the dataset: a class with no examples
    # still costs a shuffle and a Dirichlet draw. Class 3 missing in the middle, and class 10
    # missing at the end (only `num_classes` can say it exists).
    labels = np.random.RandomState(5).randint(0, 10, size=2000)
    labels = labels[labels != 3]
    for num_classes in (None, 11):
      ours = partitions.dirichlet_partition(labels, 8, 0.3, seed=4, num_classes=num_classes)
      ref = _reference_dirichlet(labels, 8, 0.3, 4, num_classes=num_classes)
      for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, np.asarray(b))
    # Skipping the absent classes would give a different split.
    self.assertFalse(all(
        np.array_equal(a, b) for a, b in zip(
            partitions.dirichlet_partition(labels, 8, 0.3, seed=4),
            partitions.dirichlet_partition(labels, 8, 0.3, seed=4, num_classes=11))))
    with self.assertRaisesRegex(ValueError, 'num_classes'):
      partitions.dirichlet_partition(labels, 8, 0.3, num_classes=5)

  def test_sizes_cover_everything_once_and_min_size(self):
    labels = np.random.RandomState(0).randint(0, 10, size=2000)
    parts = partitions.dirichlet_partition(labels, 10, 0.1, seed=5)
    flat = np.concatenate(parts)
    self.assertLen(flat, 2000)
    self.assertLen(np.unique(flat), 2000)
    self.assertGreaterEqual(min(len(p) for p in parts), 10)

  def test_deterministic_and_restores_global_rng(self):
    labels = np.arange(500) % 5
    np.random.seed(123)
    before = np.random.rand()
    np.random.seed(123)
    a = partitions.dirichlet_partition(labels, 5, 0.3, seed=7)
    after = np.random.rand()
    self.assertEqual(before, after)
    b = partitions.dirichlet_partition(labels, 5, 0.3, seed=7)
    c = partitions.dirichlet_partition(labels, 5, 0.3, seed=8)
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
    self.assertFalse(all(len(x) == len(y) and np.all(x == y) for x, y in zip(a, c)))

  def test_heterogeneity_grows_as_alpha_falls(self):
    labels = np.arange(5000) % 10

    def mean_entropy(alpha):
      parts = partitions.dirichlet_partition(labels, 10, alpha, seed=0)
      counts = partitions.class_count_matrix(labels, parts, 10).astype(float)
      p = counts / counts.sum(1, keepdims=True)
      return float(np.mean(-np.sum(np.where(p > 0, p * np.log(p), 0), 1)))
    entropies = [mean_entropy(a) for a in (0.05, 0.5, 5.0)]
    self.assertLess(entropies[0], entropies[1])
    self.assertLess(entropies[1], entropies[2])

  def test_inf_alpha_is_iid(self):
    parts = partitions.dirichlet_partition(np.arange(100) % 10, 4, float('inf'), seed=0)
    self.assertEqual(sorted(len(p) for p in parts), [25, 25, 25, 25])

  def test_errors_name_the_flag(self):
    labels = np.arange(100) % 10
    with self.assertRaisesRegex(ValueError, '--dirichlet_alpha'):
      partitions.dirichlet_partition(labels, 5, 0.0)
    with self.assertRaisesRegex(ValueError, '--dirichlet_alpha'):
      partitions.dirichlet_partition(labels, 5, -1.0)
    with self.assertRaisesRegex(ValueError, '--num_clients'):
      partitions.dirichlet_partition(labels, 101, 0.5)
    with self.assertRaisesRegex(ValueError, '--num_clients'):
      partitions.dirichlet_partition(labels, 20, 0.5)  # 20 clients x 10 > 100 examples.
    with self.assertRaisesRegex(ValueError, 'larger --dirichlet_alpha'):
      partitions.dirichlet_partition(np.arange(200) % 10, 18, 0.01, max_tries=5)
    with self.assertRaisesRegex(ValueError, 'labels must be integers >= 0'):
      partitions.dirichlet_partition(np.arange(100) % 10 - 1, 5, 0.5)
    with self.assertRaisesRegex(ValueError, 'labels must be integers >= 0'):
      partitions.dirichlet_partition(np.linspace(0, 9, 100), 5, 0.5)


class OtherPartitionsTest(absltest.TestCase):

  def test_pathological(self):
    labels = np.arange(1000) % 10
    parts = partitions.pathological_partition(labels, 10, 3, seed=0)
    counts = partitions.class_count_matrix(labels, parts, 10)
    for i, row in enumerate(counts):
      self.assertEqual(int(np.count_nonzero(row)), 3)
      self.assertGreater(row[i % 10], 0)
    flat = np.concatenate(parts)
    self.assertLen(np.unique(flat), len(flat))
    with self.assertRaisesRegex(ValueError, '--pathological_classes_per_client'):
      partitions.pathological_partition(labels, 10, 11)
    with self.assertRaisesRegex(ValueError, '--pathological_classes_per_client'):
      partitions.pathological_partition(labels, 10, 0)

  def test_pathological_classes_nobody_holds(self):
    # 3 clients x 2 classes cover at most 6 of 10 classes: the rest are left out and reported.
    labels = np.arange(1000) % 10
    parts = partitions.pathological_partition(labels, 3, 2, seed=1)
    held = sorted(set(labels[np.concatenate(parts)].tolist()))
    missing = partitions.unassigned_classes(labels, parts)
    self.assertEqual(sorted(held + missing), list(range(10)))
    self.assertGreaterEqual(len(missing), 4)
    # Each held class is split evenly (within one example) among its holders.
    counts = partitions.class_count_matrix(labels, parts, 10)
    for k in held:
      col = counts[:, k][counts[:, k] > 0]
      self.assertEqual(int(col.sum()), 100)
      self.assertLessEqual(int(col.max() - col.min()), 1)

  def test_iid_is_the_reference_permutation(self):
    # The reference: np.random.seed(seed); np.random.permutation(n); np.array_split.
    np.random.seed(3)
    ref = np.array_split(np.random.permutation(250), 7)
    for a, b in zip(partitions.iid_partition(250, 7, seed=3), ref):
      np.testing.assert_array_equal(a, b)

  def test_iid_and_domain(self):
    parts = partitions.iid_partition(103, 10, seed=1)
    self.assertLen(np.unique(np.concatenate(parts)), 103)
    self.assertLessEqual(max(map(len, parts)) - min(map(len, parts)), 1)
    domains = np.array([2, 0, 1, 0, 2, 2])
    d = partitions.domain_partition(domains)
    self.assertEqual([x.tolist() for x in d], [[1, 3], [2], [0, 4, 5]])
    with self.assertRaisesRegex(ValueError, '--num_clients'):
      partitions.iid_partition(5, 6)


if __name__ == '__main__':
  absltest.main()
