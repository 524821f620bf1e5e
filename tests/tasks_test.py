"""Tasks and client data: registry, splits, client shards, the per-client dataset function.

Augmentation is tested in augment_test.py and autoaugment_test.py; our TFDS builders in
tasks_builders_test.py.
"""

import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tff_decorr.bin import train
from tff_decorr.tasks import base
from tff_decorr.tasks import augment
from tff_decorr.tasks import client_data
from tff_decorr.tasks import registry
from tests import testutil
from tff_decorr import data_options
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
    with self.assertRaisesRegex(ValueError, '--task.*digits, cifar10'):
      registry.get('mnist')


class RegistryTest(absltest.TestCase):

  def test_every_task_is_consistent(self):
    import dataclasses  # pylint: disable=g-import-not-at-top
    from tff_decorr.tasks import augment  # pylint: disable=g-import-not-at-top
    from tff_decorr.configs import config  # pylint: disable=g-import-not-at-top
    from tff_decorr import models  # pylint: disable=g-import-not-at-top
    self.assertEqual(set(registry.names()), {'digits', 'cifar10', 'cifar100', 'tiny_imagenet',
                                             'office_caltech10', 'domainnet'})
    self.assertEqual(registry.names()[0], 'digits')
    generic = set(config.GENERIC_FIELDS)
    # Component settings are named '<component>.<field>', the component's own field names.
    settings = {f'{name}.{f.name}' for kind in config.KINDS
                for name in config.registry(kind).names()
                for f in dataclasses.fields(config.registry(kind).hparams_class(name))}
    # The client optimiser's are named by their flags (client_lr), as before they were settings.
    settings |= {spec.name for kind, _, spec in config.component_flag_specs()
                 if kind == 'client_optimizer'}
    for name in registry.names():
      task = registry.get(name)
      self.assertEqual(task.name, name)
      self.assertIn(task.default_model, models.names(), name)
      self.assertIn(task.augmentation, augment.AUGMENTATIONS, name)
      self.assertIn(task.default_partition, ('dirichlet', 'pathological', 'iid', 'domain'))
      self.assertLen(task.input_shape, 3)
      self.assertLen(task.mean, task.input_shape[-1])
      self.assertLen(task.std, task.input_shape[-1])
      self.assertEqual(set(task.defaults) - generic - settings, set(), name)
      for key in ('rounds', 'local_epochs', 'client_lr', 'momentum', 'batch_size',
                  'weight_decay', 'feddecorr.beta', 'num_clients'):
        self.assertIn(key, task.defaults, (name, key))
      if task.domains:
        self.assertEqual((task.default_model, task.default_partition), ('alexnet_bn', 'domain'))
        self.assertEqual(task.defaults['num_clients'], len(task.domains))
      else:
        self.assertIn('dirichlet.alpha', task.defaults)


def _setting(config, key):
  """A generic field ('rounds'), a component setting ('dirichlet.alpha') or a client optimiser's
  setting by its flag ('client_lr') of a Config."""
  optimizer = {'client_lr': 'lr', 'momentum': 'momentum', 'weight_decay': 'weight_decay'}
  if key in optimizer:
    return getattr(config.client_optimizer, optimizer[key])
  if '.' in key:
    component, field = key.split('.')
    return getattr(config.hparams[component], field)
  return getattr(config, key)


class ResolvedSettingsTest(absltest.TestCase):
  """What bin/train resolves from the task defaults, per algorithm (flags > task > generic)."""

  def _resolve(self, **flag_values):
    with flagsaver.flagsaver(regularizer='feddecorr', **flag_values):
      (config,) = train.resolve_configs(train.FLAGS)
    return config

  def test_moon_projection_head_per_task(self):
    # The reference's MOON uses a 256-d head on CIFAR-10/100 and none on TinyImageNet.
    for task, dim in (('cifar10', 256), ('cifar100', 256), ('tiny_imagenet', 0), ('digits', 0),
                      ('office_caltech10', 0), ('domainnet', 0)):
      self.assertEqual(self._resolve(task=task, algorithm='moon').projection_dim, dim, task)
      for algorithm in ('fedavg', 'fedprox', 'fedavgm', 'scaffold'):
        self.assertEqual(self._resolve(task=task, algorithm=algorithm).projection_dim, 0,
                         (task, algorithm))

  def test_paper_settings(self):
    """Every value of docs/reference.md §4, as a run resolves it (written out here, not read from
    the tasks): rounds, local epochs, lr, momentum, batch, weight decay, beta, clients (all
    sampled), Dirichlet alpha, augmentation and normalisation; FedProx mu; MOON mu and
    temperature; FedAvgM server momentum."""
    common = dict(client_lr=0.01, momentum=0.9, batch_size=64)
    image = dict(common, local_epochs=10, num_clients=10, clients_per_round=10,
                 partition='dirichlet', **{'dirichlet.alpha': 0.05})
    domain = dict(common, rounds=300, local_epochs=1, weight_decay=1e-5,
                  partition='domain', **{'feddecorr.beta': 0.1})
    paper = {
        'cifar10': dict(image, rounds=100, weight_decay=1e-5, **{'feddecorr.beta': 0.1}),
        'cifar100': dict(image, rounds=100, weight_decay=1e-4, **{'feddecorr.beta': 0.05}),
        'tiny_imagenet': dict(image, rounds=50, weight_decay=1e-4, **{'feddecorr.beta': 0.1}),
        'office_caltech10': dict(domain, num_clients=4, clients_per_round=4),
        'domainnet': dict(domain, num_clients=6, clients_per_round=6),
    }
    augmentation = {'cifar10': 'crop_flip', 'cifar100': 'crop_flip_autoaugment',
                    'tiny_imagenet': 'autoaugment', 'office_caltech10': 'flip_rotate',
                    'domainnet': 'flip_rotate'}
    normalisation = {
        'cifar10': ((125.3 / 255, 123.0 / 255, 113.9 / 255), (63.0 / 255, 62.1 / 255, 66.7 / 255)),
        'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
        'tiny_imagenet': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        'office_caltech10': ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # FedBN: ToTensor only.
        'domainnet': ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    }
    server_momentum = {'cifar10': 0.9, 'cifar100': 0.5, 'tiny_imagenet': 0.5}
    for name, expected in paper.items():
      config = self._resolve(task=name, algorithm='fedavg')
      self.assertEqual({k: _setting(config, k) for k in expected}, expected, name)
      task = registry.get(name)
      self.assertEqual(task.augmentation, augmentation[name], name)
      np.testing.assert_allclose(task.mean, normalisation[name][0], rtol=1e-12, err_msg=name)
      np.testing.assert_allclose(task.std, normalisation[name][1], rtol=1e-12, err_msg=name)
      self.assertEqual(self._resolve(task=name, algorithm='fedprox').hparams['fedprox'].to_dict(),
                       {'mu': 1e-3}, name)
      moon = self._resolve(task=name, algorithm='moon')
      self.assertEqual(moon.hparams['moon'].to_dict(), {'mu': 1.0, 'temperature': 0.5}, name)
      if name in server_momentum:
        fedavgm = self._resolve(task=name, algorithm='fedavgm').hparams['fedavgm']
        self.assertEqual(fedavgm.server_momentum, server_momentum[name], name)

  def test_explicit_projection_dim_wins(self):
    self.assertEqual(self._resolve(task='cifar10', algorithm='moon', projection_dim=64)
                     .projection_dim, 64)
    self.assertEqual(self._resolve(task='cifar100', algorithm='moon', projection_dim=0)
                     .projection_dim, 0)
    self.assertEqual(self._resolve(task='tiny_imagenet', algorithm='moon', projection_dim=128)
                     .projection_dim, 128)
    self.assertEqual(self._resolve(task='cifar10', algorithm='fedavg', projection_dim=32)
                     .projection_dim, 32)


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

  def test_small_clients_computed_up_front_equal_the_stream_bit_for_bit(self):
    """Small clients' batches are computed in the graph, large ones' streamed through tf.data
    functions (client_data.make_client_dataset_fn): both must give the same batches, bit for bit,
    with augmentation, several epochs and either remainder rule, eagerly and in a tf.function."""
    for epochs, batch, drop in ((1, 16, False), (2, 7, False), (3, 16, True)):
      fns = [client_data.make_client_dataset_fn(
          self.dir, self.task.input_shape, batch, self.task.preprocess, augment.random_crop_flip,
          epochs=epochs, drop_remainder=drop, materialize_bytes=limit) for limit in (1 << 40, 0)]
      graph_fns = [tf.function(lambda c, s, f=f: f(c, s).reduce(
          tf.zeros([0, *self.task.input_shape]), lambda acc, b: tf.concat([acc, b[0]], 0)))
                   for f in fns]
      for cid in ('0', '3'):
        args = (tf.constant(cid), tf.constant(11, tf.int64))
        small, large = ([(x.numpy(), y.numpy()) for x, y in f(*args)] for f in fns)
        # As the client step iterates it: tf.data's autotuning off, the stream's map on as many
        # threads as there are cores (data_options).
        untuned = [(x.numpy(), y.numpy())
                   for x, y in data_options.without_autotune(fns[1](*args))]
        self.assertEqual([x.shape for x, _ in small], [x.shape for x, _ in large])
        self.assertEqual([x.shape for x, _ in small], [x.shape for x, _ in untuned])
        self.assertNotEmpty(small)
        for (xa, ya), (xb, yb), (xc, yc) in zip(small, large, untuned):
          np.testing.assert_array_equal(xa, xb)
          np.testing.assert_array_equal(ya, yb)
          np.testing.assert_array_equal(xa, xc)
          np.testing.assert_array_equal(ya, yc)
        np.testing.assert_array_equal(graph_fns[0](*args), graph_fns[1](*args))
        np.testing.assert_array_equal(graph_fns[0](*args), np.concatenate([x for x, _ in small]))

  def test_preprocess_is_the_normalisation(self):
    x = self.images[:50]
    want = (x.astype(np.float64) / 255.0 - np.asarray(self.task.mean)) / np.asarray(self.task.std)
    np.testing.assert_allclose(self.task.preprocess(x).numpy(), want, rtol=0, atol=2e-6)

  def test_rewrite_is_skipped_when_unchanged(self):
    marker = os.path.join(self.dir, client_data.MANIFEST)
    mtime = os.path.getmtime(marker)
    client_data.write_client_shards(self.images, self.labels, self.parts, self.dir)
    self.assertEqual(os.path.getmtime(marker), mtime)


def _mock_cifar(numbers, prefix=None):
  """An `as_dataset_fn` for tfds.testing.mock_data: one example per number, stored in the given
  order, id '<split>_<number>' (TFDS's CIFAR form; `prefix` overrides '<split>'), label number %
  10, every pixel (number % 256, number // 256, 7)."""
  numbers = np.asarray(numbers, np.int64)

  def as_dataset(self, split, **kwargs):
    del self, kwargs
    images = np.zeros((len(numbers), 32, 32, 3), np.uint8)
    images[..., 0] = (numbers % 256)[:, None, None]
    images[..., 1] = (numbers // 256)[:, None, None]
    images[..., 2] = 7
    return tf.data.Dataset.from_tensor_slices({
        'id': [f'{prefix or split}_{n}' for n in numbers], 'image': images,
        'label': numbers % 10, 'coarse_label': numbers % 20})
  return as_dataset


def _numbers(images):
  return images[:, 0, 0, 0].astype(np.int64) + 256 * images[:, 0, 0, 1]


def _fake_cifar10_files(root, batch_sizes, test_size):
  """The CIFAR-10 binary distribution's layout: records of 1 label byte + 3072 pixel bytes (CHW),
  five train batch files and a test file. Example i of a split has every pixel
  (i % 256, i // 256, 11) and label (3 * i) % 10."""
  folder = os.path.join(root, 'cifar-10-batches-bin')
  os.makedirs(folder)
  with open(os.path.join(folder, 'batches.meta.txt'), 'w') as f:
    f.write('\n'.join(f'class{k}' for k in range(10)) + '\n')

  def write(name, indices):
    with open(os.path.join(folder, name), 'wb') as f:
      for i in indices:
        chw = np.stack([np.full((32, 32), i % 256), np.full((32, 32), i // 256),
                        np.full((32, 32), 11)]).astype(np.uint8)
        f.write(bytes([(3 * i) % 10]) + chw.tobytes())
  start = 0
  for b, size in enumerate(batch_sizes):
    write(f'data_batch_{b + 1}.bin', range(start, start + size))
    start += size
  write('test_batch.bin', range(test_size))


class FedUvBatchesTest(absltest.TestCase):
  """The client data of a run: FedUV drops each epoch's incomplete last batch (its official code's
  drop_last=True); FedDecorr, like its reference, keeps it."""

  BATCH = 100  # Digits, 10 clients, alpha 0.5, seed 0: clients of 88 to 187 examples.

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
    from tff_decorr.program import experiment  # pylint: disable=g-import-not-at-top
    cache = tempfile.mkdtemp()
    cls.exps = {}
    for reg in ('feduv', 'feddecorr'):
      config = config_lib.make(task='digits', regularizer=reg, num_clients=10, dirichlet_alpha=0.5,
                               seed=0, batch_size=cls.BATCH, local_epochs=2, cache_dir=cache,
                               runtime='tf')
      cls.exps[reg] = experiment.Experiment(config, log=lambda s: None)
      cls.exps[reg].prepare_client_data()
    cls.sizes = [len(p) for p in cls.exps['feduv'].partition]

  def _batch_sizes(self, reg, cid):
    ds = self.exps[reg].client_dataset_fn(tf.constant(str(cid)), tf.constant(5, tf.int64))
    return [int(y.shape[0]) for _, y in ds]

  def test_feduv_has_only_full_batches_and_feddecorr_keeps_the_remainder(self):
    b = self.BATCH
    # The cases that matter occur: a client smaller than a batch, one with a remainder.
    self.assertTrue(any(n < b for n in self.sizes), self.sizes)
    self.assertTrue(any(n > b and n % b for n in self.sizes), self.sizes)
    for cid, n in enumerate(self.sizes):
      one_epoch = [b] * (n // b)
      self.assertEqual(self._batch_sizes('feduv', cid), one_epoch * 2, (cid, n))
      self.assertEqual(self._batch_sizes('feddecorr', cid),
                       (one_epoch + ([n % b] if n % b else [])) * 2, (cid, n))

  def test_feduv_client_smaller_than_a_batch_has_weight_zero(self):
    from tff_decorr.algorithms.workspace import Workspace  # pylint: disable=g-import-not-at-top
    exp = self.exps['feduv']
    alg = exp.algorithm
    step = alg.make_client_step(Workspace(alg.model_fn, alg.num_models))
    weights = alg.initial_weights()
    broadcast = alg.broadcast(alg.initial_server_state(weights))
    small = self.sizes.index(min(self.sizes))
    large = self.sizes.index(max(self.sizes))
    self.assertLess(self.sizes[small], self.BATCH)
    for cid, trains in ((small, False), (large, True)):
      out = step(broadcast, exp.client_dataset_fn(tf.constant(str(cid)), tf.constant(5, tf.int64)),
                 alg.initial_client_state(weights))
      self.assertEqual(float(out.weight) > 0, trains, (cid, float(out.weight)))


class TfdsTasksTest(absltest.TestCase):

  def test_cifar_under_mock_data(self):
    for name, classes in (('cifar10', 10), ('cifar100', 100)):
      task = registry.get(name)
      with tfds.testing.mock_data(as_dataset_fn=_mock_cifar(np.arange(12)[::-1])):
        x, y, _ = task.load_split('train', None)
        test = next(iter(task.test_dataset(None, batch_size=4)))
      self.assertEqual(x.shape, (12, 32, 32, 3))
      self.assertEqual(x.dtype, np.uint8)
      self.assertTrue(np.all((y >= 0) & (y < classes)))
      self.assertEqual(test[0].shape, (4, 32, 32, 3))
      self.assertEqual(test[0].dtype, tf.float32)

  def test_cifar_splits_follow_the_ids_numerically(self):
    # Stored shuffled, and with ids of several widths: '..._10' sorts before '..._9' as text.
    stored = [9, 100, 0, 10, 42, 1, 256, 99, 1000]
    for name in ('cifar10', 'cifar100'):
      for split in ('train', 'test'):
        with tfds.testing.mock_data(as_dataset_fn=_mock_cifar(stored)):
          x, y, _ = registry.get(name).load_split(split, None)
        self.assertEqual(_numbers(x).tolist(), [0, 1, 9, 10, 42, 99, 100, 256, 1000],
                         (name, split))
        self.assertEqual(y.tolist(), [0, 1, 9, 0, 2, 9, 0, 6, 0], (name, split))
        self.assertTrue(np.all(x[..., 2] == 7))

  def test_cifar_ids_that_cannot_give_the_order_are_refused(self):
    task = registry.get('cifar10')
    with tfds.testing.mock_data(num_examples=5):  # Random text ids.
      with self.assertRaisesRegex(ValueError, r"--data_dir: cifar10 split 'train'.*example id.*"
                                  r'tfds build cifar10 --data_dir=DIR'):
        task.load_split('train', None)
    with tfds.testing.mock_data(as_dataset_fn=_mock_cifar([3, 1, 3])):
      with self.assertRaisesRegex(ValueError, r'--data_dir: .*repeated example indices'):
        task.load_split('train', None)

  def test_cifar10_built_by_tfds_comes_back_in_file_order(self):
    # The real TFDS cifar10 builder over fake binary files: TFDS shuffles the stored examples
    # (hash of the key); load_split must return them in the files' order.
    root = tempfile.mkdtemp()
    _fake_cifar10_files(os.path.join(root, 'extracted'), [40, 37, 41, 39, 43], 60)
    data_dir = os.path.join(root, 'tfds')
    with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract',
                           return_value=os.path.join(root, 'extracted')):
      tfds.builder('cifar10', data_dir=data_dir).download_and_prepare(
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    task = registry.get('cifar10')
    for split, n in (('train', 200), ('test', 60)):
      stored = tfds.as_numpy(tfds.load('cifar10', split=split, data_dir=data_dir))
      stored_ids = [ex['id'].decode() for ex in stored]
      self.assertNotEqual(stored_ids, sorted(stored_ids), split)  # Really shuffled on disk.
      x, y, _ = task.load_split(split, data_dir)
      self.assertEqual(_numbers(x).tolist(), list(range(n)), split)
      self.assertEqual(y.tolist(), [(3 * i) % 10 for i in range(n)], split)
      self.assertTrue(np.all(x[..., 2] == 11))
      self.assertTrue(np.all(x == x[:, :1, :1, :]))  # Each image placed whole.

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
    # The shared split is the official data_batch_1, in the files' order: its well-known first
    # labels (frog, truck, truck, deer, automobile, ...), first pixel and class counts.
    self.assertEqual(y[:10].tolist(), [6, 9, 9, 4, 1, 1, 2, 7, 8, 3])
    self.assertEqual(x[0, 0, 0].tolist(), [59, 62, 63])
    self.assertEqual(np.bincount(y, minlength=10).tolist(),
                     [1005, 974, 1032, 1016, 999, 937, 1030, 1001, 1025, 981])
    xt, yt, _ = task.load_split('test', data_dir)
    self.assertEqual(xt.shape, (10000, 32, 32, 3))
    self.assertEqual(yt[:10].tolist(), [3, 8, 8, 0, 6, 6, 1, 6, 3, 1])  # test_batch's first.


if __name__ == '__main__':
  absltest.main()
