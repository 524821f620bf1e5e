r"""Federated training with FedDecorr and its baselines.

Runs a federated simulation of one task, writes metrics (CSV, TensorBoard), a checkpoint every round,
the resolved configuration, a SavedModel of the global model and a JSON summary. Re-running the same
command resumes from the last completed round.

  bazel run //bin:train                                   # embedded digits task, FedAvg +/- FedDecorr
  bazel run //bin:train -- --task=cifar10 --data_dir=/data/tfds --regularizer=feddecorr
  .venv/bin/python -m bin.train --task=tiny_imagenet --data_dir=/data/tfds

Flag defaults marked "task default" come from the task's paper settings (docs/tasks.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import time

from absl import app
from absl import flags

# Keep TF's C++ start-up chatter out of the progress output unless the user asks for it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from tff_decorr import tf_env  # pylint: disable=g-import-not-at-top,unused-import  (before TF)

# TensorFlow must be imported before absl's app.run: imported for the first time inside main(),
# Keras 2.14 builds functional models from graph tensors and fails ("SymbolicTensor ... node").
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from tff_decorr import cli  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
_T = 'task default'

flags.DEFINE_string('task', 'digits', 'Task: digits (embedded, no download), cifar10, cifar100, '
                    'tiny_imagenet, office_caltech10, domainnet.')
flags.DEFINE_string('model', None, f'Model builder name ({_T}).')
flags.DEFINE_string('algorithm', 'fedavg', 'fedavg|fedprox|fedavgm|fedbn|moon|scaffold|fednova, or '
                    'fedavg_decomposed (with --decomposed: atoms every round, coefficients every '
                    '--coefficient_period rounds, 0: kept local).')
flags.DEFINE_string('regularizer', None, 'none|feddecorr|feduv|decov, or a comma-separated list to '
                    'run one simulation per regulariser (default: feddecorr; the embedded task '
                    'runs none,feddecorr).')
flags.DEFINE_float('beta', None, f'FedDecorr / DeCov coefficient ({_T}).')
flags.DEFINE_float('feduv_lambda', None, 'FedUV variance-loss coefficient (default 2.5).')
flags.DEFINE_float('feduv_mu', None, 'FedUV uniformity-loss coefficient (default 0.5).')
flags.DEFINE_string('partition', None, f'dirichlet|pathological|iid|domain ({_T}).')
flags.DEFINE_float('alpha', None, f'Dirichlet concentration; inf gives IID ({_T}).')
flags.DEFINE_integer('classes_per_client', None, 'Classes per client, pathological partition.')
flags.DEFINE_integer('num_clients', None, f'Number of clients ({_T}).')
flags.DEFINE_integer('clients_per_round', None, 'Clients sampled per round (default: all).')
flags.DEFINE_integer('rounds', None, f'Communication rounds ({_T}).')
flags.DEFINE_integer('local_epochs', None, f'Local epochs per round ({_T}).')
flags.DEFINE_integer('batch_size', None, f'Client batch size ({_T}).')
flags.DEFINE_float('client_lr', None, f'Client SGD learning rate ({_T}).')
flags.DEFINE_float('momentum', None, f'Client SGD momentum ({_T}).')
flags.DEFINE_float('weight_decay', None, f'Client L2 weight decay, PyTorch-style ({_T}).')
flags.DEFINE_integer('seed', 0, 'Seed of partition, initial model, sampling and augmentation.')
flags.DEFINE_string('data_dir', None, 'TFDS data dir (prepared datasets are read offline).')
flags.DEFINE_string('cache_dir', None, 'Where per-client data shards are cached '
                    '(default ~/.cache/tff_decorr).')
flags.DEFINE_string('output_dir', None, 'Run directory (default runs/<task>-<algorithm>-'
                    '<regularizer>-<config hash>; the same command resumes the same run).')
flags.DEFINE_integer('eval_every', None, 'Evaluate the global model every N rounds (and at the end).')
flags.DEFINE_integer('export_every', 0, 'Also export a SavedModel every N rounds (0: end only).')
flags.DEFINE_float('mu', None, 'FedProx proximal coefficient (1e-3) / MOON contrastive weight (1.0).')
flags.DEFINE_float('temperature', 0.5, 'MOON temperature.')
flags.DEFINE_integer('projection_dim', None, 'Projection head width (MOON; 0: none).')
flags.DEFINE_float('server_lr', 1.0, 'Server learning rate (FedAvgM tff form, SCAFFOLD).')
flags.DEFINE_float('server_momentum', None, 'FedAvgM server momentum.')
flags.DEFINE_enum('fedavgm_form', 'reference', ['reference', 'tff'],
                  'FedAvgM update: reference (m=b*m+(1-b)*d; w+=m) or tff (server SGD momentum).')
flags.DEFINE_bool('decomposed', False, 'Use filter-decomposed convolutions (atoms x coefficients).')
flags.DEFINE_integer('num_atoms', 0, 'Atoms per decomposed convolution (0: k*k).')
flags.DEFINE_integer('coefficient_period', 1, 'fedavg_decomposed: aggregate coefficients every K '
                     'rounds (atoms every round); 0 keeps them local (personalisation).')
flags.DEFINE_enum('runtime', 'tff', ['tff', 'tf'], 'tff: TFF C++ runtime (CPU, remote workers); '
                  'tf: the same TF functions in this process (uses a GPU).')
flags.DEFINE_string('workers', '', 'Comma-separated host:port of TFF workers (bin/worker).')
flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                     'TFF runtime: concurrent client computations (-1: unlimited).')
flags.DEFINE_bool('track_collapse', False, 'Log effective rank and significant singular values of '
                  'the global model every --eval_every rounds.')
flags.DEFINE_list('save_local_models', [], 'Client ids whose local models to export at the '
                  '--save_local_rounds (for local-vs-global analysis with bin/analyze).')
flags.DEFINE_list('save_local_rounds', [], 'Rounds at which to export the local models of '
                  '--save_local_models (only if the client is sampled that round).')
flags.DEFINE_bool('overwrite', False, 'Move an existing run with a different configuration aside.')

_GENERIC_KEYS = ('model', 'beta', 'feduv_lambda', 'feduv_mu', 'partition', 'alpha',
                 'classes_per_client', 'num_clients', 'clients_per_round', 'rounds',
                 'local_epochs', 'batch_size', 'client_lr', 'momentum', 'weight_decay',
                 'eval_every', 'mu', 'projection_dim', 'server_momentum')


class UsageError(Exception):
  pass


def resolve_configs(argv_flags) -> list:
  """Flags > task defaults > generic defaults. Returns one Config per regulariser."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr import experiment  # pylint: disable=g-import-not-at-top
  if argv_flags.task not in task_registry.names():
    raise ValueError(f'--task: unknown task {argv_flags.task!r}; choose one of '
                     f'{", ".join(task_registry.names())}.')
  task = task_registry.get(argv_flags.task)
  defaults = dict(task.defaults)
  defaults.setdefault('partition', task.default_partition)
  base = experiment.Config()
  values = {}
  for f in dataclasses.fields(experiment.Config):
    v = getattr(argv_flags, f.name, None) if f.name in argv_flags else None
    if v is None:
      v = defaults.get(f.name, getattr(base, f.name))
    values[f.name] = v
  # Algorithm-specific meaning of --mu when not given.
  if argv_flags.mu is None and 'mu' not in defaults:
    values['mu'] = 1.0 if values['algorithm'] == 'moon' else 1e-3
  if argv_flags.clients_per_round is None:
    values['clients_per_round'] = defaults.get('clients_per_round', values['num_clients'])
  # A task's projection_dim is MOON's head (CIFAR: 256, as the reference's --use_proj_head); other
  # algorithms get no head unless --projection_dim asks for one.
  if argv_flags.projection_dim is None and values['algorithm'] != 'moon':
    values['projection_dim'] = 0
  values['model'] = values['model'] or task.default_model
  values['data_dir'] = cli.user_path(values['data_dir'] or '')
  values['cache_dir'] = cli.user_path(values['cache_dir'] or '')
  regs = argv_flags.regularizer or defaults.get('regularizer', 'feddecorr')
  reg_list = [r.strip() for r in str(regs).split(',') if r.strip()]
  if not reg_list:
    raise ValueError('--regularizer: empty; give none, feddecorr, feduv or decov.')
  configs = []
  for reg in reg_list:
    c = experiment.Config(**{**values, 'regularizer': reg})
    experiment.validate(c)
    if argv_flags.output_dir:
      out = cli.user_path(argv_flags.output_dir)
      c.output_dir = os.path.join(out, reg) if len(reg_list) > 1 else out
    else:
      c.output_dir = cli.user_path(os.path.join(
          'runs', f'{c.task}-{c.algorithm}-{reg}-{c.result_hash()}'))
    configs.append(c)
  return configs




def _versions() -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return {'python': platform.python_version(), 'tensorflow': tf.__version__,
          'tensorflow_federated': tff.__version__}


def _local_model_rounds(config) -> list:
  """--save_local_rounds as integers, after checking --save_local_models names real clients."""
  try:
    rounds = [int(r) for r in FLAGS.save_local_rounds]
  except ValueError as e:
    raise ValueError(f'--save_local_rounds: {FLAGS.save_local_rounds} are not round '
                     'numbers.') from e
  bad = [c for c in FLAGS.save_local_models if not c.isdigit() or int(c) >= config.num_clients]
  if bad:
    raise ValueError(f'--save_local_models: {bad} are not client ids (0..'
                     f'{config.num_clients - 1}).')
  return rounds


def train_one(config, log=print) -> dict:
  """Runs (or resumes) one configuration; returns its summary."""
  from tff_decorr import experiment  # pylint: disable=g-import-not-at-top
  from tff_decorr import program  # pylint: disable=g-import-not-at-top
  from tff_decorr import run_dir  # pylint: disable=g-import-not-at-top
  from tff_decorr import client_state  # pylint: disable=g-import-not-at-top
  from tff_decorr import personalized  # pylint: disable=g-import-not-at-top

  program.set_gpu_memory_growth()
  local_rounds = _local_model_rounds(config)
  # Lock and compare first; config.json is written only once every check below has passed, so a
  # start that fails (bad partition, too many clients, ...) leaves nothing that refuses the
  # corrected command.
  resumed = run_dir.prepare(config.output_dir, config.to_dict(), overwrite=FLAGS.overwrite,
                            log=log)
  try:
    exp = experiment.Experiment(config, log=log)
    exp.prepare_client_data()
  except BaseException:
    run_dir.unlock(config.output_dir, remove_if_unused=True)
    raise
  run_dir.write_config(config.output_dir, config.to_dict())
  log(('Resuming' if resumed else 'Configuration') + ' (saved to ' +
      run_dir.config_path(config.output_dir) + '):')
  log(json.dumps(config.to_dict(), indent=None, sort_keys=True))
  runtime = exp.runtime(config.output_dir)
  evaluator = exp.evaluator()
  test_ds = exp.test_dataset()
  initial_weights = exp.algorithm.initial_weights()
  store = client_state.ClientStateStore(
      os.path.join(config.output_dir, 'client_states'),
      initial_fn=lambda: exp.algorithm.initial_client_state(initial_weights))

  alg = exp.algorithm
  client_sets = (personalized.client_test_datasets(exp.task, config.data_dir or None)
                 if alg.personalized else None)

  def evaluate(server_state, round_num):
    del round_num
    if alg.personalized:  # FedBN & co: each client's own model, as their papers report.
      return personalized.evaluate_clients(alg, server_state, store.load, config.num_clients,
                                           evaluator, client_sets)
    m = evaluator.evaluate(alg.global_weights(server_state), test_ds)
    return {'test_accuracy': m['test_accuracy'], 'test_loss': m['test_loss']}

  on_round_end = None
  if config.track_collapse:
    from tff_decorr import collapse_tracking  # pylint: disable=g-import-not-at-top
    on_round_end = collapse_tracking.tracker(exp, evaluator, test_ds, config.eval_every,
                                             config.rounds)

  before_round = None
  if FLAGS.save_local_models or config.track_collapse:
    from tff_decorr import collapse_tracking  # pylint: disable=g-import-not-at-top
    before_round = collapse_tracking.LocalModels(exp, evaluator, test_ds,
                                                 FLAGS.save_local_models, local_rounds,
                                                 track=config.track_collapse)

  loop = program.LoopConfig(rounds=config.rounds, num_clients=config.num_clients,
                            clients_per_round=config.clients_per_round, seed=config.seed,
                            eval_every=config.eval_every, export_every=config.export_every)
  t0 = time.time()
  summary = program.run(runtime=runtime, algorithm=exp.algorithm, store=store, loop=loop,
                        output_dir=config.output_dir, evaluate_fn=evaluate,
                        export_fn=exp.export, on_round_end=on_round_end,
                        before_round=before_round, check_clients=exp.check_client_data, log=log)
  if summary is None:  # More rounds done than --rounds: nothing trained, nothing (re)written.
    return None
  summary.update({'config': config.to_dict(), 'versions': _versions(),
                  'wall_time_s': time.time() - t0})
  run_dir.write_json_atomic(os.path.join(config.output_dir, 'summary.json'), summary)
  return summary




def main(argv):
  cli.quiet_logging()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; flags are --name=value.')
  return cli.run_guarded('train', _train_all,
                         interrupted_message='interrupted before the first round completed; '
                         're-run the same command to start again')


def _train_all() -> int:
  from tff_decorr import tff_context  # pylint: disable=g-import-not-at-top
  configs = resolve_configs(FLAGS)
  results = []
  for config in configs:
    print(f'=== {config.task}: {config.algorithm} + {config.regularizer} -> {config.output_dir}',
          flush=True)
    summary = train_one(config, log=lambda s: print(s, flush=True))
    # Each configuration gets its own TFF worker (its log is in its run directory); stop this one
    # before the next configuration starts another, so they never compete for the cores.
    pids = tff_context.worker_pids()
    tff_context.stop_all()
    if pids:
      print(f'stopped the TFF worker of this configuration (PID {", ".join(map(str, pids))})',
            flush=True)
    if summary is not None:
      results.append((config, summary))
  print('\nResults (test accuracy of the global model; * personalised: mean of the clients\' own '
        'models, weighted by test examples):')
  for config, s in results:
    mark = '*' if 'per_client_test_accuracy' in s else ' '
    print(f' {mark}{config.algorithm:>9} + {config.regularizer:<10} final '
          f'{s["final_test_accuracy"]:.4f} (round {s["final_round"]})  best '
          f'{s["best_test_accuracy"]:.4f} (round {s["best_round"]})')
    if 'per_client_test_accuracy' in s:
      print('      per client: ' + ' '.join(f'{i}:{a:.3f}' for i, a in
                                            enumerate(s['per_client_test_accuracy'])))
    print(f'      outputs: {config.output_dir}  (metrics.csv, tensorboard/, '
          'export/saved_model, summary.json)')
  return 0


if __name__ == '__main__':
  app.run(main)
