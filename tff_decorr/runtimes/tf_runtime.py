"""In-process runtime: a `federated_round.Round`'s client work called for each sampled client in this
Python process, `concurrency` clients at a time.

No algorithm math lives here: this module builds client workspaces, calls the Round's client work
for each sampled client, sums the uploads with TF ops in the clients' order, and calls the Round's
server update. It runs the plain sum only (bin/train's --aggregator=mean): a tff.aggregators
factory is a federated computation. It uses a GPU when TensorFlow sees one (TFF 0.87's worker is
CPU-only).

Concurrency. One small client step does not fill a CPU's cores (docs/benchmarks.md §1: one client
against two at once), so on a CPU `concurrency` clients train at once, each in its own workspace
(Keras model and momentum buffers) and Python thread: a tf.function call runs its ops without
holding the GIL, and the threads share TensorFlow's intra-op pool. The uploads are added in the
clients' order whatever order they finish in, and a client's computation does not depend on which
thread runs it, so a round's result is bit-identical to running the clients one after another. On
a GPU one client at a time (the default there): kernels of concurrent clients would only queue on
the same device.

Two things keep the cores busy at a round's edges. The first concurrent round traces the extra
workspaces in the calling thread while the first workspace already trains (tracing is Python and
holds the GIL; a running step does not). And when a round has few clients for its threads, they
start longest first, by each client's last measured time (unknown ones first, in the round's
order): the round's end is then not one large client training alone on a partly idle CPU. Neither
changes a result, which does not depend on order or workspace.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_decorr.algorithms import base
from tff_decorr.runtimes import federated_round

ClientDatasetFn = Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset]


def _to_numpy(structure):
  return tf.nest.map_structure(lambda t: np.asarray(t), structure)


def _to_tensors(structure):
  return tf.nest.map_structure(tf.convert_to_tensor, structure)


def default_concurrency() -> int:
  """Clients trained at once by default: 1 on a GPU, else one per CPU core this process may use.

  Returns:
    An int >= 1.
  """
  if tf.config.list_physical_devices('GPU'):
    return 1
  return max(1, len(os.sched_getaffinity(0)))


def longest_first(client_ids: Sequence[str], seconds: dict) -> list:
  """Positions of `client_ids` in the order to start them: clients never timed first, in the
  given order (they may be long), then the timed ones by their last time, longest first.

  Args:
    client_ids: the round's sampled clients.
    seconds: {client id: wall seconds of its last local training}.

  Returns:
    A permutation of range(len(client_ids)); ties keep the given order.
  """
  unknown = [i for i, c in enumerate(client_ids) if c not in seconds]
  known = sorted((i for i, c in enumerate(client_ids) if c in seconds),
                 key=lambda i: (-seconds[client_ids[i]], i))
  return unknown + known


# Reordering holds the uploads of clients that finish ahead of an earlier one until the sum reaches
# them (the sum stays in the clients' order); with at most this many clients per thread that is a
# few models' worth, and with more the round's end is a small part of it anyway.
_REORDER_MAX_CLIENTS_PER_THREAD = 4


def sum_structures(structures: Sequence[Any]):
  """Element-wise sum of identical structures (the runtime's aggregation: a plain SUM).

  Args:
    structures: a non-empty sequence of nests of tensors, all of one structure.

  Returns:
    One nest of that structure, each leaf the tf.add_n of the corresponding leaves.
  """
  return tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)), *structures)


def _results_in_order(futures: list):
  """Yields the futures' results in list order, dropping each as it is yielded (an upload is held
  only until the sum reaches it); on an error the clients not yet started are cancelled."""
  try:
    for i, f in enumerate(futures):
      futures[i] = None
      yield f.result()
  finally:
    for f in futures:
      if f is not None:
        f.cancel()


class TfRuntime:
  """Runs rounds of `algorithm` in this Python process, `concurrency` clients at a time (module
  docstring; None: `default_concurrency()`, one per CPU core on a CPU, 1 on a GPU)."""

  def __init__(self, algorithm: base.Algorithm, client_dataset_fn: ClientDatasetFn,
               concurrency: Optional[int] = 1):
    if not isinstance(algorithm, base.Algorithm):
      raise ValueError(f'algorithm must be a tff_decorr Algorithm, got {type(algorithm).__name__}.')
    if not callable(client_dataset_fn):
      raise ValueError('client_dataset_fn must be a callable (client_id, seed) -> tf.data.Dataset.')
    if concurrency is None or concurrency < 1:
      concurrency = default_concurrency()
    self.algorithm = algorithm
    self.client_dataset_fn = client_dataset_fn
    self.concurrency = int(concurrency)
    self.round = federated_round.Round(algorithm)
    self._steps = []  # One tf.function per workspace, built as concurrency needs them.
    self._add_step()
    self._server_update = tf.function(self.round.server_update_with_metrics)
    self._broadcast = tf.function(algorithm.broadcast)
    self._pool = None
    self._free = None  # queue.SimpleQueue of the indices of the steps no thread is running.
    self._seconds = {}  # client id -> wall seconds of its last local training here.

  def _add_step(self):
    workspace = self.round.new_workspace()
    work = self.round.client_work(workspace)
    dataset_fn = self.client_dataset_fn

    # The dataset is built inside a tf.function, as inside the TFF computation: its pipeline is
    # traced once instead of once per client (building tf.data map functions eagerly is paid per
    # client), so per-client overhead does not depend on how many clients a round has.
    @tf.function
    def step_from_id(broadcast, client_id, seed, state):
      return work(broadcast, dataset_fn(client_id, seed), state)
    self._steps.append(step_from_id)
    return workspace

  def _start_threads(self, broadcast, client_id, seed, state):
    """Starts the client threads with the first workspace's step traced; returns the specs the
    other workspaces' steps are traced for (`_add_workspaces`)."""
    specs = [tf.nest.map_structure(tf.TensorSpec.from_tensor, x)
             for x in (broadcast, client_id, seed, state)]
    self._steps[0].get_concrete_function(*specs)
    self._free = queue.SimpleQueue()
    for i in range(len(self._steps)):
      self._free.put(i)
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=self.concurrency, thread_name_prefix='tff_decorr_client')
    return specs

  def _add_workspaces(self, specs):
    """Builds the other workspaces and traces their steps here, in the calling thread, while the
    client threads already train on the first: Keras model construction and tracing are not
    meant to run in several threads at once, and a running step does not hold the GIL."""
    while len(self._steps) < self.concurrency:
      self._add_step()
      self._steps[-1].get_concrete_function(*specs)
      self._free.put(len(self._steps) - 1)

  def _call(self, i, args):
    """(upload parts, the client's new state as NumPy) of one client on workspace i."""
    out = self._steps[i](*args)
    return ({k: out[k] for k in ('update', 'exact', 'weight', 'metrics')},
            _to_numpy(out['client_state']))

  def _run_client(self, client_id, args):
    """In a client thread: one client on a workspace no other thread is using (waits for one)."""
    i = self._free.get()
    try:
      t0 = time.perf_counter()
      out = self._call(i, args)
      self._seconds[client_id] = time.perf_counter() - t0
      return out
    finally:
      self._free.put(i)

  def close(self):
    """Stops the client threads (idempotent; the runtime starts them again if used)."""
    if self._pool is not None:
      self._pool.shutdown(wait=True)
      self._pool = None

  def initialize(self, initial_weights=None):
    """The server state before round 1.

    Args:
      initial_weights: the global model's starting weights; None: the algorithm's own.

    Returns:
      The algorithm's `initial_server_state` of those weights (NumPy).
    """
    weights = self.algorithm.initial_weights() if initial_weights is None else initial_weights
    return self.algorithm.initial_server_state(weights)

  def run_round(self, server_state, client_inputs: Sequence[Tuple[str, int]],
                client_states: Sequence[Any]):
    """One round: the sampled clients train, their uploads are summed, the server steps.

    Args:
      server_state: the state at the round's start (NumPy or tensors).
      client_inputs: (client id, seed) per sampled client, in the round's order.
      client_states: each sampled client's state, in the same order.

    Returns:
      (new server state, new client states (a list, in the clients' order), metrics), NumPy:
      the clients' summed metrics and the server step's as 'server/<name>'.

    Raises:
      ValueError: no client, or not one state per client.
    """
    if len(client_inputs) != len(client_states):
      raise ValueError(f'client_states has {len(client_states)} entries but client_inputs has '
                       f'{len(client_inputs)}; pass one state per sampled client.')
    if not client_inputs:
      raise ValueError('client_inputs is empty: sample at least one client per round.')
    broadcast = self._broadcast(_to_tensors(server_state))
    args = [(broadcast, tf.constant(client_id, tf.string), tf.constant(seed, tf.int64),
             _to_tensors(state))
            for (client_id, seed), state in zip(client_inputs, client_states)]
    if self.concurrency > 1 and len(args) > 1:
      specs = self._start_threads(*args[0]) if self._pool is None else None
      ids = [client_id for client_id, _ in client_inputs]
      order = (longest_first(ids, self._seconds)
               if len(ids) <= _REORDER_MAX_CLIENTS_PER_THREAD * self.concurrency
               else range(len(ids)))
      futures = [None] * len(args)
      for i in order:
        futures[i] = self._pool.submit(self._run_client, ids[i], args[i])
      if specs is not None:
        self._add_workspaces(specs)
      results = _results_in_order(futures)
    else:
      results = (self._call(0, a) for a in args)
    # Running sums in the clients' order: bit-identical to one client at a time, and memory stays
    # one model's worth plus the uploads of clients that finished ahead of an earlier one.
    summed = None
    new_states = []
    for parts, state in results:
      summed = parts if summed is None else sum_structures([summed, parts])
      new_states.append(state)
    new_server_state, server_metrics = self._server_update(
        _to_tensors(server_state), summed['update'], summed['exact'], summed['weight'])
    metrics = {**_to_numpy(summed['metrics']), **federated_round.flat_server_metrics(server_metrics)}
    return _to_numpy(new_server_state), new_states, metrics
