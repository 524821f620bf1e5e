"""SCAFFOLD (Karimireddy et al. 2020), option II control variates, with the shared local SGD.

Server state: x (global weights), c (server control variate, one per trainable weight).
Client state: c_i (one per trainable weight), initially 0. Client i, from y_i = x:
  each local step uses the corrected gradient g + c - c_i (before weight decay and momentum);
  after K local steps:  c_i+ = c_i - c + (x - y_i) / (a_K * lr)          (option II)
  with a_K = client_update.effective_steps(K, rho) = (K - rho (1 - rho^K)/(1 - rho)) / (1 - rho),
  the distance K momentum-SGD steps travel per unit of constant gradient (a_K = K at rho = 0:
  the paper's option II exactly).
Why a_K and not K: the paper's SCAFFOLD uses plain SGD. With momentum rho the K steps move about
a_K/K (up to 1/(1-rho)) times further, so (x - y_i)/(K lr) overestimates the corrected gradient
g + c - c_i by that factor, and the error on c - c_i grows each round: at rho = 0.9, K >= 4 the
run diverges. With a_K the estimate is exact for a constant gradient, and the optimum is a fixed
point: there g_i(x*) + c - c_i = 0, so the momentum buffer stays at zero and y_i = x*.
NIID-Bench instead applies the correction outside the momentum and divides by K; that is stable
but its fixed point is not the optimum under momentum (docs/algorithms.md has the measurement).
  uploads (y_i - x, c_i+ - c_i) with weight 1 (a uniform average over the sampled clients, as in
  the paper). Non-trainable state (BN statistics) is part of y_i - x; it has no control variate.
Server, S = sampled clients, N = total clients (`num_clients`):
  x <- x + server_lr * (1/|S|) sum_i (y_i - x);   c <- c + (|S|/N) * (1/|S|) sum_i (c_i+ - c_i).
A client with no data (K = 0) keeps c_i and uploads zeros.
Under a tff.aggregators factory (--aggregator) only delta_y goes through it; delta_c is an exact
key (summed exactly beside it), so clipping or zeroing the model delta never moves c away from the
clients' mean. Private aggregators are refused (the exact sums would release c_i).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base
from tff_decorr.algorithms import client_update


@dataclasses.dataclass(frozen=True)
class ScaffoldHParams(hparams.HParams):
  component: ClassVar[str] = 'scaffold'
  server_lr: float = hparams.field(1.0, 'server learning rate on the averaged update (the paper: '
                                   '1).', minimum=0.0, min_exclusive=True)


class Scaffold(base.Algorithm):
  name = 'scaffold'
  upload = 'delta'
  stateful = True  # c_i.
  needs_num_clients = True  # c += (|S|/N) avg dc.
  # c must stay the mean of the clients' c_i; a factory's clipping, zeroing or noise on delta_c
  # would move it away, and DP noise there accumulates and is amplified by lr x a_K every round.
  exact_keys = ('delta_c',)
  private_refusal = ('its control-variate deltas are summed exactly, so each client\'s c_i would '
                     'reach the server in the clear (and noised, c would drift from the clients\' '
                     'mean)')
  HParams = ScaffoldHParams

  def __init__(self, model_fn, optimizer=base.SGDHParams(), regularizer=None, hparams=None, *,
               num_clients: int):
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
      raise ValueError(f'num_clients (total clients N, for c += |S|/N avg dc) must be an integer '
                       f'>= 1, got {num_clients!r}.')
    super().__init__(model_fn, optimizer, regularizer, hparams, num_clients=int(num_clients))

  @property
  def server_lr(self) -> float:
    return self.hparams.server_lr

  def _zeros_trainable(self, weights):
    return [np.zeros_like(np.asarray(w)) for w, t in zip(weights, self.spec.trainable) if t]

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights], 'control': self._zeros_trainable(weights)}

  def initial_client_state(self, weights):
    return {'control': self._zeros_trainable(weights)}

  def broadcast(self, server_state):
    return {'weights': list(server_state['weights']), 'control': list(server_state['control'])}

  def _client_step(self, ws, broadcast, dataset, client_state):
    c = [tf.convert_to_tensor(t) for t in broadcast['control']]
    ci = [tf.convert_to_tensor(t) for t in client_state['control']]

    def correct(grads):
      return [None if g is None else tf.convert_to_tensor(g) + cj - cij
              for g, cj, cij in zip(grads, c, ci)]

    res = self._train(ws, broadcast['weights'], dataset, grad_correction=correct)
    x = [tf.convert_to_tensor(w) for w in broadcast['weights']]
    x_tr = [w for w, t in zip(x, self.spec.trainable) if t]
    y_tr = [w for w, t in zip(res.weights, self.spec.trainable) if t]
    # a_K lr in each weight's own float type (float64 in the reference equivalence tests).
    k_lr = {dt: client_update.effective_steps(res.num_steps, self.optimizer.momentum, dt)
            * tf.constant(float(self.optimizer.lr), dt) for dt in {w.dtype for w in y_tr}}
    new_ci = [tf.where(k_lr[yj.dtype] > 0,
                       cij - cj + (xj - yj) / tf.maximum(k_lr[yj.dtype], 1e-30), cij)
              for cij, cj, xj, yj in zip(ci, c, x_tr, y_tr)]
    contribution = {'delta_y': [y - xj for y, xj in zip(res.weights, x)],
                    'delta_c': [n - o for n, o in zip(new_ci, ci)]}
    return base.ClientOutput(contribution, tf.constant(1.0), {'control': new_ci}, res.metrics)

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    zeros = [tf.zeros_like(w) for w in x]
    avg_dy = base.safe_average(contribution['delta_y'], weight, zeros)
    new_x = [w + self.server_lr * d for w, d in zip(x, avg_dy)]
    new_c = [tf.convert_to_tensor(cj) + dc / float(self.num_clients)
             for cj, dc in zip(server_state['control'], contribution['delta_c'])]
    return {'weights': new_x, 'control': new_c}
