"""Representation regularisers: FedDecorr, FedUV, DeCov, Structured-DeCov; and the registry the training code uses.

Every loss here is a pure TensorFlow function of one batch. They are written so that one trace
serves every batch size (the batch dimension may be unknown, `None`, and the last batch of an epoch
is smaller): the batch size is read with `tf.shape`, degenerate batches (N == 1, constant columns)
are handled with `tf.where` / safe division instead of Python branches, and nothing produces a
data-dependent shape, so every function also compiles under `tf.function(jit_compile=True)`.
Gradients are finite for N == 1 and for constant columns.

The training loop never branches on a regulariser's name: it calls `get(name, ...)` once and then
`regularizer(representation, logits)`, which already includes the coefficient(s). Each regulariser
declares its hyper-parameters once (a frozen dataclass, tff_decorr.hparams) and is added with one
`register(...)` line (docs/DESIGN.md, "Adding a regulariser").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Dict, Tuple

import tensorflow as tf

from tff_decorr import hparams

# The FedDecorr reference adds this inside the square root of the variance (docs/reference.md §1).
FEDDECORR_EPS = 1e-8


def _as_float(x: tf.Tensor) -> tf.Tensor:
  x = tf.convert_to_tensor(x)
  if x.dtype not in (tf.float32, tf.float64):
    x = tf.cast(x, tf.float32)
  return x


def _check_rank2(x: tf.Tensor, what: str) -> None:
  if x.shape.rank is not None and x.shape.rank != 2:
    raise ValueError(f'{what} must be a [batch, features] matrix, got shape {x.shape}.')


def _standardize(z: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """Columns centred on the batch mean and divided by sqrt(unbiased var + 1e-8); also returns N.

  For N == 1 the unbiased variance is undefined; the centred column is exactly 0 there, so any
  finite divisor gives the same (zero) result: we divide the sum of squares by max(N - 1, 1).
  A constant column has var = 0 and is divided by sqrt(1e-8): finite value and gradient.
  """
  n = tf.cast(tf.shape(z)[0], z.dtype)
  zc = z - tf.reduce_mean(z, axis=0, keepdims=True)
  var = tf.reduce_sum(tf.square(zc), axis=0, keepdims=True) / tf.maximum(n - 1.0, 1.0)
  return zc * tf.math.rsqrt(var + FEDDECORR_EPS), n


def _off_diagonal_sq_sum(k: tf.Tensor) -> tf.Tensor:
  """Sum of the squared off-diagonal entries, computed without subtracting the (large) diagonal."""
  off = tf.linalg.set_diag(k, tf.zeros_like(tf.linalg.diag_part(k)))
  return tf.reduce_sum(tf.square(off))


def _gram_value_and_grad(x: tf.Tensor, off_diagonal: bool) -> Tuple[tf.Tensor, tf.Tensor]:
  """S = ||X^T X||_F^2 (or only its off-diagonal part) for X [N, d], and dS/dX.

  ||X^T X||_F^2 = trace((X^T X)^2) = ||X X^T||_F^2, and the diagonal of X^T X holds the squared
  column norms c. With N < d (a batch of 64 against 512-4096 features) the N x N Gram matrix costs
  N^2 d flops and N^2 memory instead of N d^2 and d^2: at N = 64, d = 4096 (AlexNet-BN) the d x d
  form took about a quarter of a training step. The off-diagonal sum is then a difference of two
  sums, with a rounding error relative to ||X^T X||_F^2 (about 1e-7 of it in float32); that matters
  only if the off-diagonal part is a tiny fraction of the whole, which cannot happen while more than
  N - 1 columns vary (the centred batch has rank < N, so they cannot be orthogonal). With N >= d the
  d x d form is cheaper and is used. The branch is chosen in the graph when N or d is only known at
  run time.
  The gradient, 4 X X^T X (minus 4 X diag(c) for the off-diagonal part), is computed here with the
  same association as the value, so that no gradient has to pass through the tf.cond: XLA cannot
  differentiate a cond whose branches hold intermediates of different dynamic shapes.
  """
  colsq = tf.reduce_sum(tf.square(x), axis=0)

  def small():
    g = tf.matmul(x, x, transpose_b=True)
    value = tf.reduce_sum(tf.square(g))
    if off_diagonal:
      value = tf.maximum(value - tf.reduce_sum(tf.square(colsq)), 0.0)
    return value, tf.matmul(g, x)

  def large():
    k = tf.matmul(x, x, transpose_a=True)
    value = _off_diagonal_sq_sum(k) if off_diagonal else tf.reduce_sum(tf.square(k))
    return value, tf.matmul(x, k)

  n, d = x.shape[0], x.shape[1]
  if n is not None and d is not None:
    value, xk = small() if n < d else large()
  else:
    shape = tf.shape(x)
    value, xk = tf.cond(shape[0] < shape[1], small, large)
  grad = 4.0 * xk
  if off_diagonal:
    grad -= 4.0 * x * colsq
  return value, grad


@tf.custom_gradient
def _gram_sq_sum(x: tf.Tensor):
  """||X^T X||_F^2 (see _gram_value_and_grad)."""
  value, grad = _gram_value_and_grad(x, off_diagonal=False)
  return value, lambda dy: dy * grad


@tf.custom_gradient
def _gram_off_diagonal_sq_sum(x: tf.Tensor):
  """Sum of the squared off-diagonal entries of X^T X (see _gram_value_and_grad)."""
  value, grad = _gram_value_and_grad(x, off_diagonal=True)
  return value, lambda dy: dy * grad


def feddecorr_loss(z: tf.Tensor) -> tf.Tensor:
  """FedDecorr exactly as the PyTorch reference computes it (docs/reference.md §1).

  z: [N, d] representations. With N the actual batch size:
  standardise each column (centre, divide by sqrt(unbiased var + 1e-8)); K = z^T z (no 1/N);
  loss = mean over the d(d-1) off-diagonal entries of K^2, divided by N; 0 when N == 1.
  Equivalently ((N-1)^2 / N) * mean_{i!=j} R_ij^2 with R the Pearson correlation matrix.
  Gradients flow through the batch mean and variance. d == 1 has no off-diagonal entry: 0.

  Args:
    z: the batch's representations, [N, d] (any float dtype; integers are cast to float32).

  Returns:
    The loss, a scalar tensor (float64 for float64 z, else float32), not multiplied by beta.

  Raises:
    ValueError: z is not a matrix ([batch, features]) when its rank is known.
  """
  z = _as_float(z)
  _check_rank2(z, 'feddecorr_loss: z')
  zs, n = _standardize(z)
  off_diagonal = _gram_off_diagonal_sq_sum(zs)  # of K = zs^T zs
  d = tf.cast(tf.shape(z)[1], z.dtype)
  loss = tf.math.divide_no_nan(off_diagonal, d * (d - 1.0) * n)
  return tf.where(n > 1.0, loss, tf.zeros_like(loss))


def feddecorr_loss_paper(z: tf.Tensor) -> tf.Tensor:
  """FedDecorr as the paper writes it: (1/d^2) ||K||_F^2, K = (1/N) z^T z.

  z is standardised exactly as in `feddecorr_loss` (centred, divided by sqrt(unbiased var + 1e-8)),
  so the two forms differ only in normalisation and in the paper's form including the diagonal:
  with R the correlation matrix (R_ii ~ 1) and S = ||R||_F^2,
    paper     = ((N-1)/N)^2 * S / d^2
    reference = ((N-1)^2/N) * (S - d) / (d (d-1))
    reference / paper = N d (S - d) / ((d-1) S),
  which is about N when the off-diagonal mass dominates (S >> d) and N d / (N + d - 2) for i.i.d.
  features (61x at N = 64, d = 1280). The paper's form is therefore about N times smaller, and the
  coefficient beta = 0.1 of the papers' experiments is calibrated for `feddecorr_loss`.
  0 when N == 1.

  Args:
    z: [N, d] representations, as for `feddecorr_loss`.

  Returns:
    The paper's loss, a scalar tensor in `feddecorr_loss`'s dtype, not multiplied by beta.

  Raises:
    ValueError: as `feddecorr_loss`: z is not a matrix when its rank is known.
  """
  z = _as_float(z)
  _check_rank2(z, 'feddecorr_loss_paper: z')
  zs, n = _standardize(z)
  total = _gram_sq_sum(zs)  # ||zs^T zs||_F^2; K = zs^T zs / N
  d = tf.cast(tf.shape(z)[1], z.dtype)
  loss = total / (n * n * d * d)
  return tf.where(n > 1.0, loss, tf.zeros_like(loss))


def _lower_median(values: tf.Tensor, valid: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """torch.median of values[valid] (the lower middle value for an even count), static shapes.

  Returns (median, count). Invalid entries are pushed to +inf and sorted last; the median is the
  element at index (count - 1) // 2 of the ascending order, so the gradient flows to that element
  only, as in PyTorch. count == 0 gives median 1 (never used by the callers).
  """
  flat = tf.reshape(values, [-1])
  flat_valid = tf.reshape(valid, [-1])
  big = tf.constant(float('inf'), flat.dtype)
  # Ascending order through top_k of the negation (top_k has XLA support and a gradient).
  neg_sorted, _ = tf.math.top_k(-tf.where(flat_valid, flat, big), k=tf.size(flat))
  count = tf.reduce_sum(tf.cast(flat_valid, tf.int32))
  idx = tf.maximum((count - 1) // 2, 0)
  med = -tf.gather(neg_sorted, idx)
  safe = tf.where(count > 0, med, tf.ones_like(med))
  return safe, count


def uniformity_loss(z: tf.Tensor) -> tf.Tensor:
  """FedUV's uniformity term as its official code computes it (docs/reference.md §7).

  z: [N, d], the input of the final classifier (not L2-normalised). Over pairs i < j:
  dist_ij = ||z_i - z_j||^2 (from differences, so identical rows give exactly 0 as torch.pdist);
  sigma = median of the non-zero dist (lower middle value; the gradient flows through it);
  loss = mean_{i<j} exp(-dist_ij / sigma). N < 2 (no pair): 0. All distances 0: every term is
  exp(0) = 1 whatever sigma, so sigma = 1 is used and the loss is 1 with zero gradient.
  Memory is O(N^2 d) for the differences (64 x 64 x 1280 floats = 21 MB at FedUV's batch size).

  Args:
    z: the classifier's inputs, [N, d] (any float dtype; integers are cast to float32).

  Returns:
    The loss in (0, 1], a scalar tensor (float64 for float64 z, else float32); 0 when N < 2.

  Raises:
    ValueError: z is not a matrix ([batch, features]) when its rank is known.
  """
  z = _as_float(z)
  _check_rank2(z, 'uniformity_loss: z')
  n = tf.shape(z)[0]
  diff = z[:, None, :] - z[None, :, :]
  dist = tf.reduce_sum(tf.square(diff), axis=-1)
  pairs = tf.linalg.band_part(tf.ones([n, n], tf.bool), 0, -1)  # i <= j
  pairs = tf.logical_and(pairs, tf.logical_not(tf.eye(n, dtype=tf.bool)))  # i < j
  sigma, _ = _lower_median(dist, tf.logical_and(pairs, dist > 0))
  num_pairs = tf.reduce_sum(tf.cast(pairs, z.dtype))
  terms = tf.where(pairs, tf.exp(-dist / sigma), tf.zeros_like(dist))
  loss = tf.math.divide_no_nan(tf.reduce_sum(terms), num_pairs)
  return loss


def _safe_sqrt(x: tf.Tensor) -> tf.Tensor:
  """sqrt with value 0 and gradient 0 at x == 0 (the true gradient there is infinite)."""
  positive = x > 0
  return tf.where(positive, tf.sqrt(tf.where(positive, x, tf.ones_like(x))), tf.zeros_like(x))


def variance_loss(logits: tf.Tensor) -> tf.Tensor:
  """FedUV's variance term (docs/reference.md §7).

  P = softmax(logits) [N, C]; s_k = unbiased standard deviation of column k over the batch;
  gamma = 1/sqrt(C) (the unbiased std of each column of the C x C identity, i.e. of a batch of
  perfectly spread one-hot predictions); loss = mean_k relu(gamma - s_k).
  N == 1 (unbiased std undefined): 0. A column with zero variance contributes gamma with a zero
  gradient through its std (sqrt has an infinite slope at 0; we use 0 there instead of NaN).

  Args:
    logits: the batch's logits, [N, C] (any float dtype; integers are cast to float32).

  Returns:
    The loss in [0, 1/sqrt(C)], a scalar tensor (float64 for float64 logits, else float32).

  Raises:
    ValueError: logits is not a matrix ([batch, classes]) when its rank is known.
  """
  logits = _as_float(logits)
  _check_rank2(logits, 'variance_loss: logits')
  p = tf.nn.softmax(logits, axis=-1)
  n = tf.cast(tf.shape(p)[0], p.dtype)
  c = tf.cast(tf.shape(p)[1], p.dtype)
  pc = p - tf.reduce_mean(p, axis=0, keepdims=True)
  var = tf.reduce_sum(tf.square(pc), axis=0) / tf.maximum(n - 1.0, 1.0)
  std = _safe_sqrt(var)
  gamma = tf.math.rsqrt(c)
  loss = tf.reduce_mean(tf.nn.relu(gamma - std))
  return tf.where(n > 1.0, loss, tf.zeros_like(loss))


def decov_loss(z: tf.Tensor) -> tf.Tensor:
  """DeCov (Cogswell et al. 2016): 0.5 * (||C||_F^2 - ||diag C||_2^2).

  C = (1/N) sum_i (z_i - mean)(z_i - mean)^T, the covariance over the batch with the 1/N of
  Cogswell et al. (not 1/(N-1)). N == 1 gives C = 0 and loss 0.

  Args:
    z: the batch's representations, [N, d] (any float dtype; integers are cast to float32).

  Returns:
    The loss, a non-negative scalar tensor (float64 for float64 z, else float32).

  Raises:
    ValueError: z is not a matrix ([batch, features]) when its rank is known.
  """
  z = _as_float(z)
  _check_rank2(z, 'decov_loss: z')
  n = tf.cast(tf.shape(z)[0], z.dtype)
  zc = z - tf.reduce_mean(z, axis=0, keepdims=True)
  off_diagonal = _gram_off_diagonal_sq_sum(zc)  # of zc^T zc = N C
  return 0.5 * off_diagonal / (n * n)


def structured_decov_loss(z: tf.Tensor, groups: int) -> tf.Tensor:
  """Structured-DeCov: DeCov's penalty on the covariances BETWEEN groups of units only.

  The decorrelation term of the Structured Decorrelation Constraint (Xiong et al., "Regularizing
  Deep Convolutional Neural Networks with a Structured Decorrelation Constraint", ICDM 2016),
  which groups a layer's units and minimises the cross-covariance between different groups,
  leaving units within a group free to be correlated. The d units are split into
  G = min(groups, d) contiguous groups as NumPy's array_split does (the first d mod G groups one
  unit larger);
  C = (1/N) sum_i (z_i - mean)(z_i - mean)^T as in DeCov (1/N, Cogswell et al. 2016), and
  loss = 0.5 * sum_{i, j in different groups} C_ij^2.
  G = d (every unit its own group) is DeCov exactly; G = 1 is 0. N == 1 gives 0.
  SDC also has a term that encourages the units of one group to be correlated; its exact form
  was not available to us and it is not implemented (docs/algorithms.md, Structured-DeCov).

  Args:
    z: the batch's representations, [N, d] (any float dtype; integers are cast to float32).
    groups: G, the number of groups (an integer >= 1; more than d counts as d).

  Returns:
    The loss, a non-negative scalar tensor (float64 for float64 z, else float32).

  Raises:
    ValueError: z is not a matrix when its rank is known, or `groups` is not an integer >= 1.
  """
  z = _as_float(z)
  _check_rank2(z, 'structured_decov_loss: z')
  if int(groups) != groups or groups < 1:
    raise ValueError(f'structured_decov_loss: groups must be an integer >= 1, got {groups!r}.')
  n = tf.cast(tf.shape(z)[0], z.dtype)
  d = tf.shape(z)[1]
  zc = z - tf.reduce_mean(z, axis=0, keepdims=True)
  cov = tf.matmul(zc, zc, transpose_a=True) / n
  # Group sizes as NumPy's array_split: q = d // G units each, the first r = d % G one more.
  g = tf.minimum(tf.constant(int(groups), tf.int32), d)
  q, r = d // g, d % g
  i = tf.range(d)
  big = r * (q + 1)  # units in the larger groups
  group = tf.where(i < big, i // (q + 1), r + (i - big) // tf.maximum(q, 1))
  between = tf.not_equal(group[:, None], group[None, :])
  return 0.5 * tf.reduce_sum(tf.where(between, tf.square(cov), tf.zeros_like(cov)))


# ---------------------------------------------------------------------------------------------
# Registry.


@dataclasses.dataclass(frozen=True)
class Regularizer:
  """A regulariser ready for the client loss: `reg(representation, logits)` returns a scalar
  already multiplied by its coefficient(s), float32 (float64 for a float64 representation, as in
  the reference-equivalence test). `coefficients` holds its hyper-parameters by
  field name, e.g. {'beta': 0.1}; it is empty for 'none'."""
  name: str
  coefficients: Dict[str, float]
  fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

  def __call__(self, representation: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    dtype = tf.float64 if representation.dtype == tf.float64 else tf.float32
    return tf.cast(self.fn(representation, logits), dtype)


@dataclasses.dataclass(frozen=True)
class FedDecorrHParams(hparams.HParams):
  """FedDecorr's settings (`--feddecorr_beta`).

  Args:
    beta: the coefficient of the decorrelation loss in the client's loss, >= 0.

  Raises:
    ValueError: beta negative or not a finite number (the message names --feddecorr_beta).
  """
  component: ClassVar[str] = 'feddecorr'
  beta: float = hparams.field(0.1, 'FedDecorr coefficient: loss += beta * decorrelation loss '
                              '(the reference: 0.1; 0.05 on CIFAR-100).', minimum=0.0)


@dataclasses.dataclass(frozen=True)
class FedUVHParams(hparams.HParams):
  component: ClassVar[str] = 'feduv'
  lam: float = hparams.field(2.5, "FedUV variance-loss coefficient (FedUV's code: 2.5).",
                             minimum=0.0, flag='lambda')
  mu: float = hparams.field(0.5, "FedUV uniformity-loss coefficient (FedUV's code: 0.5).",
                            minimum=0.0)


@dataclasses.dataclass(frozen=True)
class DeCovHParams(hparams.HParams):
  component: ClassVar[str] = 'decov'
  beta: float = hparams.field(0.1, 'DeCov coefficient: loss += beta * DeCov loss.', minimum=0.0)


@dataclasses.dataclass(frozen=True)
class StructuredDeCovHParams(hparams.HParams):
  component: ClassVar[str] = 'structured_decov'
  beta: float = hparams.field(0.1, 'Structured-DeCov coefficient: loss += beta * (DeCov over the '
                              'covariances between groups of units).', minimum=0.0)
  groups: int = hparams.field(4, 'contiguous groups of representation units (capped at the '
                              'representation width; = width is DeCov).', minimum=1)


@dataclasses.dataclass(frozen=True)
class Spec:
  """A registered regulariser: its hyper-parameters and how to build its loss from them."""
  name: str
  HParams: type  # pylint: disable=invalid-name
  make: Callable[[Any], Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]
  drop_last: bool = False  # Clients train on full batches only (the method's own code does).


_REGISTRY = hparams.Registry('regularizer')


def register(name: str, hparams_cls: type,
             make: Callable[[Any], Callable[[tf.Tensor, tf.Tensor], tf.Tensor]],
             drop_last: bool = False) -> None:
  """Adds regulariser `name`; its flags, `--regularizer` choice and `get` then work.

  Args:
    name: the regulariser's name (its flag prefix, `--<name>_<field>`).
    hparams_cls: its settings, an `hparams.HParams` subclass whose `component` is `name`
      (`hparams.NoHParams` for none).
    make: `make(hp)` returns fn(representation [N, d], logits [N, C]) -> scalar tensor, already
      multiplied by its coefficient(s) and written for any batch size.
    drop_last: clients train on full batches only (FedUV's code drops the last one).

  Returns:
    None.

  Raises:
    ValueError: `name` is registered already, or `hparams_cls.component` is not `name`.
  """
  _REGISTRY.add(name, Spec(name, hparams_cls, make, drop_last))


register('none', hparams.NoHParams,
         lambda hp: lambda representation, logits: tf.constant(0.0, tf.float32))
register('feddecorr', FedDecorrHParams,
         lambda hp: lambda representation, logits: hp.beta * feddecorr_loss(representation))
# FedUV's official code drops each epoch's last incomplete batch (drop_last=True).
register('feduv', FedUVHParams,
         lambda hp: lambda representation, logits: (hp.lam * variance_loss(logits) +
                                                    hp.mu * uniformity_loss(representation)),
         drop_last=True)
register('decov', DeCovHParams,
         lambda hp: lambda representation, logits: hp.beta * decov_loss(representation))
register('structured_decov', StructuredDeCovHParams,
         lambda hp: lambda representation, logits: hp.beta * structured_decov_loss(
             representation, hp.groups))


def names() -> Tuple[str, ...]:
  """The registered regularisers' names.

  Returns:
    A tuple of names, in registration order ('none', 'feddecorr', ...).

  Raises:
    Nothing.
  """
  return _REGISTRY.names()


def hparams_class(name: str) -> type:
  """The HParams class regulariser `name` declared its settings with.

  Args:
    name: a name in `names()`.

  Returns:
    Its `hparams.HParams` subclass (`FedDecorrHParams` for 'feddecorr').

  Raises:
    ValueError: an unknown name (the message lists the choices).
  """
  return _REGISTRY.get(name).HParams


def drops_last_batch(name: str) -> bool:
  """Whether clients of regulariser `name` train on full batches only.

  Args:
    name: a name in `names()`.

  Returns:
    True when it was registered with `drop_last` (its method's code drops an incomplete batch).

  Raises:
    ValueError: an unknown name (the message lists the choices).
  """
  return _REGISTRY.get(name).drop_last


def get(name: str, hparams=None, **values) -> Regularizer:  # pylint: disable=redefined-outer-name
  """The regulariser `name` with its hyper-parameters, ready for the client loss.

  Args:
    name: a name in `names()`.
    hparams: an instance of its HParams (`FedDecorrHParams(beta=0.05)`), or None.
    **values: its fields as keywords instead (`get('feddecorr', beta=0.05)`); neither: defaults.

  Returns:
    A `Regularizer`: `reg(representation, logits)` returns the scalar loss term, already
    multiplied by its coefficient(s); `reg.coefficients` holds the settings by field name.

  Raises:
    ValueError: an unknown name (the message lists the choices), an unknown keyword (never
      ignored), a value out of range (naming its flag), both `hparams` and keywords, or `hparams`
      of another component's class.
  """
  spec = _REGISTRY.get(name)
  if values:
    if hparams is not None:
      raise ValueError('get: give hparams or keyword hyper-parameters, not both.')
    hparams = spec.HParams.from_mapping(values)
  hparams = spec.HParams() if hparams is None else hparams
  if not isinstance(hparams, spec.HParams):
    raise ValueError(f'hparams of regularizer {name} must be a {spec.HParams.__name__}.')
  return Regularizer(name=name, coefficients=hparams.to_dict(), fn=spec.make(hparams))
