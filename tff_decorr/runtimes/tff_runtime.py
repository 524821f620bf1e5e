"""TFF runtime: the algorithm's TF functions wrapped as a `tff.templates.IterativeProcess`.

`next(server_state, client_inputs, client_states)` is a `tff.federated_computation`:
  server_state  @SERVER   algorithm.initial_server_state structure
  client_inputs {<client_id=string, seed=int64>}@CLIENTS
  client_states {algorithm client state}@CLIENTS
returns <new server_state@SERVER, new client_states@CLIENTS, summed metrics@SERVER>.

Each client's dataset is built INSIDE the client computation from (client_id, seed) by
`client_dataset_fn`, so datasets never cross into the runtime as serialized arrays (100 MB cap,
re-serialised every round: docs/reference.md §8). The client workspace (Keras model(s) + momentum
variables) is constructed inside the `tff.tensorflow.computation` body, as TFF's simple_fedavg does.
Aggregation is `tff.federated_sum` of contributions and of weights; the server step is the
algorithm's own function. No algorithm math lives here.

With an `aggregator` (a `tff.aggregators` factory, bin/train's --aggregator) clients send deltas
instead (tff_decorr.aggregation), the factory's AggregationProcess replaces the sum, and the
server state gains the key 'aggregator' (the process's state, checkpointed with the rest);
the factory's measurements come back with the metrics as 'aggregator/<name>'.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import aggregation
from tff_decorr.algorithms import base
from tff_decorr.algorithms.workspace import Workspace

CLIENT_INPUT_TYPE = tff.StructType([('client_id', np.str_), ('seed', np.int64)])


def constant_structure(structure):
  """NumPy structure -> the same structure of tf.constant (a computation's initial value)."""
  return tf.nest.map_structure(lambda x: tf.constant(np.asarray(x)), structure)


AGGREGATOR_KEY = 'aggregator'


def build_process(algorithm: base.Algorithm,
                  client_dataset_fn: Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset],
                  initial_weights: Optional[Sequence[np.ndarray]] = None,
                  aggregator: Optional[tff.aggregators.AggregationFactory] = None
                  ) -> tff.templates.IterativeProcess:
  """Builds the IterativeProcess. `initial_weights` default: algorithm.initial_weights().

  `aggregator`: None, the plain sum; or a tff.aggregators factory (`_build_aggregated`).
  """
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
  init_client = algorithm.initial_client_state(weights)

  @tff.tensorflow.computation
  def server_init_tf():
    return constant_structure(init_server)

  @tff.tensorflow.computation
  def client_init_tf():
    return constant_structure(init_client)

  server_state_type = server_init_tf.type_signature.result
  client_state_type = client_init_tf.type_signature.result

  @tff.tensorflow.computation(server_state_type)
  def broadcast_tf(server_state):
    return algorithm.broadcast(server_state)

  if aggregator is not None:
    if AGGREGATOR_KEY in init_server:
      raise ValueError(f'algorithm {algorithm.name!r} has a server-state key {AGGREGATOR_KEY!r}, '
                       'which the runtime uses for the aggregator state.')
    return _build_aggregated(algorithm, client_dataset_fn, aggregator, server_init_tf,
                             client_state_type, broadcast_tf)

  @tff.tensorflow.computation(broadcast_tf.type_signature.result, CLIENT_INPUT_TYPE,
                              client_state_type)
  def client_tf(broadcast, client_input, client_state):
    ws = Workspace(algorithm.model_fn, algorithm.num_models)
    client_step = algorithm.make_client_step(ws)
    dataset = client_dataset_fn(client_input[0], client_input[1])
    return client_step(broadcast, dataset, client_state)

  out_type = client_tf.type_signature.result

  @tff.tensorflow.computation(server_state_type, out_type.contribution, out_type.weight)
  def server_tf(server_state, contribution, weight):
    return algorithm.server_step(server_state, contribution, weight)

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(server_init_tf, tff.SERVER)

  @tff.federated_computation(tff.FederatedType(server_state_type, tff.SERVER),
                             tff.FederatedType(CLIENT_INPUT_TYPE, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(server_state, client_inputs, client_states):
    broadcast = tff.federated_broadcast(tff.federated_map(broadcast_tf, server_state))
    outputs = tff.federated_map(client_tf, (broadcast, client_inputs, client_states))
    contribution = tff.federated_sum(outputs.contribution)
    weight = tff.federated_sum(outputs.weight)
    new_state = tff.federated_map(server_tf, (server_state, contribution, weight))
    metrics = tff.federated_sum(outputs.metrics)
    return new_state, outputs.client_state, metrics

  process = tff.templates.IterativeProcess(initialize, next_fn)
  return process


def _build_aggregated(algorithm, client_dataset_fn, factory, server_init_tf, client_state_type,
                      broadcast_tf):
  """The process with a tff.aggregators factory in place of the sum (module docstring).

  State: <algorithm=the algorithm's server state, aggregator=the AggregationProcess's state>;
  metrics: <train=summed client metrics, aggregator=the process's measurements>.
  """
  aggregation.check_upload(algorithm, '--aggregator')  # Before tracing the client's delta.
  server_state_type = server_init_tf.type_signature.result
  weighted = aggregation.is_weighted(factory)

  @tff.tensorflow.computation(broadcast_tf.type_signature.result, CLIENT_INPUT_TYPE,
                              client_state_type)
  def client_tf(broadcast, client_input, client_state):
    ws = Workspace(algorithm.model_fn, algorithm.num_models)
    client_step = algorithm.make_client_step(ws)
    out = client_step(broadcast, client_dataset_fn(client_input[0], client_input[1]),
                      client_state)
    return collections.OrderedDict(
        update=aggregation.client_update(algorithm, broadcast, out), weight=out.weight,
        one=tf.constant(1.0), client_state=out.client_state, metrics=out.metrics)

  out_type = client_tf.type_signature.result
  agg = aggregation.create(factory, out_type['update'], out_type['weight'], algorithm,
                           state_on_server=False, what='--aggregator')

  @tff.tensorflow.computation(server_state_type, out_type['update'], tf.float32)
  def server_tf(server_state, mean_update, total_weight):
    summed = aggregation.summed_contribution(algorithm, algorithm.broadcast(server_state),
                                             mean_update, total_weight)
    new_state = dict(algorithm.server_step(server_state, summed, total_weight))
    new_state['weights'] = aggregation.nonnegative_variances(algorithm,
                                                             list(new_state['weights']))
    return new_state

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(collections.OrderedDict(
        algorithm=tff.federated_eval(server_init_tf, tff.SERVER), aggregator=agg.initialize()))

  state_type = initialize.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(CLIENT_INPUT_TYPE, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(state, client_inputs, client_states):
    broadcast = tff.federated_broadcast(tff.federated_map(broadcast_tf, state.algorithm))
    outputs = tff.federated_map(client_tf, (broadcast, client_inputs, client_states))
    if weighted:
      agg_out = agg.next(state.aggregator, outputs.update, outputs.weight)
      total = tff.federated_sum(outputs.weight)
    else:
      agg_out = agg.next(state.aggregator, outputs.update)
      total = tff.federated_sum(outputs.one)
    new_algorithm = tff.federated_map(server_tf, (state.algorithm, agg_out.result, total))
    new_state = tff.federated_zip(collections.OrderedDict(algorithm=new_algorithm,
                                                          aggregator=agg_out.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        train=tff.federated_sum(outputs.metrics), aggregator=agg_out.measurements))
    return new_state, outputs.client_state, metrics

  process = tff.templates.IterativeProcess(initialize, next_fn)
  process.upload_bytes_per_client = aggregation.upload_bytes_per_client(agg)
  return process


class TffRuntime:
  """The IterativeProcess behind the same interface as tf_runtime.TfRuntime (for the program).

  `initialize()` and `run_round(server_state, client_inputs, client_states)` call the process's
  `initialize` and `next` in TFF's default context (install tff_decorr.tff_context first).
  """

  def __init__(self, algorithm: base.Algorithm,
               client_dataset_fn: Callable[[tf.Tensor, tf.Tensor], tf.data.Dataset],
               initial_weights: Optional[Sequence[np.ndarray]] = None,
               aggregator: Optional[tff.aggregators.AggregationFactory] = None):
    self.algorithm = algorithm
    self.aggregated = aggregator is not None
    self.process = build_process(algorithm, client_dataset_fn, initial_weights, aggregator)

  def initialize(self, initial_weights: Optional[Sequence[np.ndarray]] = None):
    """The server state: the algorithm's, plus 'aggregator' (its state) with an aggregator."""
    if not self.aggregated:
      if initial_weights is not None:  # The process's initial state is baked in at build time.
        return self.algorithm.initial_server_state(initial_weights)
      return self.process.initialize()
    state = self.process.initialize()
    algorithm_state = (state['algorithm'] if initial_weights is None
                       else self.algorithm.initial_server_state(initial_weights))
    return {**algorithm_state, AGGREGATOR_KEY: state['aggregator']}

  def run_round(self, server_state, client_inputs, client_states):
    if len(client_inputs) != len(client_states):
      raise ValueError(f'client_states has {len(client_states)} entries but client_inputs has '
                       f'{len(client_inputs)}; pass one state per sampled client.')
    if not client_inputs:
      raise ValueError('client_inputs is empty: sample at least one client per round.')
    inputs = [(str(c), int(s)) for c, s in client_inputs]
    if not self.aggregated:
      new_state, new_client_states, metrics = self.process.next(server_state, inputs,
                                                                list(client_states))
      return new_state, list(new_client_states), metrics
    state = collections.OrderedDict(
        algorithm={k: v for k, v in server_state.items() if k != AGGREGATOR_KEY},
        aggregator=server_state[AGGREGATOR_KEY])
    new_state, new_client_states, out = self.process.next(state, inputs, list(client_states))
    metrics = dict(out['train'])
    # Bytes as the aggregator's wire format sends them (compression: its encoded tensors); the
    # update as plain float32 is kept beside it.
    metrics['bytes_up_float32'] = metrics.get('bytes_up', 0.0)
    metrics['bytes_up'] = float(metrics['clients']) * self.process.upload_bytes_per_client
    metrics.update(aggregation.flat_measurements(out['aggregator']))
    return ({**new_state['algorithm'], AGGREGATOR_KEY: new_state['aggregator']},
            list(new_client_states), metrics)
