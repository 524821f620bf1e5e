"""Filter-decomposed convolutions (Chen & Qiu, "Extra Clients at No Extra Cost"; docs/reference.md
§7).

A k x k convolution whose kernel is rebuilt at every call from two variables:
  atoms        D [m, k, k]               (filter atoms, shared by every filter of the layer)
  coefficients alpha [a, b, m]           (atom coefficients, one vector per k x k filter)
  W[h, w, i, o] = sum_m alpha[i, o, m] * D[m, h, w]      (Keras kernel layout [k, k, a, b])
For `DecomposedConv2D` (a, b) = (c_in, c_out); for `DecomposedDepthwiseConv2D` (a, b) =
(channels, depth multiplier), the layout of Keras' DepthwiseConv2D kernel, so both share the
composition, the initialisation and `set_from_kernel`.
The variable names contain 'atoms' and 'coefficients', which is how the federated code
(`fedavg_decomposed`, `models.atom_variable_mask`) finds them. Default m = k * k, with which the
decomposition can represent every k x k kernel (`set_from_kernel`).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

ATOMS = 'atoms'
COEFFICIENTS = 'coefficients'


def compose_kernel(coefficients: tf.Tensor, atoms: tf.Tensor) -> tf.Tensor:
  """[a, b, m] x [m, k, k] -> Keras conv kernel [k, k, a, b]."""
  return tf.einsum('iom,mhw->hwio', coefficients, atoms)


def _single(value, what: str, layer: str) -> int:
  if isinstance(value, (tuple, list)):
    if len(set(value)) != 1:
      raise ValueError(f'{layer}: {what} must be the same for height and width, got {value}.')
    value = value[0]
  return int(value)


class DecomposedConvBase(tf.keras.layers.Layer):
  """A convolution with kernel [k, k, a, b] = coefficients [a, b, m] x atoms [m, k, k].

  Subclasses say what (a, b) and the output width are for an input width (`_kernel_dims`) and
  how the composed kernel is applied (`_convolve`).

  Initialisation: atoms are orthonormal (rows of a random orthogonal [m, k*k] matrix, or its
  columns when m > k*k); coefficients are uniform with the variance that makes the composed kernel
  as large on average as Keras' default Glorot-uniform kernel of the same layout (fan_in = a k^2,
  fan_out = b k^2), i.e. the Glorot variance times k^2 / min(m, k^2).
  """

  def __init__(self, kernel_size: int, strides: int = 1, padding: str = 'valid',
               use_bias: bool = True, num_atoms: Optional[int] = None, **kwargs):
    super().__init__(**kwargs)
    layer = type(self).__name__
    self.kernel_size = _single(kernel_size, 'kernel_size', layer)
    self.strides = _single(strides, 'strides', layer)
    self.padding = padding.lower()
    if self.padding not in ('valid', 'same'):
      raise ValueError(f"{layer}: padding must be 'valid' or 'same', got {padding!r}.")
    self.use_bias = bool(use_bias)
    self.num_atoms = int(num_atoms) if num_atoms else self.kernel_size ** 2
    if self.num_atoms < 1:
      raise ValueError(f'--num_atoms: must be >= 1 (0: k*k), got {num_atoms}.')

  def _kernel_dims(self, c_in: int) -> Tuple[int, int, int]:
    """(a, b, output channels) for `c_in` input channels."""
    raise NotImplementedError

  def _convolve(self, inputs, kernel):
    raise NotImplementedError

  def build(self, input_shape):
    a, b, c_out = self._kernel_dims(int(input_shape[-1]))
    k, m = self.kernel_size, self.num_atoms

    def atoms_init(shape, dtype=None):
      flat = tf.keras.initializers.Orthogonal()((m, k * k), dtype=dtype)
      return tf.reshape(flat, shape)

    glorot_var = 2.0 / (a * k * k + b * k * k)
    limit = math.sqrt(3.0 * glorot_var * k * k / min(m, k * k))
    self.atoms = self.add_weight(ATOMS, shape=(m, k, k), initializer=atoms_init, trainable=True)
    self.coefficients = self.add_weight(
        COEFFICIENTS, shape=(a, b, m),
        initializer=tf.keras.initializers.RandomUniform(-limit, limit), trainable=True)
    if self.use_bias:
      self.bias = self.add_weight('bias', shape=(c_out,), initializer='zeros', trainable=True)
    super().build(input_shape)

  def kernel(self) -> tf.Tensor:
    return compose_kernel(self.coefficients, self.atoms)

  def call(self, inputs):
    y = self._convolve(inputs, tf.cast(self.kernel(), inputs.dtype))
    if self.use_bias:
      y = tf.nn.bias_add(y, self.bias)
    return y

  def set_from_kernel(self, kernel) -> None:
    """Sets atoms to the standard basis of k x k filters and coefficients to `kernel`
    ([k, k, a, b], the Keras kernel layout), so the layer computes exactly that convolution.
    Needs m == k*k."""
    k, m = self.kernel_size, self.num_atoms
    if m != k * k:
      raise ValueError(f'set_from_kernel needs num_atoms == k*k = {k * k}, got {m}.')
    kernel = np.asarray(kernel)
    want = (k, k) + tuple(self.coefficients.shape[:2])
    if kernel.shape != want:
      raise ValueError(f'kernel shape {kernel.shape} does not match the layer {want}.')
    self.atoms.assign(np.eye(m, dtype=np.float32).reshape(m, k, k))
    self.coefficients.assign(kernel.reshape(m, kernel.shape[2], kernel.shape[3])
                             .transpose(1, 2, 0))

  def get_config(self):
    config = super().get_config()
    config.update(kernel_size=self.kernel_size, strides=self.strides, padding=self.padding,
                  use_bias=self.use_bias, num_atoms=self.num_atoms)
    return config


class DecomposedConv2D(DecomposedConvBase):
  """Conv2D with kernel = coefficients [c_in, c_out, m] x atoms; same call semantics as
  tf.keras.layers.Conv2D (square kernel, equal strides, 'same' / 'valid')."""

  def __init__(self, filters: int, kernel_size: int, strides: int = 1, padding: str = 'valid',
               use_bias: bool = True, num_atoms: Optional[int] = None, **kwargs):
    super().__init__(kernel_size, strides=strides, padding=padding, use_bias=use_bias,
                     num_atoms=num_atoms, **kwargs)
    self.filters = int(filters)

  def _kernel_dims(self, c_in):
    return c_in, self.filters, self.filters

  def _convolve(self, inputs, kernel):
    return tf.nn.conv2d(inputs, kernel, self.strides, self.padding.upper())

  def get_config(self):
    config = super().get_config()
    config.update(filters=self.filters)
    return config


class DecomposedDepthwiseConv2D(DecomposedConvBase):
  """DepthwiseConv2D with kernel [k, k, C, mult] = coefficients [C, mult, m] x atoms; same call
  semantics as tf.keras.layers.DepthwiseConv2D (output channel c * mult + j is channel c filtered
  by its j-th filter). Every channel's filters are combinations of the same m atoms."""

  def __init__(self, kernel_size: int, strides: int = 1, padding: str = 'valid',
               depth_multiplier: int = 1, use_bias: bool = True, num_atoms: Optional[int] = None,
               **kwargs):
    super().__init__(kernel_size, strides=strides, padding=padding, use_bias=use_bias,
                     num_atoms=num_atoms, **kwargs)
    self.depth_multiplier = int(depth_multiplier)
    if self.depth_multiplier < 1:
      raise ValueError(f'DecomposedDepthwiseConv2D: depth_multiplier must be >= 1, got '
                       f'{depth_multiplier}.')

  def _kernel_dims(self, c_in):
    return c_in, self.depth_multiplier, c_in * self.depth_multiplier

  def _convolve(self, inputs, kernel):
    s = self.strides
    return tf.nn.depthwise_conv2d(inputs, kernel, [1, s, s, 1], self.padding.upper())

  def get_config(self):
    config = super().get_config()
    config.update(depth_multiplier=self.depth_multiplier)
    return config
