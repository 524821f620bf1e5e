"""Loads PyTorch state-dict arrays into the project's Keras models (no PyTorch needed).

The reference's networks and ours create their layers in the same order (docs/models.md), so a
state_dict (NumPy arrays by PyTorch name, e.g. an .npz of `{k: v.numpy() for k, v in
net.state_dict().items()}`) maps onto the model's layers one module at a time: every PyTorch module
with parameters is paired with the next Keras layer with weights, its kind and shapes checked, and
its arrays converted to Keras' layouts:
- Conv2d weight [out, in, kh, kw] -> Conv2D kernel [kh, kw, in, out];
- depthwise Conv2d (groups = channels) weight [c, 1, kh, kw] -> DepthwiseConv2D kernel
  [kh, kw, c, 1];
- Linear weight [out, in] -> Dense kernel [in, out]; biases as they are;
- BatchNorm2d/1d weight, bias, running_mean, running_var -> gamma, beta, moving_mean,
  moving_variance (`num_batches_tracked` has no Keras counterpart and is ignored).
Used to start both implementations from the same weights (the step-by-step comparison with the
reference), and by anyone who wants to evaluate or fine-tune a reference checkpoint here.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import numpy as np
import tensorflow as tf

_BN_FIELDS = ('weight', 'bias', 'running_mean', 'running_var')


def _torch_modules(state: Mapping[str, np.ndarray]) -> List[Tuple[str, Dict[str, np.ndarray]]]:
  """[(module prefix, {param name: array})] in state-dict order."""
  modules: Dict[str, Dict[str, np.ndarray]] = {}
  for key, value in state.items():
    prefix, _, field = key.rpartition('.')
    if field == 'num_batches_tracked':
      continue
    modules.setdefault(prefix, {})[field] = np.asarray(value)
  return list(modules.items())


def _creation_index(layer) -> int:
  # TF numbers every variable it creates (`_unique_id` = '<name>_<uid>', uid from a global
  # counter); there is no public equivalent.
  return int(layer.weights[0]._unique_id.rsplit('_', 1)[1])  # pylint: disable=protected-access


def _keras_layers(model: tf.keras.Model) -> List[tf.keras.layers.Layer]:
  """Layers with weights in the order they were built, i.e. the order the model's builder calls
  them, which is the PyTorch module order. Not `model.layers`: a functional model orders layers by
  graph depth, which puts a residual block's shortcut conv between its last conv and that conv's
  BatchNormalization."""
  return sorted((layer for layer in model.layers if layer.weights), key=_creation_index)


def _convert(prefix: str, params: Dict[str, np.ndarray], layer) -> List[np.ndarray]:
  """The layer's weights (in `layer.weights` order) from one PyTorch module's arrays."""
  where = f'PyTorch module {prefix!r} -> Keras layer {layer.name!r}'
  if isinstance(layer, tf.keras.layers.BatchNormalization):
    if set(params) != set(_BN_FIELDS):
      raise ValueError(f'{where}: a BatchNormalization layer needs {_BN_FIELDS}, the module has '
                       f'{sorted(params)}.')
    return [params[f] for f in _BN_FIELDS]
  weight = params.get('weight')
  if weight is None or set(params) - {'weight', 'bias'}:
    raise ValueError(f'{where}: expected a weight (and bias), the module has {sorted(params)}.')
  if isinstance(layer, tf.keras.layers.DepthwiseConv2D):  # Before Conv2D: it subclasses it.
    kernel = weight.transpose(2, 3, 0, 1)  # [c, 1, kh, kw] -> [kh, kw, c, 1]
  elif isinstance(layer, tf.keras.layers.Conv2D):
    kernel = weight.transpose(2, 3, 1, 0)
  elif isinstance(layer, tf.keras.layers.Dense):
    kernel = weight.T
  else:
    raise ValueError(f'{where}: no conversion for Keras layer type {type(layer).__name__}.')
  return [kernel] + ([params['bias']] if 'bias' in params else [])


def assign_torch_state(model: tf.keras.Model, state: Mapping[str, np.ndarray]) -> None:
  """Assigns a PyTorch state_dict (arrays by name, in state-dict order) to `model`'s weights.

  Raises ValueError naming the first module whose kind or shapes do not match the next Keras layer
  (nothing is assigned then), or when the counts of modules and layers differ.
  """
  modules = _torch_modules(state)
  layers = _keras_layers(model)
  if len(modules) != len(layers):
    raise ValueError(f'the state_dict has {len(modules)} modules with parameters but model '
                     f'{model.name!r} has {len(layers)} layers with weights; it is not the same '
                     'architecture.')
  assignments = []
  for (prefix, params), layer in zip(modules, layers):
    values = _convert(prefix, params, layer)
    if len(values) != len(layer.weights):
      raise ValueError(f'PyTorch module {prefix!r} has {len(values)} arrays but Keras layer '
                       f'{layer.name!r} has {len(layer.weights)} weights (a bias on one side only?).')
    for v, x in zip(layer.weights, values):
      if tuple(v.shape) != x.shape:
        raise ValueError(f'PyTorch module {prefix!r} -> Keras layer {layer.name!r}: shape '
                         f'{x.shape} (converted) does not match {tuple(v.shape)} of {v.name}.')
      assignments.append((v, x.astype(v.dtype.as_numpy_dtype)))
  for v, x in assignments:
    v.assign(x)


def _paired_variables(model: tf.keras.Model, state: Mapping[str, np.ndarray]):
  """(PyTorch key, Keras variable, Keras layer) for every weight, in the pairing
  assign_torch_state uses."""
  for (prefix, params), layer in zip(_torch_modules(state), _keras_layers(model)):
    fields = _BN_FIELDS if isinstance(layer, tf.keras.layers.BatchNormalization) else \
        [f for f in ('weight', 'bias') if f in params]
    for v, f in zip(layer.weights, fields):
      yield f'{prefix}.{f}', v, layer


def torch_names(model: tf.keras.Model, state: Mapping[str, np.ndarray]) -> Dict[str, str]:
  """Keras variable name -> PyTorch state-dict key, for reading a comparison by either name."""
  return {v.name: key for key, v, _ in _paired_variables(model, state)}


def to_torch_layout(model: tf.keras.Model, state: Mapping[str, np.ndarray]
                    ) -> Dict[str, np.ndarray]:
  """`model`'s current weights as a state_dict shaped like `state` (the inverse of
  assign_torch_state), for comparing with arrays a PyTorch run saved."""
  out = {}
  for key, v, layer in _paired_variables(model, state):
    x = v.numpy()
    if key.endswith('.weight') and x.ndim == 4:
      x = x.transpose(2, 3, 0, 1) if isinstance(layer, tf.keras.layers.DepthwiseConv2D) \
          else x.transpose(3, 2, 0, 1)
    elif key.endswith('.weight') and x.ndim == 2 and isinstance(layer, tf.keras.layers.Dense):
      x = x.T
    out[key] = x
  return out
