"""FedBN evaluation as the FedBN paper reports it: each client's accuracy with its own BN state.

FedBN's server model keeps its initial BatchNorm variables (they never leave the clients), so the
global model alone is not what FedBN deploys. Client i is evaluated with the global non-BN weights
and its own BN variables from the run's client-state store, on its own domain's test split for
domain tasks (client i <-> domain i) and on the task's test split otherwise.
"""

from __future__ import annotations

import dataclasses
import os

from tff_decorr import client_state
from tff_decorr import experiment
from tff_decorr import program


def client_weights(global_weights, bn_values, batchnorm_mask):
  """Global weights with the BatchNorm entries replaced by a client's own (same order)."""
  bn = iter(bn_values)
  return [next(bn) if is_bn else w for w, is_bn in zip(global_weights, batchnorm_mask)]


def per_client_accuracy(run_root: str, cfg: dict, task, data_dir, batch_size: int) -> dict:
  """{client id: test accuracy with that client's BN state} for a FedBN run directory."""
  names = {f.name for f in dataclasses.fields(experiment.Config)}
  config = experiment.Config(**{k: v for k, v in cfg.items() if k in names})
  exp = experiment.Experiment(config, log=lambda s: None)
  alg = exp.algorithm
  initial = alg.initial_weights()
  state = program.load_checkpoint(run_root, alg.initial_server_state(initial))
  if state is None:
    raise ValueError(f'--saved_model={run_root}: the run has no checkpoint to read client BN '
                     'states from.')
  store = client_state.ClientStateStore(os.path.join(run_root, 'client_states'),
                                        initial_fn=lambda: alg.initial_client_state(initial))
  store.load_manifest(program.client_manifest_path(run_root, int(state['round'])))
  global_weights = alg.global_weights(state['server_state'])
  domain_sets = task.domain_test_datasets(data_dir, batch_size)
  shared_test = None if domain_sets else task.test_dataset(data_dir, batch_size)
  evaluator = exp.evaluator()
  out = {}
  for cid in range(config.num_clients):
    key = str(cid)
    if key not in store:
      continue  # Never sampled: it has no BN state of its own.
    weights = client_weights(global_weights, store.load(key)['bn'], alg.spec.batchnorm)
    dataset = domain_sets.get(cid, shared_test) if domain_sets else shared_test
    if dataset is None:
      continue
    out[key] = evaluator.evaluate(weights, dataset)['test_accuracy']
  return out
