"""CIFAR ResNets of the FedDecorr reference (docs/reference.md §2).

- resnet20 / resnet32 (He et al. 2016, CIFAR): 3x3 conv 3->16 + BN + ReLU; three stages of n = 3 / 5
  basic blocks with 16, 32, 64 channels (stride 1, 2, 2); global average pooling (64-d); linear
  classifier. Shortcuts where the shape changes are "option A" as in the reference and the
  original paper: parameter-free, the input subsampled with stride 2 and zero-padded with
  channels/4 zero channels on each side. 272,474 / 466,906 parameters for 10 classes.
- resnet18 (CIFAR variant): 3x3 conv 3->64 stem, no max-pool; basic blocks [2, 2, 2, 2] with
  64..512 channels; "option B" shortcuts (1x1 conv stride s + BN) as in the reference; global
  average pooling (512-d; the reference's fixed 4x4 window only works at 32x32). 11,173,962
  parameters for 10 classes.
Convs have no bias. With decomposed=True every 3x3 conv is decomposed (1x1 shortcuts stay plain).
Initialisation (`init`, models/common.py) follows the reference: resnet20/32 apply its
`_weights_init` (Kaiming-normal conv and linear weights: 'kaiming_normal'); its resnet18 does not,
so it starts from PyTorch's defaults ('torch').
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tff_decorr.models import common


class _OptionAShortcut(tf.keras.layers.Layer):
  """x[:, ::2, ::2, :] zero-padded to `out_channels` (pad (out - in) / 2 on each side)."""

  def __init__(self, out_channels: int, stride: int, **kwargs):
    super().__init__(**kwargs)
    self.out_channels, self.stride = int(out_channels), int(stride)

  def call(self, x):
    x = x[:, ::self.stride, ::self.stride, :]
    extra = self.out_channels - int(x.shape[-1])
    return tf.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])

  def get_config(self):
    config = super().get_config()
    config.update(out_channels=self.out_channels, stride=self.stride)
    return config


def _basic_block(x, convs: common.Convs, out_ch: int, stride: int, option: str, name: str):
  in_ch = int(x.shape[-1])
  y = convs.conv(x, out_ch, 3, strides=stride, padding=1, name=f'{name}_conv1')
  y = tf.keras.layers.ReLU(name=f'{name}_relu1')(common.batch_norm(f'{name}_bn1')(y))
  y = convs.conv(y, out_ch, 3, strides=1, padding=1, name=f'{name}_conv2')
  y = common.batch_norm(f'{name}_bn2')(y)
  shortcut = x
  if stride != 1 or in_ch != out_ch:
    if option == 'A':
      shortcut = _OptionAShortcut(out_ch, stride, name=f'{name}_shortcut')(x)
    else:
      shortcut = convs.conv(x, out_ch, 1, strides=stride, name=f'{name}_shortcut')
      shortcut = common.batch_norm(f'{name}_shortcut_bn')(shortcut)
  y = tf.keras.layers.Add(name=f'{name}_add')([y, shortcut])
  return tf.keras.layers.ReLU(name=f'{name}_out')(y)


# Ten parameters: the public builders' arguments and the architecture they fix, passed through.
def _resnet(name, widths, blocks, option, num_classes, input_shape, projection_dim, decomposed,
            num_atoms, init):
  num_classes, input_shape, projection_dim, decomposed, num_atoms = common.check_common_args(
      num_classes, input_shape, projection_dim, decomposed, num_atoms)
  convs = common.Convs(decomposed, num_atoms, init)
  inputs = tf.keras.Input(input_shape, name='images')
  x = convs.conv(inputs, widths[0], 3, strides=1, padding=1, name='stem')
  x = tf.keras.layers.ReLU(name='stem_relu')(common.batch_norm('stem_bn')(x))
  for stage, (width, n) in enumerate(zip(widths, blocks)):
    for i in range(n):
      stride = 2 if (stage > 0 and i == 0) else 1
      x = _basic_block(x, convs, width, stride, option, name=f'stage{stage + 1}_block{i}')
  pooled = tf.keras.layers.GlobalAveragePooling2D(name='pool')(x)
  rep, logits = common.head(pooled, num_classes, projection_dim, init)
  return common.make_model(inputs, rep, logits, name)


def resnet20(num_classes: int, input_shape: Sequence[int], projection_dim: Optional[int] = None,
             decomposed: bool = False, num_atoms: Optional[int] = None,
             init: str = 'kaiming_normal') -> tf.keras.Model:
  """ResNet-20 of the reference's CIFAR ResNets: widths 16/32/64, 3 blocks a stage, option-A
  (zero-padded) shortcuts; a 64-d representation.

  Args:
    num_classes: the classifier's outputs (`models.build` describes every argument).
    input_shape: (H, W, C).
    projection_dim: MOON's projection head's width; None or 0: none.
    decomposed: filter-decomposed convolutions.
    num_atoms: atoms of a decomposed convolution; None: k*k.
    init: one of models.INITS.

  Returns:
    The functional Keras model, outputs {'representation', 'logits'}.

  Raises:
    ValueError: an argument out of range (named by its flag).
  """
  return _resnet('resnet20', (16, 32, 64), (3, 3, 3), 'A', num_classes, input_shape,
                 projection_dim, decomposed, num_atoms, init)


def resnet32(num_classes: int, input_shape: Sequence[int], projection_dim: Optional[int] = None,
             decomposed: bool = False, num_atoms: Optional[int] = None,
             init: str = 'kaiming_normal') -> tf.keras.Model:
  """ResNet-32: resnet20's network with 5 blocks a stage. Arguments, result and errors are
  resnet20's."""
  return _resnet('resnet32', (16, 32, 64), (5, 5, 5), 'A', num_classes, input_shape,
                 projection_dim, decomposed, num_atoms, init)


def resnet18(num_classes: int, input_shape: Sequence[int], projection_dim: Optional[int] = None,
             decomposed: bool = False, num_atoms: Optional[int] = None,
             init: str = 'torch') -> tf.keras.Model:
  """ResNet-18 for small images: widths 64-512, 2 blocks a stage, option-B (1x1 conv)
  shortcuts, PyTorch's default initialisation; a 512-d representation. Arguments, result and
  errors are resnet20's."""
  return _resnet('resnet18', (64, 128, 256, 512), (2, 2, 2, 2), 'B', num_classes, input_shape,
                 projection_dim, decomposed, num_atoms, init)
