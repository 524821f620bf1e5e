r"""Shows how a task's train split is divided among clients: the clients x classes count matrix.

  python -m bin.partition --task=cifar10 --data_dir=/data/tfds      # cifar10's defaults: alpha 0.05
  python -m bin.partition --dirichlet_alpha=0.1 --num_clients=20 --output=/tmp/digits.png

Prints the matrix and writes a heatmap PNG (the picture FL papers show). The partition is the one
bin/train trains on for the same flags: the settings are resolved as bin/train resolves them (an
explicit flag > the task's default > the partition's own default: cifar10's Dirichlet alpha is
0.05) and split by the same function (tff_decorr.program.experiment.client_partition), with the same
seed and clients.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from absl import app
from absl import flags

# Nothing imported here imports TensorFlow: --help and a mistyped flag answer at once;
# cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import tf_env
from tff_decorr.configs import cli

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FLAGS = flags.FLAGS
_DEFAULT = 'default: the task\'s, as in bin/train'
flags.DEFINE_string('task', 'digits', 'Task name.')
flags.DEFINE_string('partition', None, f'dirichlet|pathological|iid|domain ({_DEFAULT}).')
flags.DEFINE_float('dirichlet_alpha', None, f'Dirichlet concentration, inf: IID ({_DEFAULT}; '
                   'cifar10: 0.05).')
flags.DEFINE_integer('pathological_classes_per_client', None,
                     f'Pathological partition: classes per client ({_DEFAULT}, else 2).')
flags.DEFINE_integer('num_clients', None, f'Number of clients ({_DEFAULT}).')
flags.DEFINE_integer('seed', 0, 'Partition seed (same meaning as bin/train --seed).')
flags.DEFINE_string('data_dir', None, 'TFDS data dir.')
flags.DEFINE_string('output', None, 'Heatmap PNG path (default: partition_<task>_<partition>.png '
                    'in the current directory).')
# The settings bin/train would take from these flags (the rest are where the data is and goes).
_SETTINGS = ('partition', 'dirichlet_alpha', 'pathological_classes_per_client', 'num_clients',
             'seed')


def resolve(task: str, given: Mapping[str, object]):
  """The run configuration bin/train would resolve from the partition settings `given` (explicit
  flags only): config.make, explicit > the task's defaults > the partition's own defaults.

  Args:
    task: the task's name.
    given: {setting: value} the user gave (num_clients, seed, partition, its settings).

  Returns:
    A validated Config.

  Raises:
    ValueError: an unknown task or setting, or a value out of range.
  """
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.make(task=task, regularizer='none', **given)


def partition_counts(config, data_dir):
  """(counts [clients, classes], task) of the partition of the task's train split that a run of
  `config` trains on.

  Args:
    config: the run's Config.
    data_dir: where the task's data is prepared (None: TFDS's default).

  Returns:
    (int counts [clients, classes], the task).

  Raises:
    ValueError: the domain partition of a task without domains, or a partition that cannot split.
    tasks.base.DatasetNotFoundError: the task's data is not prepared.
  """
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import experiment  # pylint: disable=g-import-not-at-top
  task = registry.get(config.task)
  _, labels, domains = task.load_split('train', data_dir)
  if config.partition == 'domain' and domains is None:
    raise ValueError(f'--partition=domain: task {config.task} has no domains.')
  parts = experiment.client_partition(config, task, labels, domains)
  return partitions.class_count_matrix(labels, parts, task.num_classes), task


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
  try:
    config = resolve(FLAGS.task, {n: FLAGS[n].value for n in _SETTINGS
                                  if FLAGS[n].value is not None})
    counts, task = partition_counts(config, FLAGS.data_dir)
  except (ValueError, KeyError, FileNotFoundError) as e:
    print(f'partition: error: {str(e).strip(chr(39))}', file=sys.stderr)
    return 2
  settings = config.component_hparams('partition').to_dict()
  print(f'{config.task}: {config.partition} partition' +
        ''.join(f', {k} {v:g}' if isinstance(v, float) else f', {k} {v}'
                for k, v in settings.items()) +
        f', {config.num_clients} clients, seed {config.seed} (as bin/train --task={config.task} '
        'resolves them)')
  header = 'client ' + ' '.join(f'{k:>5d}' for k in range(task.num_classes)) + '   total'
  print(header)
  for i, row in enumerate(counts):
    print(f'{i:>6d} ' + ' '.join(f'{int(v):>5d}' for v in row) + f' {int(row.sum()):>7d}')
  empty = [k for k in range(task.num_classes) if counts[:, k].sum() == 0]
  if empty:
    print(f'classes held by no client (left out of the federation): {empty}')
  out = FLAGS.output or f'partition_{config.task}_{config.partition}.png'
  if not os.path.isabs(out):
    out = os.path.join(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()), out)
  title = (f'{config.task}: {config.partition}' +
           ''.join(f' {k}={v:g}' if isinstance(v, float) else f' {k}={v}'
                   for k, v in settings.items()) +
           f', {counts.shape[0]} clients, seed {config.seed}')
  plots.plot_count_matrix(counts, out, title=title)
  print(f'wrote {out}')
  return 0


def entry() -> None:
  """The program, as tff-decorr-partition, `python -m bin.partition` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('partition', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
