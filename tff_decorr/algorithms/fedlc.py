"""FedLC (Zhang et al. 2022, "Federated Learning with Label Distribution Skew via Logits
Calibration"), as the FedDecorr reference runs it (approach/fedlogitcal.py).

Client i counts its examples per class, n_c (its local dataset, one epoch), and trains on the
cross-entropy of calibrated logits: logit_c - tau * n_c^(-1/4), every class c. A class the client
does not hold (n_c = 0) gets logit -inf: it leaves the softmax (the reference computes
0^(-1/4) = inf, so its logit is -inf for any tau > 0; its gradient is 0). tau = 0 is FedAvg
exactly (the reference's 0 * inf would be NaN there). Everything else, the server included, is
FedAvg; the model itself is not changed (evaluation uses its plain logits).
The reference's default tau (`--calibration_temp`) is 0.1, also its CIFAR-10 script's value.
docs/algorithms.md has what differs from the paper and why.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg, label_counts


@dataclasses.dataclass(frozen=True)
class FedLCHParams(hparams.HParams):
  component: ClassVar[str] = 'fedlc'
  tau: float = hparams.field(0.1, 'calibration strength: the cross-entropy takes logit_c - '
                             'tau * n_c^(-1/4), n_c the client\'s examples of class c (the '
                             'reference: 0.1).', minimum=0.0)


def calibration(counts: tf.Tensor, tau: float) -> tf.Tensor:
  """[C] offsets subtracted from the logits: tau * n_c^(-1/4), +inf where n_c = 0 (tau > 0).

  Args:
    counts: the client's class sizes n_c, float [C].
    tau: FedLC's calibration strength.

  Returns:
    The offsets, [C], in counts' dtype.
  """
  present = counts > 0
  safe = tf.where(present, counts, tf.ones_like(counts))
  offset = tf.constant(tau, counts.dtype) * tf.pow(safe, -0.25)
  return tf.where(present, offset, tf.fill(tf.shape(counts), tf.constant(float('inf'),
                                                                         counts.dtype)))


class FedLC(fedavg.FedAvg):
  name = 'fedlc'
  needs_local_epochs = True  # Class sizes are the dataset's label counts / local epochs.
  HParams = FedLCHParams

  @property
  def tau(self) -> float:
    return self.hparams.tau

  def _client_step(self, ws, broadcast, dataset, client_state):
    adjust = None
    if self.tau > 0:
      counts = label_counts.dataset_label_counts(dataset, label_counts.num_classes(ws.model))
      offset = calibration(counts / float(self.local_epochs), self.tau)
      adjust = lambda logits: logits - tf.cast(offset, logits.dtype)
    res = self._train(ws, broadcast['weights'], dataset, logit_adjustment=adjust)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             client_state, res.metrics)
