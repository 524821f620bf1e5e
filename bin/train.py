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
`--feddecorr_beta`, `--dirichlet_alpha`, ... (`--helpfull` lists them; `--help` lists the generic
ones). This file only parses flags and reports errors: the training program is
`tff_decorr.program.training.train`.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

# Nothing here imports TensorFlow: the flags are defined and parsed first, so --help and a mistyped
# flag answer at once; cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import tf_env
from tff_decorr.configs import cli

# Keep TF's C++ start-up chatter out of the progress output unless the user asks for it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
  """Defines every flag on `fv` (tff_decorr.configs.cli.define_train_flags: bin/study defines the
  same flags on its own FlagValues to check each configuration of a grid as bin/train would)."""
  for name in cli.define_train_flags(fv):
    # Defined in tff_decorr.configs.cli; declared here so that --help lists them, as before.
    flags.declare_key_flag(name, flag_values=fv)
  # bin/train's own (bin/study never starts a worker itself): not part of a run's configuration.
  flags.DEFINE_bool(
      'worker_without_namespace', False,
      'Where the local TFF worker (--runtime=tff) cannot have a network namespace of its own (no '
      'unshare, user namespaces not allowed), run it on 127.0.0.1 instead, through the loopback '
      'library (proven on a canary process before the worker starts). Its service is '
      'unauthenticated: every user of this machine can then connect to it and run any TensorFlow '
      'graph as you. Without it, such a run is refused (docs/security.md).',
      flag_values=fv)


def resolve_configs(fv: flags.FlagValues = FLAGS) -> list:
  """Flags > task defaults > component defaults. Returns one Config per regulariser."""
  return cli.resolve_configs(fv)


def run_header(config, requested_runtime: str) -> str:
  """The first line of a configuration's run: what runs where, and which runtime and why."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  why = config_lib.choose_runtime(requested_runtime, config.workers, config.aggregator)[1]
  return (f'=== {config.task}: {config.algorithm} + {config.regularizer} -> {config.output_dir}  '
          f'(runtime {config.runtime}, {why})')


def main(argv):
  cli.quiet_logging()
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; flags are --name=value.')
  cli.exit_without_finalising(cli.run_guarded(
      'train', lambda: run(FLAGS),
      interrupted_message='interrupted before the first round completed; re-run the same command '
      'to start again'))


def run(fv: flags.FlagValues) -> int:
  """Trains every configuration the flags name, then prints the results."""
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import phases  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import training  # pylint: disable=g-import-not-at-top
  tff_context.set_without_namespace(fv.worker_without_namespace)
  configs = resolve_configs(fv)
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  if any(config_lib.choose_runtime(c.runtime, c.workers, c.aggregator)[0] == 'tff' and
         not c.workers for c in configs):
    tff_context.check_local_worker_allowed()  # Refused before anything is built or written.
  results = []
  start_up = phases.since_process_start()  # Interpreter, imports, flags: the first run's share.
  for config in configs:
    print(run_header(config, fv.runtime), flush=True)
    timer = phases.Phases()
    if start_up is not None:
      timer.add('start_up', start_up)
      start_up = None
    summary = training.train(config, overwrite=fv.overwrite,
                             save_local_models=fv.save_local_models,
                             save_local_rounds=fv.save_local_rounds,
                             log=lambda s: print(s, flush=True), timer=timer)
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


def entry() -> None:
  """The program, as the console script tff-decorr-train, `python -m bin.train` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('train', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
