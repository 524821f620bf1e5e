"""Tiny fixtures for tests of algorithms and runtimes: a BN model with dict outputs, synthetic data.

Kept in the library (not in a test file) so the tests of algorithms and of runtimes share them.
`client_dataset_fn(client_id, seed)` is built from TF ops only, as the task contract requires, so
the TFF runtime can build the datasets inside its computation.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

INPUT_SHAPE = (5, 5, 2)
NUM_CLASSES = 3


def tiny_model(representation_dim: int = 4, projection_dim: Optional[int] = None,
               seed: int = 0) -> tf.keras.Model:
  """Conv -> BN -> ReLU -> global pool (representation) -> Dense (logits); dict outputs."""
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)
  inputs = tf.keras.Input(INPUT_SHAPE)
  x = tf.keras.layers.Conv2D(representation_dim, 3, padding='same', kernel_initializer=init(1),
                             name='conv')(inputs)
  x = tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name='bn')(x)
  x = tf.keras.layers.ReLU()(x)
  rep = tf.keras.layers.GlobalAveragePooling2D()(x)
  if projection_dim:
    rep = tf.keras.layers.Dense(projection_dim, kernel_initializer=init(3), name='proj')(rep)
  logits = tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=init(2), name='head')(rep)
  return tf.keras.Model(inputs, {'representation': rep, 'logits': logits})


def synthetic_clients(sizes: Sequence[int] = (10, 6, 14, 8), seed: int = 0):
  """Per-client (images, labels) NumPy arrays with client-specific feature shifts."""
  rng = np.random.RandomState(seed)
  data = []
  for i, n in enumerate(sizes):
    x = rng.normal(loc=0.5 * i, scale=1.0 + 0.3 * i, size=(n,) + INPUT_SHAPE).astype(np.float32)
    y = rng.randint(0, NUM_CLASSES, size=n).astype(np.int32)
    data.append((x, y))
  return data


def make_client_dataset_fn(data, batch_size: int = 4, shuffle: bool = False, epochs: int = 1):
  """(client_id: tf.string holding an integer index, seed: tf.int64) -> batched dataset holding
  `epochs` passes (local epochs live in the dataset, as in tasks/client_data.py)."""
  # NumPy here, tensors inside fn: fn may run in a graph (TFF) or eagerly (TF runtime).
  all_images = np.concatenate([d[0] for d in data])
  all_labels = np.concatenate([d[1] for d in data])
  all_sizes = np.array([len(d[1]) for d in data], np.int64)
  all_starts = np.concatenate([[0], np.cumsum(all_sizes)[:-1]]).astype(np.int64)

  def fn(client_id, seed):
    images, labels = tf.constant(all_images), tf.constant(all_labels)
    starts, sizes = tf.constant(all_starts), tf.constant(all_sizes)
    i = tf.strings.to_number(client_id, tf.int64)
    start, size = starts[i], sizes[i]
    x, y = images[start:start + size], labels[start:start + size]
    if shuffle:
      # Stateless: the order depends on (seed, client) only, never on a global/graph seed, so the
      # TFF runtime (graph in the worker) and the TF runtime (eager) see the same order.
      noise = tf.random.stateless_uniform(tf.reshape(size, [1]), seed=tf.stack([seed, i]))
      perm = tf.argsort(noise)
      x, y = tf.gather(x, perm), tf.gather(y, perm)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat(epochs)

  return fn


class _TinyDecomposedConv(tf.keras.layers.Layer):
  """k x k conv whose kernel = coefficients [k*k... m atoms] x atoms [m, k, k] (test fixture)."""

  def __init__(self, filters, kernel_size=3, num_atoms=4, seed=0, **kwargs):
    super().__init__(**kwargs)
    self.filters, self.k, self.m, self.seed = filters, kernel_size, num_atoms, seed

  def build(self, input_shape):
    c_in = int(input_shape[-1])
    init = tf.keras.initializers.GlorotUniform(seed=self.seed)
    self.atoms = self.add_weight('atoms', (self.m, self.k, self.k), initializer=init)
    self.coefficients = self.add_weight('coefficients', (c_in, self.filters, self.m),
                                        initializer=init)

  def call(self, x):
    kernel = tf.einsum('iom,mhw->hwio', self.coefficients, self.atoms)
    return tf.nn.conv2d(x, kernel, 1, 'SAME')


def tiny_decomposed_model(seed: int = 0) -> tf.keras.Model:
  inputs = tf.keras.Input(INPUT_SHAPE)
  x = _TinyDecomposedConv(4, seed=seed, name='dconv')(inputs)
  x = tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name='bn')(x)
  rep = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.ReLU()(x))
  logits = tf.keras.layers.Dense(
      NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 2),
      name='head')(rep)
  return tf.keras.Model(inputs, {'representation': rep, 'logits': logits})


def feddecorr_reference_form(beta: float = 0.1):
  """FedDecorr per docs/reference.md §1, used by tests only until/unless tff_decorr.regularizers
  provides it (tests prefer `regularizers.get('feddecorr', beta=...)` when that module exists)."""

  def fn(representation, logits):
    del logits
    z = tf.cast(representation, tf.float32)
    n = tf.shape(z)[0]
    nf = tf.cast(n, tf.float32)
    z = z - tf.reduce_mean(z, axis=0, keepdims=True)
    var = tf.reduce_sum(tf.square(z), axis=0, keepdims=True) / tf.maximum(nf - 1.0, 1.0)
    z = z / tf.sqrt(var + 1e-8)
    k = tf.matmul(z, z, transpose_a=True)
    d = tf.cast(tf.shape(k)[0], tf.float32)
    off = tf.reduce_sum(tf.square(k)) - tf.reduce_sum(tf.square(tf.linalg.diag_part(k)))
    loss = off / (d * (d - 1.0)) / nf
    return tf.where(n > 1, beta * loss, 0.0)

  return fn


def feddecorr(beta: float = 0.1):
  """The project's FedDecorr regulariser if tff_decorr.regularizers exists, else the above."""
  try:
    from tff_decorr import regularizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return feddecorr_reference_form(beta)
  return regularizers.get('feddecorr', beta=beta)
