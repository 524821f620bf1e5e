"""The one local-training loop shared by every algorithm, and its configuration.

Every federated algorithm in this package trains a client the same way: start from weights given by
the algorithm, make one pass of SGD over the client's dataset, return the new weights. The dataset
holds all local epochs (tasks/client_data.py: each epoch in its own stateless order), so a round's
local training is one pass over it and its order is the same in both runtimes.
The algorithms differ only through `LocalHooks` (an extra loss term, a gradient correction, a logit
adjustment, sharpness-aware steps), so the optimiser, the loss and the metrics exist once.

Model state is an explicit flat list of tensors in `model.weights` order. It holds trainable
variables AND non-trainable ones (BatchNorm moving mean/variance): the reference averages the whole
`state_dict`, BN statistics included, and a global model whose statistics stay at their initial
values evaluates badly (docs/reference.md §5, §8).

SGD is written by hand because it must equal PyTorch's `SGD(lr, momentum, weight_decay)` that the
reference uses: coupled L2 (`g += wd * w`, on every trainable variable, BN gamma/beta included),
`buf = momentum * buf + g`, `w -= lr * buf`. TFF's `sgdm` has no weight decay, and Keras' weight
decay is decoupled (applied to the weights, not folded into the momentum buffer): neither
matches.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, ClassVar, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from tff_decorr import _moved
from tff_decorr import data_options
from tff_decorr import hparams
from tff_decorr.algorithms.workspace import Workspace

# (representation, logits) -> scalar, already multiplied by its coefficient (what
# regularizers.Regularizer objects are; any such callable works).
RegularizerFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
# (model outputs dict, images, labels) -> scalar added to the loss inside the gradient tape.
ExtraLoss = Callable[[dict, tf.Tensor, tf.Tensor], tf.Tensor]
# list of gradients (one per trainable variable, None allowed) -> corrected list.
GradCorrection = Callable[[List[Optional[tf.Tensor]]], List[Optional[tf.Tensor]]]
# logits -> the logits the cross-entropy is computed from (FedLC's calibration, FedRS's scaling).
LogitAdjustment = Callable[[tf.Tensor], tf.Tensor]

METRIC_NAMES = ('loss_sum', 'ce_sum', 'reg_sum', 'extra_sum', 'correct', 'examples', 'steps')


@dataclasses.dataclass(frozen=True)
class SGDHParams(hparams.HParams):
  """The client optimiser: the reference's per-client SGD (coupled L2, PyTorch-style momentum).

  A component every run has, declared like every component's settings (tff_decorr.hparams): one
  place for defaults, help and validation. A run's Config holds it in `hparams['sgd']`
  (`Config.client_optimizer`); its flags and errors keep the names they had as generic settings,
  `--client_lr`, `--momentum` and `--weight_decay`.

  Args:
    lr: the learning rate, > 0 (`--client_lr`).
    momentum: PyTorch-form momentum, in [0, 1) (`--momentum`).
    weight_decay: coupled L2 decay, >= 0 (`--weight_decay`).

  Raises:
    ValueError: a value out of range or not a finite number (the message names the flag).
  """
  component: ClassVar[str] = 'sgd'
  flag_prefix: ClassVar[str] = ''  # --client_lr (the field's `flag`), --momentum, --weight_decay

  lr: float = hparams.field(0.01, 'Client SGD learning rate.', minimum=0.0, min_exclusive=True,
                            flag='client_lr')
  momentum: float = hparams.field(0.9, 'Client SGD momentum (PyTorch form: buf = m buf + g).',
                                  minimum=0.0, maximum=1.0, max_exclusive=True)
  weight_decay: float = hparams.field(1e-5, 'Client L2 weight decay, PyTorch-style (coupled: '
                                      'g += wd w).', minimum=0.0)


def optimizer_argument(optimizer: SGDHParams, keywords: dict, where: str) -> SGDHParams:
  """`optimizer`, or the settings given as `config=`, the keyword's name before 0.4.0 (taken out of
  `keywords`, a builder's **keywords, with a DeprecationWarning).

  Args:
    optimizer: the builder's `optimizer` argument.
    keywords: the builder's other keywords; `config` is taken out of them.
    where: the builder's name, for the messages.

  Returns:
    The client optimiser's settings to build with.

  Raises:
    ValueError: both `config` and an `optimizer` other than the default were given.
  """
  if 'config' not in keywords:
    return optimizer
  warnings.warn(f'{where}(config=...) is deprecated and will be removed in 0.4.0; the client '
                'optimiser\'s settings are the keyword optimizer=.', DeprecationWarning,
                stacklevel=3)
  config = keywords.pop('config')
  if optimizer != SGDHParams():
    raise ValueError(f'{where}: give optimizer= or its old name config=, not both.')
  return config


# ClientConfig, SGDHParams' name before 0.4.0.
__getattr__ = _moved.renamed(__name__, {'ClientConfig': 'SGDHParams'}, globals())


def effective_steps(num_steps: tf.Tensor, momentum: float, dtype=tf.float32) -> tf.Tensor:
  """How far `num_steps` steps of this loop's momentum SGD move under a constant gradient g, in
  units of lr * g: sum_{t=1..K} sum_{s<=t} rho^(t-s) = (K - rho (1 - rho^K) / (1 - rho)) / (1 - rho)
  (buffers start at zero; = K when rho = 0). FedNova normalises by it, SCAFFOLD estimates its
  control variates with it (Wang et al. 2020, eq. 5 with momentum). In `dtype`: the weights' own
  float type (in float32 the subtraction loses ~3e-7 relative, which float64 tests would see)."""
  k = tf.cast(num_steps, dtype)
  if momentum == 0:
    return k
  rho = tf.constant(float(momentum), dtype)
  return (k - rho * (1.0 - tf.pow(rho, k)) / (1.0 - rho)) / (1.0 - rho)


class LocalResult(NamedTuple):
  weights: list  # new flat weights, model.weights order
  num_examples: tf.Tensor  # float32: examples trained on (all local epochs of the dataset)
  num_steps: tf.Tensor  # int32: local SGD steps over all epochs
  metrics: dict  # sums over all local steps, see METRIC_NAMES


@dataclasses.dataclass(frozen=True)
class LocalHooks:
  """How an algorithm's local training differs from the reference client's (defaults: not at all).

  Args:
    extra_loss: (model outputs, images, labels) -> scalar added to the loss inside the gradient
      tape (FedProx's proximal term, MOON's contrastive term).
    grad_correction: the gradients (one per trainable variable, None allowed) -> corrected ones,
      before the SGD step (SCAFFOLD's control variates).
    logit_adjustment: logits -> the logits the cross-entropy is taken of (FedLC, FedRS); the
      regulariser, the extra loss and the accuracy see the model's own logits.
    sam_rho: > 0 for sharpness-aware steps (FedSAM, the SAM optimiser the reference uses): the
      gradient g at w, e = sam_rho * g / (||g|| + 1e-12) over all trainable variables, and the
      SGD step from w with the gradient at w + e (weight decay at w).
  """
  extra_loss: Optional[ExtraLoss] = None
  grad_correction: Optional[GradCorrection] = None
  logit_adjustment: Optional[LogitAdjustment] = None
  sam_rho: float = 0.0


class _Pass(NamedTuple):
  """One forward and backward pass on a batch: the gradients and what the metrics need."""
  grads: list  # one per trainable variable, None where the loss does not depend on it
  logits: tf.Tensor  # the model's own (not adjusted)
  loss: tf.Tensor  # ce + reg + extra, in the model's float type
  ce: tf.Tensor
  reg: tf.Tensor
  extra: tf.Tensor


def local_train(ws: Workspace, start_weights: Sequence[tf.Tensor], dataset: tf.data.Dataset,
                optimizer: SGDHParams, regularizer: Optional[RegularizerFn] = None,
                hooks: Optional[LocalHooks] = None) -> LocalResult:
  """Local SGD exactly as the reference's client (call inside a tf.function).

  Loss per batch = mean cross-entropy + regularizer(representation, logits) + hooks.extra_loss.
  The model runs with training=True, so BN moving statistics update as in PyTorch's train mode
  (with SAM, again in the second pass). Momentum buffers are zeroed first: the reference builds a
  fresh optimizer every round.

  Args:
    ws: the workspace (model and momentum buffers) to train in.
    start_weights: the flat weights to start from, `ws.weights` order.
    dataset: (images, labels) batches of every local epoch, in order.
    optimizer: the client optimiser's settings.
    regularizer: (representation, logits) -> scalar added to the loss, or None.
    hooks: the algorithm's changes to the step (None: the reference's plain step).

  Returns:
    The LocalResult: new weights, examples and steps, and the metrics (summed over steps, of the
    pass at w).
  """
  Workspace.assign(ws.weights, start_weights)
  for b in ws.momentum:
    b.assign(tf.zeros_like(b))
  train_step = _train_step_fn(ws, optimizer, regularizer, hooks or LocalHooks())
  zero = tf.constant(0.0, tf.float32)
  loss_sum, ce_sum, reg_sum, extra_sum, correct, examples = zero, zero, zero, zero, zero, zero
  steps = tf.constant(0, tf.int32)
  # `iter()`: AutoGraph makes `for x in dataset` a dataset reduce, which re-instantiates the step
  # on every call with less intra-op parallelism (docs/benchmarks.md §1); an iterator becomes a
  # while loop in this function's own graph, under both runtimes.
  for images, labels in iter(data_options.without_autotune(dataset)):
    d_loss, d_ce, d_reg, d_extra, d_correct, bs = train_step(images, labels)
    loss_sum += d_loss
    ce_sum += d_ce
    reg_sum += d_reg
    extra_sum += d_extra
    correct += d_correct
    examples += bs
    steps += 1
  metrics = dict(loss_sum=loss_sum, ce_sum=ce_sum, reg_sum=reg_sum, extra_sum=extra_sum,
                 correct=correct, examples=examples, steps=tf.cast(steps, tf.float32))
  return LocalResult([tf.identity(v) for v in ws.weights], examples, steps, metrics)


def _train_step_fn(ws: Workspace, optimizer: SGDHParams, regularizer: Optional[RegularizerFn],
                   hooks: LocalHooks):
  """One SGD step on a batch, (images, labels) -> its metric increments (loss, ce, reg, extra,
  correct, examples; float32).

  A function of its own that is never inlined: grappler may turn the gradient sums of a large
  model into TemporaryVariable accumulators, which inside the caller's while loop outlive the call
  (the next call fails with AlreadyExistsError); in a called function they do not.
  """
  sam = float(hooks.sam_rho)

  @tf.function(autograph=False, experimental_attributes={'_noinline': True})
  def train_step(images, labels):
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    at_w = _forward_backward(ws, images, labels, regularizer, hooks)
    grads = at_w.grads
    if sam > 0:
      grads = _sam_gradients(
          ws, grads, sam, lambda: _forward_backward(ws, images, labels, regularizer, hooks).grads)
    if hooks.grad_correction is not None:
      grads = hooks.grad_correction(grads)
    _sgd_step(ws, grads, optimizer)
    return _step_metrics(at_w, labels)

  return train_step


def _forward_backward(ws: Workspace, images, labels, regularizer: Optional[RegularizerFn],
                      hooks: LocalHooks) -> _Pass:
  """The loss of a batch at the current weights and its gradients."""
  with tf.GradientTape() as tape:
    outputs = ws.model(images, training=True)
    logits = outputs['logits']
    adjust = hooks.logit_adjustment
    ce_logits = adjust(logits) if adjust is not None else logits
    ce = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, ce_logits, from_logits=True))
    # The loss is computed in the model's float type (float32, or float64 in the reference
    # equivalence test); metrics are summed in float32.
    dtype = ce.dtype
    reg = (tf.cast(regularizer(outputs['representation'], logits), dtype)
           if regularizer is not None else tf.zeros([], dtype))
    extra = (tf.cast(hooks.extra_loss(outputs, images, labels), dtype)
             if hooks.extra_loss is not None else tf.zeros([], dtype))
    loss = ce + reg + extra
  return _Pass(tape.gradient(loss, ws.trainable), logits, loss, ce, reg, extra)


def _sam_gradients(ws: Workspace, grads: list, rho: float, gradients_at_w: Callable[[], list]):
  """SAM's gradient: the weights that have a gradient g move to w + rho g / (||g|| + 1e-12), the
  gradient is taken there (`gradients_at_w()` at the moved weights), and the start values are
  restored exactly (not by subtracting the step again)."""
  used = [(v, g) for v, g in zip(ws.trainable, grads) if g is not None]
  norm = tf.linalg.global_norm([tf.convert_to_tensor(g) for _, g in used])
  start = [tf.identity(v) for v, _ in used]
  with tf.control_dependencies(start):
    for v, g in used:
      v.assign_add(tf.cast(rho / (norm + 1e-12), v.dtype) * tf.convert_to_tensor(g))
  grads = gradients_at_w()
  with tf.control_dependencies([tf.convert_to_tensor(g) for g in grads if g is not None]):
    for (v, _), w in zip(used, start):
      v.assign(w)
  return grads


def _sgd_step(ws: Workspace, grads: list, optimizer: SGDHParams) -> None:
  """PyTorch's SGD step: g += wd w; buf = momentum buf + g; w -= lr buf."""
  # Python floats, made into constants of each variable's own type (a float32 0.01 cast to
  # float64 would differ from 0.01 by 2e-8, which the float64 equivalence test would see).
  lr, mom, wd = (float(optimizer.lr), float(optimizer.momentum),
                 float(optimizer.weight_decay))
  for v, g, buf in zip(ws.trainable, grads, ws.momentum):
    if g is None:  # Unused variable: PyTorch skips parameters whose .grad is None.
      continue
    g = tf.convert_to_tensor(g) + tf.constant(wd, v.dtype) * v
    buf.assign(tf.constant(mom, v.dtype) * buf + g)
    v.assign_sub(tf.constant(lr, v.dtype) * buf)


def _step_metrics(at_w: _Pass, labels: tf.Tensor) -> tuple:
  """A step's metric increments (float32): loss, ce, reg and extra times the batch size, the
  correct predictions and the batch size."""
  bs = tf.cast(tf.shape(labels)[0], tf.float32)
  preds = tf.cast(tf.argmax(at_w.logits, axis=-1), tf.int32)
  correct = tf.reduce_sum(tf.cast(tf.equal(preds, labels), tf.float32))
  f32 = lambda t: tf.cast(t, tf.float32) * bs
  return f32(at_w.loss), f32(at_w.ce), f32(at_w.reg), f32(at_w.extra), correct, bs
