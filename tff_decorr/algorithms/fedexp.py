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
- 'average' (the default: the paper's norms are over the weights): they are left out of the norms
  and get FedAvg's average (eta 1).
- 'reference': as the reference, they are part of Delta_i in the norms and are extrapolated by
  eta_g like every weight; since eta_g >= 1 can push a moving variance below zero, variances are
  clamped at 0 afterwards (base.nonnegative_variances; the reference has no guard).
PyTorch's num_batches_tracked counters, `step_counters`: the reference's norms run over the whole
state_dict, so they include each BN layer's integer step counter, whose delta is the client's local
step count K_i. With L BN layers that adds L K_i^2 to ||Delta_i||^2 and L (sum_i p_i K_i)^2 to
||avg||^2; it swamps the weights' terms and makes eta_g about max(1, E_p[K^2] / (2 E_p[K]^2)), i.e.
FedAvg's step unless the clients' step counts vary widely. Keras BN has no such counter.
- False (the default): the paper's norms, over the weights (and the statistics, by `bn`) only.
- True (the reference's form; with it the project's FedExP ends within one std of the reference's,
  docs/benchmarks.md §6): the counters' terms are added to both norms, from each client's own step
  count (uploaded exactly beside its norm). A model without BN layers has none, as in the reference.
(Both defaults were chosen by measurement: docs/algorithms.md, "Settings chosen by measurement".)
The evaluated (and exported) global model, `evaluate`:
- 'average_last_two': the paper's, (x_t + x_{t-1}) / 2, because FedExP's iterates oscillate; as
  the authors' code (Divyansh03/FedExP, main.py) averages the parameters, the trainable variables
  are averaged and the BN statistics are x_t's. The server state then keeps x_{t-1} beside x_t.
  Training is unchanged: clients always receive x_t.
- 'last': x_t, as the reference evaluates.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base

BN_RULES = ('reference', 'average')
EVALUATED = ('average_last_two', 'last')


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
  evaluate: str = hparams.field(
      'average_last_two', 'The global model evaluated and exported: average_last_two = the '
      'paper\'s (x_t + x_{t-1}) / 2 of the trainable variables (BN statistics: x_t\'s), as '
      'FedExP\'s iterates oscillate (the default); last = x_t, as the reference. Training is the '
      'same either way.', choices=EVALUATED)


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

  def _keeps_previous(self) -> bool:
    return self.hparams.evaluate == 'average_last_two'

  def initial_server_state(self, weights):
    state = {'weights': [np.asarray(w) for w in weights], 'eta_g': np.float32(1.0),
             'eta_raw': np.float32(1.0)}
    if self._keeps_previous():  # x_{t-1}; before the first round, x_0 itself.
      state['previous_weights'] = [np.array(w) for w in weights]
    return state

  def global_weights(self, server_state) -> list:
    if not self._keeps_previous():
      return list(server_state['weights'])
    # The mean of two float32 values in float64, rounded once to the variable's dtype; the
    # statistics (not trainable) are the last iterate's.
    mean = lambda p, w: ((np.asarray(p, np.float64) + np.asarray(w, np.float64)) / 2).astype(
        np.asarray(w).dtype)
    return [mean(p, w) if trainable else np.asarray(w) for p, w, trainable in zip(
        server_state['previous_weights'], server_state['weights'], self.spec.trainable)]

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
    state = {'weights': base.nonnegative_variances(self.spec, new_x), 'eta_g': eta,
             'eta_raw': raw}
    if self._keeps_previous():
      state['previous_weights'] = x
    return state

  def server_metrics(self, server_state, contribution, weight, new_state):
    """server/eta_g, server/eta_raw (the paper's figure), and base.step_norms: |x_new - x| and
    the averaged delta's |avg|, over the whole model state."""
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution['delta'], weight, [tf.zeros_like(w) for w in x])
    return {'eta_g': new_state['eta_g'], 'eta_raw': new_state['eta_raw'],
            **base.step_norms(server_state, new_state, avg)}
