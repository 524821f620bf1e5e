"""Deriving graph_check.ALLOWED_OPS: the operations of every SavedModel tff_decorr writes.

`python -m tff_decorr.run_files.allowed_ops` exports every model of the registry in every
precision, plain and with the variants that change the graph, also as a Keras object, and an
old-format checkpoint, and prints the union of their operations; `--check` compares it with
graph_check.ALLOWED_OPS (graph_check's docstring says why the scan is an allow list). A tool of its
own, apart from graph_check: it exports models (run_files/export), which read through graph_check.
"""

from __future__ import annotations

import os
import sys

from tff_decorr.run_files import graph_check


# Input shapes as small as each model accepts: the operations do not depend on the size.
_SMALL_INPUT = {'alexnet_bn': (63, 63, 3)}
_SMALL_KWARGS = {'alexnet_bn': {'hidden_dim': 8}}
VARIANTS = ({}, {'decomposed': True, 'projection_dim': 8})


def export_operations(directory: str, model_name: str, precision_name: str, variant: dict,
                      keras_object: bool = False) -> set:
  """The operations of tff_decorr's export (run_files/export.py) of `model_name` built in
  `precision_name` with `variant` (model kwargs), written under `directory`; with
  `keras_object`, of the Keras model saved as an object instead.

  Args:
    directory: a scratch folder.
    model_name: a name in models.names().
    precision_name: one of models.PRECISIONS.
    variant: extra model kwargs (`VARIANTS`).
    keras_object: save the Keras model with tf.saved_model.save instead.

  Returns:
    The set of op type names of that SavedModel.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  from tff_decorr.models import precision  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  kwargs = dict(num_classes=3, input_shape=_SMALL_INPUT.get(model_name, (8, 8, 3)),
                **_SMALL_KWARGS.get(model_name, {}), **variant)
  model_fn = lambda: precision.build(lambda: models.build(model_name, **kwargs), precision_name)
  tag = [model_name, precision_name, *sorted(variant)] + (['keras'] if keras_object else [])
  path = os.path.join(directory, '-'.join(tag))
  model = model_fn()
  if keras_object:
    tf.saved_model.save(model, path)
  else:
    export.export_saved_model(model_fn, [v.numpy() for v in model.weights], path, {
        'model': model_name, 'precision': precision_name,
        'model_kwargs': {k: v for k, v in kwargs.items() if k not in ('num_classes',
                                                                      'input_shape')}})
  return graph_check.operations(path)


def old_checkpoint_operations(directory: str) -> set:
  """The operations of a checkpoint in TFF's SavedModel format (tff_decorr before
  checkpoint_files), with the structure the training program saves.

  Args:
    directory: a scratch folder.

  Returns:
    The set of op type names.
  """
  import asyncio  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state = {'round': 1, 'server_state': {'weights': [np.zeros((3, 3), np.float32)],
                                        'aggregator': b'\x00state'},
           'best_accuracy': np.float64(0.5), 'best_round': 1, 'last_accuracy': np.float64(0.5)}
  manager = tff.program.FileProgramStateManager(os.path.join(directory, 'old'), prefix='round_')
  asyncio.run(manager.save(state, 1))
  return graph_check.operations(os.path.join(directory, 'old', 'round_1'))


def derive_allowed_ops(directory: str, log=print) -> set:
  """Every operation of tff_decorr's SavedModels, as the module docstring says.

  Args:
    directory: a scratch folder for the exports.
    log: called with one line per export.

  Returns:
    The union of their op type names.
  """
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  out = old_checkpoint_operations(directory)
  for name in models.names():
    for precision_name in models.PRECISIONS:
      for variant in VARIANTS:
        for keras_object in (False, True):
          ops = export_operations(directory, name, precision_name, variant, keras_object)
          log(f'{name} {precision_name} {variant or "plain"}'
              f'{" (Keras object)" if keras_object else ""}: {len(ops)} operations')
          out |= ops
  return out


def main(argv) -> int:
  """Prints the derived ALLOWED_OPS; with --check, what ALLOWED_OPS lacks or has in excess.

  Args:
    argv: the command line's arguments ('--check' or none).

  Returns:
    The exit status: 1 when --check finds an operation missing from ALLOWED_OPS, else 0.
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  from tff_decorr import tf_env  # pylint: disable=g-import-not-at-top,unused-import
  with tempfile.TemporaryDirectory() as directory:
    derived = derive_allowed_ops(directory, log=lambda s: print(s, file=sys.stderr))
  if '--check' in argv:
    missing = sorted(derived - graph_check.ALLOWED_OPS)
    extra = sorted(graph_check.ALLOWED_OPS - derived)
    print(f'missing from ALLOWED_OPS: {missing or "none"}; listed but not derived: '
          f'{extra or "none"}')
    return 1 if missing else 0
  print(sorted(derived))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
