"""Filter-decomposed convolution (Chen & Qiu, "Extra Clients at No Extra Cost"; REFERENCE-NOTES §7).

A k x k convolution whose kernel is rebuilt at every call from two variables:
  atoms        D [m, k, k]               (filter atoms, shared by every (c_in, c_out) pair)
  coefficients alpha [c_in, c_out, m]    (atom coefficients)
  W[h, w, i, o] = sum_m alpha[i, o, m] * D[m, h, w]      (Keras kernel layout [k, k, c_in, c_out])
The variable names contain 'atoms' and 'coefficients', which is how the federated code
(`fedavg_decomposed`, `models.atom_variable_mask`) finds them. Default m = k * k, with which the
decomposition can represent every k x k kernel (`set_from_kernel`).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf

ATOMS = 'atoms'
COEFFICIENTS = 'coefficients'


def compose_kernel(coefficients: tf.Tensor, atoms: tf.Tensor) -> tf.Tensor:
  """[c_in, c_out, m] x [m, k, k] -> Keras conv kernel [k, k, c_in, c_out]."""
  return tf.einsum('iom,mhw->hwio', coefficients, atoms)


class DecomposedConv2D(tf.keras.layers.Layer):
  """Conv2D with kernel = coefficients x atoms; same call semantics as tf.keras.layers.Conv2D.

  Initialisation: atoms are orthonormal (rows of a random orthogonal [m, k*k] matrix, or its
  columns when m > k*k); coefficients are uniform with the variance that makes the composed kernel
  as large on average as Keras' default Glorot-uniform conv kernel (fan_in = c_in k^2,
  fan_out = c_out k^2), i.e. the Glorot variance times k^2 / min(m, k^2).
  """

  def __init__(self, filters: int, kernel_size: int, strides: int = 1, padding: str = 'valid',
               use_bias: bool = True, num_atoms: Optional[int] = None, **kwargs):
    super().__init__(**kwargs)
    if isinstance(kernel_size, (tuple, list)):
      if len(set(kernel_size)) != 1:
        raise ValueError(f'DecomposedConv2D: kernel_size must be square, got {kernel_size}.')
      kernel_size = kernel_size[0]
    if isinstance(strides, (tuple, list)):
      if len(set(strides)) != 1:
        raise ValueError(f'DecomposedConv2D: strides must be equal, got {strides}.')
      strides = strides[0]
    self.filters = int(filters)
    self.kernel_size = int(kernel_size)
    self.strides = int(strides)
    self.padding = padding.lower()
    if self.padding not in ('valid', 'same'):
      raise ValueError(f"DecomposedConv2D: padding must be 'valid' or 'same', got {padding!r}.")
    self.use_bias = bool(use_bias)
    self.num_atoms = int(num_atoms) if num_atoms else self.kernel_size ** 2
    if self.num_atoms < 1:
      raise ValueError(f'--num_atoms: must be >= 1 (0: k*k), got {num_atoms}.')

  def build(self, input_shape):
    c_in = int(input_shape[-1])
    k, m = self.kernel_size, self.num_atoms

    def atoms_init(shape, dtype=None):
      flat = tf.keras.initializers.Orthogonal()((m, k * k), dtype=dtype)
      return tf.reshape(flat, shape)

    glorot_var = 2.0 / (c_in * k * k + self.filters * k * k)
    limit = math.sqrt(3.0 * glorot_var * k * k / min(m, k * k))
    self.atoms = self.add_weight(ATOMS, shape=(m, k, k), initializer=atoms_init, trainable=True)
    self.coefficients = self.add_weight(
        COEFFICIENTS, shape=(c_in, self.filters, m),
        initializer=tf.keras.initializers.RandomUniform(-limit, limit), trainable=True)
    if self.use_bias:
      self.bias = self.add_weight('bias', shape=(self.filters,), initializer='zeros',
                                  trainable=True)
    super().build(input_shape)

  def kernel(self) -> tf.Tensor:
    return compose_kernel(self.coefficients, self.atoms)

  def call(self, inputs):
    y = tf.nn.conv2d(inputs, tf.cast(self.kernel(), inputs.dtype), self.strides,
                     self.padding.upper())
    if self.use_bias:
      y = tf.nn.bias_add(y, self.bias)
    return y

  def set_from_kernel(self, kernel) -> None:
    """Sets atoms to the standard basis of k x k filters and coefficients to `kernel`
    ([k, k, c_in, c_out]), so the layer computes exactly that convolution. Needs m == k*k."""
    k, m = self.kernel_size, self.num_atoms
    if m != k * k:
      raise ValueError(f'set_from_kernel needs num_atoms == k*k = {k * k}, got {m}.')
    kernel = np.asarray(kernel)
    if kernel.shape != (k, k) + tuple(self.coefficients.shape[:2]):
      raise ValueError(f'kernel shape {kernel.shape} does not match the layer '
                       f'({k}, {k}, {self.coefficients.shape[0]}, {self.filters}).')
    self.atoms.assign(np.eye(m, dtype=np.float32).reshape(m, k, k))
    self.coefficients.assign(kernel.reshape(m, kernel.shape[2], kernel.shape[3])
                             .transpose(1, 2, 0))

  def get_config(self):
    config = super().get_config()
    config.update(filters=self.filters, kernel_size=self.kernel_size, strides=self.strides,
                  padding=self.padding, use_bias=self.use_bias, num_atoms=self.num_atoms)
    return config
