"""Building blocks shared by the model builders.

Conventions (see docs/models.md):
- BatchNormalization uses PyTorch's defaults: torch momentum 0.1 == Keras momentum 0.9, eps 1e-5.
- Convolutions take PyTorch-style integer padding. Stride-1 convs with padding k // 2 use Keras
  'same' (identical); otherwise the input is zero-padded explicitly and the conv is 'valid', so a
  stride-2 conv pads symmetrically as PyTorch does (Keras 'same' would pad only bottom/right).
- Initialisation: as the PyTorch code each model comes from (`init`, INITS): 'torch' is PyTorch's
  default for Conv2d / Linear (weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), i.e.
  kaiming_uniform_(a=sqrt(5))); 'kaiming_normal' is the reference CIFAR ResNets' `_weights_init`
  (conv and linear weights N(0, 2/fan_in), untruncated; linear biases keep PyTorch's default);
  'keras' is Keras' own (Glorot-uniform kernels, zero biases). fan_in is PyTorch's: in_channels /
  groups * kh * kw (a depthwise kernel's fan_in is kh * kw, where Keras' VarianceScaling would use
  kh * kw * channels). BN starts at gamma 1, beta 0 in all three. Decomposed convolutions keep
  their own initialisation (models/decomposed.py). docs/models.md says which model uses which and
  why it matters (docs/benchmarks.md §6 measures the Glorot start against the reference's).
- No Keras kernel regularizers: weight decay is applied by the client update (DESIGN.md).
- Every model returns {'representation': [N, d], 'logits': [N, num_classes]}.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_decorr.models import decomposed as decomposed_lib

BN_MOMENTUM = 0.9  # == torch.nn.BatchNorm momentum 0.1
BN_EPSILON = 1e-5
INITS = ('torch', 'kaiming_normal', 'keras')


def check_init(init: str) -> str:
  if init not in INITS:
    raise ValueError(f'init must be one of {", ".join(INITS)}, got {init!r}.')
  return init


def kernel_initializer(init: str, fan_in: int):
  """A new initializer for one layer's weights (one instance per layer: Keras returns the same
  values from every call of one unseeded instance)."""
  if init == 'keras':
    return tf.keras.initializers.GlorotUniform()
  if init == 'kaiming_normal':
    return tf.keras.initializers.RandomNormal(0.0, float(np.sqrt(2.0 / fan_in)))
  bound = float(1.0 / np.sqrt(fan_in))
  return tf.keras.initializers.RandomUniform(-bound, bound)


def bias_initializer(init: str, fan_in: int):
  """PyTorch's default bias (also under the reference's kaiming_normal, which sets weights only)."""
  if init == 'keras':
    return tf.keras.initializers.Zeros()
  bound = float(1.0 / np.sqrt(fan_in))
  return tf.keras.initializers.RandomUniform(-bound, bound)


def dense(x, units: int, init: str, name: str, activation=None):
  """A Dense layer initialised as `init` says (fan_in = the input width)."""
  fan_in = int(x.shape[-1])
  return tf.keras.layers.Dense(units, activation=activation, name=name,
                               kernel_initializer=kernel_initializer(init, fan_in),
                               bias_initializer=bias_initializer(init, fan_in))(x)


def batch_norm(name: Optional[str] = None) -> tf.keras.layers.BatchNormalization:
  return tf.keras.layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name)


def check_common_args(num_classes, input_shape, projection_dim, decomposed, num_atoms
                      ) -> Tuple[int, Tuple[int, int, int], Optional[int], bool, Optional[int]]:
  """Validates the arguments every builder takes; errors name the flag/argument and the fix."""
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or \
      num_classes < 1:
    raise ValueError(f'num_classes must be an integer >= 1, got {num_classes!r}.')
  try:
    shape = tuple(int(s) for s in input_shape)
  except (TypeError, ValueError):
    raise ValueError(f'input_shape must be (height, width, channels), got {input_shape!r}.'
                     ) from None
  if len(shape) != 3 or min(shape) < 1:
    raise ValueError(f'input_shape must be (height, width, channels) of positive integers, got '
                     f'{input_shape!r}.')
  if projection_dim is not None and (not isinstance(projection_dim, (int, np.integer)) or
                                     projection_dim < 0):
    raise ValueError(f'--projection_dim: must be an integer >= 0 (0: no projection head), got '
                     f'{projection_dim!r}.')
  if num_atoms is not None and num_atoms != 0:
    if not decomposed:
      raise ValueError('--num_atoms: only meaningful with --decomposed; add --decomposed or drop '
                       '--num_atoms.')
    if not isinstance(num_atoms, (int, np.integer)) or num_atoms < 1:
      raise ValueError(f'--num_atoms: must be an integer >= 1 (0: k*k), got {num_atoms!r}.')
  return (int(num_classes), shape, int(projection_dim) if projection_dim else None,
          bool(decomposed), int(num_atoms) if num_atoms else None)


class Convs:
  """Creates the convolutions of a model: plain Conv2D / DepthwiseConv2D, or their decomposed
  versions when `decomposed` and k > 1. 1x1 convs stay plain: with one position per filter, atoms
  would only rescale the coefficients (m = 1 is the plain kernel plus one redundant scalar)."""

  def __init__(self, decomposed: bool = False, num_atoms: Optional[int] = None,
               init: str = 'keras'):
    self.decomposed = decomposed
    self.num_atoms = num_atoms
    self.init = check_init(init)

  def _inits(self, fan_in: int) -> dict:
    return dict(kernel_initializer=kernel_initializer(self.init, fan_in),
                bias_initializer=bias_initializer(self.init, fan_in))

  # Seven parameters: one per convolution setting, as keras.layers.Conv2D takes them.
  def conv(self, x, filters: int, kernel_size: int, strides: int = 1, padding: int = 0,
           use_bias: bool = False, name: Optional[str] = None):
    fan_in = int(x.shape[-1]) * kernel_size * kernel_size
    x, keras_padding = _pad(x, kernel_size, strides, padding, name)
    if self.decomposed and kernel_size > 1:
      layer = decomposed_lib.DecomposedConv2D(filters, kernel_size, strides=strides,
                                              padding=keras_padding, use_bias=use_bias,
                                              num_atoms=self.num_atoms, name=name)
    else:
      layer = tf.keras.layers.Conv2D(filters, kernel_size, strides=strides,
                                     padding=keras_padding, use_bias=use_bias, name=name,
                                     **self._inits(fan_in))
    return layer(x)

  def depthwise(self, x, kernel_size: int, strides: int = 1, padding: int = 0,
                use_bias: bool = False, name: Optional[str] = None):
    fan_in = kernel_size * kernel_size  # groups == channels: one input channel per filter.
    x, keras_padding = _pad(x, kernel_size, strides, padding, name)
    if self.decomposed and kernel_size > 1:
      layer = decomposed_lib.DecomposedDepthwiseConv2D(kernel_size, strides=strides,
                                                       padding=keras_padding, use_bias=use_bias,
                                                       num_atoms=self.num_atoms, name=name)
    else:
      inits = self._inits(fan_in)
      layer = tf.keras.layers.DepthwiseConv2D(
          kernel_size, strides=strides, padding=keras_padding, use_bias=use_bias, name=name,
          depthwise_initializer=inits['kernel_initializer'],
          bias_initializer=inits['bias_initializer'])
    return layer(x)


def _pad(x, kernel_size, strides, padding, name):
  if padding == 0:
    return x, 'valid'
  if strides == 1 and padding == kernel_size // 2 and kernel_size % 2 == 1:
    return x, 'same'
  pad_name = f'{name}_pad' if name else None
  return tf.keras.layers.ZeroPadding2D(padding, name=pad_name)(x), 'valid'


def head(pooled, num_classes: int, projection_dim: Optional[int], init: str = 'keras'):
  """Classifier on the pooled features; with `projection_dim` (MOON) the representation is the
  output of a two-layer projection head pooled -> Dense(pooled_dim // 2) ReLU ->
  Dense(projection_dim), and the classifier reads it. The hidden width is half the pooled width as
  in the FedDecorr reference's MOON wrapper (MOON's own code uses the full width), so MOON rows
  compare with the paper's. Returns (representation, logits).
  `init` is the base network's; the reference's MOON wrapper creates its head and classifier
  afterwards as fresh nn.Linear layers, so with a projection head they get PyTorch's default
  ('torch') unless the model uses Keras' initialisation."""
  rep = pooled
  if projection_dim:
    init = 'keras' if init == 'keras' else 'torch'
    width = max(int(pooled.shape[-1]) // 2, 1)
    rep = dense(rep, width, init, 'projection_hidden', activation='relu')
    rep = dense(rep, projection_dim, init, 'projection')
  logits = dense(rep, num_classes, init, 'classifier')
  return rep, logits


def make_model(inputs, representation, logits, name: str) -> tf.keras.Model:
  return tf.keras.Model(inputs, {'representation': representation, 'logits': logits}, name=name)


class AdaptiveAveragePooling2D(tf.keras.layers.Layer):
  """torch.nn.AdaptiveAvgPool2d for a static input size: output cell (i, j) averages input rows
  floor(i H / h) .. ceil((i + 1) H / h) - 1 (and likewise columns), as PyTorch does; an output
  larger than the input repeats input cells. Implemented as two averaging matrices."""

  def __init__(self, output_size: Sequence[int], **kwargs):
    super().__init__(**kwargs)
    self.output_size = tuple(int(s) for s in output_size)

  @staticmethod
  def _matrix(n_in: int, n_out: int) -> np.ndarray:
    m = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
      start = (i * n_in) // n_out
      end = -((-(i + 1) * n_in) // n_out)  # ceil
      m[i, start:end] = 1.0 / (end - start)
    return m

  def build(self, input_shape):
    h, w = int(input_shape[1]), int(input_shape[2])
    self._ph = tf.constant(self._matrix(h, self.output_size[0]))
    self._pw = tf.constant(self._matrix(w, self.output_size[1]))
    super().build(input_shape)

  def call(self, x):
    return tf.einsum('nhwc,ih,jw->nijc', x, tf.cast(self._ph, x.dtype), tf.cast(self._pw, x.dtype))

  def get_config(self):
    config = super().get_config()
    config.update(output_size=self.output_size)
    return config
