r"""Shows how a task's train split is divided among clients: the clients x classes count matrix.

  bazel run //bin:partition -- --task=cifar10 --data_dir=/data/tfds --dirichlet_alpha=0.05 \
      --num_clients=10
  .venv/bin/python -m bin.partition --dirichlet_alpha=0.5 --output=/tmp/digits_partition.png

Prints the matrix and writes a heatmap PNG (the picture FL papers show), using exactly the partition
code bin/train uses (same seed, same clients).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

# Nothing imported here imports TensorFlow: --help and a mistyped flag answer at once;
# cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import tf_env
from tff_decorr.configs import cli

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FLAGS = flags.FLAGS
flags.DEFINE_string('task', 'digits', 'Task name.')
flags.DEFINE_string('partition', 'dirichlet', 'dirichlet|pathological|iid|domain.')
# The names bin/train uses.
flags.DEFINE_float('dirichlet_alpha', 0.5, 'Dirichlet concentration (inf: IID).')
flags.DEFINE_integer('pathological_classes_per_client', 2,
                     'Pathological partition: classes per client.')
flags.DEFINE_integer('num_clients', 10, 'Number of clients.')
flags.DEFINE_integer('seed', 0, 'Partition seed (same meaning as bin/train --seed).')
flags.DEFINE_string('data_dir', None, 'TFDS data dir.')
flags.DEFINE_string('output', None, 'Heatmap PNG path (default: partition_<task>_<partition>.png '
                    'in the current directory).')


def partition_counts(task_name, partition, alpha, classes_per_client, num_clients, seed,
                     data_dir):
  """(counts [clients, classes], task) for the given partition of the task's train split."""
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
  task = registry.get(task_name)
  _, labels, domains = task.load_split('train', data_dir)
  if partition == 'dirichlet':
    parts = partitions.dirichlet_partition(labels, num_clients, alpha, seed=seed)
  elif partition == 'pathological':
    parts = partitions.pathological_partition(labels, num_clients, classes_per_client, seed=seed)
  elif partition == 'iid':
    parts = partitions.iid_partition(len(labels), num_clients, seed=seed)
  elif partition == 'domain':
    if domains is None:
      raise ValueError(f'--partition=domain: task {task_name} has no domains.')
    parts = partitions.domain_partition(domains)
  else:
    raise ValueError(f'--partition: unknown partition {partition!r}; choose dirichlet, '
                     'pathological, iid or domain.')
  return partitions.class_count_matrix(labels, parts, task.num_classes), task


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
  alpha, classes_per_client = FLAGS.dirichlet_alpha, FLAGS.pathological_classes_per_client
  try:
    counts, task = partition_counts(FLAGS.task, FLAGS.partition, alpha, classes_per_client,
                                    FLAGS.num_clients, FLAGS.seed, FLAGS.data_dir)
  except (ValueError, FileNotFoundError) as e:
    print(f'partition: error: {e}', file=sys.stderr)
    return 2
  header = 'client ' + ' '.join(f'{k:>5d}' for k in range(task.num_classes)) + '   total'
  print(header)
  for i, row in enumerate(counts):
    print(f'{i:>6d} ' + ' '.join(f'{int(v):>5d}' for v in row) + f' {int(row.sum()):>7d}')
  empty = [k for k in range(task.num_classes) if counts[:, k].sum() == 0]
  if empty:
    print(f'classes held by no client (left out of the federation): {empty}')
  out = FLAGS.output or f'partition_{FLAGS.task}_{FLAGS.partition}.png'
  if not os.path.isabs(out):
    out = os.path.join(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()), out)
  title = (f'{FLAGS.task}: {FLAGS.partition}' +
           (f' alpha={alpha:g}' if FLAGS.partition == 'dirichlet' else '') +
           f', {counts.shape[0]} clients, seed {FLAGS.seed}')
  plots.plot_count_matrix(counts, out, title=title)
  print(f'wrote {out}')
  return 0


def entry() -> None:
  """The program, as tff-decorr-partition, `python -m bin.partition` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('partition', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
