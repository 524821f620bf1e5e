"""In-process runtime: a `rounds.Round` called client after client in this Python process.

No algorithm math lives here: this module builds one client workspace, calls the Round's client
work for each sampled client, sums the uploads with TF ops, and calls the Round's server update.
It runs the plain sum only (bin/train's --aggregator=mean): a tff.aggregators factory is a
federated computation. It uses a GPU when TensorFlow sees one (TFF 0.87's worker is CPU-only).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_decorr.algorithms import base
from tff_decorr.runtimes import rounds

ClientDatasetFn = Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset]


def _to_numpy(structure):
  return tf.nest.map_structure(lambda t: np.asarray(t), structure)


def _to_tensors(structure):
  return tf.nest.map_structure(tf.convert_to_tensor, structure)


def sum_structures(structures: Sequence[Any]):
  """Element-wise sum of identical structures (the runtime's aggregation: a plain SUM)."""
  return tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)), *structures)


class TfRuntime:
  """Runs rounds of `algorithm` in this Python process."""

  def __init__(self, algorithm: base.Algorithm, client_dataset_fn: ClientDatasetFn):
    if not isinstance(algorithm, base.Algorithm):
      raise ValueError(f'algorithm must be a tff_decorr Algorithm, got {type(algorithm).__name__}.')
    if not callable(client_dataset_fn):
      raise ValueError('client_dataset_fn must be a callable (client_id, seed) -> tf.data.Dataset.')
    self.algorithm = algorithm
    self.client_dataset_fn = client_dataset_fn
    self.round = rounds.Round(algorithm)
    self.workspace = self.round.new_workspace()
    work = self.round.client_work(self.workspace)

    # The dataset is built inside a tf.function, as inside the TFF computation: its pipeline is
    # traced once instead of once per client (building tf.data map functions eagerly costs ~0.1 s
    # a client), so per-client overhead does not depend on how many clients a round has.
    @tf.function
    def step_from_id(broadcast, client_id, seed, state):
      return work(broadcast, client_dataset_fn(client_id, seed), state)
    self._step_from_id = step_from_id
    self._server_update = tf.function(self.round.server_update)
    self._broadcast = tf.function(algorithm.broadcast)

  def initialize(self, initial_weights=None):
    weights = self.algorithm.initial_weights() if initial_weights is None else initial_weights
    return self.algorithm.initial_server_state(weights)

  def run_round(self, server_state, client_inputs: Sequence[Tuple[str, int]],
                client_states: Sequence[Any]):
    """One round. Returns (new server state, new client states (list), summed metrics), NumPy."""
    if len(client_inputs) != len(client_states):
      raise ValueError(f'client_states has {len(client_states)} entries but client_inputs has '
                       f'{len(client_inputs)}; pass one state per sampled client.')
    if not client_inputs:
      raise ValueError('client_inputs is empty: sample at least one client per round.')
    broadcast = self._broadcast(_to_tensors(server_state))
    # Running sums: memory stays one model's worth however many clients a round samples.
    summed = None
    new_states = []
    for (client_id, seed), state in zip(client_inputs, client_states):
      out = self._step_from_id(broadcast, tf.constant(client_id, tf.string),
                               tf.constant(seed, tf.int64), _to_tensors(state))
      parts = {k: out[k] for k in ('update', 'exact', 'weight', 'metrics')}
      summed = parts if summed is None else sum_structures([summed, parts])
      new_states.append(_to_numpy(out['client_state']))
    new_server_state = self._server_update(_to_tensors(server_state), summed['update'],
                                           summed['exact'], summed['weight'])
    return _to_numpy(new_server_state), new_states, _to_numpy(summed['metrics'])
