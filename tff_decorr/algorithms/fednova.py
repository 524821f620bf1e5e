"""FedNova (Wang et al. 2020), normalised averaging for local SGD with momentum rho.

Client i runs tau_i local steps from x and ends at y_i. With momentum rho its cumulative
gradient-coefficient norm is
  a_i = (tau_i - rho * (1 - rho^tau_i) / (1 - rho)) / (1 - rho)      (= tau_i when rho = 0),
and its normalised update is d_i = (x - y_i) / a_i. With p_i = n_i / sum_{j in S} n_j over the
SAMPLED clients S, for the trainable weights:
  tau_eff = sum_i p_i a_i;     x <- x - tau_eff * sum_i p_i d_i.
Non-trainable state (BN moving mean and variance) is not a parameter moved by gradient steps, so
there is nothing to normalise: it becomes the clients' example-weighted mean, as in FedAvg,
  s <- sum_i p_i s_i,
sent as d_i = x - y_i (no 1/a_i) and applied without tau_eff. Through the normalised rule it
would be x + sum_i p_i (tau_eff / a_i)(y_i - x), with tau_eff / a_i up to 1.56 on a CIFAR-10
Dirichlet partition and coefficients summing to E_p[a] E_p[1/a] >= 1: an extrapolation past the
clients' values that can make a moving variance negative and the evaluation NaN.
Equal a_i for all clients gives FedAvg exactly. Normalising over the sampled clients makes it work
under partial participation (the reference crashes there). Uploads: (n_i d_i, n_i a_i) with weight
n_i, a delta (`upload = 'delta'`): the server receives their sums.
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
    n = res.num_examples
    # a_i in each weight's own float type, and the upload n_i a_i in the model's (float64 in the
    # reference equivalence tests, where a float32 tau_eff would be 4e-7 off in small BN biases).
    a = {dt: client_update.effective_steps(res.num_steps, self.optimizer.momentum, dt)
         for dt in {w.dtype for w in res.weights}}
    a_dtype = res.weights[0].dtype
    # Trainable: normalised by a_i. Non-trainable (BN statistics): the plain difference, so that
    # the server's x - avg(x - y_i) is the clients' weighted mean (module docstring).
    d = [tf.math.divide_no_nan(tf.convert_to_tensor(x) - y, a[y.dtype]) if trainable
         else tf.convert_to_tensor(x) - y
         for x, y, trainable in zip(broadcast['weights'], res.weights, self.spec.trainable)]
    contribution = {'d': base.weighted(d, n), 'a': tf.cast(n, a_dtype) * a[a_dtype]}
    return base.ClientOutput(contribution, n, client_state, res.metrics)

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    a_sum = tf.convert_to_tensor(contribution['a'])
    tau_eff = tf.math.divide_no_nan(a_sum, tf.cast(weight, a_sum.dtype))
    avg_d = base.safe_average(contribution['d'], weight, [tf.zeros_like(w) for w in x])
    return {'weights': [w - tf.cast(tau_eff, w.dtype) * d if trainable else w - d
                        for w, d, trainable in zip(x, avg_d, self.spec.trainable)]}
