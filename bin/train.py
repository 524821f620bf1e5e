r"""Federated training with FedDecorr and its baselines.

Runs a federated simulation of one task, writes metrics (CSV, TensorBoard), a checkpoint every round,
the resolved configuration, a SavedModel of the global model and a JSON summary. Re-running the same
command resumes from the last completed round.

  bazel run //bin:train                                   # embedded digits task, FedAvg +/- FedDecorr
  bazel run //bin:train -- --task=cifar10 --data_dir=/data/tfds --regularizer=feddecorr
  .venv/bin/python -m bin.train --task=tiny_imagenet --data_dir=/data/tfds

Flag defaults marked "task default" come from the task's paper settings (docs/tasks.md). Each
algorithm, regulariser and partition has its own flags, `--<component>_<setting>`, generated from
the setting it declares (tff_decorr.hparams): `--fedprox_mu`, `--moon_temperature`,
`--feddecorr_beta`, `--dirichlet_alpha`, ... (`--help` lists them). This file only parses flags and
reports errors: the training program is `tff_decorr.training.train`.
"""

from __future__ import annotations

import os

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


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
  """Defines every flag on `fv`: the generic ones, then one per component setting, generated from
  the registries (a component registered before this call gets its flags too)."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr import aggregation  # pylint: disable=g-import-not-at-top
  from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
  from tff_decorr import regularizers  # pylint: disable=g-import-not-at-top
  d = dict(flag_values=fv)
  flags.DEFINE_enum('task', 'digits', list(task_registry.names()),
                    'Task (digits: embedded, no download).', **d)
  flags.DEFINE_string('model', None, f'Model builder name ({_T}).', **d)
  flags.DEFINE_enum('algorithm', 'fedavg', list(algorithms.names()), 'Federated algorithm.', **d)
  flags.DEFINE_string('regularizer', None, f'{"|".join(regularizers.names())}, or a '
                      'comma-separated list to run one simulation per regulariser (default: '
                      'feddecorr; the embedded task runs none,feddecorr).', **d)
  flags.DEFINE_enum('partition', None, list(partitions.names()), f'Client partition ({_T}).', **d)
  flags.DEFINE_enum('aggregator', None, list(aggregation.names()),
                    "Model aggregation: mean (the algorithm's own weighted sum, default) or a "
                    'tff.aggregators factory over client deltas: robust, dp, compression, secure '
                    '(simulated: no cryptography, TFF 0.87 has no secure-aggregation protocol) '
                    '(--runtime=tff; settings --<aggregator>_<setting>).', **d)
  flags.DEFINE_integer('num_clients', None, f'Number of clients ({_T}).', **d)
  flags.DEFINE_integer('clients_per_round', None, 'Clients sampled per round (default: all).', **d)
  flags.DEFINE_integer('rounds', None, f'Communication rounds ({_T}).', **d)
  flags.DEFINE_integer('local_epochs', None, f'Local epochs per round ({_T}).', **d)
  flags.DEFINE_integer('batch_size', None, f'Client batch size ({_T}).', **d)
  flags.DEFINE_float('client_lr', None, f'Client SGD learning rate ({_T}).', **d)
  flags.DEFINE_float('momentum', None, f'Client SGD momentum ({_T}).', **d)
  flags.DEFINE_float('weight_decay', None, f'Client L2 weight decay, PyTorch-style ({_T}).', **d)
  flags.DEFINE_integer('seed', 0, 'Seed of partition, initial model, sampling and augmentation.',
                       **d)
  flags.DEFINE_integer('projection_dim', None, 'Projection head width, for algorithms that use '
                       'one (MOON; task default: 256 on CIFAR; 0: none).', **d)
  flags.DEFINE_bool('decomposed', False, 'Use filter-decomposed convolutions (atoms x '
                    'coefficients).', **d)
  flags.DEFINE_integer('num_atoms', 0, 'Atoms per decomposed convolution (0: k*k).', **d)
  flags.DEFINE_enum('init', None, list(models.INITS), 'Weight initialisation (default: the '
                    'model\'s reference one, as the PyTorch code it ports: kaiming_normal for '
                    'resnet20/32, torch for resnet18, mobilenet_v2_cifar, alexnet_bn; keras for '
                    'small_cnn).', **d)
  flags.DEFINE_enum('runtime', 'auto', ['auto', 'tff', 'tf'], 'auto: tf when TensorFlow sees a '
                    'GPU, else tff (tff with --workers or an --aggregator factory); tff: TFF C++ '
                    'runtime (CPU, remote workers); tf: the same TF functions in this process '
                    '(uses a GPU). The choice is printed first and recorded in config.json; a run '
                    'resumes under either.', **d)
  flags.DEFINE_string('data_dir', None, 'TFDS data dir (prepared datasets are read offline).', **d)
  flags.DEFINE_string('cache_dir', None, 'Where per-client data shards are cached '
                      '(default ~/.cache/tff_decorr).', **d)
  flags.DEFINE_string('output_dir', None, 'Run directory (default runs/<task>-<algorithm>-'
                      '<regularizer>-<config hash>; the same command resumes the same run).', **d)
  flags.DEFINE_integer('eval_every', None, 'Evaluate every N rounds (and at the end).', **d)
  flags.DEFINE_integer('export_every', 0, 'Also export a SavedModel every N rounds (0: end '
                       'only).', **d)
  flags.DEFINE_string('workers', '', 'Comma-separated host:port of TFF workers (bin/worker).', **d)
  flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                       'TFF runtime: concurrent client computations (-1: unlimited).', **d)
  flags.DEFINE_bool('track_collapse', False, 'Log effective rank and significant singular values '
                    'of the global model every --eval_every rounds.', **d)
  flags.DEFINE_list('save_local_models', [], 'Client ids whose local models to export at the '
                    '--save_local_rounds (for local-vs-global analysis with bin/analyze).', **d)
  flags.DEFINE_list('save_local_rounds', [], 'Rounds at which to export the local models of '
                    '--save_local_models (only if the client is sampled that round).', **d)
  flags.DEFINE_bool('overwrite', False, 'Move an existing run with a different configuration '
                    'aside (an identical one is resumed).', **d)
  cli.define_component_flags(fv)


def resolve_configs(fv: flags.FlagValues = FLAGS) -> list:
  """Flags > task defaults > component defaults. Returns one Config per regulariser."""
  return cli.resolve_configs(fv)


def run_header(config, requested_runtime: str) -> str:
  """The first line of a configuration's run: what runs where, and which runtime and why."""
  from tff_decorr import config as config_lib  # pylint: disable=g-import-not-at-top
  why = config_lib.choose_runtime(requested_runtime, config.workers, config.aggregator)[1]
  return (f'=== {config.task}: {config.algorithm} + {config.regularizer} -> {config.output_dir}  '
          f'(runtime {config.runtime}, {why})')


def main(argv):
  cli.quiet_logging()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; flags are --name=value.')
  return cli.run_guarded('train', lambda: run(FLAGS),
                         interrupted_message='interrupted before the first round completed; '
                         're-run the same command to start again')


def run(fv: flags.FlagValues) -> int:
  """Trains every configuration the flags name, then prints the results."""
  from tff_decorr import tff_context  # pylint: disable=g-import-not-at-top
  from tff_decorr import training  # pylint: disable=g-import-not-at-top
  results = []
  for config in resolve_configs(fv):
    print(run_header(config, fv.runtime), flush=True)
    summary = training.train(config, overwrite=fv.overwrite,
                             save_local_models=fv.save_local_models,
                             save_local_rounds=fv.save_local_rounds,
                             log=lambda s: print(s, flush=True))
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


define_flags()

if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags_or_exit('train'))
