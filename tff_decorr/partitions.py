"""Client partitions of a labelled dataset: Dirichlet (bit-exact with the reference), pathological,
IID and domain. Each returns a list of int64 index arrays, one per client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, ClassVar, List, Optional, Sequence, Tuple

import numpy as np

from tff_decorr import hparams


@contextlib.contextmanager
def _legacy_global_rng(seed: int):
  """Seeds NumPy's legacy global RNG for the block and restores the caller's state afterwards.

  The reference (NIID-Bench's partition code, used by FedDecorr) draws from the *global* legacy RNG;
  reproducing its splits bit for bit needs the same generator and the same sequence of calls, but
  callers of this library must not see their global RNG state changed.
  """
  saved = np.random.get_state()
  np.random.seed(seed)
  try:
    yield
  finally:
    np.random.set_state(saved)


def _check_common(labels: np.ndarray, num_clients: int) -> None:
  if labels.ndim != 1:
    raise ValueError(f'labels must be a 1-D array, got shape {labels.shape}.')
  if len(labels) and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
    raise ValueError(f'labels must be integers >= 0 (class indices), got dtype {labels.dtype} '
                     f'and minimum {labels.min()}.')
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f'--num_clients must be an integer >= 1, got {num_clients!r}.')
  if num_clients > len(labels):
    raise ValueError(f'--num_clients={num_clients} is more than the {len(labels)} examples; use '
                     'fewer clients.')


# Seven parameters: the reference's own settings (N, alpha, seed, min size, K) and a retry bound.
def dirichlet_partition(labels: Sequence[int], num_clients: int, alpha: float, seed: int = 0,
                        min_size: int = 10, max_tries: int = 1000,
                        num_classes: Optional[int] = None) -> List[np.ndarray]:
  """Label-skewed split with per-class client proportions ~ Dir(alpha) ("noniid-labeldir").

  Exactly the reference algorithm (docs/reference.md §3), so the same labels and seed give every
  client exactly the examples it gets in the papers' code: seed the legacy global RNG; repeat until
  every client holds >= min_size examples: for each class k = 0 .. num_classes - 1 in order,
  shuffle its indices, draw p ~ Dir(alpha * 1), zero p_j for clients already holding
  >= N / num_clients examples, renormalise, cut at (cumsum(p) * n_k).astype(int)[:-1]; finally
  shuffle each client's list, client 0 first.

  Every class index below `num_classes` (default: max label + 1, the reference's fixed K when the
  last class occurs) consumes one shuffle and one Dirichlet draw even when it has no examples, as
  in the reference; iterating only over the classes present would shift every later draw.
  `alpha = inf` gives `iid_partition`.

  NumPy's *global* legacy RNG is used (that is what makes it bit-exact) but its state is saved
  before and restored after, so callers' own np.random draws are not affected.

  Args:
    labels: the class index of every example, 1-D integers >= 0.
    num_clients: how many clients, >= 1.
    alpha: the Dirichlet concentration, > 0 (smaller: more heterogeneous; inf: IID).
    seed: the draw's seed.
    min_size: every client gets at least this many examples (draws are repeated until so).
    max_tries: how many draws to try.
    num_classes: the number of classes K (default: max label + 1).

  Returns:
    One int64 array of example indices per client, client 0 first.

  Raises:
    ValueError: labels not 1-D non-negative integers, num_clients not in [1, examples], alpha not
      > 0, fewer than min_size * num_clients examples, num_classes below the largest label, or
      no draw in max_tries that gives every client min_size examples (the message names the
      flag to change).
  """
  labels = np.asarray(labels)
  _check_common(labels, num_clients)
  alpha = float(alpha)
  if not alpha > 0 or math.isnan(alpha):
    raise ValueError(f'--dirichlet_alpha must be > 0 (smaller is more heterogeneous; inf is IID), '
                     f'got {alpha}.')
  if math.isinf(alpha):
    return iid_partition(len(labels), num_clients, seed)
  if min_size * num_clients > len(labels):
    raise ValueError(f'--num_clients={num_clients}: every client needs at least {min_size} '
                     f'examples but there are only {len(labels)}; use fewer clients.')
  k_max = int(labels.max()) + 1
  if num_classes is None:
    num_classes = k_max
  elif num_classes < k_max:
    raise ValueError(f'num_classes={num_classes} but the labels go up to {k_max - 1}.')
  # A tiny alpha makes some draws all zero (0/0 below): those draws are rejected like the
  # reference's, and NumPy's warnings about them would only precede the one-line error.
  with _legacy_global_rng(seed), np.errstate(divide='ignore', invalid='ignore'):
    for _ in range(max_tries):
      idx_batch = _dirichlet_draw(labels, num_clients, alpha, num_classes)
      if min(len(b) for b in idx_batch) >= min_size:
        break
    else:
      raise ValueError(
          f'--dirichlet_alpha={alpha}: no Dirichlet draw in {max_tries} tries gave every one of '
          f'{num_clients} clients at least {min_size} examples; use a larger --dirichlet_alpha '
          'or fewer --num_clients.')
    out = []
    for b in idx_batch:
      np.random.shuffle(b)
      out.append(np.asarray(b, np.int64))
  return out


def _dirichlet_draw(labels: np.ndarray, num_clients: int, alpha: float,
                    num_classes: int) -> List[list]:
  """One try of the reference's draw from NumPy's global RNG: each client's example indices."""
  n = len(labels)
  idx_batch = [[] for _ in range(num_clients)]
  for k in range(num_classes):
    idx_k = np.where(labels == k)[0]
    np.random.shuffle(idx_k)
    p = np.random.dirichlet(np.repeat(alpha, num_clients))
    p = np.array([pj * (len(idx_j) < n / num_clients) for pj, idx_j in zip(p, idx_batch)])
    p = p / p.sum()
    cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
    idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, cuts))]
  return idx_batch


def pathological_partition(labels: Sequence[int], num_clients: int, classes_per_client: int,
                           seed: int = 0) -> List[np.ndarray]:
  """"#label k" split: client i holds class i mod C plus k-1 other distinct random classes; each
  class's examples are shuffled and split evenly among the clients that hold it.

  A class that no client drew (possible when num_clients * k < C) is left out of the federation;
  the returned indices then do not cover it, and `unassigned_classes` reports which.

  Args:
    labels: the class index of every example, 1-D integers >= 0.
    num_clients: how many clients, >= 1.
    classes_per_client: k, the classes each client holds, in [1, number of classes].
    seed: the draw's seed.

  Returns:
    One int64 array of example indices per client, client 0 first.

  Raises:
    ValueError: labels not 1-D non-negative integers, num_clients not in [1, examples], or
      classes_per_client out of range (naming --pathological_classes_per_client).
  """
  labels = np.asarray(labels)
  _check_common(labels, num_clients)
  classes = np.unique(labels)
  c = len(classes)
  if not isinstance(classes_per_client, (int, np.integer)) or not 1 <= classes_per_client <= c:
    raise ValueError(f'--pathological_classes_per_client must be between 1 and the {c} classes, got '
                     f'{classes_per_client!r}.')
  rng = np.random.RandomState(seed)
  holders = {int(k): [] for k in classes}
  for i in range(num_clients):
    own = int(classes[i % c])
    others = [int(k) for k in classes if int(k) != own]
    picked = [own] + [int(k) for k in rng.choice(others, classes_per_client - 1, replace=False)]
    for k in picked:
      holders[k].append(i)
  parts = [[] for _ in range(num_clients)]
  for k in classes:
    idx = np.where(labels == k)[0]
    rng.shuffle(idx)
    owners = holders[int(k)]
    for owner, chunk in zip(owners, np.array_split(idx, len(owners)) if owners else []):
      parts[owner].extend(chunk.tolist())
  out = []
  for i, p in enumerate(parts):
    if not p:
      raise ValueError(f'--num_clients: client {i} received no examples (its classes have fewer '
                       'examples than clients holding them); use fewer clients.')
    p = np.asarray(p, np.int64)
    rng.shuffle(p)
    out.append(p)
  return out


def unassigned_classes(labels: Sequence[int], parts: Sequence[np.ndarray]) -> List[int]:
  """Classes present in `labels` that no client holds (pathological with num_clients * k < C)."""
  labels = np.asarray(labels)
  held = set(np.unique(labels[np.concatenate(parts)]).tolist()) if parts else set()
  return sorted(set(np.unique(labels).tolist()) - held)


def iid_partition(num_examples: int, num_clients: int, seed: int = 0) -> List[np.ndarray]:
  """A random permutation cut into num_clients near-equal parts (np.array_split).

  `RandomState(seed).permutation` is the same draw as the reference's
  `np.random.seed(seed); np.random.permutation(n)`, without touching the global RNG.

  Args:
    num_examples: how many examples to split.
    num_clients: how many clients, in [1, num_examples].
    seed: the permutation's seed.

  Returns:
    One int64 array of example indices per client (sizes differ by at most one).

  Raises:
    ValueError: num_clients not an integer in [1, num_examples] (naming --num_clients).
  """
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f'--num_clients must be an integer >= 1, got {num_clients!r}.')
  if num_clients > num_examples:
    raise ValueError(f'--num_clients={num_clients} is more than the {num_examples} examples; use '
                     'fewer clients.')
  perm = np.random.RandomState(seed).permutation(num_examples).astype(np.int64)
  return [np.asarray(p, np.int64) for p in np.array_split(perm, num_clients)]


def domain_partition(domain_ids: Sequence[int]) -> List[np.ndarray]:
  """One client per domain, ordered by domain id; each client's indices in dataset order."""
  domain_ids = np.asarray(domain_ids)
  if domain_ids.ndim != 1 or len(domain_ids) == 0:
    raise ValueError('domain_ids must be a non-empty 1-D array.')
  return [np.where(domain_ids == d)[0].astype(np.int64) for d in np.unique(domain_ids)]


def class_count_matrix(labels: Sequence[int], parts: Sequence[np.ndarray],
                       num_classes: int) -> np.ndarray:
  """[num_clients, num_classes] example counts."""
  labels = np.asarray(labels)
  return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Registry: each partition declares its settings once (tff_decorr.hparams) and how it splits.


@dataclasses.dataclass(frozen=True)
class DirichletHParams(hparams.HParams):
  component: ClassVar[str] = 'dirichlet'
  alpha: float = hparams.field(0.5, 'Dirichlet concentration (smaller: more heterogeneous; inf: '
                               'IID; the papers: 0.05).', minimum=0.0, min_exclusive=True,
                               allow_inf=True)


@dataclasses.dataclass(frozen=True)
class PathologicalHParams(hparams.HParams):
  component: ClassVar[str] = 'pathological'
  classes_per_client: int = hparams.field(2, 'classes per client ("#label k").', minimum=1)


@dataclasses.dataclass(frozen=True)
class Data:
  """What a partition may split on: labels, domain ids (None when the task has no domains)."""
  labels: np.ndarray
  domains: Optional[np.ndarray]
  num_classes: int
  task: str


def _domain(data: Data, num_clients: int, seed: int, hp) -> List[np.ndarray]:
  del seed, hp
  if data.domains is None:
    raise ValueError(f'--partition=domain: task {data.task} has no domains; use dirichlet, '
                     'pathological or iid, or a domain task (office_caltech10, domainnet).')
  parts = domain_partition(data.domains)
  if len(parts) != num_clients:
    raise ValueError(f'--num_clients: the domain partition of {data.task} has {len(parts)} '
                     f'clients (one per domain); pass --num_clients={len(parts)}.')
  return parts


@dataclasses.dataclass(frozen=True)
class Spec:
  name: str
  HParams: type  # pylint: disable=invalid-name
  split: Callable[[Data, int, int, Any], List[np.ndarray]]  # (data, num_clients, seed, hp)


_REGISTRY = hparams.Registry('partition')


def register(name: str, hparams_cls: type,
             split: Callable[[Data, int, int, Any], List[np.ndarray]]) -> None:
  """Adds partition `name`; its flags, `--partition` choice and `split` then work.

  Args:
    name: the partition's name (its flag prefix, `--<name>_<field>`).
    hparams_cls: its settings, an `hparams.HParams` subclass whose `component` is `name`
      (`hparams.NoHParams` for none).
    split: split(data, num_clients, seed, hp) -> one index array per client; `data` is a `Data`
      (labels, domains, num_classes, task), `hp` an instance of `hparams_cls`.

  Returns:
    None.

  Raises:
    ValueError: `name` is registered already, or `hparams_cls.component` is not `name`.
  """
  _REGISTRY.add(name, Spec(name, hparams_cls, split))


register('dirichlet', DirichletHParams,
         lambda d, n, seed, hp: dirichlet_partition(d.labels, n, hp.alpha, seed=seed,
                                                    num_classes=d.num_classes))
register('pathological', PathologicalHParams,
         lambda d, n, seed, hp: pathological_partition(d.labels, n, hp.classes_per_client,
                                                       seed=seed))
register('iid', hparams.NoHParams, lambda d, n, seed, hp: iid_partition(len(d.labels), n, seed))
register('domain', hparams.NoHParams, _domain)


def names() -> Tuple[str, ...]:
  """The registered partitions' names.

  Returns:
    A tuple of names, in registration order ('dirichlet', 'pathological', 'iid', 'domain', ...).

  Raises:
    Nothing.
  """
  return _REGISTRY.names()


def hparams_class(name: str) -> type:
  return _REGISTRY.get(name).HParams


def split(name: str, data: Data, num_clients: int, seed: int, hp=None) -> List[np.ndarray]:
  """The clients' index arrays of partition `name` with settings `hp`.

  Args:
    name: a name in `names()`.
    data: the `Data` to split (labels, domains, num_classes, task).
    num_clients: how many clients.
    seed: the partition's seed (bin/train's --seed).
    hp: an instance of the partition's HParams, or None for its defaults.

  Returns:
    One int64 array of example indices per client, client 0 first.

  Raises:
    ValueError: an unknown name, more clients than examples, or what the partition itself refuses
      (each message names the flag to change).
  """
  spec = _REGISTRY.get(name)
  if len(data.labels) < num_clients:
    raise ValueError(f'--num_clients: {num_clients} clients but the train split has only '
                     f'{len(data.labels)} examples; use fewer clients.')
  return spec.split(data, num_clients, seed, spec.HParams() if hp is None else hp)
