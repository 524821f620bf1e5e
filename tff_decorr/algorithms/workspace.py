"""What a client step runs on: the model's flat weight layout (ModelSpec) and the Workspace of
Keras model(s) and SGD momentum buffers that the local-training loop (client_update) updates.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from tff_decorr import models


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Static description of the flat weight list of a model: what every algorithm needs to know."""
  names: tuple
  shapes: tuple
  dtypes: tuple
  trainable: tuple  # bool per weight
  batchnorm: tuple  # bool per weight: variable of a BatchNormalization layer (gamma, beta, stats)

  @property
  def num_weights(self) -> int:
    return len(self.names)


def _masks(model: tf.keras.Model):
  weights = list(model.weights)
  trainable_refs = {v.ref() for v in model.trainable_weights}
  return (weights, tuple(v.ref() in trainable_refs for v in weights),
          tuple(models.bn_variable_mask(model)))


def model_spec(model: tf.keras.Model) -> ModelSpec:
  weights, trainable, bn = _masks(model)
  return ModelSpec(names=tuple(v.name for v in weights),
                   shapes=tuple(tuple(v.shape.as_list()) for v in weights),
                   dtypes=tuple(v.dtype.base_dtype for v in weights),
                   trainable=trainable, batchnorm=bn)


class Workspace:
  """What a client step runs on: Keras model(s) and SGD momentum buffers (one per trainable weight).

  Built once per TF runtime (reused by every client, variables overwritten at the start of each
  client update) and once inside the TFF `tff.tensorflow.computation` body.
  `num_models > 1` builds auxiliary copies of the model (MOON: global and previous-local models).
  """

  def __init__(self, model_fn: Callable[[], tf.keras.Model], num_models: int = 1):
    self.model = model_fn()
    self.aux_models = [model_fn() for _ in range(num_models - 1)]
    self.weights, trainable, bn = _masks(self.model)
    self.trainable_mask = trainable
    self.batchnorm_mask = bn
    self.trainable = [v for v, t in zip(self.weights, trainable) if t]
    self.momentum = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name='sgd_momentum')
                     for v in self.trainable]

  @staticmethod
  def assign(variables, values) -> None:
    for v, x in zip(variables, values):
      v.assign(x)
