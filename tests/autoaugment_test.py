"""AutoAugment ops: shape/dtype, determinism, graph use, and known values (PIL as the oracle)."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps
import tensorflow as tf

from tff_decorr.tasks import augment
from tff_decorr.tasks import autoaugment as aa


def _image(seed=0, shape=(32, 32, 3)):
  return np.random.RandomState(seed).randint(0, 256, shape).astype(np.uint8)


def _level(v):
  return tf.constant(float(v))


_NO = tf.constant(False)


class OpsTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(aa.OPS))
  def test_shape_dtype_determinism_and_graph(self, name):
    op = aa.OPS[name]
    for shape in ((32, 32, 3), (64, 64, 3), (8, 8, 1)):
      img = tf.constant(_image(1, shape))
      a = op(img, _level(7), tf.constant(True))
      b = tf.function(lambda x: op(x, _level(7), tf.constant(True)))(img)
      self.assertEqual(a.shape, shape)
      self.assertEqual(a.dtype, tf.uint8)
      np.testing.assert_array_equal(a.numpy(), b.numpy())

  def test_invert(self):
    img = _image(2)
    np.testing.assert_array_equal(aa.invert(tf.constant(img)).numpy(), 255 - img)

  def test_solarize_matches_pil(self):
    img = _image(3)
    for level in (0, 2, 5, 9):
      threshold = 256 - level / 9 * 256
      want = np.where(img >= threshold, 255 - img, img)
      got = aa.solarize(tf.constant(img), _level(level)).numpy()
      np.testing.assert_array_equal(got, want)
      if threshold == int(threshold):
        pil = np.asarray(ImageOps.solarize(Image.fromarray(img), int(threshold)))
        np.testing.assert_array_equal(got, pil)
    # Level 0 leaves the image unchanged, level 9 inverts everything.
    np.testing.assert_array_equal(aa.solarize(tf.constant(img), _level(0)).numpy(), img)
    np.testing.assert_array_equal(aa.solarize(tf.constant(img), _level(9)).numpy(), 255 - img)

  def test_posterize_matches_pil(self):
    img = _image(4)
    for level, bits in ((0, 8), (2, 7), (4, 6), (7, 5), (9, 4)):
      got = aa.posterize(tf.constant(img), _level(level)).numpy()
      np.testing.assert_array_equal(got, np.asarray(ImageOps.posterize(Image.fromarray(img),
                                                                       bits)))
    self.assertEqual(int(aa.posterize(tf.constant([[[0xFF]]], tf.uint8), _level(9))[0, 0, 0]),
                     0xF0)

  def test_autocontrast_and_equalize_match_pil(self):
    rs = np.random.RandomState(5)
    img = (rs.randint(0, 120, (32, 32, 3)) + np.array([10, 40, 0])).astype(np.uint8)
    img[..., 2] = 77  # A constant channel is left unchanged.
    pil = Image.fromarray(img)
    np.testing.assert_array_equal(aa.auto_contrast(tf.constant(img)).numpy(),
                                  np.asarray(ImageOps.autocontrast(pil)))
    np.testing.assert_array_equal(aa.equalize(tf.constant(img)).numpy(),
                                  np.asarray(ImageOps.equalize(pil)))

  @parameterized.parameters(('Brightness', ImageEnhance.Brightness),
                            ('Color', ImageEnhance.Color),
                            ('Contrast', ImageEnhance.Contrast),
                            ('Sharpness', ImageEnhance.Sharpness))
  def test_enhance_ops_match_pil(self, name, enhancer):
    img = _image(6)
    for level, negate in ((3, False), (9, True), (6, False)):
      factor = 1 + (-1 if negate else 1) * 0.9 * level / 9
      want = np.asarray(enhancer(Image.fromarray(img)).enhance(factor)).astype(int)
      got = aa.OPS[name](tf.constant(img), _level(level), tf.constant(negate)).numpy().astype(int)
      # PIL truncates where we round: at most one grey level apart.
      self.assertLessEqual(np.abs(got - want).max(), 1, f'{name} level {level}')
      self.assertGreater(np.abs(got - img).max(), 5)  # It did something.

  def test_translate_known_shift(self):
    # At level 9 the shift is 150/331 of the side: exactly 150 pixels on a 331-pixel-wide image.
    img = _image(7, (4, 331, 1))
    got = aa.translate_x(tf.constant(img), _level(9), _NO).numpy()
    np.testing.assert_array_equal(got[:, :181], img[:, 150:])
    self.assertTrue(np.all(got[:, 181:] == 128))
    got = aa.translate_x(tf.constant(img), _level(9), tf.constant(True)).numpy()
    np.testing.assert_array_equal(got[:, 150:], img[:, :181])
    img_t = np.transpose(img, (1, 0, 2))
    got = aa.translate_y(tf.constant(img_t), _level(9), _NO).numpy()
    np.testing.assert_array_equal(got[:181], img_t[150:])

  def test_geometric_level_zero_is_identity(self):
    img = _image(8)
    for name in ('ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate'):
      np.testing.assert_array_equal(aa.OPS[name](tf.constant(img), _level(0), _NO).numpy(), img)

  def test_shear_and_rotate_move_pixels(self):
    img = _image(9, (33, 33, 3))
    sx = aa.shear_x(tf.constant(img), _level(9), _NO).numpy()
    # Row y samples x + 0.3 y: row 0 is unchanged, the last row is shifted and grey-filled.
    np.testing.assert_array_equal(sx[0], img[0])
    self.assertTrue(np.all(sx[32, -5:] == 128))
    r = aa.rotate(tf.constant(img), _level(9), _NO).numpy()
    np.testing.assert_array_equal(r[16, 16], img[16, 16])  # The centre stays.
    self.assertTrue(np.all(r[0, 0] == 128))  # A corner is rotated out: fill.
    r2 = aa.rotate(tf.constant(img), _level(9), tf.constant(True)).numpy()
    self.assertFalse(np.array_equal(r, r2))

  def test_rotate_degrees_quarter_turn_is_exact(self):
    img = _image(11, (9, 9, 3))
    got = aa.rotate_degrees(tf.constant(img), 90.0, fill=0).numpy()
    # A quarter turn of a square image is a permutation of its pixels: one of the two directions.
    self.assertTrue(np.array_equal(got, np.rot90(img, 1)) or np.array_equal(got, np.rot90(img, 3)))

  def test_flip_rotate_augmentation(self):
    img = tf.constant(_image(12, (16, 16, 3)))
    fn = augment.AUGMENTATIONS['flip_rotate']
    a = fn(img, tf.constant([5, 6], tf.int64)).numpy()
    np.testing.assert_array_equal(a, fn(img, tf.constant([5, 6], tf.int64)).numpy())
    self.assertEqual((a.shape, a.dtype), ((16, 16, 3), np.uint8))
    outs = [fn(img, tf.constant([5, s], tf.int64)).numpy() for s in range(10)]
    self.assertGreater(len({o.tobytes() for o in outs}), 5)
    # Rotations by a non-zero angle uncover corners, filled with black (torchvision's default).
    self.assertGreater(sum(int(np.all(o[0, 0] == 0)) for o in outs), 5)


class PolicyTest(absltest.TestCase):

  def test_policy_table(self):
    self.assertLen(aa.CIFAR10_POLICY, 25)
    for sub in aa.CIFAR10_POLICY:
      self.assertLen(sub, 2)
      for name, prob, level in sub:
        self.assertIn(name, aa.OPS)
        self.assertTrue(0 <= prob <= 1 and 0 <= level <= 9)

  def test_deterministic_given_seed_and_varied_across_seeds(self):
    img = tf.constant(_image(10))
    a = aa.apply_policy(img, tf.constant([3, 4], tf.int64))
    b = aa.apply_policy(img, tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    self.assertEqual(a.shape, (32, 32, 3))
    self.assertEqual(a.dtype, tf.uint8)
    outs = {aa.apply_policy(img, tf.constant([3, s], tf.int64)).numpy().tobytes()
            for s in range(40)}
    self.assertGreater(len(outs), 15)

  def test_registered_augmentations_in_a_tf_data_map(self):
    images = np.stack([_image(i) for i in range(6)])
    for name in ('autoaugment', 'crop_flip_autoaugment'):
      fn = augment.AUGMENTATIONS[name]
      ds = tf.data.Dataset.from_tensor_slices((images, tf.range(6, dtype=tf.int64)))
      ds = ds.map(lambda x, i, fn=fn: fn(x, tf.stack([tf.constant(1, tf.int64), i])))
      got = np.stack(list(ds.as_numpy_iterator()))
      again = np.stack(list(ds.as_numpy_iterator()))
      self.assertEqual(got.shape, images.shape)
      self.assertEqual(got.dtype, np.uint8)
      np.testing.assert_array_equal(got, again)
      eager = fn(tf.constant(images[2]), tf.constant([1, 2], tf.int64)).numpy()
      np.testing.assert_array_equal(got[2], eager)  # Graph and eager agree.
      self.assertFalse(np.array_equal(got, images))

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'uint8'):
      aa.apply_policy(tf.zeros([8, 8, 3], tf.float32), tf.constant([1, 2], tf.int64))
    with self.assertRaisesRegex(ValueError, 'statically shaped'):
      aa.apply_policy(tf.zeros([8, 8], tf.uint8), tf.constant([1, 2], tf.int64))


if __name__ == '__main__':
  absltest.main()
