"""FedNova (Wang et al. 2020), normalised averaging for local SGD with momentum rho.

Client i runs tau_i local steps from x and ends at y_i. With momentum rho its cumulative
gradient-coefficient norm is
  a_i = (tau_i - rho * (1 - rho^tau_i) / (1 - rho)) / (1 - rho)      (= tau_i when rho = 0),
and its normalised update is d_i = (x - y_i) / a_i. With p_i = n_i / sum_{j in S} n_j over the
SAMPLED clients S:
  tau_eff = sum_i p_i a_i;     x <- x - tau_eff * sum_i p_i d_i.
Applied to the whole state (BN statistics included). Equal a_i for all clients gives FedAvg
exactly. Normalising over the sampled clients makes it work under partial participation (the
reference crashes there). Uploads: (n_i d_i, n_i a_i) with weight n_i.
"""

from __future__ import annotations

import tensorflow as tf

from tff_decorr.algorithms import base
from tff_decorr.algorithms import client_update


class FedNova(base.Algorithm):
  name = 'fednova'
  upload = 'delta'
  # Its upload carries n_i a_i (local steps, tens to thousands) beside the normalised update: an
  # L2 bound would be spent on a_i (the update zeroed or clipped hard), and noise would hit it.
  norm_bound_refusal = ('its upload carries the normaliser a_i (local steps, tens to thousands), '
                        'which dominates the L2 norm that is clipped or zeroed')
  private_refusal = norm_bound_refusal

  def _client_step(self, ws, broadcast, dataset, client_state):
    res = self._train(ws, broadcast['weights'], dataset)
    a = client_update.effective_steps(res.num_steps, self.config.momentum)
    n = res.num_examples
    d = [tf.math.divide_no_nan(tf.convert_to_tensor(x) - y, a)
         for x, y in zip(broadcast['weights'], res.weights)]
    contribution = {'d': base.weighted(d, n), 'a': n * a}
    return base.ClientOutput(contribution, n, client_state, res.metrics)

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    tau_eff = tf.math.divide_no_nan(contribution['a'], weight)
    avg_d = base.safe_average(contribution['d'], weight, [tf.zeros_like(w) for w in x])
    return {'weights': [w - tau_eff * d for w, d in zip(x, avg_d)]}
