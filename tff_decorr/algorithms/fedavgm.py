"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum. Two forms, selected by `form`:

delta = avg_i(y_i) - x (example-weighted average of the whole state, as FedAvg), then
- form='reference' (the FedDecorr reference code): m <- b*m + (1-b)*delta;  x <- x + m
  (an exponential moving average of the updates; equals server SGD with momentum b and
  learning rate 1-b);
- form='tff' (TFF's server optimizer `sgdm`; alias 'sgdm'): m <- b*m + delta; x <- x + server_lr*m.
They differ: with server_lr=1 the 'tff' form takes steps about 1/(1-b) times larger.
The momentum covers the trainable weights (BN gamma and beta included). Non-trainable state (BN
moving mean and variance) is averaged as FedAvg does (x <- avg_i y_i), unlike the reference, which
puts its whole state_dict through the momentum: the statistics are running estimates of the data,
not parameters with a gradient, and momentum extrapolates them. Server momentum is an underdamped
iteration (eigenvalues of modulus sqrt(b)), so when the clients' averaged variance drops and stays
small, the variance overshoots below zero and the global model's logits become NaN
(tests/algorithms_test.py). TFF's server optimizers likewise act on trainable weights only.
Their momentum entries are kept (always zero) so the state's structure is unchanged.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_decorr.algorithms import base, fedavg

FORMS = ('reference', 'tff')
_ALIASES = {'sgdm': 'tff'}


class FedAvgM(fedavg.FedAvg):
  name = 'fedavgm'

  def __init__(self, model_fn, config=base.ClientConfig(), regularizer=None,
               server_momentum: float = 0.9, form: str = 'reference', server_lr: float = 1.0):
    form = _ALIASES.get(form, form)
    if form not in FORMS:
      raise ValueError(f'form must be one of {FORMS}, got {form!r}.')
    if not 0 <= server_momentum < 1:
      raise ValueError(f'server_momentum must be in [0, 1), got {server_momentum!r}.')
    if not server_lr > 0:
      raise ValueError(f'server_lr must be > 0, got {server_lr!r}.')
    if form == 'reference' and server_lr != 1.0:
      raise ValueError("server_lr applies only to the fedavgm form 'tff'; the reference form has "
                       "none (use server_lr=1 or --fedavgm_form=tff).")
    super().__init__(model_fn, config, regularizer)
    self.server_momentum = float(server_momentum)
    self.form = form
    self.server_lr = float(server_lr)

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights],
            'momentum': [np.zeros_like(np.asarray(w)) for w in weights]}

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution, weight, x)
    b = tf.constant(self.server_momentum, tf.float32)
    new_x, new_m = [], []
    for xi, ai, mi, trainable in zip(x, avg, server_state['momentum'], self.spec.trainable):
      if not trainable:  # BN statistics: averaged, never extrapolated (see the module docstring).
        new_x.append(ai)
        new_m.append(tf.zeros_like(xi))
        continue
      delta = ai - xi
      if self.form == 'reference':
        m = b * mi + (1.0 - b) * delta
        new_x.append(xi + m)
      else:
        m = b * mi + delta
        new_x.append(xi + self.server_lr * m)
      new_m.append(m)
    return {'weights': new_x, 'momentum': new_m}
