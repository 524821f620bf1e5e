r"""Evaluates an exported global model on a task's test split.

  python -m bin.evaluate --saved_model=runs/<run>          # the run's task and --data_dir
  python -m bin.evaluate --saved_model=runs/<run>/export/saved_model --data_dir=/data/tfds

Prints top-1 accuracy and per-class accuracy, writes a confusion-matrix PNG and a JSON report. Given
the run directory of a personalised algorithm (FedBN; fedavg_decomposed with
--fedavg_decomposed_coefficient_period=0), also reports each client's own model (exported by
bin/train under export/clients/<id>/) on that client's test data, as the FedBN paper does, and
their mean weighted by test examples. One client's model:
--saved_model=<run>/export/clients/<id>/saved_model (bin/analyze takes the same path). A SavedModel
whose input or output size does not match the task is refused. The task and the data directory are
the run's (its config.json, when --saved_model is a run directory or a model inside one) unless
--task or --data_dir is given.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags

# Nothing imported here imports TensorFlow (personalized is loaded on first use): --help and a
# mistyped flag answer at once; cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import lazy
from tff_decorr import tf_env
from tff_decorr.configs import cli
from tff_decorr.run_files import run_dir

personalized = lazy.lazy_module('tff_decorr.program.personalized')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FLAGS = flags.FLAGS
flags.DEFINE_string('saved_model', None, 'A SavedModel directory, or a run directory of bin/train.')
flags.DEFINE_string('task', None, 'Task whose test split to use (default: the task the model was '
                    'trained on: its run\'s config.json, else the SavedModel\'s metadata).')
flags.DEFINE_string('data_dir', None, 'TFDS data dir (default: its run\'s --data_dir, from the '
                    'run\'s config.json).')
flags.DEFINE_string('output_dir', None, 'Where to write evaluation.json and confusion_matrix.png '
                    '(default: <saved_model>/../evaluation).')
flags.DEFINE_integer('batch_size', 256, 'Evaluation batch size (>= 1).', lower_bound=1)
flags.DEFINE_bool('trust_saved_model', False, 'Load a SavedModel tff_decorr did not write (no '
                  'tff_decorr.json naming its model, no run config.json) with TensorFlow, which '
                  'runs the program the file holds (docs/security.md); bin/train\'s exports are '
                  'read as data without it.')




def evaluate_saved_model(saved_model: str, task_name, data_dir, batch_size: int,
                         output_dir=None, trust_saved_model: bool = False) -> dict:
  """Evaluates a SavedModel on its task's test set and writes evaluation.json and the confusion
  matrix's figure.

  Args:
    saved_model: a SavedModel directory, or a run directory (its final export).
    task_name: the task; None: the run's config.json, else the SavedModel's metadata.
    data_dir: where the task's data is prepared; None: the run's, else TFDS's default.
    batch_size: examples a batch.
    output_dir: where the report goes; None: <run>/evaluation (or beside the SavedModel).
    trust_saved_model: allow a foreign SavedModel's own program to run (docs/security.md).

  Returns:
    The report: test_accuracy, per-class accuracy, confusion matrix, the files written,
    per-client accuracies of a personalised run.

  Raises:
    ValueError: misuse (no task known, an unknown task, a model that does not fit the task);
      export.SavedModelError and graph_check.UnsafeGraphError are ValueErrors too.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top

  run_root = saved_model if os.path.isdir(os.path.join(saved_model, 'export')) else None
  if output_dir is None:
    base = run_root or os.path.dirname(os.path.abspath(saved_model.rstrip(os.sep)))
    output_dir = os.path.join(base, 'evaluation')
  fn, meta = export.load_serving(saved_model, trust_saved_model=trust_saved_model)
  cli.ensure_writable_dir(output_dir)  # Before any work: fail at once if it cannot be written.
  # An explicit flag > the run's config.json > (the task only) the SavedModel's metadata.
  _, run_config = run_dir.find_run(saved_model)
  task_name = task_name or run_config.get('task') or meta.get('task')
  data_dir = data_dir or run_config.get('data_dir') or None
  if not task_name:
    raise ValueError('--task: the SavedModel has no task metadata; name the task it was trained on.')
  if task_name not in task_registry.names():
    raise ValueError(f'--task: unknown task {task_name!r}; choose one of '
                     f'{", ".join(task_registry.names())}.')
  task = task_registry.get(task_name)
  export.check_compatible(fn, meta, task.num_classes, task.input_shape, task_name)
  if 'client_id' in meta and task.domains:  # One client's model of a domain task: its domain.
    test_set = personalized.client_test_datasets(task, data_dir, batch_size)(meta['client_id'])
  else:
    test_set = task.test_dataset(data_dir, batch_size)
  conf = _confusion(fn, test_set, task.num_classes)
  n = int(conf.sum())
  per_class = (np.diag(conf) / np.maximum(conf.sum(1), 1)).tolist()
  report = {'saved_model': saved_model, 'task': task_name, 'data_dir': data_dir,
            'test_examples': n, 'test_accuracy': float(np.trace(conf) / max(n, 1)),
            'per_class_accuracy': per_class, 'confusion_matrix': conf.tolist()}
  if run_root is not None and meta.get('personalized'):
    report.update(_per_client(run_root, task, data_dir, batch_size))
  png = plots.plot_confusion_matrix(conf, os.path.join(output_dir, 'confusion_matrix.png'),
                                    title=f'{task_name}: accuracy {report["test_accuracy"]:.4f}')
  report['confusion_matrix_png'] = png
  with open(os.path.join(output_dir, 'evaluation.json'), 'w') as f:
    json.dump(report, f, indent=2)
  report['output_dir'] = output_dir
  return report


def _confusion(fn, dataset, num_classes):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  conf = np.zeros((num_classes, num_classes), np.int64)
  for images, labels in dataset:
    pred = tf.argmax(fn(images=images)['logits'], -1, output_type=tf.int32)
    conf += tf.math.confusion_matrix(tf.cast(labels, tf.int32), pred, num_classes=num_classes,
                                     dtype=tf.int64).numpy()
  return conf


def _per_client(run_root, task, data_dir, batch_size) -> dict:
  """Each exported client model on its own test data; the mean weighted by test examples."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  clients_dir = os.path.dirname(os.path.dirname(personalized.client_export_dir(run_root, 0)))
  ids = sorted((int(c) for c in os.listdir(clients_dir) if c.isdigit())
               if os.path.isdir(clients_dir) else [])
  if not ids:
    raise ValueError(f'--saved_model={run_root}: a personalised run without exported client '
                     'models (export/clients/); re-run the same bin/train command to export them.')
  datasets = personalized.client_test_datasets(task, data_dir, batch_size)
  per_client = []
  for cid in ids:
    fn, _ = export.load_serving(personalized.client_export_dir(run_root, cid))
    conf = _confusion(fn, datasets(cid), task.num_classes)
    per_client.append({'test_accuracy': float(np.trace(conf) / max(conf.sum(), 1)),
                       'test_examples': int(conf.sum())})
  summary = personalized.weighted_summary(per_client)
  return {'per_client_test_accuracy': summary['per_client_test_accuracy'],
          'per_client_test_examples': summary['per_client_test_examples'],
          'mean_client_test_accuracy': summary['test_accuracy']}


def main(argv):
  cli.quiet_logging()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  return cli.run_guarded('evaluate', _main)


def _main() -> int:
  if not FLAGS.saved_model:
    raise ValueError('--saved_model is required (a SavedModel or a run directory).')
  report = evaluate_saved_model(cli.user_path(FLAGS.saved_model), FLAGS.task,
                                cli.user_path(FLAGS.data_dir), FLAGS.batch_size,
                                cli.user_path(FLAGS.output_dir), FLAGS.trust_saved_model)
  print(f'task {report["task"]}' + (f' (data {report["data_dir"]})' if report['data_dir'] else '')
        + f': top-1 accuracy {report["test_accuracy"]:.4f} on {report["test_examples"]} test '
        'examples')
  print('per-class accuracy: ' + ' '.join(f'{i}:{a:.3f}' for i, a in
                                          enumerate(report['per_class_accuracy'])))
  if 'per_client_test_accuracy' in report:
    print('the global model above is not what a personalised algorithm deploys; each client\'s '
          'own model (shared weights + its local part) on its test data:')
    print('per-client accuracy: ' + ' '.join(
        f'{i}:{a:.3f}' for i, a in enumerate(report['per_client_test_accuracy'])) +
          f'  mean (weighted by test examples) {report["mean_client_test_accuracy"]:.4f}')
  print(f'wrote {report["output_dir"]}/evaluation.json and {report["confusion_matrix_png"]}')
  return 0


def entry() -> None:
  """The program, as tff-decorr-evaluate, `python -m bin.evaluate` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('evaluate', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
