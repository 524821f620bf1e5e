"""tasks/augment.py: crop+flip, flip, the AutoAugment compositions; stateless, off at test time.

The AutoAugment operations themselves (PIL as the oracle) are tested in autoaugment_test.py.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tests import testutil
from tff_decorr.tasks import augment
from tff_decorr.tasks import client_data
from tff_decorr.tasks import registry


def _image(seed=0, shape=(32, 32, 3)):
  return np.random.RandomState(seed).randint(0, 256, shape).astype(np.uint8)


def _seed(a, b):
  return tf.constant([a, b], tf.int64)


def _windows(img, pad):
  """Every crop of the zero-padded image, and its mirror: all outputs crop+flip may give."""
  h, w, _ = img.shape
  padded = np.pad(img, [(pad, pad), (pad, pad), (0, 0)])
  out = {}
  for dy in range(2 * pad + 1):
    for dx in range(2 * pad + 1):
      win = padded[dy:dy + h, dx:dx + w]
      out[win.tobytes()] = (dy, dx, False)
      out[win[:, ::-1].tobytes()] = (dy, dx, True)
  return out


class AugmentTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(k for k, v in augment.AUGMENTATIONS.items() if v is not None))
  def test_shape_dtype_determinism_graph(self, name):
    fn = augment.AUGMENTATIONS[name]
    # Traced as in client datasets (inside TFF computations). Tracing AutoAugment takes seconds,
    # so the graph is checked at 32x32 only; 64x64 (Tiny ImageNet, domain tasks) runs eagerly.
    traced = tf.function(fn)
    img = tf.constant(_image(1, (32, 32, 3)))
    a = fn(img, _seed(7, 8)).numpy()
    self.assertEqual((a.shape, a.dtype), ((32, 32, 3), np.uint8))
    np.testing.assert_array_equal(traced(img, _seed(7, 8)).numpy(), a)  # Graph == eager.
    np.testing.assert_array_equal(traced(img, _seed(7, 8)).numpy(), a)
    outs = {traced(img, _seed(7, s)).numpy().tobytes() for s in range(12)}
    self.assertGreater(len(outs), 1 if name == 'flip' else 4, name)  # flip: 2 outcomes.
    big = tf.constant(_image(2, (64, 64, 3)))
    a = fn(big, _seed(3, 4)).numpy()
    self.assertEqual((a.shape, a.dtype), ((64, 64, 3), np.uint8))
    np.testing.assert_array_equal(fn(big, _seed(3, 4)).numpy(), a)

  def test_crop_flip_is_a_padded_window_maybe_mirrored(self):
    img = _image(3)
    windows = _windows(img, 4)
    seen_offsets, seen_flips = set(), set()
    for s in range(60):
      out = augment.random_crop_flip(tf.constant(img), _seed(1, s)).numpy()
      self.assertIn(out.tobytes(), windows)
      dy, dx, flipped = windows[out.tobytes()]
      seen_offsets.add((dy, dx))
      seen_flips.add(flipped)
    self.assertEqual(seen_flips, {False, True})
    self.assertGreater(len(seen_offsets), 20)  # 81 possible offsets, drawn uniformly.

  def test_flip_only_mirrors(self):
    img = _image(4)
    outs = [augment.random_flip(tf.constant(img), _seed(2, s)).numpy() for s in range(20)]
    for o in outs:
      self.assertTrue(np.array_equal(o, img) or np.array_equal(o, img[:, ::-1]))
    self.assertTrue(any(np.array_equal(o, img) for o in outs))
    self.assertTrue(any(np.array_equal(o, img[:, ::-1]) for o in outs))

  def test_seed_streams_are_independent_per_position(self):
    # Client datasets seed example i of epoch e with [seed, (e + 1) * 2**32 + i]: neighbouring
    # positions and epochs must not share draws.
    img = tf.constant(_image(5))
    fn = augment.random_crop_flip
    a = fn(img, _seed(9, (1 << 32) + 0)).numpy()
    b = fn(img, _seed(9, (1 << 32) + 1)).numpy()
    c = fn(img, _seed(9, (2 << 32) + 0)).numpy()
    self.assertFalse(np.array_equal(a, b) and np.array_equal(a, c))


class TestTimeTest(testutil.ClassTempDir, absltest.TestCase):
  """Augmentation is applied to training client data only."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = registry.get('cifar10')
    cls.images = np.stack([_image(i) for i in range(6)])
    cls.labels = np.arange(6) % 10
    cls.dir = os.path.join(cls.tmp, 's')
    client_data.write_client_shards(cls.images, cls.labels, [np.arange(6)], cls.dir)
    cls.clean = sorted(bytes(cls.task.preprocess(im).numpy().round(4)) for im in cls.images)

  def _batch(self, train, seed):
    fn = self.task.client_dataset_fn(self.dir, batch_size=6, train=train)
    return next(iter(fn(tf.constant('0'), tf.constant(seed, tf.int64))))[0].numpy()

  def test_client_data_without_train_is_clean(self):
    # Without augmentation only the order depends on the seed: the same preprocessed images.
    for seed in (1, 2):
      self.assertEqual(sorted(map(bytes, self._batch(False, seed).round(4))), self.clean)

  def test_client_data_with_train_is_augmented(self):
    got = sorted(map(bytes, self._batch(True, 1).round(4)))
    self.assertNotEqual(got, self.clean)

  def test_test_dataset_is_clean(self):
    def as_dataset(builder, split, **kwargs):  # Random pixels; CIFAR's id form (the loader
      del builder, kwargs                       # orders examples by it and refuses other ids).
      images = np.random.RandomState(0).randint(0, 256, (5, 32, 32, 3)).astype(np.uint8)
      return tf.data.Dataset.from_tensor_slices({
          'id': [f'{split}_{i:05d}' for i in range(5)], 'image': images, 'label': np.arange(5)})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
      raw, _, _ = self.task.load_split('test', None)
      x = np.concatenate([b[0].numpy() for b in self.task.test_dataset(None, batch_size=2)])
    np.testing.assert_allclose(x, self.task.preprocess(raw).numpy(), atol=1e-6)


if __name__ == '__main__':
  absltest.main()
