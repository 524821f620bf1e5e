"""FedRS (Li & Zhan 2021, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data"), as the FedDecorr reference runs it (approach/fedrs.py).

Client i's cross-entropy takes the logits of the classes it does not hold (no example in its local
dataset) multiplied by alpha, the others unchanged: s_c * logit_c with s_c = 1 if the client has
class c, else alpha. The reference multiplies the network's output logits (the classifier's bias included); the paper
scales a missing class's classifier weight vector, alpha * w_c^T h, which is the same for a
classifier without bias (docs/algorithms.md). alpha = 1 is FedAvg exactly. Server: as FedAvg; evaluation uses the
model's plain logits. The reference's default alpha (`--restricted_strength`) is 0.5, also its
CIFAR-10 script's value.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg, label_counts


@dataclasses.dataclass(frozen=True)
class FedRSHParams(hparams.HParams):
  component: ClassVar[str] = 'fedrs'
  alpha: float = hparams.field(0.5, 'restricted-softmax strength: logits of classes a client does '
                               'not hold are multiplied by alpha in its cross-entropy (the '
                               'reference: 0.5).', minimum=0.0, maximum=1.0)


class FedRS(fedavg.FedAvg):
  name = 'fedrs'
  HParams = FedRSHParams

  @property
  def alpha(self) -> float:
    return self.hparams.alpha

  def _client_step(self, ws, broadcast, dataset, client_state):
    adjust = None
    if self.alpha != 1.0:
      counts = label_counts.dataset_label_counts(dataset, label_counts.num_classes(ws.model))
      scale = tf.where(counts > 0, tf.ones_like(counts), tf.fill(tf.shape(counts), self.alpha))
      adjust = lambda logits: logits * tf.cast(scale, logits.dtype)
    res = self._train(ws, broadcast['weights'], dataset, logit_adjustment=adjust)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             client_state, res.metrics)
