"""A small CNN for quick experiments and the embedded default task (8x8x1 digits, 32x32x3).

conv 3x3 (width) + BN + ReLU; max-pool 2x2; conv 3x3 (2 width) + ReLU; global average pooling;
Dense(representation_dim) + ReLU = the representation; linear classifier. The one
BatchNormalization layer exercises the BN paths (BN-statistics averaging, FedBN). Both 3x3 convs
are decomposed with decomposed=True. Works for any input of at least 2x2. Not a port of PyTorch
code, so it keeps Keras' initialisation by default (`init`, models/common.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tff_decorr.models import common


# Eight parameters: a keras.applications-style builder, one explicit argument per choice.
def small_cnn(num_classes: int, input_shape: Sequence[int], projection_dim: Optional[int] = None,
              decomposed: bool = False, num_atoms: Optional[int] = None, width: int = 32,
              representation_dim: int = 64, init: str = 'keras') -> tf.keras.Model:
  """The small CNN of the embedded default and the CPU-scale checks.

  Args:
    num_classes: see `models.build` (so are projection_dim, decomposed, num_atoms, init).
    input_shape: (H, W, C), at least 2x2.
    projection_dim: see `models.build`.
    decomposed: see `models.build`.
    num_atoms: see `models.build`.
    width: channels of the convolutions, >= 1.
    representation_dim: d, the width of the layer before the classifier, >= 1.
    init: see `models.build`.

  Returns:
    The functional Keras model, outputs {'representation', 'logits'}.

  Raises:
    ValueError: an argument out of range, or images smaller than 2x2.
  """
  num_classes, input_shape, projection_dim, decomposed, num_atoms = common.check_common_args(
      num_classes, input_shape, projection_dim, decomposed, num_atoms)
  for arg, v in (('width', width), ('representation_dim', representation_dim)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f'{arg} must be an integer >= 1, got {v!r}.')
  if min(input_shape[:2]) < 2:
    raise ValueError(f'input_shape {input_shape}: small_cnn needs images of at least 2x2.')
  convs = common.Convs(decomposed, num_atoms, init)
  inputs = tf.keras.Input(input_shape, name='images')
  x = convs.conv(inputs, width, 3, padding=1, use_bias=False, name='conv1')
  x = tf.keras.layers.ReLU(name='relu1')(common.batch_norm('bn1')(x))
  x = tf.keras.layers.MaxPool2D(2, name='pool1')(x)
  x = convs.conv(x, 2 * width, 3, padding=1, use_bias=True, name='conv2')
  x = tf.keras.layers.ReLU(name='relu2')(x)
  x = tf.keras.layers.GlobalAveragePooling2D(name='pool')(x)
  x = common.dense(x, representation_dim, init, 'fc', activation='relu')
  rep, logits = common.head(x, num_classes, projection_dim, init)
  return common.make_model(inputs, rep, logits, 'small_cnn')
