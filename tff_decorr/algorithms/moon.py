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

import numpy as np
import tensorflow as tf

from tff_decorr.algorithms import base, fedavg
from tff_decorr.algorithms.client_update import Workspace


class Moon(fedavg.FedAvg):
  name = 'moon'
  num_models = 3  # local (trained), global, previous local

  def __init__(self, model_fn, config=base.ClientConfig(), regularizer=None, mu: float = 1.0,
               temperature: float = 0.5):
    if mu < 0:
      raise ValueError(f'mu (MOON contrastive coefficient) must be >= 0, got {mu!r}.')
    if not temperature > 0:
      raise ValueError(f'temperature must be > 0, got {temperature!r}.')
    super().__init__(model_fn, config, regularizer)
    self.mu = float(mu)
    self.temperature = float(temperature)

  def initial_client_state(self, weights):
    return {'previous': [np.asarray(w) for w in weights]}

  def _client_step(self, ws, broadcast, dataset, client_state):
    global_model, previous_model = ws.aux_models
    Workspace.assign(global_model.weights, broadcast['weights'])
    Workspace.assign(previous_model.weights, client_state['previous'])
    mu = tf.constant(self.mu, tf.float32)
    inv_t = tf.constant(1.0 / self.temperature, tf.float32)

    def contrastive(outputs, images, labels):
      del labels
      z = tf.math.l2_normalize(outputs['representation'], axis=-1)
      zg = tf.math.l2_normalize(
          tf.stop_gradient(global_model(images, training=False)['representation']), axis=-1)
      zp = tf.math.l2_normalize(
          tf.stop_gradient(previous_model(images, training=False)['representation']), axis=-1)
      logits = tf.stack([tf.reduce_sum(z * zg, -1), tf.reduce_sum(z * zp, -1)], axis=1) * inv_t
      return mu * tf.reduce_mean(-tf.nn.log_softmax(logits, axis=1)[:, 0])

    res = self._train(ws, broadcast['weights'], dataset, extra_loss=contrastive)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             {'previous': res.weights}, res.metrics)
