"""Training-time augmentation as stateless TF ops on uint8 images (seeded per example).

Stateless ops make the augmentation a pure function of (seed, image): the same client, round and
epoch give the same batches in both runtimes, and a resumed run sees the same data as an
uninterrupted one. Augmentation is applied to training client data only, never at test time.
"""

from __future__ import annotations

import tensorflow as tf

from tff_decorr.tasks import autoaugment as autoaugment_lib


def _split(seed: tf.Tensor, n: int) -> tf.Tensor:
  return tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=n)


def random_crop_flip(image: tf.Tensor, seed: tf.Tensor, pad: int = 4) -> tf.Tensor:
  """CIFAR augmentation: zero-pad by `pad`, random crop back to size, random horizontal flip."""
  s = _split(seed, 2)
  h, w, c = image.shape
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  image = tf.image.stateless_random_crop(padded, [h, w, c], seed=s[0])
  return tf.image.stateless_random_flip_left_right(image, seed=s[1])


def random_flip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  return tf.image.stateless_random_flip_left_right(image, seed=_split(seed, 1)[0])


def autoaugment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """AutoAugment, CIFAR-10 policy (tasks/autoaugment.py): TinyImageNet in the paper."""
  return autoaugment_lib.apply_policy(image, _split(seed, 1)[0])


def crop_flip_autoaugment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Crop (pad 4) and flip, then AutoAugment (CIFAR-10 policy): CIFAR-100 in the paper."""
  s = _split(seed, 2)
  return autoaugment_lib.apply_policy(random_crop_flip(image, s[0]), s[1])


def flip_rotate(image: tf.Tensor, seed: tf.Tensor, max_degrees: float = 30.0) -> tf.Tensor:
  """FedBN's Office-Caltech10 / DomainNet training augmentation: random horizontal flip, then a
  rotation by a uniform angle in [-30, 30] degrees (black fill, as torchvision's RandomRotation)."""
  s = _split(seed, 2)
  image = tf.image.stateless_random_flip_left_right(image, seed=s[0])
  degrees = tf.random.stateless_uniform([], s[1], -max_degrees, max_degrees)
  return autoaugment_lib.rotate_degrees(image, degrees, fill=0)


AUGMENTATIONS = {
    'none': None,
    'crop_flip': random_crop_flip,
    'flip': random_flip,
    'autoaugment': autoaugment,
    'crop_flip_autoaugment': crop_flip_autoaugment,
    'flip_rotate': flip_rotate,
}
