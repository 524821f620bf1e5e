"""TFF runtime: a `federated_round.Round` as a `tff.templates.IterativeProcess`.

`next(state, client_inputs, client_states)` is a `tff.federated_computation`:
  state         <algorithm=its server state, aggregator=the aggregation process's state>@SERVER
  client_inputs {<client_id=string, seed=int64>}@CLIENTS
  client_states {algorithm client state}@CLIENTS
returns <new state@SERVER, new client_states@CLIENTS, <train=summed client metrics,
aggregator=the aggregator's measurements, server=the server step's scalars>@SERVER>.

Each client's dataset is built INSIDE the client computation from (client_id, seed) by
`client_dataset_fn`, so datasets never cross into the runtime as serialized arrays (100 MB cap,
re-serialised every round: docs/reference.md §8). What clients compute, what is aggregated and
how the server updates is the Round's (tff_decorr/runtimes/federated_round.py); this module only places
it: client state stays CLIENTS-placed, where a deployed client would keep it. No algorithm math
lives here.

`TffRuntime` gives the process the program's interface: the server state is the algorithm's,
plus the key 'aggregator' (the factory's state, checkpointed with the rest) under a
tff.aggregators factory (bin/train's --aggregator), whose measurements come back with the
metrics as 'aggregator/<name>'; the server step's scalars (FedExP's eta_g, ...) as 'server/<name>'.
"""
from __future__ import annotations

import collections
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import aggregators
from tff_decorr.algorithms import base
from tff_decorr.runtimes import federated_round

CLIENT_INPUT_TYPE = tff.StructType([('client_id', np.str_), ('seed', np.int64)])


def constant_structure(structure):
  """NumPy structure -> the same structure of tf.constant (a computation's initial value)."""
  return tf.nest.map_structure(lambda x: tf.constant(np.asarray(x)), structure)


AGGREGATOR_KEY = 'aggregator'


def _checked_initial_state(algorithm, client_dataset_fn, initial_weights):
  """build_process's argument checks; returns (the initial weights, the initial server state)."""
  if not isinstance(algorithm, base.Algorithm):
    raise ValueError(f'algorithm must be a tff_decorr Algorithm, got {type(algorithm).__name__}.')
  if not callable(client_dataset_fn):
    raise ValueError('client_dataset_fn must be a callable (client_id, seed) -> tf.data.Dataset '
                     'built from TF ops.')
  weights = algorithm.initial_weights() if initial_weights is None else list(initial_weights)
  if len(weights) != algorithm.spec.num_weights:
    raise ValueError(f'initial_weights has {len(weights)} arrays; the model has '
                     f'{algorithm.spec.num_weights} weights (model.weights order).')
  init_server = algorithm.initial_server_state(weights)
  if AGGREGATOR_KEY in init_server:
    raise ValueError(f'algorithm {algorithm.name!r} has a server-state key {AGGREGATOR_KEY!r}, '
                     'which the runtime uses for the aggregator state.')
  return weights, init_server


def _server_computation(round_: federated_round.Round, server_state_type, out_type):
  """(server state, aggregate, exact, total weight) -> <state, metrics> of the server update."""

  @tff.tensorflow.computation(server_state_type, out_type['update'], out_type['exact'],
                              tf.float32)
  def server_tf(server_state, aggregate, exact, total_weight):
    new_state, metrics = round_.server_update_with_metrics(server_state, aggregate, exact,
                                                           total_weight)
    return collections.OrderedDict(state=new_state, metrics=metrics)

  return server_tf


def build_process(algorithm: base.Algorithm,
                  client_dataset_fn: Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset],
                  initial_weights: Optional[Sequence[np.ndarray]] = None,
                  aggregator: Optional[tff.aggregators.AggregationFactory] = None
                  ) -> tff.templates.IterativeProcess:
  """The IterativeProcess of `federated_round.Round(algorithm, aggregator)`.

  `initial_weights` default: algorithm.initial_weights(). `aggregator`: None, the algorithm's
  own weighted sum; or a tff.aggregators factory.
  State: <algorithm=the algorithm's server state, aggregator=the aggregation process's state (empty
  for the plain sum)>; metrics: <train=summed client metrics, aggregator=its measurements,
  server=the algorithm's server_metrics (federated_round.Round.server_update_with_metrics)>.
  """
  weights, init_server = _checked_initial_state(algorithm, client_dataset_fn, initial_weights)
  round_ = federated_round.Round(algorithm, aggregator)
  init_client = algorithm.initial_client_state(weights)

  @tff.tensorflow.computation
  def server_init_tf():
    return constant_structure(init_server)

  @tff.tensorflow.computation
  def client_init_tf():
    return constant_structure(init_client)

  server_state_type = server_init_tf.type_signature.result

  @tff.tensorflow.computation(server_state_type)
  def broadcast_tf(server_state):
    return algorithm.broadcast(server_state)

  @tff.tensorflow.computation(broadcast_tf.type_signature.result, CLIENT_INPUT_TYPE,
                              client_init_tf.type_signature.result)
  def client_tf(broadcast, client_input, client_state):
    # The workspace (Keras models, momentum) is built inside the computation, as TFF's
    # simple_fedavg does.
    work = round_.client_work(round_.new_workspace())
    return work(broadcast, client_dataset_fn(client_input[0], client_input[1]), client_state)

  out_type = client_tf.type_signature.result
  agg = round_.aggregation_process(out_type['update'], out_type['weight'])

  server_tf = _server_computation(round_, server_state_type, out_type)

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(collections.OrderedDict(
        algorithm=tff.federated_eval(server_init_tf, tff.SERVER), aggregator=agg.initialize()))

  state_type = initialize.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(CLIENT_INPUT_TYPE, tff.CLIENTS),
                             tff.FederatedType(client_init_tf.type_signature.result, tff.CLIENTS))
  def next_fn(state, client_inputs, client_states):
    broadcast = tff.federated_broadcast(tff.federated_map(broadcast_tf, state.algorithm))
    outputs = tff.federated_map(client_tf, (broadcast, client_inputs, client_states))
    agg_out, exact, total = round_.aggregate(agg, state.aggregator, outputs)
    server_out = tff.federated_map(server_tf, (state.algorithm, agg_out.result, exact, total))
    new_state = tff.federated_zip(collections.OrderedDict(algorithm=server_out.state,
                                                          aggregator=agg_out.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        train=tff.federated_sum(outputs.metrics), aggregator=agg_out.measurements,
        server=server_out.metrics))
    return new_state, outputs.client_state, metrics

  process = tff.templates.IterativeProcess(initialize, next_fn)
  process.upload_bytes_per_client = round_.upload_bytes_per_client(agg, out_type['exact'])
  return process


class TffRuntime:
  """The IterativeProcess behind the same interface as tf_runtime.TfRuntime (for the program).

  `initialize()` and `run_round(server_state, client_inputs, client_states)` call the process's
  `initialize` and `next` in TFF's default context (install tff_decorr.worker.tff_context first). The
  server state is the algorithm's, plus 'aggregator' (the factory's state) under a factory.
  """

  def __init__(self, algorithm: base.Algorithm,
               client_dataset_fn: Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset],
               initial_weights: Optional[Sequence[np.ndarray]] = None,
               aggregator: Optional[tff.aggregators.AggregationFactory] = None):
    self.algorithm = algorithm
    self.aggregated = aggregator is not None
    self.process = build_process(algorithm, client_dataset_fn, initial_weights, aggregator)
    self._empty_aggregator_state = None  # The plain sum's (empty) state, kept out of checkpoints.

  def initialize(self, initial_weights: Optional[Sequence[np.ndarray]] = None):
    state = self.process.initialize()
    algorithm_state = (state['algorithm'] if initial_weights is None
                       else self.algorithm.initial_server_state(initial_weights))
    if not self.aggregated:
      self._empty_aggregator_state = state['aggregator']
      return algorithm_state
    return {**algorithm_state, AGGREGATOR_KEY: state['aggregator']}

  def run_round(self, server_state, client_inputs, client_states):
    if len(client_inputs) != len(client_states):
      raise ValueError(f'client_states has {len(client_states)} entries but client_inputs has '
                       f'{len(client_inputs)}; pass one state per sampled client.')
    if not client_inputs:
      raise ValueError('client_inputs is empty: sample at least one client per round.')
    inputs = [(str(c), int(s)) for c, s in client_inputs]
    if self.aggregated:
      aggregator_state = server_state[AGGREGATOR_KEY]
    else:
      if self._empty_aggregator_state is None:  # A resumed run that did not call initialize().
        self._empty_aggregator_state = self.process.initialize()['aggregator']
      aggregator_state = self._empty_aggregator_state
    state = collections.OrderedDict(
        algorithm={k: v for k, v in server_state.items() if k != AGGREGATOR_KEY},
        aggregator=aggregator_state)
    new_state, new_client_states, out = self.process.next(state, inputs, list(client_states))
    metrics = {**out['train'], **federated_round.flat_server_metrics(out['server'])}
    if not self.aggregated:
      return dict(new_state['algorithm']), list(new_client_states), metrics
    # Bytes as the aggregator's wire format sends them (compression: its encoded tensors); the
    # update as plain float32 is kept beside it.
    metrics['bytes_up_float32'] = metrics.get('bytes_up', 0.0)
    metrics['bytes_up'] = float(metrics['clients']) * self.process.upload_bytes_per_client
    metrics.update(aggregators.flat_measurements(out['aggregator']))
    return ({**new_state['algorithm'], AGGREGATOR_KEY: new_state['aggregator']},
            list(new_client_states), metrics)
