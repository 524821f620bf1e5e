"""A client's label counts, from the dataset it trains on (FedLC, FedRS).

The client step sees only (broadcast, dataset, client state), and a client's dataset holds all its
local epochs (tasks/client_data.py). Its class sizes are therefore counted inside the client step,
in both runtimes and in the LearningProcess alike: one pass of the input pipeline over the labels
(no model computation), before local training. Each epoch is a permutation of the client's
examples, so the counts over the dataset are `local_epochs` times the class sizes (exactly, unless
the last incomplete batch of each epoch is dropped, FedUV: then the examples trained on).
"""

from __future__ import annotations

import tensorflow as tf


def num_classes(model: tf.keras.Model) -> int:
  """The width of the model's logits (dict outputs {'representation', 'logits'}).

  Args:
    model: a functional Keras model.

  Returns:
    C, the number of classes.

  Raises:
    ValueError: the model has no 'logits' output of known width.
  """
  try:
    return int(model.output_shape['logits'][-1])
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise ValueError('the model must be a Keras functional model with a dict output "logits" of '
                     f'known width to count its classes: {e}') from e


def dataset_label_counts(dataset: tf.data.Dataset, classes: int) -> tf.Tensor:
  """How many examples of each class the batched (x, y) dataset holds (one pass, TF ops).

  Args:
    dataset: batches of (images, integer labels in [0, classes)).
    classes: C.

  Returns:
    float32 [classes].
  """
  def add(counts, batch):
    labels = tf.cast(tf.reshape(batch[1], [-1]), tf.int32)
    return counts + tf.math.bincount(labels, minlength=classes, maxlength=classes,
                                     dtype=tf.float32)
  return dataset.reduce(tf.zeros([classes], tf.float32), add)
