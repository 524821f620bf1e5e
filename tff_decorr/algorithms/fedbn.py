"""FedBN (Li et al. 2021): BatchNorm stays local.

Client state = that client's BN variables (gamma, beta, moving mean, moving variance of every
BatchNormalization layer), initialised from the initial global model and persisted across rounds.
Client i starts from the global non-BN weights combined with its own BN variables, trains, uploads
only n_i * (non-BN weights). Server: non-BN weights <- example-weighted average; the server's BN
variables are never changed (they stay at their initial values).
The server model is therefore not a model any client uses: evaluation and export use each client's
model (`client_weights`: shared weights + its own BN), as the FedBN paper reports.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_decorr.algorithms import base, fedavg


class FedBN(fedavg.FedAvg):
  name = 'fedbn'
  stateful = True  # Its BN variables.

  def __init__(self, model_fn, optimizer=base.SGDHParams(), regularizer=None, hparams=None, **kw):
    super().__init__(model_fn, optimizer, regularizer, hparams, **kw)
    if not any(self.spec.batchnorm):
      raise ValueError('FedBN needs a model with BatchNormalization layers; this model has none '
                       '(use --algorithm=fedavg).')

  @property
  def personalized(self) -> bool:
    return True

  def client_weights(self, server_state, client_state):
    """Global non-BN weights with the client's own BN variables (what the FedBN paper evaluates)."""
    own = iter(client_state['bn'])
    return [np.asarray(next(own)) if b else np.asarray(w)
            for w, b in zip(self.global_weights(server_state), self.spec.batchnorm)]

  def initial_client_state(self, weights):
    return {'bn': [np.asarray(w) for w, b in zip(weights, self.spec.batchnorm) if b]}

  def update_reference(self, broadcast):
    # Only the non-BN weights are uploaded (BN stays with the client).
    return [w for w, b in zip(broadcast['weights'], self.spec.batchnorm) if not b]

  def _client_step(self, ws, broadcast, dataset, client_state):
    local_bn = iter(client_state['bn'])
    start = [next(local_bn) if b else w for w, b in zip(broadcast['weights'], self.spec.batchnorm)]
    res = self._train(ws, start, dataset)
    shared = [w for w, b in zip(res.weights, self.spec.batchnorm) if not b]
    new_state = {'bn': [w for w, b in zip(res.weights, self.spec.batchnorm) if b]}
    return base.ClientOutput(base.weighted(shared, res.num_examples), res.num_examples, new_state,
                             res.metrics)

  def server_step(self, server_state, contribution, weight):
    old = [tf.convert_to_tensor(w) for w in server_state['weights']]
    old_shared = [w for w, b in zip(old, self.spec.batchnorm) if not b]
    avg = iter(base.safe_average(contribution, weight, old_shared))
    return {'weights': [w if b else next(avg) for w, b in zip(old, self.spec.batchnorm)]}
