"""FedAvg (McMahan et al. 2017) as the reference runs it.

Client i trains from the global weights x with local SGD (client_update.local_train) and returns
y_i. Server: x <- sum_i n_i y_i / sum_i n_i over the WHOLE model state, n_i = the client's number of
examples. BN moving statistics are averaged too (the reference averages `state_dict`), unlike
TFF's stock FedAvg, which leaves non-trainable variables at their initial values.
"""

from __future__ import annotations

from tff_decorr.algorithms import base


class FedAvg(base.Algorithm):
  name = 'fedavg'
  upload = 'model'

  def _client_step(self, ws, broadcast, dataset, client_state):
    res = self._train(ws, broadcast['weights'], dataset)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             client_state, res.metrics)

  def server_step(self, server_state, contribution, weight):
    return {'weights': base.safe_average(contribution, weight, server_state['weights'])}
