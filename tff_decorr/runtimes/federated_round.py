"""One round of an algorithm, composed once: client work, aggregation, server update.

In the spirit of tff.learning's `compose_learning_process`: an algorithm's client step and server
step (tff_decorr.algorithms) are joined with an aggregator here and only here. The three ways of
running a round are thin faces over a `Round`:
- runtimes/tff_runtime.py: a tff.templates.IterativeProcess, client state CLIENTS-placed;
- runtimes/tf_runtime.py: the same TF functions called in this process (a GPU when present);
- runtimes/learning.py: a tff.learning LearningProcess, client state in a server-held table.
They differ only in where client state lives and how a client's dataset is named; what a client
computes, what is aggregated and how the server updates is decided here.

The aggregator is the plain sum (`factory=None`, bin/train's `--aggregator=mean`: each
algorithm's own weighted average, summed by `tff.aggregators.SumFactory` in TFF or `tf.add_n`
in-process) or any `tff.aggregators` factory. What a client sends (`Round.client_work`):
  update  what the aggregator aggregates: the plain sum takes the algorithm's weighted
          contribution; a factory takes contribution / weight as a model delta
          (aggregators.client_update), which it may clip, zero, noise or quantise;
  exact   the contribution's `Algorithm.exact_keys`, always summed exactly and never through a
          factory (SCAFFOLD's control-variate deltas: its c must stay the clients' mean);
  weight  the algorithm's aggregation weight; `one` = 1 (unweighted factories count clients).
`Round.server_update` turns the aggregate back into the summed contribution the algorithm's
`server_step` takes (aggregators.summed_contribution), adds the exact sums, and calls it;
`server_update_with_metrics` also returns the algorithm's `server_metrics` (FedExP's eta_g, the
adaptive optimisers' update norm), which the TFF and TF faces report as `server/<name>`.
Whether an algorithm may run under a factory at all is its declared capabilities
(base.Algorithm; aggregators.refusal), checked when the aggregation process is created.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import aggregators
from tff_decorr.algorithms import base
from tff_decorr.algorithms.workspace import Workspace


SERVER_PREFIX = 'server/'


def flat_server_metrics(metrics) -> dict:
  """The server step's scalars (`Round.server_update_with_metrics`) as the round's metrics
  {'server/<name>': float}, next to the clients' sums (metrics.csv and TensorBoard columns).

  Args:
    metrics: {name: scalar} (tensors or arrays), or None or () (no server metrics).

  Returns:
    {'server/<name>': float}; {} without metrics.
  """
  if not metrics:  # None here: an empty structure comes back from a remote worker as ().
    return {}
  return {SERVER_PREFIX + name: float(np.asarray(value)) for name, value in metrics.items()}


class Round:
  """An algorithm joined with an aggregator (module docstring). Pure TF pieces plus the federated
  aggregation step; the faces build computations or tf.functions around them."""

  def __init__(self, algorithm: base.Algorithm,
               factory: Optional[tff.aggregators.AggregationFactory] = None, *,
               state_on_server: bool = False, what: str = '--aggregator'):
    if not isinstance(algorithm, base.Algorithm):
      raise ValueError(f'algorithm must be a tff_decorr Algorithm, got {type(algorithm).__name__}.')
    if factory is not None:
      aggregators.check_factory(factory, what)
      aggregators.check_upload(algorithm, what)  # Before a client's delta is traced.
    self.algorithm = algorithm
    self.factory = factory
    self.state_on_server = state_on_server
    self.what = what
    self.exact_keys = tuple(algorithm.exact_keys)
    # The plain sum adds pre-weighted contributions; the server step divides by the summed weight.
    self.weighted = factory is None or aggregators.is_weighted(factory)

  @property
  def plain(self) -> bool:
    """The algorithm's own weighted sum (no tff.aggregators factory)."""
    return self.factory is None

  def new_workspace(self) -> Workspace:
    """A fresh workspace (Keras models and optimiser variables) for one client at a time.

    Returns:
      A `Workspace` of the algorithm's `num_models` models.
    """
    return Workspace(self.algorithm.model_fn, self.algorithm.num_models)

  # ---- client ----
  def _split(self, contribution):
    """(what the aggregator takes, the exact part) of a contribution."""
    if not self.exact_keys:
      return contribution, collections.OrderedDict()
    missing = [k for k in self.exact_keys if k not in contribution]
    if missing:
      raise ValueError(f'{self.algorithm.name}: exact_keys {missing} are not keys of its '
                       'contribution.')
    rest = {k: v for k, v in contribution.items() if k not in self.exact_keys}
    return rest, collections.OrderedDict((k, contribution[k]) for k in self.exact_keys)

  def client_work(self, ws: Workspace):
    """fn(broadcast, dataset, client_state) -> OrderedDict(update, exact, weight, one,
    client_state, metrics), bound to workspace `ws` (TF ops; call it inside a tf.function or a
    tff.tensorflow.computation).

    Args:
      ws: the workspace the client trains in.

    Returns:
      The function; `update` is what the aggregator takes (the contribution, or under a factory
      its delta), `exact` the exact-sum keys, `one` a constant 1 (to count clients).

    Raises:
      ValueError: when traced, an `exact_keys` entry is not a key of the contribution.
    """
    step = self.algorithm.make_client_step(ws)

    def work(broadcast, dataset, client_state):
      out = step(broadcast, dataset, client_state)
      rest, exact = self._split(out.contribution)
      update = rest if self.plain else aggregators.client_update(
          self.algorithm, broadcast, out._replace(contribution=rest))
      return collections.OrderedDict(update=update, exact=exact, weight=out.weight,
                                     one=tf.constant(1.0), client_state=out.client_state,
                                     metrics=out.metrics)

    return work

  # ---- server ----
  def server_update(self, server_state, aggregate, exact, total_weight):
    """The algorithm's new server state from the aggregate, the exact sums and the total weight
    (the summed weights; under an unweighted factory, the number of clients). TF ops.

    Args:
      server_state: the state at the round's start.
      aggregate: the aggregator's output (the plain sum, or the factory's aggregate of deltas).
      exact: the exact sums of the `exact_keys` parts.
      total_weight: as above.

    Returns:
      The new server state.
    """
    return self.server_update_with_metrics(server_state, aggregate, exact, total_weight)[0]

  def server_update_with_metrics(self, server_state, aggregate, exact, total_weight):
    """(`server_update`'s new state, OrderedDict of the algorithm's `server_metrics` as float32
    scalars, by name). The faces report them as `server/<name>` (`flat_server_metrics`). TF ops.

    Under a factory, BN moving variances of the new state are clamped at 0 (noise or quantisation
    can push an averaged variance below zero).

    Args:
      server_state: as `server_update`'s.
      aggregate: as `server_update`'s.
      exact: as `server_update`'s.
      total_weight: as `server_update`'s.

    Returns:
      (new server state, OrderedDict {name: float32 scalar}, names sorted).
    """
    alg = self.algorithm
    summed = aggregate if self.plain else aggregators.summed_contribution(
        alg, alg.broadcast(server_state), aggregate, total_weight)
    if self.exact_keys:
      summed = {**summed, **exact}
    new_state = dict(alg.server_step(server_state, summed, total_weight))
    if not self.plain:  # Noise or quantisation can push an averaged variance below zero.
      new_state['weights'] = aggregators.nonnegative_variances(alg, list(new_state['weights']))
    metrics = alg.server_metrics(server_state, summed, total_weight, new_state)
    return new_state, collections.OrderedDict(
        (name, tf.cast(metrics[name], tf.float32)) for name in sorted(metrics))

  # ---- aggregation (federated) ----
  def aggregation_process(self, update_type, weight_type) -> tff.templates.AggregationProcess:
    """The process that aggregates `update`: SumFactory's for the plain sum, else the factory's
    (after the compatibility check against the algorithm's capabilities).

    Args:
      update_type: the TFF type of a client's `update`.
      weight_type: the TFF type of a client's weight.

    Returns:
      A `tff.templates.AggregationProcess`.

    Raises:
      ValueError: the factory refuses the algorithm (its capabilities) or the update's type.
    """
    if self.plain:
      return tff.aggregators.SumFactory().create(update_type)
    return aggregators.create(self.factory, update_type, weight_type, self.algorithm,
                              state_on_server=self.state_on_server, what=self.what)

  def aggregate(self, process: tff.templates.AggregationProcess, state, outputs):
    """Inside a federated computation: (process output, exact sums, total weight) @SERVER from
    the clients' `client_work` outputs.

    Args:
      process: `aggregation_process`'s process.
      state: its state @SERVER.
      outputs: the clients' `client_work` outputs @CLIENTS.

    Returns:
      (the process's MeasuredProcessOutput, exact sums @SERVER, total weight @SERVER); the total
      is the number of clients under an unweighted factory.
    """
    if not self.plain and self.weighted:
      out = process.next(state, outputs.update, outputs.weight)
    else:
      out = process.next(state, outputs.update)
    total = tff.federated_sum(outputs.weight if self.weighted else outputs.one)
    return out, tff.federated_sum(outputs.exact), total

  def upload_bytes_per_client(self, process, exact_type) -> Optional[int]:
    """Bytes a client sends under a factory (its wire format plus the exact part); None for the
    plain sum, whose clients report their own bytes (fedavg_decomposed's vary by round).

    Args:
      process: `aggregation_process`'s process.
      exact_type: the TFF type of a client's `exact` part.

    Returns:
      The byte count, or None for the plain sum.
    """
    if self.plain:
      return None
    return aggregators.upload_bytes_per_client(process) + aggregators.tensor_bytes(exact_type)
