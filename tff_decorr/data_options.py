"""tf.data options for the datasets the project's loops iterate: a client's local training and the
evaluation of a test set."""

import tensorflow as tf


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's autotuning off; works inside a tf.function.

  What autotuning would tune here is only the parallelism of a streamed client's `map`, which
  without it runs on as many threads as the machine has cores; in-memory batches have nothing to
  tune. Values and their order are the same either way: that map is deterministic.

  Args:
    dataset: the client's or the test set's batches.

  Returns:
    The same dataset, its options' `autotune.enabled` False.
  """
  # Autotuning off: with it on, steps and evaluations stalled on one core of two
  # (docs/benchmarks.md §1, "tf.data autotuning").
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
