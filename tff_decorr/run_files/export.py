"""Global-model evaluation in the Python process, and SavedModel export.

Evaluation and export run eagerly in this process (on a GPU when present), whatever runtime trained
the model: TFF 0.87's worker is CPU-only and evaluation needs no federation.

Exported SavedModel contract (read by bin/evaluate and bin/analyze):
  signatures['serving_default'](images=float32 [N, H, W, C], preprocessed as the task's test split)
    -> {'logits': [N, num_classes], 'representation': [N, d]}
  <dir>/tff_decorr.json: {'task', 'model', 'num_classes', 'input_shape', 'representation_dim', ...}
  its variables, by name (`weights_by_name`); not the Keras model object (`_Serving` says why)
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_decorr import data_options
from tff_decorr.run_files import graph_check

METADATA_FILE = 'tff_decorr.json'


def set_weights(model: tf.keras.Model, weights: Sequence) -> None:
  """Assigns a flat weight list in `model.weights` order (trainable and non-trainable)."""
  variables = model.weights
  if len(variables) != len(weights):
    raise ValueError(f'model has {len(variables)} weights but {len(weights)} were given: the '
                     'weights belong to a different model (check --model / --task).')
  for v, w in zip(variables, weights):
    if tuple(v.shape) != tuple(np.shape(w)):
      raise ValueError(f'weight {v.name} has shape {tuple(v.shape)} but the given value has '
                       f'{tuple(np.shape(w))}: the weights belong to a different model.')
    v.assign(w)


class Evaluator:
  """Test-set metrics of a model given flat weights; builds the Keras model once."""

  def __init__(self, model_fn: Callable[[], tf.keras.Model], num_classes: int):
    self.model = model_fn()
    self.num_classes = num_classes
    self._step = tf.function(self._batch_stats)

  def _batch_stats(self, images, labels):
    out = self.model(images, training=False)
    logits = out['logits']
    labels = tf.cast(labels, tf.int32)
    ce = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    pred = tf.argmax(logits, axis=-1, output_type=tf.int32)
    conf = tf.math.confusion_matrix(labels, pred, num_classes=self.num_classes, dtype=tf.int64)
    return tf.reduce_sum(ce), conf

  def evaluate(self, weights: Optional[Sequence], dataset: tf.data.Dataset) -> dict:
    """Returns test_accuracy, test_loss, per-class accuracy and the confusion matrix."""
    if weights is not None:
      set_weights(self.model, weights)
    loss_sum = 0.0
    conf = np.zeros((self.num_classes, self.num_classes), np.int64)
    for images, labels in data_options.without_autotune(dataset):
      l, c = self._step(images, labels)
      loss_sum += float(l)
      conf += c.numpy()
    n = int(conf.sum())
    if n == 0:
      raise ValueError('the evaluation dataset is empty.')
    per_class = np.where(conf.sum(1) > 0, np.diag(conf) / np.maximum(conf.sum(1), 1), np.nan)
    return {
        'test_accuracy': float(np.trace(conf) / n),
        'test_loss': loss_sum / n,
        'test_examples': n,
        'per_class_accuracy': per_class.tolist(),
        'confusion_matrix': conf.tolist(),
    }


class _Serving(tf.Module):
  """What an export holds: the serving function and the model's variables, by name. Not the Keras
  model object: tf.saved_model.save then also traces every layer's call for Keras' own restore (a
  ResNet20 export took 3.9 s with it, 1.2 s without, docs/benchmarks.md §3; `bench.speed.run_phases
  --settings=fidelity`), while the contract is the signature."""

  def __init__(self, model: tf.keras.Model, input_shape: Sequence[int]):
    super().__init__()
    # Tracked so that the function's captured variables are saved; numbered, as layer names
    # repeat across a model's sub-models.
    self.weights_by_name = {f'{i:04d}_{v.name.replace(":0", "")}': v
                            for i, v in enumerate(model.weights)}

    def serve(images):  # The model lives in this closure only, not as a tracked attribute.
      out = model(images, training=False)
      return {'logits': out['logits'], 'representation': out['representation']}

    self.serve = tf.function(
        serve, input_signature=[tf.TensorSpec([None, *input_shape], tf.float32, name='images')])


def export_saved_model(model_fn: Callable[[], tf.keras.Model], weights: Sequence, path: str,
                       metadata: Mapping[str, Any]) -> str:
  """Writes the model with `weights` as a SavedModel at `path` (atomically: temp dir + rename)."""
  model = model_fn()
  set_weights(model, weights)
  input_shape = tuple(int(d) for d in model.input_shape[1:])
  module = _Serving(model, input_shape)
  tmp = f'{path.rstrip(os.sep)}.tmp-{os.getpid()}'
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  tf.saved_model.save(module, tmp, signatures={'serving_default': module.serve})
  rep_dim = int(model.output['representation'].shape[-1])
  meta = dict(metadata)
  meta.update({'input_shape': list(input_shape), 'representation_dim': rep_dim,
               'num_classes': int(model.output['logits'].shape[-1])})
  with open(os.path.join(tmp, METADATA_FILE), 'w') as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  old = None
  if os.path.exists(path):
    old = f'{path.rstrip(os.sep)}.old-{os.getpid()}'
    os.replace(path, old)
  os.makedirs(os.path.dirname(path.rstrip(os.sep)) or '.', exist_ok=True)
  os.replace(tmp, path)
  if old:
    shutil.rmtree(old, ignore_errors=True)
  return path


def read_metadata(path: str) -> dict:
  meta = os.path.join(path, METADATA_FILE)
  if not os.path.exists(meta):
    return {}
  with open(meta) as f:
    return json.load(f)


class SavedModelError(ValueError):
  """A SavedModel cannot be used as asked; the message names the flag and the fix."""


def load_serving(path: str, flag: str = '--saved_model'):
  """Loads an exported model; returns (serving function, metadata). Clear errors for bad paths."""
  if os.path.isdir(os.path.join(path, 'export', 'saved_model')):
    path = os.path.join(path, 'export', 'saved_model')  # A run directory was given.
  if os.path.exists(path) and not os.path.isdir(path):
    raise SavedModelError(f'{flag}={path} is a file, not a SavedModel; give a SavedModel '
                          'directory (export/saved_model of a run) or a run directory of bin/train.')
  if not os.path.isdir(path):
    raise SavedModelError(f'{flag}={path} does not exist; give a SavedModel directory or a run '
                          'directory of bin/train.')
  if not (os.path.exists(os.path.join(path, 'saved_model.pb')) or
          os.path.exists(os.path.join(path, 'saved_model.pbtxt'))):
    raise SavedModelError(f'{flag}={path} is not a SavedModel (no saved_model.pb); give the '
                          'export/saved_model directory of a run.')
  graph_check.check(path, f'{flag}={path}')  # Before anything in it runs (docs/security.md).
  try:
    loaded = tf.saved_model.load(path)
  except Exception as e:  # TF raises many types for corrupt models; report one clear error.
    raise SavedModelError(f'{flag}={path} could not be loaded ({type(e).__name__}); '
                          're-export it with bin/train.') from e
  if 'serving_default' not in loaded.signatures:
    raise SavedModelError(f'{flag}={path} has no serving_default signature; export it with '
                          'bin/train.')
  fn = loaded.signatures['serving_default']
  outputs = set(fn.structured_outputs)
  if not {'logits', 'representation'} <= outputs:
    raise SavedModelError(f'{flag}={path} returns {sorted(outputs)}, not logits and '
                          'representation; export it with bin/train.')
  meta = read_metadata(path)
  meta['_loaded'] = loaded  # Keep the object alive as long as the function is used.
  return fn, meta


def check_compatible(fn, meta: Mapping[str, Any], num_classes: int, input_shape: Sequence[int],
                     task_name: str, flag: str = '--saved_model') -> None:
  """Refuses a SavedModel whose input or output size does not match the task."""
  spec = fn.structured_input_signature[1]['images']
  model_shape = tuple(int(d) for d in spec.shape[1:])
  if model_shape != tuple(input_shape):
    raise SavedModelError(
        f'{flag}: the model takes inputs of shape {model_shape} but --task={task_name} has '
        f'{tuple(input_shape)}; evaluate it with the task it was trained on'
        + (f" (--task={meta['task']})." if meta.get('task') else '.'))
  out_classes = int(fn.structured_outputs['logits'].shape[-1])
  if out_classes != num_classes:
    raise SavedModelError(
        f'{flag}: the model has {out_classes} outputs but --task={task_name} has {num_classes} '
        'classes; evaluate it with the task it was trained on'
        + (f" (--task={meta['task']})." if meta.get('task') else '.'))
