"""FedAdagrad, FedAdam, FedYogi (Reddi et al. 2021, "Adaptive Federated Optimization") as the
FedDecorr reference runs them (its `fedoptim` approach with --server_optimizer adagrad/adam/yogi).

Clients train as in FedAvg. The server treats delta = avg_i(y_i) - x (the example-weighted average
of the clients' models minus the global model, the pseudo-gradient's negative) with an adaptive
optimiser, per coordinate, without bias correction:
  m <- b1 m + (1 - b1) delta
  v <- v + delta^2                                    (adagrad)
  v <- b2 v + (1 - b2) delta^2                        (adam)
  v <- v - (1 - b2) delta^2 sign(v - delta^2)         (yogi)
  x <- x + server_lr m / (sqrt(v) + tau)
with m = v = 0 initially. Server state {weights, m, v} (both moments of every weight), so a
checkpoint resumes exactly. Each round reports `server/update_norm` (|x_new - x|) and
`server/pseudo_gradient_norm` (|delta|), over the whole model state (metrics.csv, TensorBoard).

Differences from the paper (Algorithm 2 of Reddi et al.), all following the reference:
- v starts at 0, not at v_{-1} >= tau^2 (with tau = 1e-3 the difference is at most tau^2 = 1e-6
  in v, i.e. only the first rounds' steps of coordinates with tiny updates change);
- the whole model state goes through the optimiser, BN moving mean and variance included
  (`bn='reference'`); the paper's experiments have no BN statistics (they replace BatchNorm by
  GroupNorm) and TFF's own server optimisers see trainable weights only. An adaptive step moves a
  statistic by about server_lr per round whatever the clients report, so it lags (and can step a
  small variance below zero: variances are clamped at 0 afterwards, base.nonnegative_variances;
  the reference has no such guard). `bn='average'` gives the statistics FedAvg's plain average
  instead (their moments stay 0).
PyTorch's num_batches_tracked, which the reference also pushes through the optimiser (and then
truncates back to an integer), has no Keras counterpart and only matters for BN with momentum None.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg

BN_RULES = ('reference', 'average')


@dataclasses.dataclass(frozen=True)
class FedOptHParams(hparams.HParams):
  """What the three share (not registered itself: each algorithm has its own flag prefix)."""
  server_lr: float = hparams.field(
      0.01, 'server learning rate: 0.01, measured best for fedadam and fedyogi over the paper\'s '
      'powers of ten (bench.accuracy.server_defaults; also the reference\'s run script, '
      'run_scripts/cifar10_fedadam.sh); fedadagrad 0.1.', minimum=0.0, min_exclusive=True)
  beta1: float = hparams.field(0.9, 'first-moment coefficient b1 (the reference: 0.9).',
                               minimum=0.0, maximum=1.0, max_exclusive=True)
  tau: float = hparams.field(1e-3, 'epsilon added to sqrt(v) (the reference and the paper: 1e-3).',
                             minimum=0.0, min_exclusive=True)
  bn: str = hparams.field('average', 'BN moving statistics: average = FedAvg\'s average (the '
                          'default, measured: bench.accuracy.server_defaults); reference = through '
                          'the optimiser like every weight, as the reference (variances clamped '
                          'at 0).', choices=BN_RULES)


@dataclasses.dataclass(frozen=True)
class FedAdagradHParams(FedOptHParams):
  component: ClassVar[str] = 'fedadagrad'
  server_lr: float = hparams.field(
      0.1, 'server learning rate: 0.1, measured best over the paper\'s powers of ten '
      '(bench.accuracy.server_defaults); the reference\'s run script has 0.01.', minimum=0.0,
      min_exclusive=True)


@dataclasses.dataclass(frozen=True)
class FedAdamHParams(FedOptHParams):
  component: ClassVar[str] = 'fedadam'
  beta2: float = hparams.field(0.99, 'second-moment coefficient b2 (the reference: 0.99).',
                               minimum=0.0, maximum=1.0, max_exclusive=True)


@dataclasses.dataclass(frozen=True)
class FedYogiHParams(FedOptHParams):
  component: ClassVar[str] = 'fedyogi'
  beta2: float = hparams.field(0.99, 'second-moment coefficient b2 (the reference: 0.99).',
                               minimum=0.0, maximum=1.0, max_exclusive=True)


class FedOpt(fedavg.FedAvg):
  """Base of the three: FedAvg's clients and upload, an adaptive server step. Subclasses give
  `_second_moment(v, delta_squared)`."""

  name = ''  # Not registered itself.
  HParams = FedOptHParams

  def initial_server_state(self, weights):
    zeros = lambda: [np.zeros_like(np.asarray(w)) for w in weights]
    return {'weights': [np.asarray(w) for w in weights], 'm': zeros(), 'v': zeros()}

  def _second_moment(self, v, d2):
    raise NotImplementedError

  def server_step(self, server_state, contribution, weight):
    hp = self.hparams
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution, weight, x)
    new_x, new_m, new_v = [], [], []
    for xi, ai, mi, vi, trainable in zip(x, avg, server_state['m'], server_state['v'],
                                         self.spec.trainable):
      mi, vi = tf.convert_to_tensor(mi), tf.convert_to_tensor(vi)
      if not trainable and hp.bn == 'average':
        new_x.append(ai)
        new_m.append(mi)
        new_v.append(vi)
        continue
      d = ai - xi
      m = hp.beta1 * mi + (1.0 - hp.beta1) * d
      v = self._second_moment(vi, tf.square(d))
      new_x.append(xi + hp.server_lr * m / (tf.sqrt(v) + hp.tau))
      new_m.append(m)
      new_v.append(v)
    return {'weights': base.nonnegative_variances(self.spec, new_x), 'm': new_m, 'v': new_v}

  def server_metrics(self, server_state, contribution, weight, new_state):
    """server/update_norm and server/pseudo_gradient_norm (base.step_norms: over the whole model
    state, so under bn='average' they include the statistics' jump to the clients' average)."""
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    delta = [a - xi for a, xi in zip(base.safe_average(contribution, weight, x), x)]
    return base.step_norms(server_state, new_state, delta)


class FedAdagrad(FedOpt):
  name = 'fedadagrad'
  HParams = FedAdagradHParams

  def _second_moment(self, v, d2):
    return v + d2


class FedAdam(FedOpt):
  name = 'fedadam'
  HParams = FedAdamHParams

  def _second_moment(self, v, d2):
    b2 = self.hparams.beta2
    return b2 * v + (1.0 - b2) * d2


class FedYogi(FedOpt):
  name = 'fedyogi'
  HParams = FedYogiHParams

  def _second_moment(self, v, d2):
    return v - (1.0 - self.hparams.beta2) * d2 * tf.sign(v - d2)
