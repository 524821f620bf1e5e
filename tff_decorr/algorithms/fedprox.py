"""FedProx (Li et al. 2020): FedAvg plus a proximal term in the local loss.

Local loss += (mu / 2) * sum_over_trainable ||w - w_global||^2, w_global = the broadcast weights.
The term is computed from the variables directly (no second forward pass); its gradient is
mu * (w - w_global). The reference's proximal term is always zero (it compares the weights with
themselves); ours acts. Server: as FedAvg (example-weighted average of the whole state).
"""

from __future__ import annotations

import tensorflow as tf

import dataclasses
from typing import ClassVar

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg


@dataclasses.dataclass(frozen=True)
class FedProxHParams(hparams.HParams):
  component: ClassVar[str] = 'fedprox'
  mu: float = hparams.field(1e-3, 'proximal coefficient: local loss += (mu/2) |w - w_global|^2 '
                            '(the papers: 1e-3).', minimum=0.0)


class FedProx(fedavg.FedAvg):
  name = 'fedprox'
  HParams = FedProxHParams

  @property
  def mu(self) -> float:
    return self.hparams.mu

  def _client_step(self, ws, broadcast, dataset, client_state):
    global_trainable = [tf.convert_to_tensor(w) for w, t in
                        zip(broadcast['weights'], ws.trainable_mask) if t]
    # mu and 1/2 as constants of the variables' own float type (float64 in the reference
    # equivalence tests: a float32 1e-3 differs from 1e-3 by 5e-11 relative).
    half_mu = 0.5 * float(self.mu)

    def proximal(outputs, images, labels):
      del outputs, images, labels
      return tf.add_n([tf.constant(half_mu, v.dtype) * tf.reduce_sum(tf.square(v - g))
                       for v, g in zip(ws.trainable, global_trainable)])

    res = self._train(ws, broadcast['weights'], dataset,
                      extra_loss=proximal if self.mu > 0 else None)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             client_state, res.metrics)
