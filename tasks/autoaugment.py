"""AutoAugment (Cubuk et al., 2019) with the CIFAR-10 policy, as stateless TF ops on uint8 images.

Why our own: the maintained TF implementation (tf-models-official's `official.vision.ops.augment`)
would add about 25 packages to the pinned lock (tensorflow-text, opencv, pycocotools, kaggle, ...)
and draws its randomness from stateful ops; tensorflow-addons is end-of-life. Here every random
choice (which sub-policy, whether each operation fires, the sign of signed magnitudes) is a
stateless draw from the per-example seed, so augmentation is a pure function of (image, seed), the
same in the eager process and in TFF's traced graphs (tasks/client_data.py). Everything is plain
TF graph ops (no py_function), usable inside `tf.data.Dataset.map`.

Magnitudes follow the paper: each operation's range is cut into 10 uniformly spaced levels 0..9
(`level / 9` of the range's extent):
  ShearX/Y     shear factor in [-0.3, 0.3] (sign drawn at random)
  TranslateX/Y up to 150/331 of the image side (the paper's 150 pixels on 331-pixel images), signed
  Rotate       up to 30 degrees, signed
  Color, Contrast, Brightness, Sharpness   factor 1 +- 0.9 * level / 9 (range [0.1, 1.9])
  Posterize    keep 8 - round(4 * level / 9) bits (8..4)
  Solarize     invert pixels >= 256 - 256 * level / 9
  AutoContrast, Equalize, Invert   no magnitude
Geometric operations use nearest-neighbour sampling and fill uncovered pixels with grey (128), as
the PIL-based implementations do. The enhancement operations follow PIL's ImageEnhance definitions
(blend with a degenerate image: grey-mean for Contrast, greyscale for Color, black for Brightness,
a 3x3 smoothing for Sharpness) and round to the nearest integer.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import tensorflow as tf

NUM_LEVELS = 10
_MAX_LEVEL = float(NUM_LEVELS - 1)
_FILL = 128

# The CIFAR-10 policy found by AutoAugment: 25 sub-policies of two (operation, probability, level).
CIFAR10_POLICY: Tuple[Tuple[Tuple[str, float, int], Tuple[str, float, int]], ...] = (
    (('Invert', 0.1, 7), ('Contrast', 0.2, 6)),
    (('Rotate', 0.7, 2), ('TranslateX', 0.3, 9)),
    (('Sharpness', 0.8, 1), ('Sharpness', 0.9, 3)),
    (('ShearY', 0.5, 8), ('TranslateY', 0.7, 9)),
    (('AutoContrast', 0.5, 8), ('Equalize', 0.9, 2)),
    (('ShearY', 0.2, 7), ('Posterize', 0.3, 7)),
    (('Color', 0.4, 3), ('Brightness', 0.6, 7)),
    (('Sharpness', 0.3, 9), ('Brightness', 0.7, 9)),
    (('Equalize', 0.6, 5), ('Equalize', 0.5, 1)),
    (('Contrast', 0.6, 7), ('Sharpness', 0.6, 5)),
    (('Color', 0.7, 7), ('TranslateX', 0.5, 8)),
    (('Equalize', 0.3, 7), ('AutoContrast', 0.4, 8)),
    (('TranslateY', 0.4, 3), ('Sharpness', 0.2, 6)),
    (('Brightness', 0.9, 6), ('Color', 0.2, 8)),
    (('Solarize', 0.5, 2), ('Invert', 0.0, 3)),
    (('Equalize', 0.2, 0), ('AutoContrast', 0.6, 0)),
    (('Equalize', 0.2, 8), ('Equalize', 0.6, 4)),
    (('Color', 0.9, 9), ('Equalize', 0.6, 6)),
    (('AutoContrast', 0.8, 4), ('Solarize', 0.2, 8)),
    (('Brightness', 0.1, 3), ('Color', 0.7, 0)),
    (('Solarize', 0.4, 5), ('AutoContrast', 0.9, 3)),
    (('TranslateY', 0.9, 9), ('TranslateY', 0.7, 9)),
    (('AutoContrast', 0.9, 2), ('Solarize', 0.8, 3)),
    (('Equalize', 0.8, 8), ('Invert', 0.1, 3)),
    (('TranslateY', 0.7, 9), ('AutoContrast', 0.9, 1)),
)


# ---- helpers ----
def _to_uint8(x: tf.Tensor) -> tf.Tensor:
  return tf.cast(tf.clip_by_value(tf.round(x), 0.0, 255.0), tf.uint8)


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor) -> tf.Tensor:
  """PIL ImageEnhance: degenerate + factor * (image - degenerate), clipped to uint8."""
  d = tf.cast(degenerate, tf.float32)
  return _to_uint8(d + tf.cast(factor, tf.float32) * (tf.cast(image, tf.float32) - d))


def _grayscale(image: tf.Tensor) -> tf.Tensor:
  """[H, W, 1] float32 luminance (ITU-R 601, as PIL's 'L'); single-channel images pass through."""
  x = tf.cast(image, tf.float32)
  if image.shape[-1] == 3:
    return tf.reduce_sum(x * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)
  return x


def _transform(image: tf.Tensor, matrix: List, fill: float = _FILL) -> tf.Tensor:
  """Projective transform: output pixel (x, y) samples input (a0 x + a1 y + a2, b0 x + b1 y + b2).
  """
  h, w = image.shape[0], image.shape[1]
  m = tf.cast(tf.stack([tf.cast(v, tf.float32) for v in matrix] + [0.0, 0.0]), tf.float32)
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=tf.cast(image[tf.newaxis], tf.float32), transforms=m[tf.newaxis],
      output_shape=tf.constant([h, w], tf.int32), fill_value=float(fill),
      interpolation='NEAREST', fill_mode='CONSTANT')
  return tf.cast(out[0], tf.uint8)


def _signed(value: tf.Tensor, sign: tf.Tensor) -> tf.Tensor:
  return tf.where(sign, -value, value)


# ---- operations: fn(image uint8 [H, W, C], level float32 scalar, negate bool scalar) ----
def shear_x(image, level, negate):
  s = _signed(level / _MAX_LEVEL * 0.3, negate)
  return _transform(image, [1.0, s, 0.0, 0.0, 1.0, 0.0])


def shear_y(image, level, negate):
  s = _signed(level / _MAX_LEVEL * 0.3, negate)
  return _transform(image, [1.0, 0.0, 0.0, s, 1.0, 0.0])


def translate_x(image, level, negate):
  t = _signed(level / _MAX_LEVEL * (150.0 / 331.0) * image.shape[1], negate)
  return _transform(image, [1.0, 0.0, t, 0.0, 1.0, 0.0])


def translate_y(image, level, negate):
  t = _signed(level / _MAX_LEVEL * (150.0 / 331.0) * image.shape[0], negate)
  return _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, t])


def rotate_degrees(image: tf.Tensor, degrees, fill: float = _FILL) -> tf.Tensor:
  """Rotation about the image centre (nearest neighbour), uncovered pixels set to `fill`."""
  theta = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  c, s = tf.cos(theta), tf.sin(theta)
  cx, cy = (image.shape[1] - 1) / 2.0, (image.shape[0] - 1) / 2.0
  # Inverse map: input = R(-theta) (output - centre) + centre.
  return _transform(image, [c, s, cx - c * cx - s * cy, -s, c, cy + s * cx - c * cy], fill)


def rotate(image, level, negate):
  """Rotation about the image centre by up to 30 degrees."""
  return rotate_degrees(image, _signed(level / _MAX_LEVEL * 30.0, negate))


def auto_contrast(image, level=None, negate=None):
  """Per channel, stretch [min, max] to [0, 255]; constant channels stay. Computed as PIL does
  (float64 scale and offset, truncation), so results equal ImageOps.autocontrast."""
  del level, negate
  x = tf.cast(image, tf.float64)
  lo = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  hi = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = tf.clip_by_value(tf.floor(x * scale + (-lo * scale)), 0.0, 255.0)
  return tf.cast(tf.where(hi > lo, stretched, x), tf.uint8)


def invert(image, level=None, negate=None):
  del level, negate
  return tf.cast(255 - tf.cast(image, tf.int32), tf.uint8)


def _equalize_channel(ch: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.equalize on one uint8 channel [H, W]."""
  v = tf.cast(ch, tf.int32)
  hist = tf.math.bincount(tf.reshape(v, [-1]), minlength=256, maxlength=256, dtype=tf.int32)
  last = tf.gather(hist, tf.reduce_max(v))  # Count of the highest occurring value.
  step = (tf.reduce_sum(hist) - last) // 255

  def equalized():
    lut = (tf.cumsum(hist, exclusive=True) + step // 2) // tf.maximum(step, 1)
    return tf.cast(tf.gather(tf.clip_by_value(lut, 0, 255), v), tf.uint8)
  return tf.cond(step > 0, equalized, lambda: ch)


def equalize(image, level=None, negate=None):
  del level, negate
  return tf.stack([_equalize_channel(image[..., i]) for i in range(image.shape[-1])], axis=-1)


def solarize(image, level, negate=None):
  """Invert every pixel at or above the threshold 256 - 256 * level / 9."""
  del negate
  threshold = 256.0 - level / _MAX_LEVEL * 256.0
  return tf.where(tf.cast(image, tf.float32) >= threshold, invert(image), image)


def posterize(image, level, negate=None):
  """Keep the top 8 - round(4 * level / 9) bits of each pixel."""
  del negate
  drop = tf.cast(tf.round(level / _MAX_LEVEL * 4.0), tf.int32)
  mask = tf.bitwise.left_shift(tf.constant(255, tf.int32), drop)
  return tf.cast(tf.bitwise.bitwise_and(tf.cast(image, tf.int32), mask), tf.uint8)


def _factor(level, negate):
  return 1.0 + _signed(level / _MAX_LEVEL * 0.9, negate)


def contrast(image, level, negate):
  mean = tf.round(tf.reduce_mean(_grayscale(image)))
  return _blend(tf.fill(tf.shape(image), mean), image, _factor(level, negate))


def color(image, level, negate):
  gray = tf.broadcast_to(tf.round(_grayscale(image)), tf.shape(image))
  return _blend(gray, image, _factor(level, negate))


def brightness(image, level, negate):
  return _blend(tf.zeros_like(image), image, _factor(level, negate))


def sharpness(image, level, negate):
  """Blend with a 3x3 smoothing (centre weight 5, total 13); border pixels stay unsmoothed."""
  x = tf.cast(image, tf.float32)
  c = image.shape[-1]
  kernel = tf.constant([[1., 1., 1.], [1., 5., 1.], [1., 1., 1.]]) / 13.0
  kernel = tf.tile(kernel[:, :, tf.newaxis, tf.newaxis], [1, 1, c, 1])
  smooth = tf.round(tf.nn.depthwise_conv2d(x[tf.newaxis], kernel, [1, 1, 1, 1], 'VALID')[0])
  degenerate = tf.pad(smooth - x[1:-1, 1:-1], [[1, 1], [1, 1], [0, 0]]) + x
  return _blend(degenerate, image, _factor(level, negate))


OPS: Dict[str, Callable] = {
    'ShearX': shear_x, 'ShearY': shear_y, 'TranslateX': translate_x, 'TranslateY': translate_y,
    'Rotate': rotate, 'AutoContrast': auto_contrast, 'Invert': invert, 'Equalize': equalize,
    'Solarize': solarize, 'Posterize': posterize, 'Contrast': contrast, 'Color': color,
    'Brightness': brightness, 'Sharpness': sharpness,
}


def apply_policy(image: tf.Tensor, seed: tf.Tensor, policy=CIFAR10_POLICY) -> tf.Tensor:
  """One AutoAugment draw: a uniformly chosen sub-policy, each of its two operations applied with
  its probability. All draws are stateless functions of `seed` (int64 [2])."""
  shape = image.shape
  if shape.rank != 3 or not shape.is_fully_defined():
    raise ValueError(f'AutoAugment needs a statically shaped [H, W, C] image, got {shape}.')
  image = tf.convert_to_tensor(image)
  if image.dtype != tf.uint8:
    raise ValueError(f'AutoAugment needs uint8 images, got {image.dtype}.')
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
  index = tf.random.stateless_uniform([], seeds[0], 0, len(policy), dtype=tf.int32)
  fire = tf.random.stateless_uniform([2], seeds[1])
  negate = tf.random.stateless_uniform([2], seeds[2]) < 0.5

  def branch(sub_policy):
    def run():
      out = image
      for j, (name, prob, level) in enumerate(sub_policy):
        op = OPS[name]
        lv = tf.constant(float(level))
        out = tf.cond(fire[j] < prob,
                      lambda o=out, op=op, lv=lv, j=j: tf.ensure_shape(op(o, lv, negate[j]), shape),
                      lambda o=out: o)
      return out
    return run

  out = tf.switch_case(index, [branch(sp) for sp in policy])
  return tf.ensure_shape(out, shape)


def autoaugment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """tasks.augment signature: fn(image uint8 [H, W, C], seed int64 [2]) -> image uint8."""
  return apply_policy(image, seed)
