"""Dimensional-collapse analysis: representation covariance, its spectrum, and summary numbers.

The FedDecorr papers diagnose dimensional collapse by the spectrum of the covariance of a model's
representations over the test set (Shi et al., ICLR 2023; docs/reference.md §6):

  Sigma = (1/N) sum_i (z_i - mean)(z_i - mean)^T          (population covariance, 1/N)

its singular values in descending order (plotted on a log scale, top 100), the number of them above
a threshold tau (log10 tau = -2), and the local-vs-global gap

  R = (1/K) sum_{k<=K} log(lambda_k_local / lambda_k_global).

Everything here is plain NumPy (float64) on top of whatever produces the representations, so the
numbers do not depend on TF's float32 reductions. Definitions, normalisation and zero handling are
written down precisely in docs/analysis.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np
import tensorflow as tf

# bin/analyze's flag defaults, declared in the package, which imports no TensorFlow.
from tff_decorr.collapse import DEFAULT_LOG10_TAU  # pylint: disable=g-bad-import-order
from tff_decorr.collapse import DEFAULT_TOP  # pylint: disable=g-bad-import-order

# Spectra entries below this fraction of the largest value (over both spectra) are treated as
# numerically zero by `local_global_gap`: float64 eigenvalue solvers have absolute errors of about
# d * 1e-16 * lambda_max (~1e-13 relative at d = 1280), so anything below 1e-12 relative is noise.
DEFAULT_GAP_REL_FLOOR = 1e-12


def _as_float64_matrix(z: Any, name: str) -> np.ndarray:
  if isinstance(z, tf.Tensor) or hasattr(z, 'numpy'):
    z = z.numpy()
  z = np.asarray(z, dtype=np.float64)
  if z.ndim != 2:
    raise ValueError(f'{name} must be a [n, d] matrix of representations; got shape {z.shape}. '
                     'Flatten or pool the representation to one vector per example first.')
  if not np.all(np.isfinite(z)):
    raise ValueError(f'{name} contains NaN or Inf; the model produced non-finite representations.')
  return z


class RepresentationStats:
  """Streaming accumulator of the mean and population covariance of representations.

  Memory is O(d^2) whatever the number of examples (1280 x 1280 float64 = 13 MB), so the 10k CIFAR
  test set of a MobileNetV2 is accumulated batch by batch.

  Numerics: we accumulate in float64 the sum and the sum of outer products of the *shifted* vectors
  z - c, where c is the mean of the first batch. Covariance is shift-invariant, so
  Sigma = S2/N - m m^T with S2 = sum (z-c)(z-c)^T and m = sum (z-c) / N is exact algebraically; the
  shift keeps the subtraction from cancelling catastrophically when the mean is large compared with
  the spread (post-ReLU features have a large positive mean), which the unshifted
  "E[zz^T] - E[z]E[z]^T" formula suffers from.
  """

  def __init__(self, dim: Optional[int] = None):
    if dim is not None and (not isinstance(dim, (int, np.integer)) or dim <= 0):
      raise ValueError(f'dim must be a positive integer or None (inferred); got {dim!r}.')
    self._dim = None if dim is None else int(dim)
    self._count = 0
    self._shift = None
    self._sum = None
    self._sum_outer = None

  @property
  def dim(self) -> Optional[int]:
    """d, the representation width (None until the first batch when not given)."""
    return self._dim

  @property
  def count(self) -> int:
    """The number of examples added so far."""
    return self._count

  def add(self, z: Any) -> 'RepresentationStats':
    """Adds a batch of representations.

    Args:
      z: [n, d] (NumPy array or TF tensor, any float dtype); n = 0 adds nothing.

    Returns:
      self, so that calls chain (`RepresentationStats().add(z).covariance()`).

    Raises:
      ValueError: z is not a finite [n, d] matrix, or its d differs from earlier batches'.
    """
    z = _as_float64_matrix(z, 'z')
    n, d = z.shape
    if self._dim is None:
      self._dim = d
    elif d != self._dim:
      raise ValueError(f'z has dimension {d} but earlier batches had {self._dim}; every batch must '
                       'come from the same model.')
    if n == 0:
      return self
    if self._shift is None:
      self._shift = z.mean(axis=0)
      self._sum = np.zeros(d, np.float64)
      self._sum_outer = np.zeros((d, d), np.float64)
    centred = z - self._shift
    self._sum += centred.sum(axis=0)
    self._sum_outer += centred.T @ centred
    self._count += n
    return self

  def _require_data(self):
    if self._count == 0:
      raise ValueError('No representations were added; add at least one non-empty batch first.')

  def mean(self) -> np.ndarray:
    """The mean representation.

    Returns:
      float64 [d].

    Raises:
      ValueError: nothing was added yet.
    """
    self._require_data()
    return self._shift + self._sum / self._count

  def covariance(self) -> np.ndarray:
    """Population covariance (1/N) sum (z_i - mean)(z_i - mean)^T.

    Returns:
      float64 [d, d], symmetric.

    Raises:
      ValueError: nothing was added yet.
    """
    self._require_data()
    m = self._sum / self._count
    cov = self._sum_outer / self._count - np.outer(m, m)
    return 0.5 * (cov + cov.T)


def _images_of(element: Any) -> Any:
  """The images of one dataset element: `images`, `(images, labels)` or a dict with 'images'."""
  if isinstance(element, dict):
    for key in ('images', 'image'):
      if key in element:
        return element[key]
    raise ValueError(f'dataset elements are dicts without an "images" key (keys: {sorted(element)}); '
                     'yield (images, labels) or {"images": ...}.')
  if isinstance(element, (tuple, list)):
    if not element:
      raise ValueError('dataset elements are empty tuples; yield (images, labels).')
    return element[0]
  return element


# What the functions taking a model and a dataset expect, said in their TypeErrors.
_TAKES = ('takes (model_or_fn, dataset): a Keras model (or SavedModel, or callable) whose outputs '
          "are a dict with a 'representation' entry, and a batched tf.data.Dataset of (images, "
          'labels)')


def _is_array(value: Any) -> bool:
  return isinstance(value, (np.ndarray, tf.Tensor, tf.Variable, np.generic))


def _check_model_and_data(fn_name: str, model_or_fn: Any, **datasets: Any) -> None:
  """TypeError naming the expected input when a model or dataset argument is an array."""
  if _is_array(model_or_fn):
    raise TypeError(f'{fn_name} {_TAKES}; got a {type(model_or_fn).__name__} of shape '
                    f'{tuple(model_or_fn.shape)} as model_or_fn. For representations already '
                    'computed ([n, d]), use RepresentationStats().add(features).covariance().')
  for name, dataset in datasets.items():
    if dataset is None:
      raise TypeError(f'{fn_name} {_TAKES}; {name} is missing.')
    if _is_array(dataset):
      raise TypeError(f'{fn_name} {_TAKES}; got a {type(dataset).__name__} of shape '
                      f'{tuple(dataset.shape)} as {name}: batch it, e.g. '
                      'tf.data.Dataset.from_tensor_slices((images, labels)).batch(256).')


def as_representation_fn(model_or_fn: Any) -> Callable[[tf.Tensor], Any]:
  """Turns a Keras model, a loaded SavedModel, a signature function or a callable into images -> out.

  - `tf.keras.Model`: called with `training=False` (BatchNorm uses its moving statistics).
  - an object loaded by `tf.saved_model.load` with a 'serving_default' signature: that signature
    (the export contract), even if the object is also callable.
  - a signature `ConcreteFunction` (e.g. `loaded.signatures['serving_default']`): signature functions
    accept keyword arguments only, so it is called with its single input name (`images=...`).
  - any other callable: called positionally with the images.

  Args:
    model_or_fn: one of the above.

  Returns:
    A function of a batch of images returning the model's outputs.

  Raises:
    TypeError: `model_or_fn` is an array or tensor, or not callable.
    ValueError: a SavedModel without a 'serving_default' signature, or a signature with more than
      one input.
  """
  if _is_array(model_or_fn):
    raise TypeError(f'model_or_fn must be a Keras model, SavedModel or callable; got a '
                    f'{type(model_or_fn).__name__} of shape {tuple(model_or_fn.shape)}.')
  if isinstance(model_or_fn, tf.keras.Model):
    return lambda images: model_or_fn(images, training=False)
  signatures = getattr(model_or_fn, 'signatures', None)
  if signatures is not None:
    if 'serving_default' in signatures:
      model_or_fn = signatures['serving_default']
    elif not callable(model_or_fn):
      raise ValueError('model_or_fn is a SavedModel without a "serving_default" signature '
                       f'(signatures: {sorted(signatures)}); export one taking images=.')
  input_signature = getattr(model_or_fn, 'structured_input_signature', None)
  if input_signature is not None:
    args, kwargs = input_signature
    if not args and kwargs:
      if len(kwargs) != 1:
        raise ValueError('model_or_fn is a signature function with inputs '
                         f'{sorted(kwargs)}; expected exactly one input (images).')
      (name, spec), = kwargs.items()
      dtype = spec.dtype
      return lambda images: model_or_fn(**{name: tf.cast(images, dtype)})
  if not callable(model_or_fn):
    raise TypeError(f'model_or_fn must be a Keras model, SavedModel or callable; got '
                    f'{type(model_or_fn).__name__}.')
  return model_or_fn


def representation_stats(model_or_fn: Any, dataset: Iterable = None,
                         max_examples: Optional[int] = None) -> RepresentationStats:
  """Streams `dataset` through the model and accumulates its 'representation' outputs.

  Args:
    model_or_fn: a Keras model, a loaded SavedModel, a signature function or a callable
      (`as_representation_fn`); its output must be a dict with key 'representation' ([n, d] per
      batch), as the model and export contracts of docs/DESIGN.md say.
    dataset: a batched tf.data.Dataset (or any iterable of batches) of `(images, labels)`, images,
      or dicts with 'images'.
    max_examples: stop after this many examples (the last batch is truncated), None for all.

  Returns:
    The RepresentationStats of every representation seen (mean, covariance, count).

  Raises:
    TypeError: `model_or_fn` or `dataset` is an array or tensor (or `dataset` is missing); the
      message says what the function takes.
    ValueError: the model's output has no 'representation', a representation is not [n, d] or not
      finite, `dataset` yields nothing, or `max_examples` is not positive.
  """
  _check_model_and_data('representation_stats', model_or_fn, dataset=dataset)
  if max_examples is not None and max_examples <= 0:
    raise ValueError(f'max_examples must be positive or None; got {max_examples}.')
  fn = as_representation_fn(model_or_fn)
  stats = RepresentationStats()
  for element in dataset:
    images = _images_of(element)
    if max_examples is not None:
      remaining = max_examples - stats.count
      if remaining <= 0:
        break
      images = images[:remaining]
    outputs = fn(images)
    if not isinstance(outputs, dict) or 'representation' not in outputs:
      kind = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
      raise ValueError(f'the model must return a dict with key "representation"; got {kind}.')
    stats.add(outputs['representation'])
  if stats.count == 0:
    raise ValueError('dataset yielded no examples; nothing to analyse.')
  return stats


def representation_covariance(model_or_fn: Any, dataset: Iterable = None,
                              max_examples: Optional[int] = None) -> np.ndarray:
  """Population covariance (1/N) of the model's representations over `dataset`.

  Args:
    model_or_fn: a Keras model, a loaded SavedModel, a signature function or a callable whose
      outputs are a dict with a 'representation' entry, [n, d] per batch (the model contract of
      docs/DESIGN.md).
    dataset: a batched tf.data.Dataset (or any iterable of batches) of `(images, labels)`, images,
      or dicts with 'images'.
    max_examples: stop after this many examples, None for all.

  Returns:
    The covariance, a float64 NumPy array [d, d], symmetric positive semi-definite.

  Raises:
    TypeError: `model_or_fn` or `dataset` is an array or tensor (e.g. representations already
      computed: use `RepresentationStats().add(features).covariance()`), or `dataset` is missing.
    ValueError: as `representation_stats`.
  """
  _check_model_and_data('representation_covariance', model_or_fn, dataset=dataset)
  return representation_stats(model_or_fn, dataset, max_examples).covariance()


def singular_values(cov: Any) -> np.ndarray:
  """Singular values of a covariance matrix, descending, float64.

  A covariance is symmetric positive semi-definite, so its singular values are its eigenvalues. We
  use `np.linalg.eigvalsh` (a symmetric solver: cheaper than an SVD, and it never mixes in the
  left/right singular vectors). Round-off can make eigenvalues that are truly 0 come out
  as tiny negatives (|x| ~ 1e-16 * lambda_max); they are clipped to 0, which is what an SVD would
  report (singular values are >= 0). The matrix is symmetrised first, (C + C^T) / 2.

  Args:
    cov: a covariance matrix [d, d] (NumPy array or tensor), e.g. `representation_covariance`'s.

  Returns:
    The d singular values, float64, descending, >= 0.

  Raises:
    ValueError: `cov` is not square 2-D, or holds NaN or Inf.
  """
  cov = np.asarray(cov.numpy() if hasattr(cov, 'numpy') else cov, dtype=np.float64)
  if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
    raise ValueError(f'cov must be a square [d, d] covariance matrix; got shape {cov.shape}.')
  if not np.all(np.isfinite(cov)):
    raise ValueError('cov contains NaN or Inf.')
  eig = np.linalg.eigvalsh(0.5 * (cov + cov.T))
  return np.clip(eig, 0.0, None)[::-1].copy()


def as_spectrum(sv: Any, name: str) -> np.ndarray:
  """`sv` checked and converted to a spectrum.

  Args:
    sv: singular values (a sequence, array or tensor).
    name: what the caller calls it, for the error message.

  Returns:
    A float64 1-D NumPy array.

  Raises:
    ValueError: naming `name`: not a non-empty 1-D array, or a value negative or not finite.
  """
  sv = np.asarray(sv, dtype=np.float64)
  if sv.ndim != 1 or sv.size == 0:
    raise ValueError(f'{name} must be a non-empty 1-D array of singular values; got shape {sv.shape}.')
  if not np.all(np.isfinite(sv)) or np.any(sv < 0):
    raise ValueError(f'{name} must be finite and non-negative (use singular_values(cov)).')
  return sv


def num_significant(sv: Any, log10_tau: float = DEFAULT_LOG10_TAU, normalize: bool = True) -> int:
  """Number of singular values strictly above tau = 10**log10_tau.

  normalize=True (default): values are first divided by the largest one, so the count is
    #{k : lambda_k / lambda_1 > tau}. This makes it invariant to the overall scale of the
    representation (a model whose features are simply 10x smaller is not "more collapsed").
  normalize=False: the papers' raw reading of the log-scale plot, #{k : lambda_k > tau}, which
    depends on the representation's scale; use it to compare with the papers' figures.
  An all-zero spectrum has 0 significant values either way.

  Args:
    sv: singular values, non-negative and finite (`singular_values`'s).
    log10_tau: log10 of the threshold tau.
    normalize: compare lambda_k / lambda_1 (True) or lambda_k itself (False) with tau.

  Returns:
    The count, 0 to len(sv).

  Raises:
    ValueError: `sv` is not a valid spectrum, or `log10_tau` is not finite.
  """
  sv = as_spectrum(sv, 'sv')
  if not math.isfinite(log10_tau):
    raise ValueError(f'log10_tau must be finite; got {log10_tau}.')
  tau = 10.0 ** log10_tau
  largest = sv.max()
  if largest == 0.0:
    return 0
  values = sv / largest if normalize else sv
  return int(np.count_nonzero(values > tau))


def effective_rank(sv: Any) -> float:
  """Effective rank (Roy & Vetterli, 2007): exp(H(p)), p_k = sigma_k / sum(sigma), H = Shannon entropy.

  Zeros contribute 0 to the entropy (0 log 0 = 0). A spectrum of r equal non-zero values has
  effective rank r; an all-zero spectrum (a constant representation) gets 0.

  Args:
    sv: singular values, 1-D, finite, non-negative (any order).

  Returns:
    The effective rank, a float in [0, len(sv)] (1 <= it when any value is non-zero).

  Raises:
    ValueError: `sv` is empty, not 1-D, or has a negative or non-finite value.
  """
  sv = as_spectrum(sv, 'sv')
  total = sv.sum()
  if total == 0.0:
    return 0.0
  p = sv[sv > 0] / total
  return float(np.exp(-np.sum(p * np.log(p))))


def local_global_gap(sv_local: Any, sv_global: Any, k: Optional[int] = None,
                     rel_floor: float = DEFAULT_GAP_REL_FLOOR, normalize: bool = False) -> float:
  """R = (1/K) sum_{k=1..K} log(lambda_k_local / lambda_k_global), natural log, top K of each.

  Both spectra are sorted descending first. K defaults to the length of the shorter spectrum.
  R > 0 means the local model's spectrum lies above the global one (the global model is the more
  collapsed); identical spectra give exactly 0.

  Zeros: every value is floored at eps = rel_floor * max(lambda_1_local, lambda_1_global) before the
  log, so a pair of numerically-zero values contributes log(eps/eps) = 0 and a zero against a
  non-zero value contributes a large but finite term. If both spectra are all zero, R = 0.
  normalize=True divides each spectrum by its own largest value first (R then compares shapes only,
  not the overall scale); the papers' R is normalize=False.

  Args:
    sv_local: the local model's singular values (1-D, finite, non-negative).
    sv_global: the global model's singular values (same requirements).
    k: how many of the largest values to compare, in [1, the shorter length]; None for all.
    rel_floor: the zero floor relative to the largest value, in (0, 1).
    normalize: divide each spectrum by its largest value first.

  Returns:
    R, a float (natural log; 0 for identical spectra).

  Raises:
    ValueError: a spectrum that is empty, not 1-D, negative or non-finite; k or rel_floor out of
      range.
  """
  local = np.sort(as_spectrum(sv_local, 'sv_local'))[::-1]
  glob = np.sort(as_spectrum(sv_global, 'sv_global'))[::-1]
  if not (0.0 < rel_floor < 1.0):
    raise ValueError(f'rel_floor must be in (0, 1); got {rel_floor}.')
  limit = min(local.size, glob.size)
  if k is None:
    k = limit
  if not isinstance(k, (int, np.integer)) or not 1 <= k <= limit:
    raise ValueError(f'k must be an integer in [1, {limit}] (the shorter spectrum) or None; got {k!r}.')
  if normalize:
    local = local / local[0] if local[0] > 0 else local
    glob = glob / glob[0] if glob[0] > 0 else glob
  scale = max(local[0], glob[0])
  if scale == 0.0:
    return 0.0
  eps = rel_floor * scale
  local = np.maximum(local[:k], eps)
  glob = np.maximum(glob[:k], eps)
  return float(np.mean(np.log(local) - np.log(glob)))


def spectrum_summary(sv: Any, log10_tau: float = DEFAULT_LOG10_TAU,
                     top: int = DEFAULT_TOP) -> dict[str, Any]:
  """JSON-serialisable summary of one spectrum (plain Python floats and ints only).

  Args:
    sv: singular values, 1-D, finite, non-negative (any order).
    log10_tau: the threshold of the significant-value counts, log10.
    top: how many of the largest values to list, >= 1.

  Returns:
    A dict: dim, trace, largest, smallest, effective_rank, log10_tau,
    num_significant_normalized (values / largest above tau), num_significant_absolute, num_nonzero,
    top (the largest `top` values) and top_log10 (None for a zero).

  Raises:
    ValueError: `sv` is empty, not 1-D, negative or non-finite, or top < 1.
  """
  sv = np.sort(as_spectrum(sv, 'sv'))[::-1]
  if not isinstance(top, (int, np.integer)) or top < 1:
    raise ValueError(f'top must be a positive integer; got {top!r}.')
  largest = float(sv[0])
  head = sv[:top]
  return {
      'dim': int(sv.size),
      'trace': float(sv.sum()),
      'largest': largest,
      'smallest': float(sv[-1]),
      'effective_rank': effective_rank(sv),
      'log10_tau': float(log10_tau),
      'num_significant_normalized': num_significant(sv, log10_tau, normalize=True),
      'num_significant_absolute': num_significant(sv, log10_tau, normalize=False),
      'num_nonzero': int(np.count_nonzero(sv > 0)),
      'top': [float(x) for x in head],
      'top_log10': [float(np.log10(x)) if x > 0 else None for x in head],
  }


def _outputs_of(fn: Callable[[tf.Tensor], Any], images: Any, need_logits: bool) -> dict:
  outputs = fn(images)
  keys = ('representation', 'logits') if need_logits else ('representation',)
  if not isinstance(outputs, dict) or not all(k in outputs for k in keys):
    kind = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
    raise ValueError(f'the model must return a dict with keys {list(keys)}; got {kind}.')
  return outputs


def _labels_of(element: Any) -> np.ndarray:
  if isinstance(element, dict) and 'label' in element:
    labels = element['label']
  elif isinstance(element, (tuple, list)) and len(element) >= 2:
    labels = element[1]
  else:
    raise ValueError('the probe needs labelled data: yield (images, labels) or a dict with '
                     '"images" and "label".')
  return np.asarray(labels.numpy() if hasattr(labels, 'numpy') else labels).astype(np.int64)


def nearest_class_mean_probe(model_or_fn: Any, train_dataset: Iterable, test_dataset: Iterable,
                             num_classes: int, max_examples: Optional[int] = None) -> dict[str, Any]:
  """What the representation knows apart from the classifier head, on the test split.

  The nearest-class-mean probe: the mean representation of each class over `train_dataset`; each
  test example is given the class whose mean is nearest (Euclidean). No parameter is fitted, so
  the probe cannot learn what the representation does not hold. Beside it, on the same test
  examples, the model's own head (argmax of its logits) and how the head's predictions spread over
  the classes: a global model that puts one class on most of the test set (a biased head) can have
  a representation that separates the classes, and only the two numbers together tell which is
  which. Classes without a train example have no mean and are never predicted by the probe.

  Args:
    model_or_fn: as `representation_covariance`'s, its outputs also holding 'logits'.
    train_dataset: batches of (images, labels) the class means are taken over.
    test_dataset: batches of (images, labels) the probe and the head are scored on.
    num_classes: the task's classes (labels lie in [0, num_classes)).
    max_examples: caps each split (quick looks); None for all.

  Returns:
    A dict of plain Python numbers: nearest_class_mean_accuracy, head_accuracy,
    head_predictions_per_class (counts), largest_predicted_class_share, train_examples,
    test_examples, classes_without_train_examples.

  Raises:
    TypeError: a model or dataset argument is an array or tensor, or missing.
    ValueError: num_classes < 2, max_examples not positive, a label outside [0, num_classes),
      or a split that yields no example.
  """
  _check_model_and_data('nearest_class_mean_probe', model_or_fn, train_dataset=train_dataset,
                        test_dataset=test_dataset)
  if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
    raise ValueError(f'num_classes must be an integer >= 2; got {num_classes!r}.')
  if max_examples is not None and max_examples <= 0:
    raise ValueError(f'max_examples must be positive or None; got {max_examples}.')
  fn = as_representation_fn(model_or_fn)

  def batches(dataset, need_logits):
    seen = 0
    for element in dataset:
      images, labels = _images_of(element), _labels_of(element)
      if max_examples is not None:
        if seen >= max_examples:
          return
        images, labels = images[:max_examples - seen], labels[:max_examples - seen]
      seen += len(labels)
      if np.any((labels < 0) | (labels >= num_classes)):
        raise ValueError(f'labels outside [0, {num_classes}); is num_classes the task\'s?')
      yield _outputs_of(fn, images, need_logits), labels

  sums, counts = None, np.zeros(num_classes, np.int64)
  for outputs, labels in batches(train_dataset, need_logits=False):
    z = _as_float64_matrix(outputs['representation'], 'representation')
    if sums is None:
      sums = np.zeros((num_classes, z.shape[1]), np.float64)
    np.add.at(sums, labels, z)
    counts += np.bincount(labels, minlength=num_classes)
  if sums is None or counts.sum() == 0:
    raise ValueError('train_dataset yielded no examples; the probe needs class means.')
  present = counts > 0
  means = sums[present] / counts[present, None]
  classes = np.flatnonzero(present)
  # ||z - m||^2 = ||z||^2 - 2 z.m + ||m||^2; ||z||^2 is the same for every class of a row.
  mean_sq = np.sum(means * means, axis=1)

  probe_hits = head_hits = total = 0
  predicted = np.zeros(num_classes, np.int64)
  for outputs, labels in batches(test_dataset, need_logits=True):
    z = _as_float64_matrix(outputs['representation'], 'representation')
    nearest = classes[np.argmin(mean_sq[None, :] - 2.0 * z @ means.T, axis=1)]
    logits = np.asarray(outputs['logits'].numpy() if hasattr(outputs['logits'], 'numpy')
                        else outputs['logits'])
    head = np.argmax(logits, axis=1)
    probe_hits += int(np.sum(nearest == labels))
    head_hits += int(np.sum(head == labels))
    predicted += np.bincount(head, minlength=num_classes)
    total += len(labels)
  if total == 0:
    raise ValueError('test_dataset yielded no examples; nothing to probe.')
  return {
      'nearest_class_mean_accuracy': probe_hits / total,
      'head_accuracy': head_hits / total,
      'head_predictions_per_class': [int(c) for c in predicted],
      'largest_predicted_class_share': float(predicted.max() / total),
      'train_examples': int(counts.sum()),
      'test_examples': int(total),
      'classes_without_train_examples': [int(c) for c in np.flatnonzero(~present)],
  }
