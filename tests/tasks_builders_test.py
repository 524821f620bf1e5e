"""TFDS builders and tasks we add: tiny_imagenet (fake zip), office_caltech10 (fake tree),
domainnet (TFDS mock data)."""

import io
import os
import tempfile
import zipfile

from absl.testing import absltest
import numpy as np
from PIL import Image

from tests import testutil
from tff_decorr.tasks import base
from tff_decorr.tasks import domainnet
from tff_decorr.tasks import office_caltech10
from tff_decorr.tasks import registry
from tff_decorr.tasks import tiny_imagenet


def _jpeg(color, mode='RGB', size=(64, 64)) -> bytes:
  buf = io.BytesIO()
  Image.new(mode, size, color).save(buf, format='JPEG', quality=95)
  return buf.getvalue()


def _fake_tiny_imagenet_zip(path):
  """200 wnids in shuffled order; 1 train image each (2 for the first three); 5 val images."""
  wnids = [f'n{9000 - i:08d}' for i in range(200)]  # Listed in reverse sorted order.
  val = [('val_0.JPEG', wnids[3]), ('val_1.JPEG', wnids[150]), ('val_2.JPEG', wnids[0]),
         ('val_3.JPEG', wnids[199]), ('val_4.JPEG', wnids[3])]
  with zipfile.ZipFile(path, 'w') as z:
    z.writestr('tiny-imagenet-200/wnids.txt', '\n'.join(wnids) + '\n')
    for i, w in enumerate(wnids):
      for j in range(2 if i < 3 else 1):
        z.writestr(f'tiny-imagenet-200/train/{w}/images/{w}_{j}.JPEG',
                   _jpeg((i, 255 - i, 7 * j)))
      z.writestr(f'tiny-imagenet-200/train/{w}/{w}_boxes.txt', 'ignored\n')
    z.writestr('tiny-imagenet-200/val/val_annotations.txt',
               ''.join(f'{f}\t{w}\t0\t0\t63\t63\n' for f, w in val))
    for k, (f, _) in enumerate(val):
      # One greyscale JPEG, as in the real data: it must come out as RGB.
      z.writestr(f'tiny-imagenet-200/val/images/{f}',
                 _jpeg(40 * k, mode='L') if k == 1 else _jpeg((40 * k, 0, 0)))
    z.writestr('tiny-imagenet-200/test/images/test_0.JPEG', _jpeg((1, 2, 3)))
  return wnids, val


class TinyImagenetTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.manual = os.path.join(cls.tmp, 'manual')
    os.makedirs(cls.manual)
    cls.wnids, cls.val = _fake_tiny_imagenet_zip(os.path.join(cls.manual, tiny_imagenet.ZIP_NAME))
    cls.data_dir = os.path.join(cls.tmp, 'tfds')
    tiny_imagenet.prepare(cls.data_dir, cls.manual)

  def test_task_reads_the_built_dataset_offline(self):
    task = registry.get('tiny_imagenet')
    self.assertEqual(task.input_shape, (64, 64, 3))
    self.assertEqual(task.num_classes, 200)
    self.assertEqual(task.augmentation, 'autoaugment')
    x, y, d = task.load_split('train', self.data_dir)
    self.assertIsNone(d)
    self.assertEqual(x.shape, (203, 64, 64, 3))
    self.assertEqual(x.dtype, np.uint8)
    self.assertEqual(y.dtype, np.int64)
    # Labels are indices into sorted(wnids): every class present, 2 images for the 3 last sorted.
    counts = np.bincount(y, minlength=200)
    self.assertEqual(counts.tolist(), [1] * 197 + [2] * 3)
    xt, yt, _ = task.load_split('test', self.data_dir)
    self.assertEqual(xt.shape, (5, 64, 64, 3))
    order = sorted(self.wnids)
    self.assertEqual(sorted(yt.tolist()), sorted(order.index(w) for _, w in self.val))

  def test_splits_come_back_in_image_folder_order(self):
    # The reference indexes torchvision ImageFolder's order: wnid folders sorted, then file
    # names sorted. TFDS stores the examples shuffled; load_split restores that order.
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    stored = [ex['file_name'].decode() for ex in tfds.as_numpy(tfds.load(
        'tiny_imagenet', split='train', data_dir=self.data_dir, download=False))]
    self.assertNotEqual(stored, sorted(stored))
    task = registry.get('tiny_imagenet')
    x, y, _ = task.load_split('train', self.data_dir)
    # The zip lists the wnids in reverse sorted order: listed position i has sorted label 199 - i
    # and colour (i, 255 - i, 7 j) for its image j (j = 0, 1 for i < 3).
    expected = [(199 - i, i, 7 * j) for i in reversed(range(200)) for j in range(2 if i < 3 else 1)]
    self.assertEqual(y.tolist(), [label for label, _, _ in expected])
    centre = x[:, 32, 32].astype(int)
    np.testing.assert_allclose(centre[:, 0], [i for _, i, _ in expected], atol=3)
    np.testing.assert_allclose(centre[:, 2], [b for _, _, b in expected], atol=3)
    # val: (wnid, file name) order is val_3 (label 0), val_1 (49), val_0 and val_4 (196), val_2
    # (199); val_k is red 40 k (val_1: grey 40).
    xt, yt, _ = task.load_split('test', self.data_dir)
    self.assertEqual(yt.tolist(), [0, 49, 196, 196, 199])
    np.testing.assert_allclose(xt[:, 32, 32, 0].astype(int), [120, 40, 0, 160, 80], atol=3)

  def test_labels_follow_sorted_wnids_and_greyscale_becomes_rgb(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    ds = tfds.load('tiny_imagenet', split='test', data_dir=self.data_dir, download=False)
    order = sorted(self.wnids)
    rows = {ex['file_name'].decode(): ex for ex in tfds.as_numpy(ds)}
    for f, w in self.val:
      self.assertEqual(rows[f]['wnid'].decode(), w)
      self.assertEqual(int(rows[f]['label']), order.index(w))
    grey = rows['val_1.JPEG']['image']
    self.assertEqual(grey.shape, (64, 64, 3))
    self.assertTrue(np.all(grey[..., 0] == grey[..., 1]))
    self.assertLess(abs(int(rows['val_3.JPEG']['image'][..., 0].mean()) - 120), 3)

  def test_augmented_client_data_in_a_tf_function(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tff_decorr.tasks import client_data  # pylint: disable=g-import-not-at-top
    task = registry.get('tiny_imagenet')
    x, y, _ = task.load_split('train', self.data_dir)
    shards = os.path.join(tempfile.mkdtemp(), 'shards')
    client_data.write_client_shards(x, y, [np.arange(0, 20), np.arange(20, 30)], shards)
    fn = task.client_dataset_fn(shards, batch_size=8, epochs=1)

    @tf.function
    def first_batch(cid, seed):
      return next(iter(fn(cid, seed)))
    a = first_batch(tf.constant('0'), tf.constant(3, tf.int64))
    b = first_batch(tf.constant('0'), tf.constant(3, tf.int64))
    self.assertEqual(a[0].shape, (8, 64, 64, 3))
    self.assertEqual(a[0].dtype, tf.float32)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    # Normalised with mean/std 0.5: values in [-1, 1].
    self.assertBetween(float(tf.reduce_min(a[0])), -1.0, 1.0)
    self.assertBetween(float(tf.reduce_max(a[0])), -1.0, 1.0)

  def test_missing_dataset_names_data_dir_and_the_zip(self):
    task = registry.get('tiny_imagenet')
    with self.assertRaisesRegex(base.DatasetNotFoundError,
                                r'--data_dir.*tasks\.tiny_imagenet.*tiny-imagenet-200\.zip'):
      task.load_split('train', tempfile.mkdtemp())


class OfficeCaltech10Test(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.manual = os.path.join(cls.tmp, 'office_caltech_10')
    cls.expected = {'train': [], 'test': []}
    for d, domain in enumerate(office_caltech10.DOMAINS):
      for c, cls_name in enumerate(office_caltech10.CLASSES):
        folder = os.path.join(cls.manual, domain, cls_name)
        os.makedirs(folder)
        for k in range(3 if d == 0 else 2):
          name = f'frame_{c}_{k}.jpg' if k else f'img_{c}.png'
          # Odd sizes and a greyscale PNG: everything comes out 64x64 RGB.
          mode = 'L' if k == 0 else 'RGB'
          color = 25 * c if mode == 'L' else (25 * c, 60 * d, 100)
          Image.new(mode, (90 + 10 * k, 70), color).save(os.path.join(folder, name))
          split = 'test' if office_caltech10.is_test(domain, cls_name, name) else 'train'
          cls.expected[split].append((c, d))
        with open(os.path.join(folder, 'Thumbs.db'), 'w') as f:
          f.write('not an image')
    cls.data_dir = os.path.join(cls.tmp, 'tfds')
    office_caltech10.prepare(cls.data_dir, cls.manual)

  def test_splits_labels_domains(self):
    task = registry.get('office_caltech10')
    self.assertEqual(task.domains, ('amazon', 'caltech', 'dslr', 'webcam'))
    self.assertEqual((task.default_model, task.default_partition), ('alexnet_bn', 'domain'))
    self.assertEqual(task.defaults['num_clients'], 4)
    self.assertEqual(task.defaults['partition'], 'domain')  # What bin/train reads.
    self.assertNotEmpty(self.expected['test'])  # The hash split put some files in each split.
    total = 0
    for split in ('train', 'test'):
      x, y, d = task.load_split(split, self.data_dir)
      self.assertEqual(x.shape, (len(self.expected[split]), 64, 64, 3))
      self.assertEqual(x.dtype, np.uint8)
      self.assertEqual((y.dtype, d.dtype), (np.int64, np.int64))
      self.assertEqual(sorted(zip(y.tolist(), d.tolist())), sorted(self.expected[split]))
      # Pixel content follows label and domain (colour set from them above).
      for i in range(len(y)):
        self.assertLess(abs(int(x[i, 32, 32, 0]) - 25 * int(y[i])), 3)
      total += len(y)
    self.assertEqual(total, 10 * (3 + 2 + 2 + 2))

  def test_split_is_a_stable_hash(self):
    # Pinned values: the split must not change between machines or Python versions.
    got = [office_caltech10.is_test('amazon', 'mug', f'frame_{i:04d}.jpg') for i in range(40)]
    many = [office_caltech10.is_test('caltech', 'bike', f'{i}.jpg') for i in range(2000)]
    self.assertBetween(np.mean(many), 0.17, 0.23)  # About one in five.
    self.assertEqual(got, [office_caltech10.is_test('amazon', 'mug', f'frame_{i:04d}.jpg')
                           for i in range(40)])
    self.assertEqual(''.join('1' if g else '0' for g in got), PINNED_OFFICE_SPLIT)

  def test_domain_test_datasets_and_partition(self):
    from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
    task = registry.get('office_caltech10')
    _, y, d = task.load_split('train', self.data_dir)
    parts = partitions.domain_partition(d)
    self.assertLen(parts, 4)
    for k, p in enumerate(parts):
      self.assertTrue(np.all(d[p] == k))
    per_domain = task.domain_test_datasets(self.data_dir, batch_size=100)
    self.assertEqual(sorted(per_domain), sorted(set(dd for _, dd in self.expected['test'])))

  def test_missing_dataset(self):
    with self.assertRaisesRegex(base.DatasetNotFoundError,
                                r'--data_dir.*tasks\.office_caltech10.*--manual_dir'):
      registry.get('office_caltech10').load_split('train', tempfile.mkdtemp())

  def test_missing_domain_folder(self):
    bad = tempfile.mkdtemp()
    os.makedirs(os.path.join(bad, 'amazon', 'mug'))
    with self.assertRaisesRegex(Exception, r'missing domain folders.*caltech'):
      office_caltech10.prepare(os.path.join(bad, 'tfds'), bad)


class DomainNetTest(absltest.TestCase):

  def test_filtered_subset_under_mock_data(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    task = registry.get('domainnet')
    self.assertEqual((task.num_classes, task.input_shape), (10, (64, 64, 3)))
    self.assertEqual(task.domains, domainnet.DOMAINS)
    self.assertEqual((task.defaults['partition'], task.defaults['num_clients']), ('domain', 6))
    names = tfds.builder('domainnet/real').info.features['label'].names
    kept = [names.index(c) for c in domainnet.CLASSES]
    # Mock labels are random over 345 classes: 400 per domain keep about 12 each.
    with tfds.testing.mock_data(num_examples=400):
      x, y, d = task.load_split('train', None)
      expected = []  # The kept labels of each domain, read independently (labels only).
      for i, dom in enumerate(domainnet.DOMAINS):
        ds = tfds.load(f'domainnet/{dom}', split='train',
                       decoders={'image': tfds.decode.SkipDecoding()})
        for ex in tfds.as_numpy(ds):
          if int(ex['label']) in kept:
            expected.append((kept.index(int(ex['label'])), i))
    self.assertEqual(x.shape, (len(expected), 64, 64, 3))
    self.assertEqual(x.dtype, np.uint8)
    self.assertEqual((y.dtype, d.dtype), (np.int64, np.int64))
    self.assertEqual(sorted(zip(y.tolist(), d.tolist())), sorted(expected))
    self.assertEqual(sorted(set(d.tolist())), list(range(6)))
    self.assertGreater(x.std(), 10)  # Decoded random pixels, not zeros.

  def test_missing_dataset(self):
    with self.assertRaisesRegex(base.DatasetNotFoundError,
                                r'--data_dir.*domainnet/clipart.*tfds build domainnet'):
      registry.get('domainnet').load_split('test', tempfile.mkdtemp())


PINNED_OFFICE_SPLIT = '0000010000000000000000000000000011000000'


if __name__ == '__main__':
  absltest.main()
