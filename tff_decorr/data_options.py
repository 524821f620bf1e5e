"""tf.data options for the datasets the project's loops iterate: a client's local training and the
evaluation of a test set.

tf.data's autotuning is off for both. With it on, 7 to 15 of 40 iterations over a ResNet20 client's
6 batches inside the client step ran on one core instead of two (1.27 s of wall time for 1.24
CPU-s, against 0.62 s for the same CPU time), none of 40 with it off; 1 to 2 of 8 evaluations of
the CIFAR-10 test set did the same (10.2 s instead of 5.1 s). Whole runs at the fidelity setting
went from 258-275 s to 231 s (`bench.speed.run_phases --settings=fidelity --runtime=tf`;
bench/speed/autotune_stalls.py; docs/benchmarks.md §1). What autotuning would tune
here is only the parallelism of a streamed client's `map` (tasks/client_data.py), which without it
runs on as many threads as the machine has cores; in-memory batches have nothing to tune. Values
and their order are the same either way: that map is deterministic.
"""

import tensorflow as tf


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's autotuning off (module docstring); works inside a tf.function."""
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
