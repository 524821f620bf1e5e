"""FedExp (Jhunjhunwala et al. 2023, "FedExP: Speeding up Federated Averaging via
Extrapolation") as the FedDecorr reference runs it (approach/fedexp.py).

Client i trains as in FedAvg; Delta_i = y_i - x over the whole model state. With
p_i = n_i / sum_{j in S} n_j over the sampled clients and avg = sum_i p_i Delta_i, the server
extrapolates along the averaged update:
  eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||avg||^2 + eps))),    x <- x + eta_g avg.
eta_g is the paper's; the weights p_i are the reference's (examples, as its FedAvg), eps = 1e-3
(the reference's default and run script, the paper's value for its image tasks).
Uploads: n_i Delta_i (a delta, `upload = 'delta'`), and beside it, summed exactly (`exact_keys`),
n_i ||Delta_i||^2, n_i and n_i K_i (K_i: local steps): a factory may aggregate the delta, but the
norms must be the clients' own. Server state: the weights, the last eta_g and the ratio before its
floor of 1, `eta_raw` (for inspection: how far the round was from extrapolating; both are
recomputed every round). Each round reports them as `server/eta_g` and `server/eta_raw`, with
`server/update_norm` and `server/pseudo_gradient_norm` (metrics.csv, TensorBoard).

BN moving statistics, `bn`:
- 'reference' (the default): as the reference, they are part of Delta_i in the norms and are
  extrapolated by eta_g like every weight; since eta_g >= 1 can push a moving variance below zero,
  variances are clamped at 0 afterwards (base.nonnegative_variances; the reference has no guard).
- 'average': they are left out of the norms and get FedAvg's average (eta 1).
PyTorch's num_batches_tracked counters, `step_counters`: the reference's norms run over the whole
state_dict, so they include each BN layer's integer step counter, whose delta is the client's local
step count K_i. With L BN layers that adds L K_i^2 to ||Delta_i||^2 and L (sum_i p_i K_i)^2 to
||avg||^2; it swamps the weights' terms and makes eta_g about max(1, E_p[K^2] / (2 E_p[K]^2)), i.e.
FedAvg's step unless the clients' step counts vary widely. Keras BN has no such counter.
- True (the default, as the reference, which the project follows where it and the paper differ;
  with it the project's FedExP ends within one std of the reference's, docs/benchmarks.md §6): the
  counters' terms are added to both norms, from each client's own step count (uploaded exactly
  beside its norm). A model without BN layers has none, as in the reference.
- False: the paper's norms, over the weights (and the statistics, by `bn`) only.
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
  bn: str = hparams.field('average', 'BN moving statistics: average = left out of the norms and '
                          'averaged (the default: the paper\'s norms are over the weights); '
                          'reference = in the norms and extrapolated by eta_g, as the reference '
                          '(variances clamped at 0).', choices=BN_RULES)
  step_counters: bool = hparams.field(
      False, 'true = as the reference, add PyTorch BatchNorm\'s num_batches_tracked counters to '
      'both norms (each client\'s local step count K_i in every BN layer), which holds eta_g near '
      '1 (FedAvg\'s step) unless step counts vary widely; false (the default) = the paper\'s '
      'norms.')


class FedExp(base.Algorithm):
  name = 'fedexp'
  upload = 'delta'
  exact_keys = ('sq_norm', 'examples', 'step_sum')
  # eta_g compares the clients' own squared norms (exact) with the norm of the aggregate: a factory
  # that clips or zeroes deltas shrinks the aggregate but not the norms, so eta_g would grow and
  # extrapolate the clipped update further; and exact norms would reach the server in the clear.
  norm_bound_refusal = ('its step size eta_g compares the clients\' own squared update norms '
                        '(summed exactly) with the aggregate\'s, and clipping or zeroing the '
                        'deltas shrinks only the latter, which inflates eta_g')
  private_refusal = ('its clients\' squared update norms are summed exactly, outside the private '
                     'aggregation, so they would reach the server in the clear')
  HParams = FedExpHParams

  def _counters(self) -> int:
    """L: how many step counters the reference's state_dict would hold (one per BN layer)."""
    if not self.hparams.step_counters:
      return 0
    return sum(1 for n, b in zip(self.spec.names, self.spec.batchnorm) if b and 'moving_mean' in n)

  def _in_norm(self):
    return [t or self.hparams.bn == 'reference' for t in self.spec.trainable]

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights], 'eta_g': np.float32(1.0),
            'eta_raw': np.float32(1.0)}

  def _client_step(self, ws, broadcast, dataset, client_state):
    res = self._train(ws, broadcast['weights'], dataset)
    n = res.num_examples
    delta = [y - tf.convert_to_tensor(x) for x, y in zip(broadcast['weights'], res.weights)]
    sq = tf.add_n([tf.reduce_sum(tf.square(tf.cast(d, tf.float32)))
                   for d, used in zip(delta, self._in_norm()) if used])
    # The counters' delta is K_i in each of L layers (float32, as the reference sums them).
    k = tf.cast(res.num_steps, tf.float32)
    sq += self._counters() * tf.square(k)
    contribution = {'delta': base.weighted(delta, n), 'sq_norm': n * sq, 'examples': n,
                    'step_sum': n * k}
    return base.ClientOutput(contribution, n, client_state, res.metrics)

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution['delta'], weight, [tf.zeros_like(w) for w in x])
    avg_sq = tf.add_n([tf.reduce_sum(tf.square(tf.cast(a, tf.float32)))
                       for a, used in zip(avg, self._in_norm()) if used])
    mean_k = tf.math.divide_no_nan(contribution['step_sum'], contribution['examples'])
    avg_sq += self._counters() * tf.square(mean_k)  # The counters' averaged delta, sum_i p_i K_i.
    mean_sq = tf.math.divide_no_nan(contribution['sq_norm'], contribution['examples'])
    raw = mean_sq / (2.0 * (avg_sq + self.hparams.eps))
    eta = tf.maximum(1.0, raw)
    new_x = [w + tf.cast(eta if used else 1.0, w.dtype) * a
             for w, a, used in zip(x, avg, self._in_norm())]
    return {'weights': base.nonnegative_variances(self.spec, new_x), 'eta_g': eta,
            'eta_raw': raw}

  def server_metrics(self, server_state, contribution, weight, new_state):
    """server/eta_g, server/eta_raw (the paper's figure), and base.step_norms: |x_new - x| and
    the averaged delta's |avg|, over the whole model state."""
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution['delta'], weight, [tf.zeros_like(w) for w in x])
    return {'eta_g': new_state['eta_g'], 'eta_raw': new_state['eta_raw'],
            **base.step_norms(server_state, new_state, avg)}
