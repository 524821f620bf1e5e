"""Image-classification tasks read from the TFDS catalog (CIFAR-10, CIFAR-100).

TFDS stores a split's examples shuffled (by a hash of each example's key), so the stored order is
not the dataset's. The splits are returned in the original order, restored from a feature TFDS
keeps (CIFAR: `id` = 'train_00000', ..., the index in the official files; Tiny ImageNet: see
tasks/tiny_imagenet.py). The reference (torchvision) indexes that order, so the same partition
indices give client k the same images as the reference's client k.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Dict, Optional, Tuple

import numpy as np

from tff_decorr.tasks import base


def _where(data_dir: Optional[str]) -> str:
  return data_dir or '~/tensorflow_datasets (the TFDS default)'


@dataclasses.dataclass(frozen=True)
class TfdsImageTask(base.Task):
  tfds_name: str = ''
  train_split: str = 'train'
  test_split: str = 'test'
  # The features `original_order` reads.
  order_features: ClassVar[Tuple[str, ...]] = ('id',)

  def load_split(self, split: str, data_dir: Optional[str]):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    name = {'train': self.train_split, 'test': self.test_split}.get(split)
    if name is None:
      raise ValueError(f'unknown split {split!r}; use train or test.')
    try:
      ds = tfds.load(self.tfds_name, split=name, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises several types for a missing/unprepared dataset.
      raise base.DatasetNotFoundError(self._missing_message(data_dir, e)) from e
    keys = self.order_features
    ds = ds.map(lambda ex: (ex['image'], ex['label'], {k: ex[k] for k in keys}))
    # Decoded once, in large batches (not batch_size=-1, which needs a known cardinality).
    chunks = list(tfds.as_numpy(ds.batch(4096)))
    if not chunks:  # An empty split is a dataset prepared wrongly.
      raise base.DatasetNotFoundError(self._missing_message(data_dir))
    if tuple(chunks[0][0].shape[1:]) != tuple(self.input_shape):
      raise ValueError(f'{self.tfds_name} images have shape {chunks[0][0].shape[1:]}, expected '
                       f'{self.input_shape}.')
    order = self.original_order(
        name, data_dir, {k: np.concatenate([c[2][k] for c in chunks]) for k in keys})
    # Stored example i goes to position rank[i]. Each chunk is written straight to its positions
    # and released: at most two copies of the split at once (concatenate-then-gather makes three).
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    images = np.empty((len(order),) + tuple(self.input_shape), np.uint8)
    labels = np.empty(len(order), np.int64)
    start = 0
    while chunks:
      x, y, _ = chunks.pop(0)
      where = rank[start:start + len(y)]
      images[where] = x
      labels[where] = y
      start += len(y)
    return images, labels, None

  def original_order(self, split: str, data_dir: Optional[str],
                     features: Dict[str, np.ndarray]) -> np.ndarray:
    """Stored positions in the original dataset's order, from `features[order_features]`.

    CIFAR: ids '<split>_<index>'; sorted numerically (not as strings, in case widths differ).
    """
    ids = [v.decode() if isinstance(v, bytes) else str(v) for v in features['id']]
    index = np.empty(len(ids), np.int64)
    prefixes = set()
    for i, example_id in enumerate(ids):
      prefix, _, number = example_id.rpartition('_')
      if not prefix or not number.isdigit():
        raise ValueError(
            f'--data_dir: {self.tfds_name} split {split!r} in {_where(data_dir)} has example id '
            f'{example_id!r}, not \'<split>_<index>\' as TFDS writes CIFAR; the official order '
            f'cannot be restored. Rebuild it with `tfds build {self.tfds_name} --data_dir=DIR`.')
      prefixes.add(prefix)
      index[i] = int(number)
    if len(prefixes) > 1 or len(np.unique(index)) != len(index):
      raise ValueError(
          f'--data_dir: {self.tfds_name} split {split!r} in {_where(data_dir)}: repeated example '
          f'indices or several id prefixes ({sorted(prefixes)}); the official order is '
          f'ambiguous. Use one split (train or test) of a dataset built by '
          f'`tfds build {self.tfds_name} --data_dir=DIR`.')
    return np.argsort(index, kind='stable')

  def _missing_message(self, data_dir, err=None):
    where = _where(data_dir)
    extra = f' ({type(err).__name__}: {str(err).splitlines()[0][:160]})' if err else ''
    return (f'--data_dir: dataset {self.tfds_name} is not prepared in {where}{extra}. Prepare it '
            f'on a machine with internet: `tfds build {self.tfds_name} --data_dir=DIR` (or '
            f'`python -c "import tensorflow_datasets as tfds; tfds.load(\'{self.tfds_name}\', '
            f'data_dir=\'DIR\')"`), copy DIR here and pass --data_dir=DIR.')


# MOON's projection head on CIFAR (the reference's --use_proj_head). bin/train applies a task's
# projection_dim to --algorithm=moon only; every other algorithm gets no head unless the flag asks.
_MOON_PROJECTION_DIM = 256

CIFAR10 = TfdsImageTask(
    name='cifar10', tfds_name='cifar10', num_classes=10, input_shape=(32, 32, 3),
    default_model='mobilenet_v2_cifar', default_partition='dirichlet',
    defaults=dict(rounds=100, local_epochs=10, client_lr=0.01, momentum=0.9, batch_size=64,
                  weight_decay=1e-5, num_clients=10, eval_every=1,
                  projection_dim=_MOON_PROJECTION_DIM,
                  **{'feddecorr.beta': 0.1, 'dirichlet.alpha': 0.05, 'fedavgm.server_momentum': 0.9}),
    mean=(125.3 / 255, 123.0 / 255, 113.9 / 255), std=(63.0 / 255, 62.1 / 255, 66.7 / 255),
    augmentation='crop_flip', description='CIFAR-10 (TFDS catalog)')

CIFAR100 = TfdsImageTask(
    name='cifar100', tfds_name='cifar100', num_classes=100, input_shape=(32, 32, 3),
    default_model='mobilenet_v2_cifar', default_partition='dirichlet',
    # beta 0.05: the coefficient of the reference's CIFAR-100 scripts (0.1 elsewhere).
    defaults=dict(rounds=100, local_epochs=10, client_lr=0.01, momentum=0.9, batch_size=64,
                  weight_decay=1e-4, num_clients=10, eval_every=1,
                  projection_dim=_MOON_PROJECTION_DIM,
                  **{'feddecorr.beta': 0.05, 'dirichlet.alpha': 0.05, 'fedavgm.server_momentum': 0.5}),
    mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
    # As the paper: crop, flip, then AutoAugment with the CIFAR-10 policy (tasks/autoaugment.py).
    augmentation='crop_flip_autoaugment', description='CIFAR-100 (TFDS catalog)')
