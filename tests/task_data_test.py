"""Tasks and client data: splits, client shards, the per-client dataset function, augmentation."""

import os
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import augment
from tasks import base
from tasks import client_data
from tasks import registry
from tests import testutil
from tff_decorr import partitions


class DigitsTest(absltest.TestCase):

  def test_splits(self):
    task = registry.get('digits')
    xtr, ytr, dtr = task.load_split('train', None)
    xte, yte, _ = task.load_split('test', None)
    self.assertEqual(xtr.shape, (1437, 8, 8, 1))
    self.assertEqual(xte.shape, (360, 8, 8, 1))
    self.assertEqual(xtr.dtype, np.uint8)
    self.assertIsNone(dtr)
    self.assertEqual(sorted(np.unique(ytr).tolist()), list(range(10)))
    self.assertEqual(xtr.max(), 255)

  def test_unknown_task(self):
    with self.assertRaisesRegex(ValueError, '--task'):
      registry.get('mnist')


class ClientDataTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = registry.get('digits')
    cls.images, cls.labels, _ = cls.task.load_split('train', None)
    cls.parts = partitions.dirichlet_partition(cls.labels, 5, 0.5, seed=1)
    cls.dir = os.path.join(tempfile.mkdtemp(), 'shards')
    client_data.write_client_shards(cls.images, cls.labels, cls.parts, cls.dir)

  def test_shards_round_trip_the_partition(self):
    fn = self.task.client_dataset_fn(self.dir, batch_size=7, train=False)
    for cid, idx in enumerate(self.parts):
      got_labels = np.concatenate([y.numpy() for _, y in fn(tf.constant(str(cid)),
                                                          tf.constant(0, tf.int64))])
      self.assertEqual(sorted(got_labels.tolist()), sorted(self.labels[idx].tolist()))

  def test_images_are_preprocessed_from_the_right_examples(self):
    fn = self.task.client_dataset_fn(self.dir, batch_size=1000, train=False)
    x, y = next(iter(fn(tf.constant('0'), tf.constant(5, tf.int64))))
    expected = {tuple(self.task.preprocess(self.images[i]).numpy().ravel().round(5))
                for i in self.parts[0]}
    for row in x.numpy():
      self.assertIn(tuple(row.ravel().round(5)), expected)

  def test_deterministic_per_seed_and_epochs_differ(self):
    fn = self.task.client_dataset_fn(self.dir, batch_size=16, epochs=2)

    def labels(seed):
      return np.concatenate([y.numpy() for _, y in fn(tf.constant('1'),
                                                     tf.constant(seed, tf.int64))])
    a, b, c = labels(3), labels(3), labels(4)
    np.testing.assert_array_equal(a, b)
    self.assertFalse(np.array_equal(a, c))
    n = len(self.parts[1])
    self.assertLen(a, 2 * n)
    self.assertFalse(np.array_equal(a[:n], a[n:]))  # Each epoch has its own order.

  def test_runs_inside_tf_function(self):
    fn = self.task.client_dataset_fn(self.dir, batch_size=32)

    @tf.function
    def count(cid, seed):
      return fn(cid, seed).reduce(tf.constant(0), lambda s, b: s + tf.shape(b[1])[0])
    self.assertEqual(int(count(tf.constant('2'), tf.constant(9, tf.int64))), len(self.parts[2]))

  def test_rewrite_is_skipped_when_unchanged(self):
    marker = os.path.join(self.dir, client_data.MANIFEST)
    mtime = os.path.getmtime(marker)
    client_data.write_client_shards(self.images, self.labels, self.parts, self.dir)
    self.assertEqual(os.path.getmtime(marker), mtime)


class AugmentTest(absltest.TestCase):

  def test_crop_flip_shape_dtype_determinism(self):
    img = tf.constant(np.random.RandomState(0).randint(0, 255, (32, 32, 3)), tf.uint8)
    a = augment.random_crop_flip(img, tf.constant([1, 2], tf.int64))
    b = augment.random_crop_flip(img, tf.constant([1, 2], tf.int64))
    self.assertEqual(a.shape, (32, 32, 3))
    self.assertEqual(a.dtype, tf.uint8)
    np.testing.assert_array_equal(a, b)
    outs = {augment.random_crop_flip(img, tf.constant([1, s], tf.int64)).numpy().tobytes()
            for s in range(20)}
    self.assertGreater(len(outs), 5)

  def test_off_at_test_time(self):
    task = registry.get('cifar10')
    images = np.random.RandomState(0).randint(0, 255, (6, 32, 32, 3)).astype(np.uint8)
    labels = np.arange(6) % 10
    d = os.path.join(tempfile.mkdtemp(), 's')
    client_data.write_client_shards(images, labels, [np.arange(6)], d)
    fn = task.client_dataset_fn(d, batch_size=6, train=False)
    x1 = next(iter(fn(tf.constant('0'), tf.constant(1, tf.int64))))[0].numpy()
    x2 = next(iter(fn(tf.constant('0'), tf.constant(2, tf.int64))))[0].numpy()
    # Without augmentation only the order depends on the seed: same set of images.
    self.assertEqual(sorted(map(bytes, x1.round(4))), sorted(map(bytes, x2.round(4))))
    expected = sorted(bytes(task.preprocess(im).numpy().round(4)) for im in images)
    self.assertEqual(sorted(map(bytes, x1.round(4))), expected)


class TfdsTasksTest(absltest.TestCase):

  def test_cifar_under_mock_data(self):
    for name, classes in (('cifar10', 10), ('cifar100', 100)):
      task = registry.get(name)
      with tfds.testing.mock_data(num_examples=12):
        x, y, _ = task.load_split('train', None)
        test = next(iter(task.test_dataset(None, batch_size=4)))
      self.assertEqual(x.shape, (12, 32, 32, 3))
      self.assertEqual(x.dtype, np.uint8)
      self.assertTrue(np.all((y >= 0) & (y < classes)))
      self.assertEqual(test[0].shape, (4, 32, 32, 3))
      self.assertEqual(test[0].dtype, tf.float32)

  def test_missing_dataset_says_how_to_prepare(self):
    task = registry.get('cifar10')
    with self.assertRaisesRegex(base.DatasetNotFoundError, '--data_dir.*tfds build cifar10'):
      task.load_split('train', tempfile.mkdtemp())

  def test_cifar10_real_data(self):
    data_dir = testutil.shared_tfds_dir()
    if data_dir is None:
      self.skipTest('../shared/data/tfds is absent: no real CIFAR-10 to read')
    task = registry.get('cifar10')
    x, y, _ = task.load_split('train', data_dir)
    self.assertEqual(x.shape, (10000, 32, 32, 3))
    self.assertEqual(np.bincount(y, minlength=10).sum(), 10000)
    xt, _, _ = task.load_split('test', data_dir)
    self.assertEqual(xt.shape, (10000, 32, 32, 3))


if __name__ == '__main__':
  absltest.main()
