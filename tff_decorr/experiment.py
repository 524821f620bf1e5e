"""From a resolved configuration to the pieces of a run: task data, model, regulariser, algorithm,
runtime, evaluation and export. bin/train, the benchmarks and the end-to-end tests share it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tasks import client_data
from tasks import registry as task_registry
from tff_decorr import algorithms
from tff_decorr import export
from tff_decorr import models
from tff_decorr import partitions
from tff_decorr import regularizers
from tff_decorr.algorithms.client_update import ClientConfig

RUNTIMES = ('tff', 'tf')
PARTITIONS = ('dirichlet', 'pathological', 'iid', 'domain')


@dataclasses.dataclass
class Config:
  """Every setting of a run. Defaults here are generic; the task's paper settings override them,
  and explicit flags override both (resolved by bin/train)."""
  task: str = 'digits'
  model: str = ''
  algorithm: str = 'fedavg'
  regularizer: str = 'feddecorr'
  beta: float = 0.1
  feduv_lambda: float = 2.5
  feduv_mu: float = 0.5
  partition: str = 'dirichlet'
  alpha: float = 0.5
  classes_per_client: int = 2
  num_clients: int = 10
  clients_per_round: int = 10
  rounds: int = 10
  local_epochs: int = 1
  batch_size: int = 64
  client_lr: float = 0.01
  momentum: float = 0.9
  weight_decay: float = 1e-5
  seed: int = 0
  mu: float = 1e-3
  temperature: float = 0.5
  projection_dim: int = 0
  server_lr: float = 1.0
  server_momentum: float = 0.9
  fedavgm_form: str = 'reference'
  decomposed: bool = False
  num_atoms: int = 0
  coefficient_period: int = 1
  runtime: str = 'tff'
  eval_every: int = 1
  export_every: int = 0
  data_dir: str = ''
  cache_dir: str = ''
  output_dir: str = ''
  workers: str = ''
  max_concurrent_computation_calls: int = -1
  track_collapse: bool = False

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  def result_hash(self) -> str:
    from tff_decorr import run_dir  # pylint: disable=g-import-not-at-top
    d = {k: v for k, v in self.to_dict().items() if k not in run_dir.RESUMABLE_KEYS}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def validate(c: Config) -> None:
  """Checks what can be checked before any data is read. Errors name the flag and the fix."""
  def bad(flag, msg):
    raise ValueError(f'--{flag}: {msg}')
  if c.task not in task_registry.names():
    bad('task', f'unknown task {c.task!r}; choose one of {", ".join(task_registry.names())}.')
  if c.model and c.model not in models.names():
    bad('model', f'unknown model {c.model!r}; choose one of {", ".join(models.names())}.')
  if c.algorithm not in algorithms.names():
    bad('algorithm', f'unknown algorithm {c.algorithm!r}; choose one of '
        f'{", ".join(algorithms.names())}.')
  if c.regularizer not in regularizers.names():
    bad('regularizer', f'unknown regularizer {c.regularizer!r}; choose one of '
        f'{", ".join(regularizers.names())}.')
  if c.partition not in PARTITIONS:
    bad('partition', f'unknown partition {c.partition!r}; choose one of {", ".join(PARTITIONS)}.')
  if c.runtime not in RUNTIMES:
    bad('runtime', f'unknown runtime {c.runtime!r}; choose tff (TFF C++ runtime, CPU, remote '
        'workers) or tf (in-process, uses a GPU).')
  if not c.alpha > 0:
    bad('alpha', f'must be > 0 (smaller is more heterogeneous; inf gives IID), got {c.alpha}.')
  for flag in ('num_clients', 'clients_per_round', 'rounds', 'local_epochs', 'batch_size',
               'eval_every', 'classes_per_client'):
    if int(getattr(c, flag)) < 1:
      bad(flag, f'must be >= 1, got {getattr(c, flag)}.')
  if c.clients_per_round > c.num_clients:
    bad('clients_per_round', f'{c.clients_per_round} is more than --num_clients='
        f'{c.num_clients}; sample at most every client.')
  for flag in ('beta', 'feduv_lambda', 'feduv_mu', 'weight_decay', 'mu', 'export_every'):
    if getattr(c, flag) < 0:
      bad(flag, f'must be >= 0, got {getattr(c, flag)}.')
  if not c.client_lr > 0:
    bad('client_lr', f'must be > 0, got {c.client_lr}.')
  if not 0 <= c.momentum < 1:
    bad('momentum', f'must be in [0, 1), got {c.momentum}.')
  if not 0 <= c.server_momentum < 1:
    bad('server_momentum', f'must be in [0, 1), got {c.server_momentum}.')
  if not c.temperature > 0:
    bad('temperature', f'must be > 0, got {c.temperature}.')
  if not c.server_lr > 0:
    bad('server_lr', f'must be > 0, got {c.server_lr}.')
  if c.fedavgm_form not in ('reference', 'tff'):
    bad('fedavgm_form', f'choose reference or tff, got {c.fedavgm_form!r}.')
  if c.algorithm == 'fedavg_decomposed' and not c.decomposed:
    bad('decomposed', '--algorithm=fedavg_decomposed averages atoms and coefficients of '
        'filter-decomposed convolutions; pass --decomposed.')
  if c.coefficient_period < 0:
    bad('coefficient_period', f'must be >= 0 (0: coefficients stay local), got '
        f'{c.coefficient_period}.')
  if c.coefficient_period != 1 and c.algorithm != 'fedavg_decomposed':
    bad('coefficient_period', 'only --algorithm=fedavg_decomposed (with --decomposed) aggregates '
        'coefficients on their own schedule.')
  if c.projection_dim < 0:
    bad('projection_dim', f'must be >= 0 (0: no projection head), got {c.projection_dim}.')
  # Every float must be finite (inf/NaN would train a NaN model and exit 0); alpha = inf is the
  # documented IID limit of the Dirichlet partition.
  for f in dataclasses.fields(c):
    v = getattr(c, f.name)
    if f.type == 'float' and not (math.isfinite(v) or (f.name == 'alpha' and v == math.inf)):
      bad(f.name, f'must be a finite number, got {v}.')
  if not 0 <= int(c.seed) < 2 ** 32:
    bad('seed', f'must be an integer in [0, 2^32) (NumPy seeds), got {c.seed}.')
  if c.workers and c.runtime != 'tff':
    bad('workers', f'TFF workers run only under --runtime=tff, not --runtime={c.runtime}; drop '
        '--workers or use --runtime=tff.')
  if c.num_atoms and not c.decomposed:
    bad('num_atoms', 'sets the atoms of filter-decomposed convolutions; pass --decomposed too, '
        'or drop --num_atoms.')


class Experiment:
  """The pieces of one run, built from a validated Config."""

  def __init__(self, config: Config, log=print):
    validate(config)
    self.config = c = config
    self.task = task_registry.get(c.task)
    self.model_name = c.model or self.task.default_model
    self.log = log
    model_kwargs = dict(num_classes=self.task.num_classes, input_shape=self.task.input_shape)
    if c.projection_dim:
      model_kwargs['projection_dim'] = c.projection_dim
    if c.decomposed:
      model_kwargs['decomposed'] = True
      if c.num_atoms:
        model_kwargs['num_atoms'] = c.num_atoms
    self._model_kwargs = model_kwargs
    self.regularizer = regularizers.get(c.regularizer, beta=c.beta, lam=c.feduv_lambda,
                                        mu=c.feduv_mu)
    # Local epochs live in the client dataset (tasks.client_data): each epoch's order is a stateless
    # function of (seed, epoch), identical in both runtimes, so the update loop makes one pass.
    client_config = ClientConfig(local_epochs=1, lr=float(c.client_lr),
                                 momentum=float(c.momentum), weight_decay=float(c.weight_decay))
    tf.keras.utils.set_random_seed(c.seed)  # The initial global model depends only on the seed.
    self.algorithm = algorithms.build(c.algorithm, self.model_fn, client_config, self.regularizer,
                                      **algorithm_hparams(c))

  def model_fn(self) -> tf.keras.Model:
    return models.build(self.model_name, **self._model_kwargs)

  # ---- data ----
  def prepare_client_data(self):
    """Decodes the train split once, partitions it, writes one shard per client (cached)."""
    c = self.config
    images, labels, domains = self.task.load_split('train', c.data_dir or None)
    n = len(labels)
    if c.num_clients > n:
      raise ValueError(f'--num_clients: {c.num_clients} clients but the train split has only {n} '
                       'examples; use fewer clients.')
    if c.partition == 'dirichlet':
      parts = partitions.dirichlet_partition(labels, c.num_clients, c.alpha, seed=c.seed)
    elif c.partition == 'pathological':
      parts = partitions.pathological_partition(labels, c.num_clients, c.classes_per_client,
                                                seed=c.seed)
    elif c.partition == 'iid':
      parts = partitions.iid_partition(n, c.num_clients, seed=c.seed)
    else:
      if domains is None:
        raise ValueError(f'--partition=domain: task {c.task} has no domains; use dirichlet, '
                         'pathological or iid, or a domain task (office_caltech10, domainnet).')
      parts = partitions.domain_partition(domains)
      if len(parts) != c.num_clients:
        raise ValueError(f'--num_clients: the domain partition of {c.task} has {len(parts)} '
                         f'clients (one per domain); pass --num_clients={len(parts)}.')
    key = hashlib.sha256(json.dumps({
        'task': c.task, 'partition': c.partition, 'alpha': c.alpha, 'seed': c.seed,
        'classes_per_client': c.classes_per_client, 'num_clients': c.num_clients,
        'n': int(n)}, sort_keys=True).encode()).hexdigest()[:12]
    cache_root = c.cache_dir or os.path.join(os.path.expanduser('~'), '.cache', 'tff_decorr')
    shard_dir = os.path.join(cache_root, c.task, f'{c.partition}-{key}')
    client_data.write_client_shards(images, labels, parts, shard_dir, log=self.log)
    self.partition = parts
    self.train_labels = labels
    self.shard_dir = shard_dir
    # FedUV's official code drops each epoch's last incomplete batch (drop_last=True); FedDecorr's
    # reference keeps it. A FedUV client smaller than a batch trains on nothing (weight 0).
    self.client_dataset_fn = self.task.client_dataset_fn(shard_dir, batch_size=c.batch_size,
                                                         epochs=int(c.local_epochs),
                                                         drop_remainder=c.regularizer == 'feduv')
    return parts

  def check_client_data(self, client_ids) -> None:
    """Before a round: every sampled client's cached shard is still the one written."""
    client_data.check_shards(self.shard_dir, client_ids)

  def test_dataset(self, batch_size: int = 256) -> tf.data.Dataset:
    return self.task.test_dataset(self.config.data_dir or None, batch_size)

  # ---- runtime ----
  def runtime(self, output_dir: Optional[str] = None):
    """The runtime of `--runtime`. Build it before any Keras model that will be *called* later:
    the TFF runtime traces Keras models inside a graph, and Keras 2.14 then refuses models created
    earlier outside it ("Layer or Model is in an invalid state")."""
    c = self.config
    if c.runtime == 'tf':
      from tff_decorr.runtimes import tf_runtime  # pylint: disable=g-import-not-at-top
      return tf_runtime.TfRuntime(self.algorithm, self.client_dataset_fn)
    from tff_decorr import tff_context  # pylint: disable=g-import-not-at-top
    from tff_decorr.runtimes import tff_runtime  # pylint: disable=g-import-not-at-top
    workers = [w for w in c.workers.split(',') if w] if c.workers else []
    log_path = os.path.join(output_dir, 'tff_worker.log') if output_dir else None
    tff_context.install(max_concurrent_computation_calls=c.max_concurrent_computation_calls,
                        log_path=log_path, workers=workers)
    return tff_runtime.TffRuntime(self.algorithm, self.client_dataset_fn)

  # ---- evaluation / export ----
  def evaluator(self) -> export.Evaluator:
    return export.Evaluator(self.model_fn, self.task.num_classes)

  def export(self, weights, path: str, extra_metadata: Optional[dict] = None) -> str:
    return export.export_saved_model(self.model_fn, weights, path, {
        'task': self.config.task, 'model': self.model_name,
        'algorithm': self.config.algorithm, 'regularizer': self.config.regularizer,
        **(extra_metadata or {})})


def algorithm_hparams(c: Config) -> dict:
  """The hyper-parameters algorithm `c.algorithm` takes (each algorithm names its own)."""
  cls = algorithms.algorithm_class(c.algorithm)
  offered = {'mu': c.mu, 'temperature': c.temperature, 'server_lr': c.server_lr,
             'server_momentum': c.server_momentum, 'form': c.fedavgm_form,
             'num_clients': c.num_clients, 'coefficient_period': c.coefficient_period}
  accepted = inspect.signature(cls.__init__).parameters
  return {k: v for k, v in offered.items() if k in accepted}


def class_counts(labels: np.ndarray, parts, num_classes: int) -> np.ndarray:
  return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
