"""AlexNet with BatchNorm, as the FedBN paper uses for Office-Caltech10 and DomainNet.

features: conv 11x11/4 pad 2 (64) BN ReLU maxpool 3/2; conv 5x5 pad 2 (192) BN ReLU maxpool 3/2;
conv 3x3 (384) BN ReLU; conv 3x3 (256) BN ReLU; conv 3x3 (256) BN ReLU maxpool 3/2;
adaptive average pooling to 6x6 (PyTorch's AdaptiveAvgPool2d semantics, so any input size that
survives the three max-pools works: at least 63x63; FedBN uses 256x256);
classifier: Dense 9216->4096 BN ReLU; Dense 4096->4096 BN ReLU (= the representation, 4096-d);
Dense 4096->num_classes. Convs and dense layers have biases. Initialised with PyTorch's defaults as
FedBN's network (`init='torch'`, models/common.py). About 57M parameters.
`hidden_dim` (default 4096, FedBN's) narrows the two hidden dense layers, e.g. for tests.
With decomposed=True every conv (11x11, 5x5, 3x3) is decomposed; the dense layers stay plain.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tff_decorr.models import common

MIN_SIZE = 63  # Smallest input side for which the last max-pool has a non-empty output.


def _out(n, k, s, p=0):
  return (n + 2 * p - k) // s + 1


# Seven parameters: a keras.applications-style builder, one explicit argument per choice.
def alexnet_bn(num_classes: int, input_shape: Sequence[int], projection_dim: Optional[int] = None,
               decomposed: bool = False, num_atoms: Optional[int] = None,
               hidden_dim: int = 4096, init: str = 'torch') -> tf.keras.Model:
  """AlexNet with BatchNorm, FedBN's network for its domain tasks.

  Args:
    num_classes: see `models.build`.
    input_shape: (H, W, C), at least MIN_SIZE on each side.
    projection_dim: see `models.build`.
    decomposed: see `models.build`.
    num_atoms: see `models.build`.
    hidden_dim: width of the fully connected layers (the representation), >= 1.
    init: see `models.build`.

  Returns:
    The functional Keras model, outputs {'representation', 'logits'}.

  Raises:
    ValueError: an argument out of range, or images too small.
  """
  num_classes, input_shape, projection_dim, decomposed, num_atoms = common.check_common_args(
      num_classes, input_shape, projection_dim, decomposed, num_atoms)
  if not isinstance(hidden_dim, int) or hidden_dim < 1:
    raise ValueError(f'hidden_dim must be an integer >= 1, got {hidden_dim!r}.')
  for side in input_shape[:2]:
    n = _out(_out(_out(_out(_out(side, 11, 4, 2), 3, 2), 5, 1, 2), 3, 2), 3, 2)
    if n < 1:
      raise ValueError(f'input_shape {input_shape}: alexnet_bn needs images of at least '
                       f'{MIN_SIZE}x{MIN_SIZE} (three 3x3/2 max-pools after a stride-4 conv); '
                       'resize the images or choose another --model.')
  convs = common.Convs(decomposed, num_atoms, init)
  inputs = tf.keras.Input(input_shape, name='images')
  x = inputs
  spec = ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
          (256, 3, 1, 1, False), (256, 3, 1, 1, True))
  for i, (filters, k, s, p, pool) in enumerate(spec, start=1):
    x = convs.conv(x, filters, k, strides=s, padding=p, use_bias=True, name=f'conv{i}')
    x = tf.keras.layers.ReLU(name=f'relu{i}')(common.batch_norm(f'bn{i}')(x))
    if pool:
      x = tf.keras.layers.MaxPool2D(3, 2, padding='valid', name=f'maxpool{i}')(x)
  x = common.AdaptiveAveragePooling2D((6, 6), name='avgpool')(x)
  x = tf.keras.layers.Flatten(name='flatten')(x)
  for i in (6, 7):
    x = common.dense(x, hidden_dim, init, f'fc{i - 5}')
    x = tf.keras.layers.ReLU(name=f'relu{i}')(common.batch_norm(f'bn{i}')(x))
  rep, logits = common.head(x, num_classes, projection_dim, init)
  return common.make_model(inputs, rep, logits, 'alexnet_bn')
