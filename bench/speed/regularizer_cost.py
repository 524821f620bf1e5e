"""Cost of the FedDecorr term: per-step time of cross-entropy alone vs CE + beta * feddecorr_loss.

One training step = forward + backward + SGD (momentum 0.9) update of the whole model, inside one
tf.function, on a fixed batch (no input pipeline). Variants are timed in alternation within the
same process (round r runs every variant once, `--steps` steps each, order rotated per round), and
the median over `--repeats` rounds is reported with the ratio of medians. Also times
feddecorr_loss alone (forward + gradient w.r.t. its input) at N x d.

  .venv/bin/python -m bench.speed.regularizer_cost           # MobileNetV2, N=64, 32x32, CPU
  .venv/bin/python -m bench.speed.regularizer_cost --repeats=3 --steps=2  # shorter

Writes bench/results/regularizer_cost_<model>.json (or --output).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import _common
from tff_decorr import models
from tff_decorr import regularizers

FLAGS = flags.FLAGS
flags.DEFINE_string('model', 'mobilenet_v2_cifar', 'Model name (tff_decorr.models).')
flags.DEFINE_integer('batch_size', 64, 'Batch size N.')
flags.DEFINE_integer('image_size', 32, 'Input height = width.')
flags.DEFINE_integer('num_classes', 10, 'Classes.')
flags.DEFINE_float('beta', 0.1, 'FedDecorr coefficient.')
flags.DEFINE_integer('repeats', 7, 'Alternating rounds; the median over rounds is reported.')
flags.DEFINE_integer('steps', 3, 'Steps per variant per round (the round time is their mean).')
flags.DEFINE_integer('warmup', 2, 'Untimed steps per variant before timing (tracing).')
flags.DEFINE_integer('loss_dim', 0, 'd for the loss-only timing (0: the model\'s representation '
                     'dimension).')
flags.DEFINE_integer('loss_repeats', 50, 'Calls per round for the loss-only timing.')
flags.DEFINE_bool('jit', False, 'Compile the steps with XLA (jit_compile=True).')
flags.DEFINE_string('output', '', 'JSON output path (default '
                    'bench/results/regularizer_cost_<model>.json).')


def make_train_step(model, regularizer, optimizer, jit):
  ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function(jit_compile=jit)
  def step(x, y):
    with tf.GradientTape() as tape:
      out = model(x, training=True)
      loss = ce(y, out['logits'])
      if regularizer is not None:
        loss = loss + regularizer(out['representation'], out['logits'])
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  return step


def make_loss_step(jit):
  @tf.function(jit_compile=jit)
  def step(z):
    with tf.GradientTape() as tape:
      tape.watch(z)
      loss = regularizers.feddecorr_loss(z)
    return loss, tape.gradient(loss, z)

  return step


def timed(fn, args, n):
  t0 = time.perf_counter()
  for _ in range(n):
    out = fn(*args)
  # Force completion of the last step.
  tf.nest.map_structure(lambda t: t.numpy(), out)
  return (time.perf_counter() - t0) / n


def main(argv):
  del argv
  load_start = os.getloadavg()[0]
  rng = np.random.RandomState(0)
  n, s = FLAGS.batch_size, FLAGS.image_size
  x = tf.constant(rng.randn(n, s, s, 3), tf.float32)
  y = tf.constant(rng.randint(0, FLAGS.num_classes, n), tf.int32)
  tf.keras.utils.set_random_seed(0)
  variants = {}
  for name, reg in (('ce', None), ('ce+feddecorr', regularizers.get('feddecorr',
                                                                     beta=FLAGS.beta))):
    # A separate model and optimizer per variant so neither shares state with the other.
    model = models.build(FLAGS.model, num_classes=FLAGS.num_classes, input_shape=(s, s, 3))
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    variants[name] = make_train_step(model, reg, opt, FLAGS.jit)
  rep_dim = models.representation_dim(model)
  params = models.count_parameters(model)
  loss_dim = FLAGS.loss_dim or rep_dim
  z = tf.constant(rng.randn(n, loss_dim), tf.float32)
  loss_step = make_loss_step(FLAGS.jit)

  for name, fn in variants.items():
    timed(fn, (x, y), FLAGS.warmup)
  timed(loss_step, (z,), 3)

  times = {name: [] for name in variants}
  loss_times = []
  names = list(variants)
  for r in range(FLAGS.repeats):
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
      times[name].append(timed(variants[name], (x, y), FLAGS.steps))
    loss_times.append(timed(loss_step, (z,), FLAGS.loss_repeats))
    print(f'round {r}: ' + ', '.join(f'{k} {times[k][-1] * 1e3:.1f} ms' for k in names) +
          f', feddecorr_loss {loss_times[-1] * 1e3:.3f} ms', flush=True)

  med = {k: statistics.median(v) for k, v in times.items()}
  result = {
      'model': FLAGS.model, 'representation_dim': rep_dim, 'parameters': params,
      'batch_size': n, 'image_size': s, 'beta': FLAGS.beta, 'jit': FLAGS.jit,
      'repeats': FLAGS.repeats, 'steps_per_repeat': FLAGS.steps,
      'step_ms_median': {k: v * 1e3 for k, v in med.items()},
      'step_ms_all': {k: [t * 1e3 for t in v] for k, v in times.items()},
      'ratio_feddecorr_over_ce': med['ce+feddecorr'] / med['ce'],
      # Per-round ratios (the two variants ran back to back): less sensitive to load drifts.
      'ratio_paired_median': statistics.median(
          a / b for a, b in zip(times['ce+feddecorr'], times['ce'])),
      'loss_only': {'n': n, 'd': loss_dim,
                    'ms_median': statistics.median(loss_times) * 1e3,
                    'ms_all': [t * 1e3 for t in loss_times]},
      'loss_only_fraction_of_ce_step': statistics.median(loss_times) / med['ce'],
      'machine': {'cpus': os.cpu_count(), 'platform': platform.platform(),
                  'loadavg_1min_start_end': [load_start, os.getloadavg()[0]],
                  'tensorflow': tf.__version__,
                  'gpus': len(tf.config.list_physical_devices('GPU'))},
  }
  output = FLAGS.output or os.path.join(_common.ROOT, 'bench', 'results',
                                        f'regularizer_cost_{FLAGS.model}.json')
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  with open(output, 'w') as f:
    json.dump(result, f, indent=2)
  print(f"\n{FLAGS.model} (d={rep_dim}, {params:,} params), N={n}, {s}x{s}, jit={FLAGS.jit}")
  print(f"| variant | median ms/step |\n| --- | --- |")
  for k in names:
    print(f'| {k} | {med[k] * 1e3:.1f} |')
  print(f"ratio of medians (ce+feddecorr)/ce: {result['ratio_feddecorr_over_ce']:.3f}; "
        f"median of per-round ratios: {result['ratio_paired_median']:.3f}")
  print(f"1-min load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs (other processes inflate and scatter the times)")
  print(f"feddecorr_loss fwd+bwd alone, N={n}, d={loss_dim}: "
        f"{result['loss_only']['ms_median']:.3f} ms "
        f"({100 * result['loss_only_fraction_of_ce_step']:.2f}% of a CE step)")
  print(f'wrote {output}')


if __name__ == '__main__':
  app.run(main)
