"""Evaluation of personalised algorithms: each client's own model on that client's test data.

For FedBN (and filter-decomposed FedAvg with coefficients kept local) part of every client's model
never leaves the client, so the server model (shared weights + the initial BN variables) is not a
model anyone deploys. The FedBN paper reports each client's model, with its own BN state, on the
client's test data; the headline number here is their mean weighted by test examples. Client i is
tested on domain i's test split for domain tasks (one domain per client) and on the task's test
split otherwise. Clients never sampled are evaluated with their initial client state.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf


def client_export_dir(output_dir: str, client_id) -> str:
  """Where a personalised run exports client `client_id`'s own model (a SavedModel).

  Args:
    output_dir: the run directory.
    client_id: the client.

  Returns:
    <output_dir>/export/clients/<client_id>/saved_model.
  """
  return os.path.join(output_dir, 'export', 'clients', str(client_id), 'saved_model')


def client_test_datasets(task, data_dir, batch_size: int = 256) -> Callable[[int], tf.data.Dataset]:
  """client id -> its test dataset: its own domain's split for domain tasks, else the test split.

  Args:
    task: the run's task.
    data_dir: where its data is prepared (None: TFDS's default).
    batch_size: examples a batch.

  Returns:
    dataset(client_id); for a domain task it raises ValueError for a client without a domain.

  Raises:
    tasks.base.DatasetNotFoundError: the task's data is not prepared.
  """
  domains = task.domain_test_datasets(data_dir, batch_size)
  shared = None if domains else task.test_dataset(data_dir, batch_size)

  def dataset(client_id: int) -> tf.data.Dataset:
    if not domains:
      return shared
    if int(client_id) not in domains:
      raise ValueError(f'--num_clients: client {client_id} has no domain of {task.name} '
                       f'(domains 0..{len(domains) - 1}).')
    return domains[int(client_id)]

  return dataset


def weighted_summary(per_client: Sequence[dict]) -> dict:
  """Means over clients weighted by their test examples, plus the per-client values in id order.

  Args:
    per_client: each client's evaluation ({'test_accuracy', 'test_examples', maybe 'test_loss'}),
      in client id order; at least one with examples.

  Returns:
    {'test_accuracy', 'per_client_test_accuracy', 'per_client_test_examples'} and 'test_loss'
    when every client has one.
  """
  n = np.array([m['test_examples'] for m in per_client], np.float64)
  acc = np.array([m['test_accuracy'] for m in per_client], np.float64)
  out = {'test_accuracy': float(np.sum(n * acc) / np.sum(n)),
         'per_client_test_accuracy': acc.tolist(),
         'per_client_test_examples': n.astype(int).tolist()}
  if all('test_loss' in m for m in per_client):
    loss = np.array([m['test_loss'] for m in per_client], np.float64)
    out['test_loss'] = float(np.sum(n * loss) / np.sum(n))
  return out


def evaluate_clients(algorithm, server_state, load_client_state: Callable[[str], object],
                     num_clients: int, evaluator, datasets: Callable[[int], tf.data.Dataset]):
  """Evaluates every client's own model (`algorithm.client_weights`) on its test data.

  Args:
    algorithm: the run's (personalised) Algorithm.
    server_state: the server state after the last round.
    load_client_state: client id (str) -> its state (the initial one if never sampled).
    num_clients: clients 0 .. num_clients - 1 are evaluated.
    evaluator: an export.Evaluator.
    datasets: `client_test_datasets`' function.

  Returns:
    `weighted_summary` of the clients' evaluations.

  Raises:
    ValueError: a client without a test domain (domain tasks).
  """
  per_client = []
  for cid in range(num_clients):
    weights = algorithm.client_weights(server_state, load_client_state(str(cid)))
    per_client.append(evaluator.evaluate(weights, datasets(cid)))
  return weighted_summary(per_client)
