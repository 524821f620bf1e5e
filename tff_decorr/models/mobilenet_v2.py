"""MobileNetV2, CIFAR variant of the FedDecorr reference (docs/reference.md §2).

Stem 3x3 conv 3->32 stride 1 + BN + ReLU; inverted-residual blocks (t, c, n, s) =
(1,16,1,1) (6,24,2,1) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1); 1x1 conv
320->1280 + BN + ReLU; global average pooling (1280-d representation); linear classifier.

Block details follow the reference network (itself the widely used CIFAR port), which differs
from torchvision / Keras MobileNetV2 in ways that change the parameter count (2,296,922 for 10
classes, the "2.30M" of the paper):
- activations are plain ReLU, not ReLU6;
- the 1x1 expansion conv + BN + ReLU is present in every block, also when t = 1;
- stride-1 blocks whose channel count changes have a 1x1 conv + BN shortcut; stride-1 blocks with
  equal channels add the identity; stride-2 blocks have no residual.
Convs have no bias (BN follows). Total stride 8: 32x32 -> 4x4, 64x64 -> 8x8 before pooling.
With decomposed=True every 3x3 conv is decomposed: the stem (DecomposedConv2D) and the 17
depthwise convs (DecomposedDepthwiseConv2D); the 1x1 expansion / projection / shortcut / last convs
stay plain. Initialisation: PyTorch's defaults, as the reference network has no init of its own
(`init='torch'`, models/common.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tff_decorr.models import common

CONFIG = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))


# Seven parameters: one per column of the paper's block table, plus the input and a name.
def _block(x, convs: common.Convs, in_ch: int, out_ch: int, expansion: int, stride: int,
           name: str):
  hidden = expansion * in_ch
  y = convs.conv(x, hidden, 1, name=f'{name}_expand')
  y = tf.keras.layers.ReLU(name=f'{name}_expand_relu')(common.batch_norm(f'{name}_expand_bn')(y))
  y = convs.depthwise(y, 3, strides=stride, padding=1, name=f'{name}_depthwise')
  y = tf.keras.layers.ReLU(name=f'{name}_depthwise_relu')(
      common.batch_norm(f'{name}_depthwise_bn')(y))
  y = convs.conv(y, out_ch, 1, name=f'{name}_project')
  y = common.batch_norm(f'{name}_project_bn')(y)
  if stride != 1:
    return y
  shortcut = x
  if in_ch != out_ch:
    shortcut = convs.conv(x, out_ch, 1, name=f'{name}_shortcut')
    shortcut = common.batch_norm(f'{name}_shortcut_bn')(shortcut)
  return tf.keras.layers.Add(name=f'{name}_add')([y, shortcut])


def mobilenet_v2_cifar(num_classes: int, input_shape: Sequence[int],
                       projection_dim: Optional[int] = None, decomposed: bool = False,
                       num_atoms: Optional[int] = None, init: str = 'torch') -> tf.keras.Model:
  """The reference's MobileNetV2 for CIFAR (stride-1 stem); a 1280-d representation. Its
  arguments, result and errors are resnet20's (`models.build` describes them)."""
  num_classes, input_shape, projection_dim, decomposed, num_atoms = common.check_common_args(
      num_classes, input_shape, projection_dim, decomposed, num_atoms)
  convs = common.Convs(decomposed, num_atoms, init)
  inputs = tf.keras.Input(input_shape, name='images')
  x = convs.conv(inputs, 32, 3, strides=1, padding=1, name='stem')
  x = tf.keras.layers.ReLU(name='stem_relu')(common.batch_norm('stem_bn')(x))
  in_ch = 32
  for stage, (t, c, n, s) in enumerate(CONFIG):
    for i in range(n):
      x = _block(x, convs, in_ch, c, t, s if i == 0 else 1, name=f'block{stage}_{i}')
      in_ch = c
  x = convs.conv(x, 1280, 1, name='last_conv')
  x = tf.keras.layers.ReLU(name='last_relu')(common.batch_norm('last_bn')(x))
  pooled = tf.keras.layers.GlobalAveragePooling2D(name='pool')(x)
  rep, logits = common.head(pooled, num_classes, projection_dim, init)
  return common.make_model(inputs, rep, logits, 'mobilenet_v2_cifar')
