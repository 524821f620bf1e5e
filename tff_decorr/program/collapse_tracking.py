"""`bin/train --track_collapse`: the global model's representation spectrum during training.

Every `--eval_every` rounds (and at the end) the global model's representations over the test split
are reduced to the scalars the papers discuss: effective rank and the number of singular values of
the covariance above tau (tff_decorr.collapse.analysis; docs/analysis.md defines both). The full spectrum is
saved as well (`collapse/round_<r>.npy`), so curves can be plotted later with bin/analyze's plots.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from tff_decorr.collapse import analysis


def tracker(exp, evaluator, test_dataset,
            max_examples: Optional[int] = 10000) -> Callable[[int, object], dict]:
  """Returns an `on_evaluated(round, server_state) -> metrics` hook (`round_loop.RoundHooks`):
  the round loop calls it for the rounds it evaluates (every --eval_every rounds, and the last).

  It reuses the evaluator's Keras model, whose weights the evaluation of the same round has just
  set to the global model's (the loop evaluates before calling this hook).
  """
  out_dir = os.path.join(exp.config.output_dir, 'collapse')

  def on_evaluated(round_num: int, server_state) -> dict:
    weights = exp.algorithm.global_weights(server_state)
    from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
    export.set_weights(evaluator.model, weights)
    cov = analysis.representation_covariance(evaluator.model, test_dataset,
                                             max_examples=max_examples)
    sv = analysis.singular_values(cov)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, f'round_{round_num}.npy'), sv)
    return {'effective_rank': float(analysis.effective_rank(sv)),
            'num_significant_sv': float(analysis.num_significant(sv))}

  return on_evaluated


class LocalModels:
  """Reproduces chosen clients' local models of chosen rounds, to compare them with the global one.

  The runtimes return aggregated contributions, not local models. A client's local model of round r
  is a deterministic function of the broadcast state, its client state and its (client id, seed)
  data, so it is recomputed here with the algorithm's own client step in this process (the same
  function both runtimes run) and exported as a SavedModel under
  `<output_dir>/local_models/round_<r>/client_<id>`. With `track`, its spectrum scalars are logged
  as `local_effective_rank` / `local_num_significant_sv` next to the global model's.
  """

  # Seven parameters: the run's parts the tracker reads, then its two options.
  def __init__(self, exp, evaluator, test_dataset, clients, save_rounds, track: bool = False,
               max_examples: Optional[int] = 10000):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tff_decorr.algorithms.workspace import Workspace  # pylint: disable=g-import-not-at-top
    self.exp, self.evaluator, self.test_dataset = exp, evaluator, test_dataset
    self.clients = {str(c) for c in clients}
    self.save_rounds = set(int(r) for r in save_rounds)
    self.track = track
    # Only tracking reads the evaluator's model (the local model's spectrum); saving alone leaves
    # the round loop free to evaluate the global model while the next round trains.
    self.shares_evaluator = track
    self.max_examples = max_examples
    self.ws = Workspace(exp.algorithm.model_fn, exp.algorithm.num_models)
    self._step = exp.algorithm.make_client_step(self.ws)
    self._broadcast = tf.function(exp.algorithm.broadcast)
    self._tf = tf

  def __call__(self, round_num, server_state, client_inputs, client_states) -> dict:
    tf = self._tf
    wanted = [(i, cid, seed) for i, (cid, seed) in enumerate(client_inputs)
              if (cid in self.clients or (self.track and i == 0))]
    if not wanted or not (round_num in self.save_rounds or self.track):
      return {}
    to_t = lambda s: tf.nest.map_structure(tf.convert_to_tensor, s)
    broadcast = self._broadcast(to_t(server_state))
    out = {}
    for i, cid, seed in wanted:
      dataset = self.exp.client_dataset_fn(tf.constant(cid), tf.constant(seed, tf.int64))
      self._step(broadcast, dataset, to_t(client_states[i]))
      local = [v.numpy() for v in self.ws.model.weights]
      if cid in self.clients and round_num in self.save_rounds:
        path = os.path.join(self.exp.config.output_dir, 'local_models', f'round_{round_num}',
                            f'client_{cid}')
        self.exp.export(local, path)
      if self.track and i == 0:
        from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
        export.set_weights(self.evaluator.model, local)
        sv = analysis.singular_values(analysis.representation_covariance(
            self.evaluator.model, self.test_dataset, max_examples=self.max_examples))
        out = {'local_effective_rank': float(analysis.effective_rank(sv)),
               'local_num_significant_sv': float(analysis.num_significant(sv)),
               'local_client': float(cid)}
    return out
