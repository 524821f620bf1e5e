"""Model registry: `build(name, num_classes=..., input_shape=..., **kwargs)`, `names()`, and
per-variable masks the federated algorithms use (BatchNorm variables, decomposition atoms and
coefficients), all in `model.weights` order.

Every model returns {'representation': [N, d], 'logits': [N, num_classes]}; see docs/models.md.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_decorr.models import alexnet_bn as _alexnet_bn
from tff_decorr.models import common as _common
from tff_decorr.models import decomposed as _decomposed
from tff_decorr.models import mobilenet_v2 as _mobilenet_v2
from tff_decorr.models import precision as _precision
from tff_decorr.models import resnet as _resnet
from tff_decorr.models import small_cnn as _small_cnn
# pylint: disable=unused-import
from tff_decorr.models.decomposed import DecomposedConv2D, DecomposedConvBase
from tff_decorr.models.decomposed import DecomposedDepthwiseConv2D
# pylint: enable=unused-import

_REGISTRY: Dict[str, Callable[..., tf.keras.Model]] = {
    'small_cnn': _small_cnn.small_cnn,
    'mobilenet_v2_cifar': _mobilenet_v2.mobilenet_v2_cifar,
    'resnet18': _resnet.resnet18,
    'resnet20': _resnet.resnet20,
    'resnet32': _resnet.resnet32,
    'alexnet_bn': _alexnet_bn.alexnet_bn,
}


INITS = _common.INITS
PRECISIONS = _precision.PRECISIONS


def names() -> Tuple[str, ...]:
  """The registered models' names.

  Returns:
    A tuple of names ('small_cnn', 'resnet20', ...).

  Raises:
    Nothing.
  """
  return tuple(_REGISTRY)


def default_init(name: str) -> str:
  """The initialisation model `name` uses by default: that of the PyTorch code it ports
  (docs/models.md, models/common.py).

  Args:
    name: a name in `names()`.

  Returns:
    One of `INITS` ('torch', 'kaiming_normal' or 'keras').

  Raises:
    ValueError: an unknown name (naming --model and the choices).
  """
  if name not in _REGISTRY:
    raise ValueError(f'--model: unknown model {name!r}; choose one of {", ".join(names())}.')
  return inspect.signature(_REGISTRY[name]).parameters['init'].default


def build(name: str, *, num_classes: int, input_shape: Sequence[int], **kwargs) -> tf.keras.Model:
  """Builds model `name` with the project's model contract (docs/DESIGN.md, "Model contract").

  Args:
    name: a name in `names()`.
    num_classes: the classifier's outputs.
    input_shape: one example's shape, [H, W, C] (preprocessed float32 images).
    **kwargs: the model's own arguments; common ones: projection_dim (None/0: no MOON head),
      decomposed, num_atoms (0/None: k*k), init ('torch' | 'kaiming_normal' | 'keras'); some
      models take more (small_cnn: width, representation_dim; alexnet_bn: hidden_dim).

  Returns:
    A `tf.keras.Model` whose call returns {'representation': [N, d] float32, 'logits':
    [N, num_classes] float32}.

  Raises:
    ValueError: an unknown name (naming --model and the choices), or an argument this model does
      not take (listing those it does).
  """
  if name not in _REGISTRY:
    raise ValueError(f'--model: unknown model {name!r}; choose one of {", ".join(names())}.')
  fn = _REGISTRY[name]
  accepted = [p for p in inspect.signature(fn).parameters
              if p not in ('num_classes', 'input_shape')]
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise ValueError(f'--model={name}: unsupported argument(s) {", ".join(unknown)}; this model '
                     f'accepts {", ".join(accepted)}.')
  return fn(num_classes=num_classes, input_shape=input_shape, **kwargs)


def _layer_variable_refs(model: tf.keras.Model, layer_type) -> set:
  refs = set()
  for layer in model.submodules:
    if isinstance(layer, layer_type):
      refs |= {v.ref() for v in layer.weights}
  return refs


def bn_variable_mask(model: tf.keras.Model) -> List[bool]:
  """Per variable of `model.weights`: does it belong to a BatchNormalization layer (gamma, beta,
  moving mean, moving variance)? FedBN keeps these local.

  Args:
    model: a built Keras model.

  Returns:
    One bool per variable of `model.weights`, in that order.
  """
  refs = _layer_variable_refs(model, tf.keras.layers.BatchNormalization)
  return [v.ref() in refs for v in model.weights]


def _decomposed_mask(model, attr) -> List[bool]:
  refs = set()
  for layer in model.submodules:
    if isinstance(layer, _decomposed.DecomposedConvBase):
      refs.add(getattr(layer, attr).ref())
  return [v.ref() in refs for v in model.weights]


def atom_variable_mask(model: tf.keras.Model) -> List[bool]:
  """Per variable of `model.weights`: is it the atoms D of a decomposed (depthwise) conv?

  Args:
    model: a built Keras model (all False without decomposed layers).

  Returns:
    One bool per variable of `model.weights`, in that order.
  """
  return _decomposed_mask(model, 'atoms')


def coefficient_variable_mask(model: tf.keras.Model) -> List[bool]:
  """Per variable of `model.weights`: is it the coefficients alpha of a decomposed (depthwise)
  conv?

  Args:
    model: a built Keras model (all False without decomposed layers).

  Returns:
    One bool per variable of `model.weights`, in that order.
  """
  return _decomposed_mask(model, 'coefficients')


def count_parameters(model: tf.keras.Model) -> int:
  """Parameters counted as PyTorch's `sum(p.numel() for p in model.parameters())`: every trainable
  variable (BN gamma and beta included), not the BN moving statistics.

  Args:
    model: a built Keras model.

  Returns:
    The number of trainable scalars.
  """
  return int(sum(int(np.prod(v.shape)) for v in model.trainable_weights))


def representation_dim(model: tf.keras.Model) -> int:
  """d, the width of the model's 'representation' output (MOON's projection when it has one).

  Args:
    model: a model `build` made (functional, with dict outputs).

  Returns:
    The last dimension of its 'representation' output.
  """
  return int(model.output['representation'].shape[-1])
