"""MOON (Li et al. 2021): model-contrastive federated learning.

For a batch, z = representation of the local model being trained, z_g = of the global model (the
broadcast weights), z_p = of this client's previous local model; all in inference mode for z_g, z_p
(no BN statistic updates, no gradient). With cosine similarity sim and temperature T:
  l_con = -log( exp(sim(z, z_g)/T) / (exp(sim(z, z_g)/T) + exp(sim(z, z_p)/T)) )
Local loss += mu * mean_batch(l_con). The reference never applies T; we do (default T = 0.5).
Client state = the previous local model's full weights, initialised to the initial global model.
Server: as FedAvg.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg
from tff_decorr.algorithms.workspace import Workspace


@dataclasses.dataclass(frozen=True)
class MoonHParams(hparams.HParams):
  component: ClassVar[str] = 'moon'
  mu: float = hparams.field(1.0, 'weight of the model-contrastive loss (the papers: 1.0).',
                            minimum=0.0)
  temperature: float = hparams.field(0.5, 'temperature of the contrastive softmax.', minimum=0.0,
                                     min_exclusive=True)


class Moon(fedavg.FedAvg):
  name = 'moon'
  stateful = True  # Its previous local model.
  num_models = 3  # local (trained), global, previous local
  projection_head = True  # A task's projection-head width (--projection_dim) applies to MOON.
  HParams = MoonHParams

  @property
  def mu(self) -> float:
    return self.hparams.mu

  @property
  def temperature(self) -> float:
    return self.hparams.temperature

  def initial_client_state(self, weights):
    return {'previous': [np.asarray(w) for w in weights]}

  def _client_step(self, ws, broadcast, dataset, client_state):
    global_model, previous_model = ws.aux_models
    Workspace.assign(global_model.weights, broadcast['weights'])
    Workspace.assign(previous_model.weights, client_state['previous'])
    mu, inv_t = float(self.mu), 1.0 / float(self.temperature)

    def contrastive(outputs, images, labels):
      del labels
      z = tf.math.l2_normalize(outputs['representation'], axis=-1)
      # Constants in the model's float type (float64 in the reference equivalence tests).
      mu_c, inv_t_c = tf.constant(mu, z.dtype), tf.constant(inv_t, z.dtype)
      zg = tf.math.l2_normalize(
          tf.stop_gradient(global_model(images, training=False)['representation']), axis=-1)
      zp = tf.math.l2_normalize(
          tf.stop_gradient(previous_model(images, training=False)['representation']), axis=-1)
      logits = tf.stack([tf.reduce_sum(z * zg, -1), tf.reduce_sum(z * zp, -1)], axis=1) * inv_t_c
      return mu_c * tf.reduce_mean(-tf.nn.log_softmax(logits, axis=1)[:, 0])

    res = self._train(ws, broadcast['weights'], dataset, extra_loss=contrastive)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             {'previous': res.weights}, res.metrics)
