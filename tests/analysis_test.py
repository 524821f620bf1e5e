"""Tests of tff_decorr/collapse/analysis.py, tff_decorr/collapse/plots.py and bin/analyze.py."""

import collections
import csv
import json
import math
import os

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tff_decorr.bin import analyze
from tests import testutil
from tff_decorr.collapse import analysis
from tff_decorr.run_files import export
from tff_decorr.collapse import plots

_INPUT_SHAPE = (8, 8, 3)
_REP_DIM = 6
_NUM_CLASSES = 3
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _known_spectrum_data(n, d, variances, offset=0.0, seed=0):
  """z [n, d] whose population covariance has exactly the eigenvalues `variances` (then zeros).

  z = A diag(sqrt(v)) Q^T + offset, with A's columns centred and orthogonal with A^T A = n I, and Q
  [d, r] orthonormal, so Sigma = (1/n) (z - mean)^T (z - mean) = Q diag(v) Q^T.
  """
  rng = np.random.default_rng(seed)
  r = len(variances)
  a = rng.normal(size=(n, r))
  a -= a.mean(axis=0)
  a, _ = np.linalg.qr(a)  # Orthonormal columns, still centred (they span centred vectors).
  a *= math.sqrt(n)
  q, _ = np.linalg.qr(rng.normal(size=(d, r)))
  return a @ np.diag(np.sqrt(variances)) @ q.T + offset


def _tiny_model():
  images = tf.keras.Input(_INPUT_SHAPE)
  x = tf.keras.layers.Conv2D(8, 3, activation='relu')(images)
  x = tf.keras.layers.GlobalAveragePooling2D()(x)
  rep = tf.keras.layers.Dense(_REP_DIM, activation='relu', name='representation')(x)
  logits = tf.keras.layers.Dense(_NUM_CLASSES, name='logits')(rep)
  return tf.keras.Model(images, {'representation': rep, 'logits': logits})


class _Serving(tf.Module):
  """The export contract: serving_default(images=[N, H, W, C] float32) -> logits, representation."""

  def __init__(self, model):
    super().__init__()
    self.model = model

  @tf.function(input_signature=[tf.TensorSpec([None, *_INPUT_SHAPE], tf.float32, name='images')])
  def serve(self, images):
    out = self.model(images, training=False)
    return {'logits': out['logits'], 'representation': out['representation']}


def _save(model, path):
  module = _Serving(model)
  tf.saved_model.save(module, path, signatures={'serving_default': module.serve})
  return path


class StatsTest(absltest.TestCase):

  def test_streaming_equals_numpy_population_covariance(self):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(1000, 50)) * rng.uniform(0.1, 3, size=50) + 500.0  # Large mean.
    stats = analysis.RepresentationStats()
    start = 0
    for size in [1, 0, 63, 64, 200, 7, 665]:  # Uneven batches, an empty one, tf and np.
      batch = z[start:start + size]
      stats.add(tf.constant(batch, tf.float64) if size % 2 else batch)
      start += size
    self.assertEqual(start, 1000)
    self.assertEqual(stats.count, 1000)
    np.testing.assert_allclose(stats.mean(), z.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.covariance(), np.cov(z.T, bias=True), rtol=1e-9, atol=1e-12)

  def test_covariance_divides_by_n(self):
    stats = analysis.RepresentationStats().add(np.array([[0.0], [2.0]]))
    self.assertEqual(stats.covariance()[0, 0], 1.0)  # 1/(N-1) would give 2.

  def test_bad_batches(self):
    stats = analysis.RepresentationStats()
    with self.assertRaisesRegex(ValueError, 'No representations'):
      stats.covariance()
    stats.add(np.zeros((3, 4)))
    with self.assertRaisesRegex(ValueError, 'dimension 5 but earlier batches had 4'):
      stats.add(np.zeros((3, 5)))
    with self.assertRaisesRegex(ValueError, r'\[n, d\] matrix'):
      stats.add(np.zeros((3, 4, 1)))
    with self.assertRaisesRegex(ValueError, 'NaN'):
      stats.add(np.full((2, 4), np.nan))


class SpectrumTest(absltest.TestCase):

  def test_known_rank_and_spectrum(self):
    variances = [4.0, 2.0, 1.0, 0.5, 0.25, 0.12, 0.06]  # Rank 7, smallest/largest = 0.015.
    z = _known_spectrum_data(600, 40, variances, offset=30.0)
    stats = analysis.RepresentationStats()
    for i in range(0, 600, 64):
      stats.add(z[i:i + 64].astype(np.float32).astype(np.float64))
    sv = analysis.singular_values(stats.covariance())
    self.assertEqual(sv.shape, (40,))
    self.assertTrue(np.all(np.diff(sv) <= 0))
    self.assertTrue(np.all(sv >= 0))
    np.testing.assert_allclose(sv[:7], variances, rtol=1e-4)
    self.assertLess(sv[7], 1e-8)  # float32 rounding of z only.
    self.assertEqual(analysis.num_significant(sv, -2.0, normalize=True), 7)
    self.assertEqual(analysis.num_significant(sv, -2.0, normalize=False), 7)
    # A threshold between the 5th (0.25/4) and 6th (0.12/4) normalised values.
    self.assertEqual(analysis.num_significant(sv, math.log10(0.05), normalize=True), 5)

  def test_singular_values_clips_and_validates(self):
    sv = analysis.singular_values(np.array([[1.0, 0.0], [0.0, -1e-17]]))
    np.testing.assert_array_equal(sv, [1.0, 0.0])
    with self.assertRaisesRegex(ValueError, 'square'):
      analysis.singular_values(np.zeros((2, 3)))

  def test_num_significant_normalisation(self):
    sv = np.array([100.0, 5.0, 0.5, 0.001])
    self.assertEqual(analysis.num_significant(sv, -2.0, normalize=True), 2)
    self.assertEqual(analysis.num_significant(sv, -2.0, normalize=False), 3)
    # Normalised counts ignore the representation's scale; absolute counts do not.
    self.assertEqual(analysis.num_significant(sv * 1e-3, -2.0, normalize=True), 2)
    self.assertEqual(analysis.num_significant(sv * 1e-3, -2.0, normalize=False), 1)
    self.assertEqual(analysis.num_significant(np.zeros(4), normalize=True), 0)
    with self.assertRaisesRegex(ValueError, 'non-negative'):
      analysis.num_significant(np.array([1.0, -1.0]))

  def test_effective_rank(self):
    self.assertAlmostEqual(analysis.effective_rank([2.0] * 5 + [0.0] * 11), 5.0, places=12)
    self.assertAlmostEqual(analysis.effective_rank([7.0, 0.0, 0.0]), 1.0, places=12)
    # p = (0.75, 0.25): H = 0.5623351446, exp(H) = 1.7547654.
    self.assertAlmostEqual(analysis.effective_rank([3.0, 1.0]), 1.7547654, places=6)
    self.assertEqual(analysis.effective_rank(np.zeros(3)), 0.0)
    sv = analysis.singular_values(np.cov(_known_spectrum_data(300, 20, [1.0] * 4).T, bias=True))
    self.assertAlmostEqual(analysis.effective_rank(sv), 4.0, places=6)

  def test_local_global_gap(self):
    local = np.array([10.0, 5.0, 1.0, 0.1])
    self.assertEqual(analysis.local_global_gap(local, local.copy()), 0.0)
    self.assertAlmostEqual(analysis.local_global_gap(local, local / math.e), 1.0, places=12)
    lower = np.array([10.0, 2.0, 0.1, 0.001])
    r = analysis.local_global_gap(local, lower)
    self.assertAlmostEqual(r, (0 + math.log(2.5) + math.log(10) + math.log(100)) / 4, places=12)
    self.assertGreater(r, 0)
    self.assertLess(analysis.local_global_gap(lower, local), 0)
    self.assertAlmostEqual(analysis.local_global_gap(local, lower, k=2), math.log(2.5) / 2,
                           places=12)
    # Unsorted input is sorted; zeros in both spectra at the same rank contribute 0.
    self.assertAlmostEqual(analysis.local_global_gap([0.0, 4.0, 2.0], [1.0, 2.0, 0.0]),
                           (math.log(2) + math.log(2)) / 3, places=12)
    # A zero against a non-zero value is finite: floored at rel_floor * largest value.
    r = analysis.local_global_gap([1.0, 1.0], [1.0, 0.0], rel_floor=1e-6)
    self.assertAlmostEqual(r, math.log(1e6) / 2, places=9)
    self.assertEqual(analysis.local_global_gap(np.zeros(3), np.zeros(3)), 0.0)
    # normalize=True compares shapes only.
    self.assertAlmostEqual(analysis.local_global_gap(local, local * 0.01, normalize=True), 0.0)
    with self.assertRaisesRegex(ValueError, r'k must be an integer in \[1, 3\]'):
      analysis.local_global_gap(local, local[:3], k=4)

  def test_spectrum_summary_is_json(self):
    sv = np.array([4.0, 1.0, 0.01, 0.0])
    summary = analysis.spectrum_summary(sv, -1.0, top=3)
    self.assertEqual(json.loads(json.dumps(summary)), summary)
    self.assertEqual(summary['top'], [4.0, 1.0, 0.01])
    self.assertAlmostEqual(summary['top_log10'][2], -2.0)
    self.assertEqual(summary['num_significant_normalized'], 2)
    self.assertEqual(summary['num_significant_absolute'], 2)
    self.assertEqual(summary['num_nonzero'], 3)
    self.assertEqual(summary['dim'], 4)
    # Closed form by hand: p = (4, 1, 0.01) / 5.01 (the zero contributes nothing),
    # erank = exp(-sum p_k ln p_k).
    p = np.array([4.0, 1.0, 0.01]) / 5.01
    self.assertAlmostEqual(summary['effective_rank'], math.exp(-(
        p[0] * math.log(p[0]) + p[1] * math.log(p[1]) + p[2] * math.log(p[2]))), places=12)


class ProbeTest(absltest.TestCase):
  """analysis.nearest_class_mean_probe against a brute-force NumPy probe on known clusters."""

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(3)
    # 4 classes; class 3 has no train example. Centres of unequal norms, so dropping a mean's
    # squared norm from the distance changes the answer; spread wide enough that some test points
    # sit nearer another class's mean.
    centres = np.array([[0.0, 0, 0, 0], [3, 0, 0, 0], [0, 6, 1, 0], [1, 1, 1, 1]])
    self.train_y = rng.choice(3, size=61)
    self.test_y = rng.choice(4, size=37)
    self.train_z = centres[self.train_y] + rng.normal(scale=1.6, size=(61, 4))
    self.test_z = centres[self.test_y] + rng.normal(scale=1.6, size=(37, 4))
    self.w = rng.normal(size=(4, 4))  # The "head": logits = z W.

  def fn(self, images):  # The images are the representations themselves.
    z = tf.convert_to_tensor(images, tf.float32)
    return {'representation': z, 'logits': tf.matmul(z, tf.constant(self.w, tf.float32))}

  def data(self, z, y, batch):
    return tf.data.Dataset.from_tensor_slices((z.astype(np.float32), y)).batch(batch)

  def test_equals_brute_force_numpy(self):
    got = analysis.nearest_class_mean_probe(self.fn, self.data(self.train_z, self.train_y, 7),
                                            self.data(self.test_z, self.test_y, 5), 4)
    train = self.train_z.astype(np.float32).astype(np.float64)
    test = self.test_z.astype(np.float32).astype(np.float64)
    means = np.stack([train[self.train_y == c].mean(0) for c in range(3)])
    dist = np.linalg.norm(test[:, None, :] - means[None], axis=2)
    want_probe = np.mean(dist.argmin(1) == self.test_y)
    head = (test @ self.w.astype(np.float32).astype(np.float64)).argmax(1)
    self.assertAlmostEqual(got['nearest_class_mean_accuracy'], want_probe, places=12)
    self.assertAlmostEqual(got['head_accuracy'], np.mean(head == self.test_y), places=12)
    self.assertEqual(got['head_predictions_per_class'], np.bincount(head, minlength=4).tolist())
    self.assertAlmostEqual(got['largest_predicted_class_share'],
                           np.bincount(head, minlength=4).max() / 37)
    self.assertEqual((got['train_examples'], got['test_examples']), (61, 37))
    self.assertEqual(got['classes_without_train_examples'], [3])
    # The data make the probe informative and imperfect, so the check above has teeth.
    self.assertTrue(0.4 < want_probe < 1.0, want_probe)

  def test_max_examples_caps_each_split(self):
    got = analysis.nearest_class_mean_probe(self.fn, self.data(self.train_z, self.train_y, 7),
                                            self.data(self.test_z, self.test_y, 5), 4,
                                            max_examples=20)
    train, test = self.train_z[:20], self.test_z[:20]
    present = sorted(set(self.train_y[:20].tolist()))
    means = np.stack([train[self.train_y[:20] == c].mean(0) for c in present])
    nearest = np.array(present)[np.linalg.norm(test[:, None] - means[None], axis=2).argmin(1)]
    self.assertEqual((got['train_examples'], got['test_examples']), (20, 20))
    self.assertAlmostEqual(got['nearest_class_mean_accuracy'],
                           np.mean(nearest == self.test_y[:20]), places=12)

  def test_bad_input(self):
    train, test = self.data(self.train_z, self.train_y, 7), self.data(self.test_z, self.test_y, 5)
    with self.assertRaisesRegex(ValueError, 'labels outside'):
      analysis.nearest_class_mean_probe(self.fn, train, test, 3)  # Test labels include 3.
    with self.assertRaisesRegex(ValueError, 'num_classes'):
      analysis.nearest_class_mean_probe(self.fn, train, test, 1)
    with self.assertRaisesRegex(ValueError, 'labelled data'):
      analysis.nearest_class_mean_probe(self.fn, train.map(lambda x, y: x), test, 4)
    with self.assertRaisesRegex(ValueError, 'logits'):
      analysis.nearest_class_mean_probe(lambda x: {'representation': x}, train, test, 4)


class PlotsTest(absltest.TestCase):

  def _assert_png(self, path):
    self.assertTrue(os.path.isfile(path))
    self.assertGreater(os.path.getsize(path), 1000)
    with open(path, 'rb') as f:
      self.assertEqual(f.read(8), _PNG_MAGIC)

  def test_plots_written(self):
    tmp = self.create_tempdir().full_path
    sv = np.geomspace(10, 1e-6, 150)
    path = os.path.join(tmp, 'new', 'dir', 'spectra.png')
    self.assertEqual(plots.plot_spectra({'fedavg': sv, 'feddecorr': np.append(sv[:20], [0.0] * 5)},
                                        path, top=100, title='t'), path)
    self._assert_png(path)
    path = os.path.join(tmp, 'lg', 'local_vs_global.png')
    self.assertEqual(plots.plot_local_vs_global(sv, sv / 3, path, math.log(3)), path)
    self._assert_png(path)
    with self.assertRaisesRegex(ValueError, 'at least one'):
      plots.plot_spectra({}, path)


class SavedModelTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tf.keras.utils.set_random_seed(0)
    cls.model = _tiny_model()
    cls.images = np.random.default_rng(0).normal(size=(50, *_INPUT_SHAPE)).astype(np.float32)
    labels = np.arange(50) % _NUM_CLASSES
    cls.dataset = tf.data.Dataset.from_tensor_slices((cls.images, labels)).batch(16)
    cls.run_dir = os.path.join(cls.tmp, 'run_a')
    _save(cls.model, os.path.join(cls.run_dir, 'export', 'saved_model'))
    cls.other_model = _tiny_model()
    cls.plain_dir = _save(cls.other_model, os.path.join(cls.tmp, 'model_b'))
    reps = cls.model(cls.images, training=False)['representation'].numpy().astype(np.float64)
    cls.expected_cov = np.cov(reps.T, bias=True)

  def test_representation_covariance_paths(self):
    loaded = tf.saved_model.load(os.path.join(self.run_dir, 'export', 'saved_model'))
    for model_or_fn in [self.model, loaded, loaded.signatures['serving_default']]:
      cov = analysis.representation_covariance(model_or_fn, self.dataset)
      np.testing.assert_allclose(cov, self.expected_cov, rtol=1e-5, atol=1e-9)
    images_only = self.dataset.map(lambda x, y: x)
    cov = analysis.representation_covariance(loaded.signatures['serving_default'], images_only)
    np.testing.assert_allclose(cov, self.expected_cov, rtol=1e-5, atol=1e-9)
    stats = analysis.representation_stats(self.model, self.dataset, max_examples=20)
    self.assertEqual(stats.count, 20)
    reps = self.model(self.images[:20], training=False)['representation'].numpy()
    np.testing.assert_allclose(stats.covariance(), np.cov(reps.T.astype(np.float64), bias=True),
                               rtol=1e-5, atol=1e-9)
    with self.assertRaisesRegex(ValueError, 'key "representation"'):
      analysis.representation_covariance(lambda x: {'logits': x}, self.dataset)

  def test_a_wrong_argument_is_named_with_what_is_expected(self):
    features = self.model(self.images, training=False)['representation']
    expected = (r"takes \(model_or_fn, dataset\): a Keras model .* 'representation' entry, and a "
                r'batched tf.data.Dataset')
    for call in (lambda: analysis.representation_covariance(features),  # Features, no model.
                 lambda: analysis.representation_covariance(features.numpy(), self.dataset),
                 lambda: analysis.representation_stats(features),
                 lambda: analysis.nearest_class_mean_probe(features, self.dataset, self.dataset,
                                                           10)):
      with self.assertRaisesRegex(TypeError, expected):
        call()
    with self.assertRaisesRegex(TypeError, r'RepresentationStats\(\).add\(features\)'):
      analysis.representation_covariance(features.numpy())
    with self.assertRaisesRegex(TypeError, r'as dataset: batch it, e.g. '
                                r'tf.data.Dataset.from_tensor_slices'):
      analysis.representation_covariance(self.model, self.images)
    with self.assertRaisesRegex(TypeError, 'dataset is missing'):
      analysis.representation_covariance(self.model)
    # What the message proposes for features already computed gives the covariance.
    np.testing.assert_allclose(analysis.RepresentationStats().add(features).covariance(),
                               self.expected_cov, rtol=1e-5, atol=1e-9)

  def test_analyze_writes_outputs(self):
    # Foreign SavedModels (the export contract, without tff_decorr's metadata): trusted.
    models = analyze.load_models([self.run_dir, self.plain_dir], trust_saved_model=True)
    self.assertEqual(list(models), ['run_a', 'model_b'])
    out = os.path.join(self.tmp, 'out')
    written = analyze.analyze(models, self.dataset, out, local=models['model_b'],
                              global_=models['run_a'], log10_tau=-2.0, top=4, gap_k=5,
                              probe=(self.dataset, _NUM_CLASSES))
    for kind in ['spectra_png', 'local_vs_global_png']:
      with open(written[kind], 'rb') as f:
        self.assertEqual(f.read(8), _PNG_MAGIC)
    # Independent of analysis.py: NumPy's SVD of the NumPy covariance, and the closed forms of the
    # effective rank (exp of the entropy of sv / sum sv) and of R (mean log ratio of the top k).
    expected_sv = np.linalg.svd(self.expected_cov, compute_uv=False)
    with open(written['spectra_csv']) as f:
      rows = list(csv.reader(f))
    self.assertEqual(rows[0], ['index', 'run_a', 'model_b'])
    self.assertLen(rows, 1 + _REP_DIM)
    np.testing.assert_allclose([float(r[1]) for r in rows[1:]], expected_sv, rtol=1e-5, atol=1e-12)
    with open(written['summary_json']) as f:
      summary = json.load(f)
    run = summary['runs']['run_a']
    self.assertEqual(run['examples'], 50)
    self.assertLen(run['top'], 4)
    p = expected_sv[expected_sv > 1e-12 * expected_sv[0]] / expected_sv.sum()
    self.assertAlmostEqual(run['effective_rank'], math.exp(-np.sum(p * np.log(p))), places=4)
    # The probe through the SavedModel: the Keras model's own outputs, in NumPy.
    out_a = self.model(self.images, training=False)
    reps = out_a['representation'].numpy().astype(np.float64)
    labels = np.arange(50) % _NUM_CLASSES
    means = np.stack([reps[labels == c].mean(0) for c in range(_NUM_CLASSES)])
    nearest = np.linalg.norm(reps[:, None] - means[None], axis=2).argmin(1)
    self.assertAlmostEqual(run['probe']['nearest_class_mean_accuracy'], np.mean(nearest == labels))
    head = out_a['logits'].numpy().argmax(1)
    self.assertAlmostEqual(run['probe']['head_accuracy'], np.mean(head == labels))
    self.assertIn('probe', summary['runs']['model_b'])
    lg = summary['local_global']
    self.assertEqual(lg['k'], 5)
    sv_b = np.array([float(r[2]) for r in rows[1:]])
    # R as documented: each value floored at 1e-12 x the larger top value (model_b's spectrum has
    # numerical zeros in its top 5), then the mean log ratio of the top k.
    eps = 1e-12 * max(sv_b[0], expected_sv[0])
    self.assertAlmostEqual(
        lg['R'], np.mean(np.log(np.maximum(sv_b[:5], eps) / np.maximum(expected_sv[:5], eps))),
        places=4)

  def test_bad_input_names_the_flag(self):
    with self.assertRaisesRegex(export.SavedModelError, '--saved_model=.*does not exist'):
      analyze.load_models([os.path.join(self.tmp, 'missing')])
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(export.SavedModelError, '--saved_model=.*not a SavedModel'):
      analyze.load_models([empty])
    with self.assertRaisesRegex(analyze.FlagError, '--labels has 1 entries'):
      analyze.load_models([self.run_dir, self.plain_dir], ['x'])
    with self.assertRaisesRegex(analyze.FlagError, '--labels: duplicate'):
      analyze.load_models([self.run_dir, self.plain_dir], ['x', 'x'])
    models = analyze.load_models([self.run_dir], trust_saved_model=True)
    task = collections.namedtuple('Task', 'name num_classes input_shape')
    analyze.check_against_task([('--saved_model', models['run_a'])],
                               task('tiny', _NUM_CLASSES, _INPUT_SHAPE))
    with self.assertRaisesRegex(export.SavedModelError, '--saved_model: .*shape'):
      analyze.check_against_task([('--saved_model', models['run_a'])],
                                 task('cifar10', 10, (32, 32, 3)))

  def test_cli_bad_dir_exits_2_with_one_line(self):
    result = testutil.run_module(
        'bin.analyze', '--saved_model=' + os.path.join(self.tmp, 'missing'), '--task=cifar10',
        '--output_dir=' + os.path.join(self.tmp, 'cli_out'), env={'TF_CPP_MIN_LOG_LEVEL': '3'},
        timeout=300)
    self.assertEqual(result.returncode, 2, result.stderr)
    errors = [l for l in result.stderr.splitlines() if l.startswith('analyze: error:')]
    self.assertLen(errors, 1, result.stderr)
    self.assertIn('--saved_model=', errors[0])
    self.assertNotIn('Traceback', result.stderr)


if __name__ == '__main__':
  absltest.main()
