r"""How often a client step or an evaluation runs on one core of two, with tf.data's autotuning on
and off (tff_decorr/data_options.py).

Times blocks of the project's ResNet20 client step (6 batches of 64 in memory, FedAvg, as
bench/speed/step_speed.py builds it) and evaluations of the shared CIFAR-10 test set (10,000
images), in one process, the two variants alternating block by block:
- `off`: as the project runs them (data_options.without_autotune);
- `on`: the same with tf.data's default, autotuning on (data_options.without_autotune replaced by
  the identity while the step is traced and while the evaluation iterates).
A block counts as on one core when its wall time exceeds 0.8x its CPU time (two busy cores give
about 0.5x). Printed per variant: blocks, blocks on one core, median and mean wall time.

  .venv/bin/python -m bench.speed.autotune_stalls --blocks=40 --evaluations=8 --beta=0

bench/speed/step_speed.py's flags set the step: --beta (FedDecorr's coefficient; 0: the fidelity
setting's FedAvg), --batch_size, --precision.

Writes bench/results/autotune_stalls.json. Run it alone on the machine.
"""

from __future__ import annotations

import contextlib
import statistics
from unittest import mock

from tff_decorr import tf_env  # pylint: disable=g-bad-import-order,unused-import  (before TF)
from absl import app
from absl import flags

from bench import _common
from bench.speed import step_speed
from tff_decorr.tasks import registry
from tff_decorr import data_options
from tff_decorr import models
from tff_decorr.run_files import export

FLAGS = flags.FLAGS
flags.DEFINE_integer('blocks', 40, 'Client-step blocks per variant.', lower_bound=1)
flags.DEFINE_integer('evaluations', 8, 'Test-set evaluations per variant (0: none).',
                     lower_bound=0)
flags.DEFINE_string('data_dir', _common.DEFAULT_DATA_DIR, 'TFDS directory of the shared CIFAR-10.')

_ONE_CORE = 0.8  # wall / CPU above this: one core busy, not two


def _autotune(on: bool):
  """While active: tf.data's default (autotuning on) where the project turns it off."""
  return (mock.patch.object(data_options, 'without_autotune', lambda ds: ds) if on
          else contextlib.nullcontext())


def _alternate(runs: dict, n: int) -> dict:
  times = {k: [] for k in runs}
  for i in range(n):
    for k in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
      times[k].append(step_speed._timed(runs[k]))  # pylint: disable=protected-access
  out = {}
  for k, t in times.items():
    walls = [w for _, w in t]
    out[k] = {'cpu_wall_s': t, 'blocks': len(t),
              'on_one_core': sum(w > _ONE_CORE * c for c, w in t),
              'median_wall_s': statistics.median(walls), 'mean_wall_s': statistics.mean(walls)}
  return out


def _print(what: str, result: dict) -> list:
  lines = []
  for k, r in result.items():
    lines.append(f'{what}, autotune {k}: {r["on_one_core"]} of {r["blocks"]} on one core; wall '
                 f'median {r["median_wall_s"]:.3f} s, mean {r["mean_wall_s"]:.3f} s')
    print(lines[-1], flush=True)
  return lines


def main(argv):
  del argv
  report = {'machine': _common.machine(), 'command': ' '.join(
      ['.venv/bin/python -m bench.speed.autotune_stalls', f'--blocks={FLAGS.blocks}',
       f'--evaluations={FLAGS.evaluations}', f'--beta={FLAGS.beta}',
       f'--precision={FLAGS.precision}'])}
  steps = {}
  for k in ('off', 'on'):
    with _autotune(k == 'on'):
      steps[k] = step_speed._ClientStep('resnet20', 6)  # pylint: disable=protected-access
      steps[k]()  # traced here, with or without the options
  report['client_step'] = _alternate(steps, FLAGS.blocks)
  lines = _print('ResNet20 client step, 6 batches', report['client_step'])
  if FLAGS.evaluations:
    test = registry.get('cifar10').test_dataset(FLAGS.data_dir, 256)
    evaluator = export.Evaluator(
        lambda: models.build('resnet20', num_classes=10, input_shape=(32, 32, 3)), 10)
    evaluator.evaluate(None, test)  # traced

    def evaluate(on):
      with _autotune(on):
        evaluator.evaluate(None, test)
    report['evaluation'] = _alternate({'off': lambda: evaluate(False),
                                       'on': lambda: evaluate(True)}, FLAGS.evaluations)
    lines += _print('Evaluation of 10,000 test images', report['evaluation'])
  report['summary'] = lines
  print('wrote', _common.write('autotune_stalls', report))


if __name__ == '__main__':
  app.run(main)
