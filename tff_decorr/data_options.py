"""tf.data options for the datasets the project's loops iterate: a client's local training and the
evaluation of a test set.

tf.data's autotuning is off for both. With it on, about one iteration in six over a ResNet20
client's batches inside the client step ran on one core instead of two (6 batches: 1.27 s of wall
time for 1.24 CPU-s, against 0.62 s for the same CPU time), none in 40 with it off; one evaluation
of the CIFAR-10 test set in eight did the same (10.2 s instead of 5.1 s). Whole issue-23 runs went
from 258-275 s to 231 s (docs/benchmarks.md §11g). What autotuning would tune here is only the
parallelism of a streamed client's `map` (tasks/client_data.py), which without it runs on as many
threads as the machine has cores; in-memory batches have nothing to tune. Values and their order
are the same either way: that map is deterministic.
"""

import tensorflow as tf


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's autotuning off (module docstring); works inside a tf.function."""
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
