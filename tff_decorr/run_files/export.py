"""Global-model evaluation in the Python process, and SavedModel export.

Evaluation and export run eagerly in this process (on a GPU when present), whatever runtime trained
the model: TFF 0.87's worker is CPU-only and evaluation needs no federation.

Exported SavedModel contract (for TensorFlow Serving and other readers):
  signatures['serving_default'](images=float32 [N, H, W, C], preprocessed as the task's test split)
    -> {'logits': [N, num_classes], 'representation': [N, d]}
  <dir>/tff_decorr.json: {'task', 'model', 'model_kwargs', 'precision', 'num_classes',
    'input_shape', 'representation_dim', ...}: the architecture, enough to build the model again
  its variables, by name (`weights_by_name`); not the Keras model object (`_Serving` says why)

tff_decorr reads its own exports back as data (`load_serving`): it builds the Keras model the
metadata names (or, for an export whose metadata predates `model_kwargs`, the run's config.json)
and reads the weights from variables/ with the checkpoint reader, which parses tensors and runs no
graph. Loading a SavedModel with TensorFlow runs the program it holds, the restore op of a TF1-style
one included, before a single check of ours could stop it (docs/security.md); that happens only
for a SavedModel tff_decorr did not write, and only with `trust_saved_model=True`
(`--trust_saved_model`), after graph_check.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tff_decorr import data_options
from tff_decorr.run_files import graph_check

METADATA_FILE = 'tff_decorr.json'
CONFIG_FILE = 'config.json'  # a run directory's configuration (run_files/run_dir.py)
# The checkpoint key of the object graph in a TF2 checkpoint (what tf.train.Checkpoint writes).
_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
# How many folders above an export its run directory may be: export/saved_model and
# export/round_<r> (2), local_models/round_<r>/client_<c> (3), export/clients/<id>/saved_model (4).
_RUN_DIR_DEPTH = 4


def model_kwargs(projection_dim: Optional[int] = 0, decomposed: bool = False,
                 num_atoms: Optional[int] = 0, init: Optional[str] = None) -> dict:
  """The arguments of `models.build` beyond num_classes and input_shape that a run's settings
  give: one place for the run, which builds the model, and for reading an export, which builds it
  again.

  Args:
    projection_dim: MOON's projection head size (0 or None: none).
    decomposed: decomposed convolutions.
    num_atoms: atoms of the decomposed convolutions (0 or None: the model's default).
    init: the initialisation's name (None: the model's default).

  Returns:
    The keyword arguments, without those at their default.
  """
  out = {}
  if projection_dim:
    out['projection_dim'] = int(projection_dim)
  if decomposed:
    out['decomposed'] = True
    if num_atoms:
      out['num_atoms'] = int(num_atoms)
  if init:
    out['init'] = str(init)
  return out


def set_weights(model: tf.keras.Model, weights: Sequence) -> None:
  """Assigns a flat weight list in `model.weights` order (trainable and non-trainable).

  Args:
    model: a built Keras model.
    weights: arrays or tensors, one per variable of `model.weights`.

  Raises:
    ValueError: another number of weights, or a shape that differs (another model's weights).
  """
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
    """The model's test metrics on `dataset`.

    Args:
      weights: flat weights to assign first, or None to evaluate the model as it is.
      dataset: batches of (images, int labels).

    Returns:
      {'test_accuracy', 'test_loss' (mean cross-entropy), 'test_examples',
      'per_class_accuracy' (NaN for a class without examples), 'confusion_matrix' (true x
      predicted counts)}.

    Raises:
      ValueError: the dataset is empty, or the weights belong to another model.
    """
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
  model object: tf.saved_model.save then also traces every layer's call for Keras' own restore,
  which made every export slower (docs/benchmarks.md §3), while the contract is the signature."""

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
  """Writes the model with `weights` as a SavedModel at `path` (atomically: temp dir + rename).
  `metadata` goes to its tff_decorr.json, with the input shape and the output sizes; with 'model',
  'model_kwargs' (model_kwargs()) and 'precision' too, as the run writes it, `load_serving` reads
  the export back as data.

  Args:
    model_fn: builds the model the weights belong to.
    weights: its flat weights, in `model.weights` order.
    path: the export directory; an existing one is replaced.
    metadata: the tff_decorr.json entries.

  Returns:
    `path`.

  Raises:
    ValueError: the weights do not fit the model.
    OSError: the export cannot be written.
  """
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


class SavedModelError(ValueError):
  """A SavedModel cannot be used as asked; the message names the flag and the fix."""


def read_metadata(path: str) -> dict:
  """The export's tff_decorr.json.

  Args:
    path: the SavedModel directory.

  Returns:
    Its metadata dict; {} when it has none.

  Raises:
    SavedModelError: the file cannot be read or is not a JSON object.
  """
  meta = os.path.join(path, METADATA_FILE)
  if not os.path.exists(meta):
    return {}
  try:
    with open(meta) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise SavedModelError(f'{meta} cannot be read ({type(e).__name__}); re-export the model with '
                          'bin/train.') from e
  if not isinstance(data, dict):
    raise SavedModelError(f'{meta} is not a JSON object; re-export the model with bin/train.')
  return data


def _run_config(path: str) -> Optional[dict]:
  """The config.json of the run directory holding the export at `path` (None if there is none):
  the first of the folders above it, up to _RUN_DIR_DEPTH, that holds one."""
  directory = os.path.abspath(path.rstrip(os.sep))
  for _ in range(_RUN_DIR_DEPTH):
    directory = os.path.dirname(directory)
    candidate = os.path.join(directory, CONFIG_FILE)
    if os.path.isfile(candidate):
      try:
        with open(candidate) as f:
          config = json.load(f)
      except (OSError, ValueError):
        return None
      return config if isinstance(config, dict) else None
  return None


def architecture(path: str, meta: Mapping[str, Any]) -> Optional[dict]:
  """What builds the model of the export at `path` again: {'model', 'model_kwargs', 'precision',
  'num_classes', 'input_shape'}, from its metadata, or, where the metadata predates
  'model_kwargs', from its run's config.json. None when neither says (not tff_decorr's export).

  Args:
    path: the SavedModel directory.
    meta: its metadata (read_metadata).

  Returns:
    The architecture, or None.
  """
  if not all(k in meta for k in ('model', 'num_classes', 'input_shape')):
    return None
  if 'model_kwargs' in meta:
    kwargs, precision_name = meta['model_kwargs'], meta.get('precision', 'float32')
  else:
    config = _run_config(path)
    if config is None:
      return None
    kwargs = model_kwargs(config.get('projection_dim'), bool(config.get('decomposed')),
                          config.get('num_atoms'), config.get('init'))
    precision_name = meta.get('precision', config.get('precision', 'float32'))
  return {'model': meta['model'], 'model_kwargs': kwargs, 'precision': precision_name,
          'num_classes': meta['num_classes'], 'input_shape': meta['input_shape']}


def _build(arch: Mapping[str, Any], what: str) -> tf.keras.Model:
  """The Keras model `arch` names. SavedModelError when its values are not what an export of
  tff_decorr writes (a model name, scalar arguments, positive sizes)."""
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  from tff_decorr.models import precision  # pylint: disable=g-import-not-at-top
  kwargs, shape = arch['model_kwargs'], arch['input_shape']
  if (not isinstance(arch['model'], str) or not isinstance(kwargs, dict) or
      not all(isinstance(v, (bool, int, float, str)) or v is None for v in kwargs.values()) or
      not isinstance(arch['num_classes'], int) or arch['num_classes'] < 1 or
      not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape) or
      arch['precision'] not in models.PRECISIONS):
    raise SavedModelError(f'{what}: its {METADATA_FILE} does not describe a tff_decorr model; '
                          're-export it with bin/train.')
  try:
    return precision.build(lambda: models.build(
        arch['model'], num_classes=arch['num_classes'], input_shape=tuple(shape), **kwargs),
                           arch['precision'])
  except (ValueError, TypeError) as e:
    raise SavedModelError(f'{what}: the model its metadata names cannot be built ({e}); '
                          're-export it with bin/train.') from e


def _exported_weights(path: str, what: str) -> list:
  """The export's weights in `model.weights` order, read from its variables/ with the checkpoint
  reader (tensors only; no graph runs): the children of `weights_by_name` in the checkpoint's
  object graph, whose names start with their index (`_Serving`)."""
  prefix = os.path.join(path, 'variables', 'variables')
  if not os.path.exists(f'{prefix}.index'):
    raise SavedModelError(f'{what} has no variables/variables.index: it is not an export of '
                          'bin/train, or it was damaged; re-export it with bin/train.')
  try:
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    (node,) = [graph.nodes[c.node_id] for c in graph.nodes[0].children
               if c.local_name == 'weights_by_name']
    keys = {}
    for child in node.children:
      index, _, _ = child.local_name.partition('_')
      (key,) = [a.checkpoint_key for a in graph.nodes[child.node_id].attributes
                if a.name == 'VARIABLE_VALUE']
      keys[int(index)] = key
    if sorted(keys) != list(range(len(keys))):
      raise ValueError('the weights are not numbered 0..n-1')
    return [reader.get_tensor(keys[i]) for i in range(len(keys))]
  except Exception as e:  # pylint: disable=broad-except  (any reader or layout error: one line)
    raise SavedModelError(f'{what}: its variables cannot be read as the weights of a tff_decorr '
                          f'export ({type(e).__name__}); re-export it with bin/train.') from e


class ServingFunction:
  """The `serving_default` signature of an export, computed by the Keras model built again from its
  architecture with its weights: called as `fn(images=...)`, it returns {'logits',
  'representation'}, and it describes its input and outputs as a signature function does
  (`structured_input_signature`, `structured_outputs`)."""

  def __init__(self, model: tf.keras.Model):
    self.model = model
    spec = tf.TensorSpec([None, *(int(d) for d in model.input_shape[1:])], tf.float32,
                         name='images')
    self.structured_input_signature = ((), {'images': spec})
    self.structured_outputs = {
        k: tf.TensorSpec(model.output[k].shape, tf.float32, name=k)
        for k in ('logits', 'representation')}
    self._serve = tf.function(self._outputs, input_signature=[spec])

  def _outputs(self, images):
    out = self.model(images, training=False)
    return {'logits': out['logits'], 'representation': out['representation']}

  def __call__(self, images) -> dict:
    return self._serve(images)


def _load_trusted(path: str, what: str):
  """tf.saved_model.load: runs the SavedModel's program (docs/security.md); graph_check has
  passed it."""
  try:
    loaded = tf.saved_model.load(path)
  except Exception as e:  # TF raises many types for corrupt models; report one clear error.
    raise SavedModelError(f'{what} could not be loaded ({type(e).__name__}); '
                          're-export it with bin/train.') from e
  if 'serving_default' not in loaded.signatures:
    raise SavedModelError(f'{what} has no serving_default signature; export it with bin/train.')
  fn = loaded.signatures['serving_default']
  outputs = set(fn.structured_outputs)
  if not {'logits', 'representation'} <= outputs:
    raise SavedModelError(f'{what} returns {sorted(outputs)}, not logits and representation; '
                          'export it with bin/train.')
  return fn, loaded


def load_serving(path: str, flag: str = '--saved_model', trust_saved_model: bool = False):
  """Loads an export of bin/train as data; returns (serving function, metadata).

  The model is built again from the architecture its metadata (or its run's config.json) names,
  and its weights are read from variables/ with the checkpoint reader: nothing in the file runs.
  A SavedModel tff_decorr did not write is refused unless `trust_saved_model`, which loads it with
  TensorFlow: that runs the program the file holds (docs/security.md).

  Args:
    path: a SavedModel directory, or a run directory holding export/saved_model.
    flag: how errors name `path` (the command-line flag that gave it).
    trust_saved_model: run a foreign SavedModel's program (graph_check's allow list applies).

  Returns:
    (fn, meta): fn(images=float32 [N, H, W, C]) -> {'logits', 'representation'}, with
    `structured_input_signature` and `structured_outputs` as a signature function has; meta the
    export's metadata.

  Raises:
    SavedModelError: a path that is not a SavedModel, metadata or weights that do not fit, or a
      foreign SavedModel without `trust_saved_model` (one line naming the flag and the fix).
    graph_check.UnsafeGraphError: a SavedModel naming operations tff_decorr never writes.
  """
  if os.path.isdir(os.path.join(path, 'export', 'saved_model')):
    path = os.path.join(path, 'export', 'saved_model')  # A run directory was given.
  if os.path.exists(path) and not os.path.isdir(path):
    raise SavedModelError(f'{flag}={path} is a file, not a SavedModel; give a SavedModel '
                          'directory (export/saved_model of a run) or a run directory of '
                          'bin/train.')
  if not os.path.isdir(path):
    raise SavedModelError(f'{flag}={path} does not exist; give a SavedModel directory or a run '
                          'directory of bin/train.')
  if not (os.path.exists(os.path.join(path, 'saved_model.pb')) or
          os.path.exists(os.path.join(path, 'saved_model.pbtxt'))):
    raise SavedModelError(f'{flag}={path} is not a SavedModel (no saved_model.pb); give the '
                          'export/saved_model directory of a run.')
  what = f'{flag}={path}'
  # Reads the graph's proto only. Whichever way the file is read next, one that names what
  # tff_decorr never writes is refused as such; for a trusted foreign file, defence in depth.
  graph_check.check(path, what)
  meta = read_metadata(path)
  arch = architecture(path, meta)
  if arch is None:
    if not trust_saved_model:
      raise SavedModelError(
          f'{what} was not written by tff_decorr (no {METADATA_FILE} naming its model, no run '
          'config.json above it), and loading it would run the TensorFlow program it holds; if '
          'you trust the file, give --trust_saved_model (trust_saved_model=True in Python; '
          'docs/security.md).')
    fn, loaded = _load_trusted(path, what)
    meta['_loaded'] = loaded  # Keep the object alive as long as the function is used.
    return fn, meta
  model = _build(arch, what)
  weights = _exported_weights(path, what)
  try:
    set_weights(model, weights)
  except ValueError as e:
    raise SavedModelError(f'{what}: its variables are not the weights of the model its metadata '
                          f'names ({e}); re-export it with bin/train.') from e
  return ServingFunction(model), meta


def check_compatible(fn, meta: Mapping[str, Any], num_classes: int, input_shape: Sequence[int],
                     task_name: str, flag: str = '--saved_model') -> None:
  """Refuses a SavedModel whose input or output size does not match the task.

  Args:
    fn: the SavedModel's serving function.
    meta: its tff_decorr.json ({} for a foreign one).
    num_classes: the task's classes.
    input_shape: the task's image shape.
    task_name: for the message.
    flag: the flag that named the model, for the message.

  Raises:
    SavedModelError: the input shape or the number of outputs differs (the message names the
      task the model was trained on when known).
  """
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
