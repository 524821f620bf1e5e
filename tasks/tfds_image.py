"""Image-classification tasks read from the TFDS catalog (CIFAR-10, CIFAR-100)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tasks import base


@dataclasses.dataclass(frozen=True)
class TfdsImageTask(base.Task):
  tfds_name: str = ''
  train_split: str = 'train'
  test_split: str = 'test'

  def load_split(self, split: str, data_dir: Optional[str]):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    name = {'train': self.train_split, 'test': self.test_split}.get(split)
    if name is None:
      raise ValueError(f'unknown split {split!r}; use train or test.')
    try:
      ds = tfds.load(self.tfds_name, split=name, data_dir=data_dir, download=False,
                     as_supervised=True)
    except Exception as e:  # tfds raises several types for a missing/unprepared dataset.
      raise base.DatasetNotFoundError(self._missing_message(data_dir, e)) from e
    # Decoded in large batches (not batch_size=-1, which needs a known cardinality).
    chunks = list(tfds.as_numpy(ds.batch(4096)))
    images = np.concatenate([c[0] for c in chunks])
    labels = np.concatenate([c[1] for c in chunks])
    images = np.asarray(images, np.uint8)
    if tuple(images.shape[1:]) != tuple(self.input_shape):
      raise ValueError(f'{self.tfds_name} images have shape {images.shape[1:]}, expected '
                       f'{self.input_shape}.')
    return images, np.asarray(labels, np.int64), None

  def _missing_message(self, data_dir, err=None):
    where = data_dir or '~/tensorflow_datasets (the TFDS default)'
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
                  weight_decay=1e-5, beta=0.1, alpha=0.05, num_clients=10, eval_every=1,
                  server_momentum=0.9, projection_dim=_MOON_PROJECTION_DIM),
    mean=(125.3 / 255, 123.0 / 255, 113.9 / 255), std=(63.0 / 255, 62.1 / 255, 66.7 / 255),
    augmentation='crop_flip', description='CIFAR-10 (TFDS catalog)')

CIFAR100 = TfdsImageTask(
    name='cifar100', tfds_name='cifar100', num_classes=100, input_shape=(32, 32, 3),
    default_model='mobilenet_v2_cifar', default_partition='dirichlet',
    # beta 0.05: the coefficient of the reference's CIFAR-100 scripts (0.1 elsewhere).
    defaults=dict(rounds=100, local_epochs=10, client_lr=0.01, momentum=0.9, batch_size=64,
                  weight_decay=1e-4, beta=0.05, alpha=0.05, num_clients=10, eval_every=1,
                  server_momentum=0.5, projection_dim=_MOON_PROJECTION_DIM),
    mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
    # As the paper: crop, flip, then AutoAugment with the CIFAR-10 policy (tasks/autoaugment.py).
    augmentation='crop_flip_autoaugment', description='CIFAR-100 (TFDS catalog)')
