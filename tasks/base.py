"""What a task is: a dataset with its splits, preprocessing, default model and the paper's settings.

A task decodes a split once into uint8 arrays (`load_split`); the program partitions the train
split and writes client shards (tasks.client_data); clients then read their shard inside whichever
runtime executes them. Evaluation reads the test split in the Python process (`test_dataset`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_decorr.tasks import augment as augment_lib
from tff_decorr.tasks import client_data


class DatasetNotFoundError(FileNotFoundError):
  """A dataset is not prepared where the user pointed; the message says how to prepare it."""


@dataclasses.dataclass(frozen=True)
class Task:
  """A dataset and the paper's settings for it; a subclass implements `load_split`.

  Attributes:
    name: the `--task` value.
    num_classes: the classifier's outputs.
    input_shape: one preprocessed image's shape, (H, W, C).
    default_model: the `--model` a run of this task gets by default.
    default_partition: the partition component a run gets by default.
    defaults: the paper's settings by flag or component key ('rounds', 'feddecorr.beta', ...),
      between explicit flags and the components' own defaults.
    mean: per-channel mean of the images scaled to [0, 1].
    std: per-channel standard deviation, likewise.
    augmentation: a key of tasks.augment.AUGMENTATIONS, applied to training batches.
    description: one line for `--help`.
    domains: the domains' names of a multi-domain task, () otherwise.
  """
  name: str
  num_classes: int
  input_shape: Tuple[int, int, int]
  default_model: str
  default_partition: str
  defaults: Mapping[str, object]
  mean: Sequence[float]
  std: Sequence[float]
  augmentation: str = 'none'
  description: str = ''
  domains: Tuple[str, ...] = ()

  # ---- data ----
  def load_split(self, split: str, data_dir: Optional[str]):
    """A split decoded once into arrays.

    Args:
      split: 'train' or 'test'.
      data_dir: where the prepared data lives (TFDS's data_dir); None: TFDS's default.

    Returns:
      (images uint8 [N, H, W, C], labels int64 [N], domain ids int64 [N] or None).

    Raises:
      DatasetNotFoundError: the data is not prepared there (the message says how to prepare it).
      ValueError: an unknown split, or images of another shape than `input_shape`.
    """
    raise NotImplementedError

  def preprocess(self, image: tf.Tensor) -> tf.Tensor:
    """uint8 image -> normalised float32 (the model's input, also at test time): (x / 255 - mean)
    / std as one multiply-add with float32 constants computed in float64. A division by a constant
    may be rewritten by graph optimisation in one context and not in another; a multiply-add gives
    the same bits everywhere (tasks.client_data builds small clients' data in a graph, large ones'
    in tf.data functions).

    Args:
      image: uint8 [..., H, W, C].

    Returns:
      float32 of the same shape.
    """
    mean, std = np.asarray(self.mean, np.float64), np.asarray(self.std, np.float64)
    scale = tf.constant(1.0 / (255.0 * std), tf.float32)
    offset = tf.constant(-mean / std, tf.float32)
    return tf.cast(image, tf.float32) * scale + offset

  def client_dataset_fn(self, shard_dir: str, batch_size: int, epochs: int = 1,
                        drop_remainder: bool = False, train: bool = True):
    """The function a runtime calls for a client's data (TF ops only, so TFF can trace it).

    Args:
      shard_dir: the folder of the run's client shards (tasks.client_data writes them).
      batch_size: examples a batch.
      epochs: passes over the client's examples the dataset holds.
      drop_remainder: drop each pass's last incomplete batch.
      train: augment (the task's `augmentation`); False: preprocessing only.

    Returns:
      fn(client_id, seed) -> the client's batched dataset of (images, labels).
    """
    aug = augment_lib.AUGMENTATIONS[self.augmentation] if train else None
    return client_data.make_client_dataset_fn(shard_dir, self.input_shape, batch_size,
                                              self.preprocess, aug, epochs, drop_remainder)

  def test_dataset(self, data_dir: Optional[str], batch_size: int = 256) -> tf.data.Dataset:
    """The test split, preprocessed without augmentation, batched (evaluation, analysis).

    Args:
      data_dir: as `load_split`'s.
      batch_size: examples a batch.

    Returns:
      A dataset of (float32 images, int32 labels), in the split's order.

    Raises:
      DatasetNotFoundError: as `load_split`.
    """
    return self.split_dataset('test', data_dir, batch_size)

  def split_dataset(self, split: str, data_dir: Optional[str],
                    batch_size: int = 256) -> tf.data.Dataset:
    """A split, preprocessed without augmentation, batched, in its order.

    Args:
      split: 'train' or 'test'.
      data_dir: as `load_split`'s.
      batch_size: examples a batch.

    Returns:
      A dataset of (float32 images, int32 labels).

    Raises:
      DatasetNotFoundError: as `load_split`.
    """
    images, labels, _ = self._cached_split(split, data_dir)
    ds = tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32)))
    return ds.batch(batch_size).map(lambda x, y: (self.preprocess(x), y))

  def domain_test_datasets(self, data_dir: Optional[str], batch_size: int = 256) -> dict:
    """The test split by domain, for domain tasks (FedBN's per-client evaluation).

    Args:
      data_dir: as `load_split`'s.
      batch_size: examples a batch.

    Returns:
      {domain id: dataset as `test_dataset`'s}; {} for a task without domains.

    Raises:
      DatasetNotFoundError: as `load_split`.
    """
    images, labels, domains = self._cached_split('test', data_dir)
    if domains is None:
      return {}
    out = {}
    for d in np.unique(domains):
      m = domains == d
      ds = tf.data.Dataset.from_tensor_slices((images[m], labels[m].astype(np.int32)))
      out[int(d)] = ds.batch(batch_size).map(lambda x, y: (self.preprocess(x), y))
    return out

  def _cached_split(self, split, data_dir):
    cache = self.__dict__.setdefault('_split_cache', {})
    key = (split, data_dir)
    if key not in cache:
      cache[key] = self.load_split(split, data_dir)
    return cache[key]
