"""Regularisers against independent float64 NumPy implementations, edge cases, tracing, XLA."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from tff_decorr import regularizers

SHAPES = [(5, 3), (3, 7), (16, 8), (8, 32), (64, 20), (2, 4)]


# ---- independent NumPy implementations (float64) ----
def np_feddecorr(z):
  n, d = z.shape
  if n == 1:
    return 0.0
  z = z - z.mean(axis=0)
  z = z / np.sqrt(z.var(axis=0, ddof=1) + 1e-8)
  k = z.T @ z
  off = k[~np.eye(d, dtype=bool)]
  return float(np.mean(off ** 2) / n)


def np_feddecorr_paper(z):
  n, d = z.shape
  if n == 1:
    return 0.0
  z = z - z.mean(axis=0)
  z = z / np.sqrt(z.var(axis=0, ddof=1) + 1e-8)
  k = z.T @ z / n
  return float(np.sum(k ** 2) / d ** 2)


def np_uniformity(z):
  n = z.shape[0]
  dists = [np.sum((z[i] - z[j]) ** 2) for i in range(n) for j in range(i + 1, n)]
  if not dists:
    return 0.0
  dists = np.array(dists)
  nz = np.sort(dists[dists != 0])
  sigma = nz[(len(nz) - 1) // 2] if len(nz) else 1.0
  return float(np.mean(np.exp(-dists / sigma)))


def np_variance(logits):
  n, c = logits.shape
  if n == 1:
    return 0.0
  e = np.exp(logits - logits.max(axis=1, keepdims=True))
  p = e / e.sum(axis=1, keepdims=True)
  std = p.std(axis=0, ddof=1)
  gamma = np.eye(c).std(axis=0, ddof=1).mean()
  return float(np.mean(np.maximum(gamma - std, 0.0)))


def np_decov(z):
  zc = z - z.mean(axis=0)
  cov = zc.T @ zc / z.shape[0]
  return float(0.5 * (np.sum(cov ** 2) - np.sum(np.diag(cov) ** 2)))


def np_structured_decov(z, groups=3):
  # Independent of the library's indexing: NumPy's array_split names the groups, and the sum runs
  # over explicit pairs of units in different groups.
  zc = z - z.mean(axis=0)
  cov = zc.T @ zc / z.shape[0]
  d = z.shape[1]
  parts = np.array_split(np.arange(d), min(groups, d))
  group = {int(i): k for k, part in enumerate(parts) for i in part}
  return float(0.5 * sum(cov[i, j] ** 2 for i in range(d) for j in range(d)
                         if group[i] != group[j]))


FUNCS = {
    'feddecorr': (regularizers.feddecorr_loss, np_feddecorr),
    'feddecorr_paper': (regularizers.feddecorr_loss_paper, np_feddecorr_paper),
    'uniformity': (regularizers.uniformity_loss, np_uniformity),
    'variance': (regularizers.variance_loss, np_variance),
    'decov': (regularizers.decov_loss, np_decov),
    'structured_decov': (lambda z: regularizers.structured_decov_loss(z, 3), np_structured_decov),
}


def _inputs(n, d, seed):
  rng = np.random.RandomState(seed)
  # Correlated, shifted, scaled columns so that every term is far from trivial.
  z = rng.randn(n, d) @ rng.randn(d, d) * 0.7 + rng.randn(d) * 2.0
  return z


class MatchesNumpyTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.product(name=sorted(FUNCS), shape=SHAPES)
  def test_random(self, name, shape):
    tf_fn, np_fn = FUNCS[name]
    for seed in range(2):
      z = _inputs(*shape, seed)
      want = np_fn(z)
      self.assertNotEqual(want, 0.0)
      self.assertAllClose(tf_fn(tf.constant(z, tf.float64)).numpy(), want, rtol=1e-9, atol=1e-12)
      self.assertAllClose(tf_fn(tf.constant(z, tf.float32)).numpy(), want, rtol=2e-4, atol=1e-6)

  @parameterized.parameters(sorted(FUNCS))
  def test_single_example_is_zero(self, name):
    tf_fn, np_fn = FUNCS[name]
    z = _inputs(1, 6, 0)
    self.assertEqual(np_fn(z), 0.0)
    self.assertEqual(float(tf_fn(tf.constant(z, tf.float32))), 0.0)

  @parameterized.product(name=sorted(FUNCS), shape=[(6, 4), (3, 9)])
  def test_constant_columns(self, name, shape):
    tf_fn, np_fn = FUNCS[name]
    z = _inputs(*shape, 3)
    z[:, 1] = 2.5
    z[:, -1] = 0.0
    self.assertAllClose(tf_fn(tf.constant(z, tf.float64)).numpy(), np_fn(z), rtol=1e-9,
                        atol=1e-12)

  def test_uniformity_duplicate_rows_and_even_count(self):
    z = _inputs(5, 3, 1)
    z[3] = z[1]  # one zero distance: 9 non-zero distances remain
    z[4] = z[1]  # three zero distances: 7 remain
    self.assertAllClose(regularizers.uniformity_loss(tf.constant(z)).numpy(), np_uniformity(z),
                        rtol=1e-9)
    z = _inputs(4, 3, 2)  # 6 distances: lower middle = 3rd smallest
    d = sorted(np.sum((z[i] - z[j]) ** 2) for i in range(4) for j in range(i + 1, 4))
    want = np.mean(np.exp(-np.array(d) / d[2]))
    self.assertAllClose(regularizers.uniformity_loss(tf.constant(z)).numpy(), want, rtol=1e-9)
    same = np.ones((4, 3))
    self.assertAllClose(regularizers.uniformity_loss(tf.constant(same)).numpy(), 1.0)

  def test_variance_gamma(self):
    # A batch of the C one-hot-like predictions (very large logits): std = gamma, loss = 0;
    # identical predictions: std = 0, loss = gamma = 1/sqrt(C).
    c = 7
    self.assertAllClose(regularizers.variance_loss(tf.constant(60.0 * np.eye(c))).numpy(), 0.0,
                        atol=1e-6)
    self.assertAllClose(regularizers.variance_loss(tf.zeros([5, c])).numpy(), 1 / np.sqrt(c))


class StructuredDeCovTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters((8, 7, 5), (16, 10, 4), (6, 12, 12), (5, 4, 9))
  def test_groups_match_numpy(self, n, d, groups):
    z = _inputs(n, d, 7)
    want = np_structured_decov(z, groups)
    self.assertGreater(want, 0.0)
    got = regularizers.structured_decov_loss(tf.constant(z, tf.float64), groups)
    self.assertAllClose(got.numpy(), want, rtol=1e-9, atol=1e-12)

  def test_one_group_per_unit_is_decov_and_one_group_is_zero(self):
    z = tf.constant(_inputs(9, 6, 2), tf.float64)
    self.assertAllClose(regularizers.structured_decov_loss(z, 6), regularizers.decov_loss(z),
                        rtol=1e-12)
    self.assertAllClose(regularizers.structured_decov_loss(z, 60), regularizers.decov_loss(z),
                        rtol=1e-12)
    self.assertEqual(float(regularizers.structured_decov_loss(z, 1)), 0.0)
    with self.assertRaisesRegex(ValueError, 'groups'):
      regularizers.structured_decov_loss(z, 0)


class GramPathTest(parameterized.TestCase, tf.test.TestCase):
  """The N x N and d x d computations agree at realistic sizes, in float32, with and without a
  known batch size (tf.cond inside a traced function)."""

  @parameterized.parameters(('feddecorr',), ('feddecorr_paper',), ('decov',))
  def test_wide_and_tall_match_numpy(self, name):
    tf_fn, np_fn = FUNCS[name]
    dynamic = tf.function(tf_fn, input_signature=[tf.TensorSpec([None, None], tf.float32)])
    for n, d in [(64, 512), (64, 1280), (200, 64)]:
      z = np.random.RandomState(n + d).randn(n, d) * np.linspace(0.1, 3.0, d) + 1.0
      z[:, :d // 2] += np.random.RandomState(1).randn(n, 1)  # correlated half
      want = np_fn(z)
      for fn in (tf_fn, dynamic):
        self.assertAllClose(fn(tf.constant(z, tf.float32)).numpy(), want, rtol=5e-4,
                            msg=f'{name} N={n} d={d}')


class FedDecorrCheckValuesTest(tf.test.TestCase):

  def test_lower_bound(self):
    rng = np.random.RandomState(0)
    for n, d in [(8, 64), (64, 256), (64, 1280), (5, 6)]:
      bound = (n - 1) * (d - n + 1) / (n * (d - 1))
      for _ in range(3):
        z = rng.randn(n, d) * rng.rand(d) + rng.randn(d)
        self.assertGreaterEqual(float(regularizers.feddecorr_loss(tf.constant(z))), bound - 1e-9)

  def test_lower_bound_attained_by_a_tight_frame(self):
    # Orthonormal basis Q of the centred subspace (N x (N-1)); columns = Q e_j, each repeated
    # d / (N-1) times: equal-norm tight frame, so the correlation spectrum is flat and the bound is
    # attained (up to the 1e-8 epsilon).
    for n, reps in [(5, 2), (9, 4), (64, 2)]:
      d = (n - 1) * reps
      centring = np.eye(n) - 1.0 / n
      q = np.linalg.svd(centring)[0][:, :n - 1]
      z = np.tile(q, (1, reps))
      bound = (n - 1) * (d - n + 1) / (n * (d - 1))
      self.assertAllClose(regularizers.feddecorr_loss(tf.constant(z)).numpy(), bound, rtol=1e-6)

  def test_iid_gaussian(self):
    # E[r_ij^2] = 1/(N-1) for independent Gaussian columns, so E[loss] = (N-1)/N = 0.984 at N=64.
    # (docs/reference.md §1.) Over 5 seeds the values lie within 0.002 of it; the loss is a mean
    # over 1280*1279 correlated terms.
    n, d = 64, 1280
    values = [float(regularizers.feddecorr_loss(
        tf.constant(np.random.RandomState(s).randn(n, d), tf.float32))) for s in range(3)]
    for v in values:
      self.assertAllClose(v, (n - 1) / n, atol=3e-3)

  def test_paper_form_ratio(self):
    z = _inputs(16, 24, 5)
    ref = float(regularizers.feddecorr_loss(tf.constant(z)))
    paper = float(regularizers.feddecorr_loss_paper(tf.constant(z)))
    zs = (z - z.mean(0)) / np.sqrt(z.var(0, ddof=1) + 1e-8)
    s = np.sum((zs.T @ zs / 15) ** 2)
    n, d = z.shape
    self.assertAllClose(ref / paper, n * d * (s - d) / ((d - 1) * s), rtol=1e-6)


class GradientAndTracingTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(sorted(FUNCS))
  def test_gradients_finite(self, name):
    tf_fn, _ = FUNCS[name]
    for n in (1, 2, 6):
      z = _inputs(n, 5, 4).astype(np.float32)
      z[:, 2] = 1.0  # constant column
      z = tf.Variable(z)
      with tf.GradientTape() as tape:
        loss = tf_fn(z)
      g = tape.gradient(loss, z)
      self.assertIsNotNone(g)
      self.assertTrue(np.all(np.isfinite(g.numpy())), f'{name} N={n}: {g.numpy()}')

  @parameterized.parameters((6, 4), (3, 7))  # N > d: d x d Gram matrix; N < d: N x N.
  def test_gradient_flows_through_mean_and_variance(self, n, d):
    # Compare the autodiff gradient with central finite differences (float64).
    z0 = _inputs(n, d, 7)
    for name in ('feddecorr', 'feddecorr_paper', 'decov', 'uniformity', 'variance'):
      tf_fn, np_fn = FUNCS[name]
      z = tf.Variable(z0)
      with tf.GradientTape() as tape:
        loss = tf_fn(z)
      g = tape.gradient(loss, z).numpy()
      num = np.zeros_like(z0)
      h = 1e-6
      for idx in np.ndindex(*z0.shape):
        zp, zm = z0.copy(), z0.copy()
        zp[idx] += h
        zm[idx] -= h
        num[idx] = (np_fn(zp) - np_fn(zm)) / (2 * h)
      self.assertAllClose(g, num, rtol=1e-4, atol=1e-7, msg=name)

  @parameterized.parameters(False, True)
  def test_dynamic_batch_and_xla(self, jit):
    for name, (tf_fn, np_fn) in sorted(FUNCS.items()):
      fn = tf.function(tf_fn, jit_compile=jit,
                       input_signature=[tf.TensorSpec([None, 6], tf.float32)])

      def with_grad(z, fn=fn):
        with tf.GradientTape() as tape:
          tape.watch(z)
          loss = fn(z)
        return loss, tape.gradient(loss, z)

      for n in (1, 2, 7, 13):
        z = _inputs(n, 6, n).astype(np.float32)
        loss, g = with_grad(tf.constant(z))
        self.assertAllClose(loss.numpy(), np_fn(z.astype(np.float64)), rtol=5e-4, atol=1e-6,
                            msg=f'{name} N={n} jit={jit}')
        self.assertTrue(np.all(np.isfinite(g.numpy())))
      self.assertEqual(fn.experimental_get_tracing_count(), 1, name)

  def test_jit_gradient_in_a_train_step(self):
    # The use the client loop makes of it: CE + reg inside one jit-compiled function.
    dense = tf.keras.layers.Dense(8)
    dense.build((None, 4))

    @tf.function(jit_compile=True)
    def step(x):
      with tf.GradientTape() as tape:
        z = dense(x)
        loss = regularizers.get('feddecorr', beta=0.1)(z, z)
      return loss, tape.gradient(loss, dense.trainable_variables)

    loss, grads = step(tf.constant(_inputs(9, 4, 0), tf.float32))
    self.assertGreater(float(loss), 0.0)
    for g in grads:
      self.assertTrue(np.all(np.isfinite(g.numpy())))


class RegistryTest(tf.test.TestCase):

  def test_names(self):
    self.assertEqual(set(regularizers.names()),
                     {'none', 'feddecorr', 'feduv', 'decov', 'structured_decov'})

  def test_coefficients_applied(self):
    z = tf.constant(_inputs(8, 5, 0), tf.float32)
    logits = tf.constant(_inputs(8, 3, 1), tf.float32)
    self.assertEqual(float(regularizers.get('none')(z, logits)), 0.0)
    r = regularizers.get('feddecorr', beta=0.3)
    self.assertEqual((r.name, r.coefficients), ('feddecorr', {'beta': 0.3}))
    self.assertAllClose(r(z, logits), 0.3 * regularizers.feddecorr_loss(z))
    self.assertEqual(regularizers.get('feddecorr').coefficients, {'beta': 0.1})
    r = regularizers.get('feduv', lam=2.0, mu=0.25)
    self.assertEqual(r.coefficients, {'lam': 2.0, 'mu': 0.25})
    self.assertAllClose(r(z, logits), 2.0 * regularizers.variance_loss(logits) +
                        0.25 * regularizers.uniformity_loss(z))
    r = regularizers.get('decov', beta=0.5)
    self.assertAllClose(r(z, logits), 0.5 * regularizers.decov_loss(z))
    r = regularizers.get('structured_decov', beta=0.5, groups=2)
    self.assertEqual(r.coefficients, {'beta': 0.5, 'groups': 2})
    self.assertAllClose(r(z, logits), 0.5 * regularizers.structured_decov_loss(z, 2))
    self.assertEqual(regularizers.get('structured_decov').coefficients, {'beta': 0.1, 'groups': 4})
    self.assertEqual(r(z, logits).dtype, tf.float32)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, r'--regularizer.*none, feddecorr, feduv, decov'):
      regularizers.get('fedecorr')
    with self.assertRaisesRegex(ValueError, '--feddecorr_beta'):
      regularizers.get('feddecorr', beta=-0.1)
    with self.assertRaisesRegex(ValueError, '--feduv_mu'):
      regularizers.get('feduv', mu=float('nan'))
    with self.assertRaisesRegex(ValueError, '--feduv_lambda'):
      regularizers.get('feduv', lam=-1.0)
    with self.assertRaisesRegex(ValueError, '--structured_decov_groups'):
      regularizers.get('structured_decov', groups=0)
    # A setting the regulariser does not have is an error, never silently dropped.
    with self.assertRaisesRegex(ValueError, 'feddecorr has no setting.*lam.*--feddecorr_beta'):
      regularizers.get('feddecorr', beta=0.3, lam=9.0)
    with self.assertRaisesRegex(ValueError, 'matrix'):
      regularizers.feddecorr_loss(tf.zeros([2, 3, 4]))


if __name__ == '__main__':
  absltest.main()
