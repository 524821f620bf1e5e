"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum. Two forms, selected by `form`:

delta = avg_i(y_i) - x (example-weighted average of the whole state, as FedAvg), then
- form='reference' (the FedDecorr reference code): m <- b*m + (1-b)*delta;  x <- x + m
  (an exponential moving average of the updates; equals server SGD with momentum b and
  learning rate 1-b);
- form='tff' (TFF's server optimizer `sgdm`; alias 'sgdm'): m <- b*m + delta; x <- x + server_lr*m.
They differ: with server_lr=1 the 'tff' form takes steps about 1/(1-b) times larger.
The momentum covers the trainable weights (BN gamma and beta included). Non-trainable state (BN
moving mean and variance) follows the rule `bn` chooses (docs/algorithms.md, fedavgm):
- bn='average' (the default): FedAvg's rule, s <- avg_i(s_i);
- bn='ema' (an earlier default): an exponential moving average toward the clients'
  example-weighted average with the same coefficient b, s <- b*s + (1-b)*avg_i(s_i);
- bn='reference': the same momentum rule as the weights (the reference puts its whole state_dict
  through the momentum), then every moving variance clamped at 0 (base.nonnegative_variances).
Why not the reference's momentum by default: statistics are running estimates of the data, not
parameters with a gradient, and server momentum is an underdamped iteration (eigenvalues of
modulus sqrt(b)): when the clients' averaged variance drops and stays small, the variance
overshoots below zero (hence the clamp; at the fidelity setting it reached 0 and the model chance).
Why the average rather than the EMA: the EMA never overshoots either, but keeps b^r of the initial
statistics, and the average trained best at both settings measured (docs/algorithms.md, the
table). Both are convex combinations: a variance never goes negative. With 'ema' and 'average'
the statistics' momentum entries stay zero, so the state's structure (and old checkpoints) is the
same for every rule.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg

FORMS = ('reference', 'tff')
BN_RULES = ('ema', 'reference', 'average')


@dataclasses.dataclass(frozen=True)
class FedAvgMHParams(hparams.HParams):
  component: ClassVar[str] = 'fedavgm'
  server_momentum: float = hparams.field(
      0.9, 'server momentum b (the reference scripts: 0.9 on CIFAR-10, 0.5 on CIFAR-100 and '
      'TinyImageNet).', minimum=0.0, maximum=1.0, max_exclusive=True)
  form: str = hparams.field('reference', "reference: m = b m + (1-b) delta, w += m (the FedDecorr "
                            "reference); tff: m = b m + delta, w += server_lr m (TFF's sgdm).",
                            choices=('reference', 'tff', 'sgdm'))
  server_lr: float = hparams.field(1.0, "server learning rate (form 'tff' only).", minimum=0.0,
                                   min_exclusive=True)
  bn: str = hparams.field('average', 'BN moving statistics: average = FedAvg\'s average (the '
                          'default: trained best, docs/algorithms.md); ema = s <- b s + (1-b) avg '
                          '(older runs\' rule); reference = the same momentum as the '
                          'weights (the reference), variances clamped at 0.',
                          choices=BN_RULES)

  def __post_init__(self):
    super().__post_init__()
    if self.form == 'sgdm':  # An alias: TFF names its server optimizer sgdm.
      object.__setattr__(self, 'form', 'tff')
    if self.form == 'reference' and self.server_lr != 1.0:
      raise ValueError("--fedavgm_server_lr applies only to --fedavgm_form=tff; the reference "
                       "form has none (drop it or use --fedavgm_form=tff).")


class FedAvgM(fedavg.FedAvg):
  name = 'fedavgm'
  HParams = FedAvgMHParams

  @property
  def server_momentum(self) -> float:
    return self.hparams.server_momentum

  @property
  def form(self) -> str:
    return self.hparams.form

  @property
  def server_lr(self) -> float:
    return self.hparams.server_lr

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights],
            'momentum': [np.zeros_like(np.asarray(w)) for w in weights]}

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution, weight, x)
    bn = self.hparams.bn
    new_x, new_m = [], []
    for xi, ai, mi, trainable in zip(x, avg, server_state['momentum'], self.spec.trainable):
      b = tf.constant(self.server_momentum, xi.dtype)  # The weights' float type (float64 too).
      if not trainable and bn != 'reference':  # BN statistics (module docstring).
        new_x.append(b * xi + (1.0 - b) * ai if bn == 'ema' else ai)
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
    if bn == 'reference':  # Momentum can overshoot a variance below zero.
      new_x = base.nonnegative_variances(self.spec, new_x)
    return {'weights': new_x, 'momentum': new_m}
