"""The Experiment: a resolved configuration (tff_decorr.configs.config) composed into the pieces
of a run: task data, model, regulariser, algorithm, runtime, evaluation and export. It sits above
the registries (tasks, models, algorithms, regularizers, partitions), which know nothing of each
other; the training program (tff_decorr.program.training), the benchmarks and the end-to-end
tests share it. It runs no round: the round loop is tff_decorr.program.round_loop.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

import tensorflow as tf

from tff_decorr.tasks import client_data
from tff_decorr.tasks import registry as task_registry
from tff_decorr import aggregators
from tff_decorr import algorithms
from tff_decorr.configs import config as config_lib
from tff_decorr.run_files import export
from tff_decorr import models
from tff_decorr.models import precision
from tff_decorr import partitions
from tff_decorr import regularizers


def client_partition(config: config_lib.Config, task, labels, domains) -> list:
  """The clients' index arrays into the task's train split (`labels`, `domains` from
  task.load_split) under the configuration's partition, client count and seed: what a run trains
  on, and what bin/partition shows.

  Args:
    config: the run's Config (partition, its settings, num_clients, seed, task).
    task: the task (its num_classes).
    labels: int labels of the train split, [N].
    domains: domain ids [N], or None for a task without domains.

  Returns:
    A list of num_clients int arrays of indices into the split.

  Raises:
    ValueError: the partition cannot split these labels into that many clients.
  """
  data = partitions.Data(labels=labels, domains=domains, num_classes=task.num_classes,
                         task=config.task)
  return partitions.split(config.partition, data, config.num_clients, config.seed,
                          config.component_hparams('partition'))


class Experiment:
  """The pieces of one run, built from a validated Config."""

  def __init__(self, config: config_lib.Config, log=print):
    config_lib.validate(config)
    self.config = c = config
    self.task = task_registry.get(c.task)
    self.model_name = c.model or self.task.default_model
    self.log = log
    # The architecture beyond the task's shapes; exports record it, to be read back as data.
    self._architecture = export.model_kwargs(c.projection_dim, c.decomposed, c.num_atoms, c.init)
    self._model_kwargs = dict(num_classes=self.task.num_classes,
                              input_shape=self.task.input_shape, **self._architecture)
    self.regularizer = regularizers.get(c.regularizer, c.component_hparams('regularizer'))
    # Local epochs live in the client dataset (tasks.client_data): each epoch's order is a stateless
    # function of (seed, epoch), identical in both runtimes, so the update loop makes one pass.
    tf.keras.utils.set_random_seed(c.seed)  # The initial global model depends only on the seed.
    self.algorithm = algorithms.build(c.algorithm, self.model_fn, c.client_optimizer,
                                      self.regularizer, c.component_hparams('algorithm'),
                                      num_clients=c.num_clients,
                                      local_epochs=int(c.local_epochs))
    # The tff.aggregators factory of --aggregator (None: the runtimes' plain sum). Built here, so
    # a bad setting fails before the run directory is written.
    self.aggregator = aggregators.build(
        c.aggregator, c.component_hparams('aggregator'),
        aggregators.RunShape(num_clients=c.num_clients, clients_per_round=c.clients_per_round,
                             rounds=c.rounds))

  def model_fn(self) -> tf.keras.Model:
    """A new model of the run's architecture and precision (what every workspace builds).

    Returns:
      A Keras model with {'representation', 'logits'} outputs, freshly initialised.
    """
    return precision.build(lambda: models.build(self.model_name, **self._model_kwargs),
                           self.config.precision)

  # ---- data ----
  def prepare_client_data(self):
    """Decodes the train split once, partitions it, writes one shard per client (cached).

    Sets `partition`, `train_labels`, `shard_dir`, `client_dataset_fn` and `ledger` (the privacy
    ledger of these examples under a DP aggregator, else None).

    Returns:
      The partition: a list of index arrays, one per client.

    Raises:
      tasks.base.DatasetNotFoundError: the task's data is not prepared.
      ValueError: the partition cannot split the data as configured.
      OSError: the shards cannot be written.
    """
    c = self.config
    images, labels, domains = self.task.load_split('train', c.data_dir or None)
    n = len(labels)
    parts = client_partition(c, self.task, labels, domains)
    key = hashlib.sha256(json.dumps({
        'task': c.task, 'partition': c.partition, 'settings': c.component_hparams('partition').to_dict(),
        'seed': c.seed, 'num_clients': c.num_clients, 'n': int(n)},
        sort_keys=True).encode()).hexdigest()[:12]
    cache_root = c.cache_dir or os.path.join(os.path.expanduser('~'), '.cache', 'tff_decorr')
    shard_dir = os.path.join(cache_root, c.task, f'{c.partition}-{key}')
    # The privacy ledger of these examples (run_files/privacy_ledger.py), outside the cache; a
    # ledger an earlier release kept beside the shards is moved into it before a rebuild could
    # delete it.
    self.ledger = None
    from tff_decorr.run_files import privacy_ledger  # pylint: disable=g-import-not-at-top
    if (isinstance(self.aggregator, aggregators.AccountedDpFactory) or
        os.path.exists(os.path.join(shard_dir, privacy_ledger.FILE_NAME))):
      self.ledger = privacy_ledger.open_for_run(c.task, client_data.examples_hash(images, labels),
                                                [shard_dir], log=self.log)
    client_data.write_client_shards(images, labels, parts, shard_dir, log=self.log)
    self.partition = parts
    self.train_labels = labels
    self.shard_dir = shard_dir
    # FedUV's official code drops each epoch's last incomplete batch (drop_last=True); FedDecorr's
    # reference keeps it. A FedUV client smaller than a batch trains on nothing (weight 0).
    self.client_dataset_fn = self.task.client_dataset_fn(shard_dir, batch_size=c.batch_size,
                                                         epochs=int(c.local_epochs),
                                                         drop_remainder=regularizers.drops_last_batch(c.regularizer))
    return parts

  def check_client_data(self, client_ids) -> None:
    """Before a round: every sampled client's cached shard is still the one written.

    Args:
      client_ids: the round's sampled clients.

    Raises:
      tasks.client_data.ShardError: a shard was deleted or changed during the run.
    """
    client_data.check_shards(self.shard_dir, client_ids)

  def test_dataset(self, batch_size: int = 256) -> tf.data.Dataset:
    """The task's test split, preprocessed and batched.

    Args:
      batch_size: examples a batch.

    Returns:
      A dataset of (float32 images, int32 labels).

    Raises:
      tasks.base.DatasetNotFoundError: the task's data is not prepared.
    """
    return self.task.test_dataset(self.config.data_dir or None, batch_size)

  # ---- runtime ----
  def runtime(self, output_dir: Optional[str] = None):
    """The runtime of `--runtime`. Build it before any Keras model that will be *called* later:
    the TFF runtime traces Keras models inside a graph, and Keras 2.14 then refuses models created
    earlier outside it ("Layer or Model is in an invalid state").

    Call after `prepare_client_data` (the runtime reads `client_dataset_fn`).

    Args:
      output_dir: the run directory (TFF's worker writes tff_worker.log there); None: no log.

    Returns:
      A tf_runtime.TfRuntime or a tff_runtime.TffRuntime (after installing TFF's context).
    """
    c = self.config
    if config_lib.choose_runtime(c.runtime, c.workers, c.aggregator)[0] == 'tf':
      from tff_decorr.runtimes import tf_runtime  # pylint: disable=g-import-not-at-top
      # -1: one client per CPU core on a CPU, one at a time on a GPU (tf_runtime's docstring).
      concurrency = c.max_concurrent_computation_calls
      return tf_runtime.TfRuntime(self.algorithm, self.client_dataset_fn,
                                  concurrency=None if concurrency < 1 else concurrency)
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    from tff_decorr.runtimes import tff_runtime  # pylint: disable=g-import-not-at-top
    workers = [w for w in c.workers.split(',') if w] if c.workers else []
    log_path = os.path.join(output_dir, 'tff_worker.log') if output_dir else None
    tff_context.install(max_concurrent_computation_calls=c.max_concurrent_computation_calls,
                        log_path=log_path, workers=workers)
    return tff_runtime.TffRuntime(self.algorithm, self.client_dataset_fn,
                                  aggregator=self.aggregator)

  def dp_not_covered(self, save_local_models=()) -> list:
    """What --aggregator=dp's epsilon does not cover in this run: the aggregator's own list
    (aggregators.DP_NOT_COVERED) and the per-client outputs the run writes without noise.

    Those outputs are listed rather than refused: they are the simulation's measurements (the
    local models of chosen clients, a sampled client's spectrum, a personalised algorithm's
    per-client models), which a study of collapse or personalisation under DP needs, and the
    run's operator already holds every client's data; like the metrics, they must not be
    published as if dp_epsilon covered them. The log says so at the start (training.py).

    Call only under --aggregator=dp (the aggregator is an AccountedDpFactory).

    Args:
      save_local_models: the client indices whose local models the run exports.

    Returns:
      A list of sentences.
    """
    c = self.config
    out = self.aggregator.not_covered()
    if save_local_models:
      out.append(f'--save_local_models={",".join(str(i) for i in save_local_models)}: those '
                 'clients\' local models, exported un-noised and unclipped under local_models/')
    if c.track_collapse:
      out.append('--track_collapse: the representation spectrum of one sampled client\'s local '
                 'model each round (local_effective_rank, local_num_significant_sv, '
                 'local_client), computed from its un-noised, unclipped local model')
    if self.algorithm.personalized:
      out.append(f'--algorithm={c.algorithm}: each client\'s own model (the variables it keeps '
                 'local), exported un-noised under export/clients/ and evaluated per client')
    return out

  def privacy(self, model_rounds: int, ledger=None, save_local_models=()) -> dict:
    """(epsilon, delta) after `model_rounds` rounds under --aggregator=dp, which clipping ran, what
    it assumes and does not cover (dp_not_covered), and the epsilon of every DP release recorded in
    `ledger` (a privacy_ledger.Ledger of this client data); under an aggregator whose guarantee
    needs a caveat (secure: simulated), that caveat; else {}.

    Args:
      model_rounds: the rounds the run's model has had (its final round).
      ledger: the privacy_ledger.Ledger of this client data, or None.
      save_local_models: as `dp_not_covered`'s.

    Returns:
      The summary.json entries (dp_epsilon, dp_delta, dp_clipping, ... or aggregator_note), or
      {}.
    """
    note = aggregators.note(self.config.aggregator)
    if note:
      return {'aggregator_note': f'--aggregator={self.config.aggregator}: {note}'}
    if not isinstance(self.aggregator, aggregators.AccountedDpFactory) or model_rounds < 1:
      return {}
    # The factory's table covers rounds 1..config.rounds, the most a summary can report.
    out = {'dp_epsilon': float(self.aggregator.epsilons[model_rounds - 1]),
           'dp_delta': self.aggregator.target_delta,
           **self.aggregator.clipping(),
           'dp_assumes': list(aggregators.DP_ASSUMES),
           'dp_not_covered': self.dp_not_covered(save_local_models)}
    if ledger is not None:
      from tff_decorr.run_files import privacy_ledger  # pylint: disable=g-import-not-at-top
      # The ledger's releases and those only the run directories beside this one still hold.
      account = privacy_ledger.account(ledger, self.config.output_dir, model_rounds)
      entries, unreadable = account.releases, len(account.unreadable_lines)
      out.update({
          'dp_ledger': ledger.path, 'dp_releases_on_data': len(entries),
          'dp_epsilon_all_releases': aggregators.dp_epsilon_of_releases(
              privacy_ledger.grouped(entries), self.aggregator.target_delta)})
      if account.missing:
        out['dp_ledger_missing_releases'] = account.missing
        out['dp_ledger_note'] = account.note()
      if account.found_in_runs:
        out['dp_ledger_found_in_run_dirs'] = account.found_in_runs
      if unreadable:
        out['dp_ledger_unreadable_lines'] = unreadable
      if len(entries) > model_rounds or unreadable:
        out['dp_note'] = (
            f'{len(entries)} DP rounds were released on this data, {model_rounds} of them in '
            'this run\'s model (the others: earlier runs, runs under another seed or partition '
            'of the same examples, --overwrite, deleted checkpoints, or rounds re-run after a '
            'crash); dp_epsilon counts this run\'s model only, '
            'dp_epsilon_all_releases counts every release'
            + (f'; {unreadable} unreadable ledger lines are not counted' if unreadable else ''))
    return out

  # ---- evaluation / export ----
  def evaluator(self) -> export.Evaluator:
    """An evaluator of global weights on the test set (its own model of the architecture).

    Returns:
      An `export.Evaluator`.
    """
    return export.Evaluator(self.model_fn, self.task.num_classes)

  def export(self, weights, path: str, extra_metadata: Optional[dict] = None) -> str:
    """Writes `weights` as a SavedModel whose tff_decorr.json records the run's architecture.

    Args:
      weights: the model's flat weights, in `model.weights` order.
      path: the export directory (replaced atomically).
      extra_metadata: more tff_decorr.json entries (the round, a client's id).

    Returns:
      `path`.

    Raises:
      OSError: the export cannot be written.
    """
    return export.export_saved_model(self.model_fn, weights, path, {
        'task': self.config.task, 'model': self.model_name,
        'algorithm': self.config.algorithm, 'regularizer': self.config.regularizer,
        'precision': self.config.precision, 'model_kwargs': self._architecture,
        **(extra_metadata or {})})


