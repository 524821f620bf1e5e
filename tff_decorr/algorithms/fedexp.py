"""FedExp (Jhunjhunwala et al. 2023, "FedExP: Speeding up Federated Averaging via
Extrapolation") as the FedDecorr reference runs it (approach/fedexp.py).

Client i trains as in FedAvg; Delta_i = y_i - x over the whole model state. With
p_i = n_i / sum_{j in S} n_j over the sampled clients and avg = sum_i p_i Delta_i, the server
extrapolates along the averaged update:
  eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||avg||^2 + eps))),    x <- x + eta_g avg.
eta_g is the paper's; the weights p_i are the reference's (examples, as its FedAvg), eps = 1e-3
(the reference's default and run script, the paper's value for its image tasks).
Uploads: n_i Delta_i (a delta, `upload = 'delta'`), and beside it, summed exactly (`exact_keys`),
n_i ||Delta_i||^2 and n_i: a factory may aggregate the delta, but the norms must be the clients'
own. Server state: the weights and the last eta_g (for logging; it is recomputed every round).

BN moving statistics, `bn`:
- 'reference' (the default): as the reference, they are part of Delta_i in the norms and are
  extrapolated by eta_g like every weight; since eta_g >= 1 can push a moving variance below zero,
  variances are clamped at 0 afterwards (base.nonnegative_variances; the reference has no guard).
- 'average': they are left out of the norms and get FedAvg's average (eta 1).
The reference's norms also include PyTorch's num_batches_tracked counters (each client adds its
local steps K_i in every BN layer), which there swamp ||Delta_i||^2 and make eta_g about
max(1, E_p[K^2] / (2 E_p[K]^2)), i.e. FedAvg unless step counts vary widely; Keras BN has no such
counter, so here eta_g comes from the weights and statistics only.
Evaluation uses the last iterate, as the reference; the paper reports the average of the last two
iterates (x_t + x_{t-1}) / 2, which the reference does not do.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base

BN_RULES = ('reference', 'average')


@dataclasses.dataclass(frozen=True)
class FedExpHParams(hparams.HParams):
  component: ClassVar[str] = 'fedexp'
  eps: float = hparams.field(1e-3, 'epsilon in eta_g = max(1, avg ||Delta_i||^2 / (2 (||avg '
                             'Delta||^2 + eps))) (the reference and the paper: 1e-3).',
                             minimum=0.0, min_exclusive=True)
  bn: str = hparams.field('reference', 'BN moving statistics: reference = in the norms and '
                          'extrapolated by eta_g (variances clamped at 0); average = left out of '
                          'the norms and averaged.', choices=BN_RULES)


class FedExp(base.Algorithm):
  name = 'fedexp'
  upload = 'delta'
  exact_keys = ('sq_norm', 'examples')
  # eta_g compares the clients' own squared norms (exact) with the norm of the aggregate: a factory
  # that clips or zeroes deltas shrinks the aggregate but not the norms, so eta_g would grow and
  # extrapolate the clipped update further; and exact norms would reach the server in the clear.
  norm_bound_refusal = ('its step size eta_g compares the clients\' own squared update norms '
                        '(summed exactly) with the aggregate\'s, and clipping or zeroing the '
                        'deltas shrinks only the latter, which inflates eta_g')
  private_refusal = ('its clients\' squared update norms are summed exactly, outside the private '
                     'aggregation, so they would reach the server in the clear')
  HParams = FedExpHParams

  def _in_norm(self):
    return [t or self.hparams.bn == 'reference' for t in self.spec.trainable]

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights], 'eta_g': np.float32(1.0)}

  def _client_step(self, ws, broadcast, dataset, client_state):
    res = self._train(ws, broadcast['weights'], dataset)
    n = res.num_examples
    delta = [y - tf.convert_to_tensor(x) for x, y in zip(broadcast['weights'], res.weights)]
    sq = tf.add_n([tf.reduce_sum(tf.square(tf.cast(d, tf.float32)))
                   for d, used in zip(delta, self._in_norm()) if used])
    contribution = {'delta': base.weighted(delta, n), 'sq_norm': n * sq, 'examples': n}
    return base.ClientOutput(contribution, n, client_state, res.metrics)

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution['delta'], weight, [tf.zeros_like(w) for w in x])
    avg_sq = tf.add_n([tf.reduce_sum(tf.square(tf.cast(a, tf.float32)))
                       for a, used in zip(avg, self._in_norm()) if used])
    mean_sq = tf.math.divide_no_nan(contribution['sq_norm'], contribution['examples'])
    eta = tf.maximum(1.0, mean_sq / (2.0 * (avg_sq + self.hparams.eps)))
    new_x = [w + tf.cast(eta if used else 1.0, w.dtype) * a
             for w, a, used in zip(x, avg, self._in_norm())]
    return {'weights': base.nonnegative_variances(self.spec, new_x), 'eta_g': eta}
