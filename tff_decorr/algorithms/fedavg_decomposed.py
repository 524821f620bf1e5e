"""FedAvg for filter-decomposed models with a fast/slow schedule (Chen & Qiu, docs/reference.md §7).

In a decomposed model each conv kernel is coefficients x atoms; averaging both is plain FedAvg over
the variables (use `fedavg`). This algorithm adds the fast/slow option: variables whose name
contains 'atoms' (and every other non-coefficient variable) are averaged every round; variables
whose name contains 'coefficients' are averaged only every `coefficient_period` = K rounds, and in
between each client keeps training its own copy (client state). K = 0: coefficients are never
aggregated (fully personalised). K = 1 is exactly FedAvg.

Round r (server counter, from 0): a client starts from the global coefficients when r % K == 0
(after an aggregation; also round 0, where both are the initial model), else from its own; it
uploads its coefficients (weight n_i) only when (r + 1) % K == 0. The bytes actually uploaded are
reported per round in the `bytes_up` metric (coefficients counted only when sent).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg

COEFFICIENTS = 'coefficients'


@dataclasses.dataclass(frozen=True)
class FedAvgDecomposedHParams(hparams.HParams):
  component: ClassVar[str] = 'fedavg_decomposed'
  coefficient_period: int = hparams.field(
      1, 'aggregate the atom coefficients every K rounds (atoms every round); 0 keeps them local '
      '(personalisation); 1 is FedAvg.', minimum=0)


class FedAvgDecomposed(fedavg.FedAvg):
  name = 'fedavg_decomposed'
  stateful = True  # Its own coefficients between aggregations.
  HParams = FedAvgDecomposedHParams
  requires_decomposed = True  # Needs a filter-decomposed model (--decomposed).
  # Coefficients are averaged on their own schedule with their own weight, which one weighted mean
  # of a delta (tff.aggregators) cannot express: the plain sum only.
  upload = None

  def __init__(self, model_fn, optimizer=base.SGDHParams(), regularizer=None, hparams=None, **kw):
    super().__init__(model_fn, optimizer, regularizer, hparams, **kw)
    coefficient_period = self.hparams.coefficient_period
    self.coef_mask = tuple(COEFFICIENTS in n for n in self.spec.names)
    if not any(self.coef_mask):
      raise ValueError("fedavg_decomposed needs a decomposed model (variables named "
                       "'coefficients'); build the model with decomposed=True or use fedavg.")
    self.period = int(coefficient_period)

  @property
  def personalized(self) -> bool:
    return self.period == 0  # Coefficients never aggregated: each client's own are its model.

  def client_weights(self, server_state, client_state):
    """With coefficient_period 0: global atoms (and other shared weights) + the client's own
    coefficients. Otherwise the global model (coefficients are averaged on their schedule)."""
    if not self.personalized:
      return self.global_weights(server_state)
    own = iter(client_state['coefficients'])
    return [np.asarray(next(own)) if c else np.asarray(w)
            for w, c in zip(self.global_weights(server_state), self.coef_mask)]

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights], 'round': np.int32(0)}

  def initial_client_state(self, weights):
    return {'coefficients': [np.asarray(w) for w, c in zip(weights, self.coef_mask) if c]}

  def broadcast(self, server_state):
    return {'weights': list(server_state['weights']), 'round': server_state['round']}

  def _flags(self, r):
    if self.period == 0:
      return tf.constant(False), tf.constant(False)
    return tf.equal(r % self.period, 0), tf.equal((r + 1) % self.period, 0)

  def _client_step(self, ws, broadcast, dataset, client_state):
    sync, send = self._flags(broadcast['round'])
    own = iter(client_state['coefficients'])
    start = [tf.where(sync, w, next(own)) if c else w
             for w, c in zip(broadcast['weights'], self.coef_mask)]
    res = self._train(ws, start, dataset)
    n = res.num_examples
    n_coef = tf.where(send, n, 0.0)
    shared = [n * w for w, c in zip(res.weights, self.coef_mask) if not c]
    coefs = [w for w, c in zip(res.weights, self.coef_mask) if c]
    contribution = {'shared': shared, 'coefficients': [n_coef * w for w in coefs],
                    'coefficient_weight': n_coef}
    metrics = dict(res.metrics)
    shared_elems = base.num_elements(shared)
    coef_elems = base.num_elements(coefs)
    metrics['bytes_up'] = 4.0 * (shared_elems + tf.where(send, float(coef_elems), 0.0))
    return base.ClientOutput(contribution, n, {'coefficients': coefs}, metrics)

  def server_step(self, server_state, contribution, weight):
    old = [tf.convert_to_tensor(w) for w in server_state['weights']]
    shared = iter(base.safe_average(contribution['shared'], weight,
                                    [w for w, c in zip(old, self.coef_mask) if not c]))
    coefs = iter(base.safe_average(contribution['coefficients'], contribution['coefficient_weight'],
                                   [w for w, c in zip(old, self.coef_mask) if c]))
    return {'weights': [next(coefs) if c else next(shared) for c in self.coef_mask],
            'round': server_state['round'] + 1}
