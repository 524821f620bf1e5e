"""The training program as a library call: `tff_decorr.program.training.train(config)` (also
`tff_decorr.train`). bin/train is its command line: flags -> `cli.resolve_configs` -> `train`.

The run from start to end: this module builds the run directory's owner
(tff_decorr.run_files.run_directory.RunDirectory: lock, compare, resume, config.json once every
check has passed, summary.json), has the run's pieces composed (tff_decorr.program.experiment: data,
model, algorithm, runtime) and hands them to the round loop (tff_decorr.program.round_loop: sample,
train, evaluate, commit). The directory's lock is released when train returns or raises.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import aggregators
from tff_decorr.models import precision
from tff_decorr.configs import config as config_lib
from tff_decorr.program import experiment
from tff_decorr.program import personalized
from tff_decorr.program import phases
from tff_decorr.run_files import privacy_ledger
from tff_decorr.program import round_loop
from tff_decorr.run_files import run_dir
from tff_decorr.run_files import run_directory


def _versions() -> dict:
  return {'python': platform.python_version(), 'tensorflow': tf.__version__,
          'tensorflow_federated': tff.__version__}


def _local_model_rounds(config, save_local_models, save_local_rounds) -> list:
  """--save_local_rounds as integers, after checking --save_local_models names real clients."""
  try:
    numbers = [int(r) for r in save_local_rounds]
  except ValueError as e:
    raise ValueError(f'--save_local_rounds: {save_local_rounds} are not round '
                     'numbers.') from e
  bad = [c for c in save_local_models if not c.isdigit() or int(c) >= config.num_clients]
  if bad:
    raise ValueError(f'--save_local_models: {bad} are not client ids (0..'
                     f'{config.num_clients - 1}).')
  return numbers


def _client_exports(config: config_lib.Config) -> Callable[[dict], list]:
  """The client models' export directories of a finished run's summary (personalised runs)."""
  return lambda summary: ([personalized.client_export_dir(config.output_dir, cid)
                           for cid in range(config.num_clients)]
                          if 'per_client_test_accuracy' in summary else [])


def _precision_note(config: config_lib.Config, log) -> None:
  if config.precision == 'float32':
    return
  if tf.config.list_physical_devices('GPU'):
    where = 'on the GPU (fast on Ampere or newer)'
  elif precision.native_bfloat16_cpu():
    where = 'this CPU has bfloat16 instructions'
  else:
    where = 'this CPU has no bfloat16 instructions: oneDNN emulates them, slower than float32'
  log(f'Precision: {config.precision} (layers compute in bfloat16, weights stay float32; '
      f'{where})')


def _compose(config: config_lib.Config, directory: run_directory.RunDirectory, resumed: bool,
             overwrite: bool, setup_start: float):
  """(experiment, runtime, whether the run resumes): every check a start makes before config.json
  is written, so a start that fails (bad partition, too many clients, an aggregator that cannot
  take this algorithm's update, ...) leaves nothing that refuses the corrected command."""
  timer = directory.timer
  try:
    exp = experiment.Experiment(config, log=directory.log)
    _precision_note(config, directory.log)
    timer.add('setup', time.perf_counter() - setup_start)
    with timer('client_data'):
      exp.prepare_client_data()
    with timer('build'):  # The TFF worker starts on the first call, not here.
      runtime = exp.runtime(config.output_dir)
    if resumed:  # Same configuration: resume only from a checkpoint that can be read.
      resumed = directory.resumes(overwrite)
  except BaseException:
    directory.unlock(remove_if_unused=True)
    raise
  return exp, runtime, resumed


def _start_dp_ledger(exp: experiment.Experiment, directory: run_directory.RunDirectory,
                     resumed: bool, save_local_models: Sequence[str]):
  """Under --aggregator=dp: says which clipping runs and what epsilon assumes and omits (the
  un-noised per-client outputs of this run included), and adds the data's privacy ledger to the
  run directory's hooks (privacy_ledger.ReleaseHook). Returns the ledger (None: no DP)."""
  if not isinstance(exp.aggregator, aggregators.AccountedDpFactory):
    return None
  c, log = exp.config, directory.log
  clipping = exp.aggregator.clipping()
  if clipping['dp_clipping'] == 'adaptive':
    log('Privacy: adaptive clipping (TFF estimates the clip each round).')
  else:
    log(f'Privacy: fixed L2 clip {clipping["dp_clip"]:g}'
        + (f' ({clipping["dp_clipping_note"]}).' if 'dp_clipping_note' in clipping else '.'))
  log('Privacy: --aggregator=dp\'s epsilon assumes ' + '; '.join(aggregators.DP_ASSUMES) + '.')
  log('Privacy: it does not cover ' + '; '.join(exp.dp_not_covered(save_local_models)) + '.')
  entry = dict(noise_multiplier=c.component_hparams('aggregator').noise_multiplier,
               clients_per_round=c.clients_per_round, num_clients=c.num_clients)
  directory.hooks.append(privacy_ledger.ReleaseHook.start(
      exp.ledger, c.output_dir, directory.checkpoint_round() if resumed else 0, entry, log))
  return exp.ledger


def _round_hooks(exp: experiment.Experiment, directory: run_directory.RunDirectory,
                 save_local_models: Sequence[str], local_rounds: list) -> round_loop.RoundHooks:
  """The loop's evaluation (each client's own model for personalised algorithms), export and
  collapse tracking; opens the run's client states."""
  config, alg = exp.config, exp.algorithm
  evaluator = exp.evaluator()
  test_ds = exp.test_dataset()
  initial_weights = alg.initial_weights()
  store = directory.open_client_states(alg.stateful,
                                       lambda: alg.initial_client_state(initial_weights))
  client_sets = (personalized.client_test_datasets(exp.task, config.data_dir or None)
                 if alg.personalized else None)

  def evaluate(server_state, round_num):
    del round_num
    if alg.personalized:  # FedBN & co: each client's own model, as their papers report.
      return personalized.evaluate_clients(alg, server_state, store.load, config.num_clients,
                                           evaluator, client_sets)
    m = evaluator.evaluate(alg.global_weights(server_state), test_ds)
    return {'test_accuracy': m['test_accuracy'], 'test_loss': m['test_loss']}

  hooks = round_loop.RoundHooks(evaluate=evaluate, export=exp.export,
                                check_clients=exp.check_client_data)
  if save_local_models or config.track_collapse:
    from tff_decorr.program import collapse_tracking  # pylint: disable=g-import-not-at-top
    if config.track_collapse:
      hooks.on_evaluated = collapse_tracking.tracker(exp, evaluator, test_ds)
    hooks.before_round = collapse_tracking.LocalModels(exp, evaluator, test_ds, save_local_models,
                                                       local_rounds, track=config.track_collapse)
  return hooks


def _summarize(exp: experiment.Experiment, directory: run_directory.RunDirectory, summary: dict,
               ledger, save_local_models: Sequence[str], started: float) -> dict:
  """The loop's summary with the run's privacy accounting, configuration, versions and phases,
  written to summary.json."""
  log, timer, config = directory.log, directory.timer, exp.config
  summary.update(exp.privacy(summary['final_round'], ledger, save_local_models))
  if 'dp_note' in summary:
    log(f'Privacy: {summary["dp_note"]}.')
  if 'dp_ledger_note' in summary:
    log(f'Privacy: warning: {summary["dp_ledger_note"]}.')
  summary.update({'config': config.to_dict(), 'versions': _versions(),
                  'wall_time_s': time.time() - started})
  with timer('summary'):
    summary['phases_s'] = timer.ordered()  # Without the summary's own write: a few ms.
    directory.write_summary(summary)
  log(timer.line())
  return summary


def train(config: config_lib.Config, *, overwrite: bool = False,
          save_local_models: Sequence[str] = (), save_local_rounds: Sequence = (),
          log=print, timer: Optional[phases.Phases] = None) -> Optional[dict]:
  """Runs (or resumes) one configuration in `config.output_dir`; returns its summary.

  The run directory gets config.json, metrics.csv, TensorBoard logs, checkpoints, the exported
  model and summary.json (README, "What a run writes"). Re-running with the same configuration
  resumes after the last completed round;
  re-running a finished run returns its summary.json's contents, and trains and exports nothing.
  Exit codes and messages of the errors below are mapped by `tff_decorr.configs.cli.run_guarded`.

  Args:
    config: the run's Config, from `tff_decorr.configs.config.make` (or `resolve`), bin/train's
      flags (`tff_decorr.configs.cli.resolve_configs`), or built directly (validated here);
      `config.output_dir` must be set.
    overwrite: move a run directory holding another configuration aside (never deleted) and
      start afresh, instead of refusing it.
    save_local_models: client ids whose locally trained models are saved (bin/train
      --save_local_models).
    save_local_rounds: the rounds at which they are saved (default: the last).
    log: where progress lines go.
    timer: a phases.Phases (e.g. holding bin/train's start-up), given this run's phases; they are
      logged at the end and written to summary.json as `phases_s`.

  Returns:
    The run's summary (summary.json's contents: final and best test accuracy, rounds, timings,
    versions), or None when the directory already holds more rounds than `config.rounds`.

  Raises:
    ValueError: bad settings, an unusable run directory (another configuration without
      `overwrite`, a config.json of before 0.2.0, a lock held by another process), or an
      unreadable checkpoint (run_directory.CheckpointError); the message says what to do.
    round_loop.NonFiniteError: the loss or weights became NaN or Inf.
    run_directory.DiskFullError: the disk filled up while writing the run.
    round_loop.Interrupted: SIGINT or SIGTERM; the last completed round is checkpointed.
  """
  timer = timer or phases.Phases()
  setup_start = time.perf_counter()
  round_loop.set_gpu_memory_growth()
  if config.runtime == 'auto':  # A Config built directly (resolution resolves it already).
    runtime, why = config_lib.choose_runtime(config.runtime, config.workers, config.aggregator)
    config = dataclasses.replace(config, runtime=runtime)
    log(f'Runtime: {runtime} ({why})')
  local_rounds = _local_model_rounds(config, save_local_models, save_local_rounds)
  directory = run_directory.RunDirectory(config.output_dir, config.rounds,
                                         config=config.to_dict(), log=log, timer=timer)
  # Lock and compare first; config.json is written only once every check has passed (_compose).
  resumed = directory.prepare(overwrite=overwrite, migrate=config_lib.migrate_dict)
  try:  # The lock is released when train returns or raises: a caller may train again.
    return _train_locked(config, directory, resumed, overwrite, save_local_models, local_rounds,
                         setup_start)
  finally:
    directory.unlock()


# Seven parameters: train's own and what it prepared (the locked directory, whether it resumes).
def _train_locked(config, directory, resumed, overwrite, save_local_models, local_rounds,
                  setup_start):
  """train() once its run directory is locked and compared."""
  log = directory.log
  finished = directory.finished(_client_exports(config)) if resumed else None
  if finished is not None:  # Complete, or past --rounds: said by the directory.
    return finished.summary
  exp, runtime, resumed = _compose(config, directory, resumed, overwrite, setup_start)
  directory.write_config()
  log(('Resuming' if resumed else 'Configuration') + ' (saved to ' +
      run_dir.config_path(config.output_dir) + '):')
  log(json.dumps(config.to_dict(), indent=None, sort_keys=True))
  if aggregators.note(config.aggregator):
    log(f'Note: --aggregator={config.aggregator} is {aggregators.note(config.aggregator)}.')
  ledger = _start_dp_ledger(exp, directory, resumed, save_local_models)
  hooks = _round_hooks(exp, directory, save_local_models, local_rounds)
  started = time.time()
  summary = round_loop.train_rounds(runtime, exp.algorithm,
                                    round_loop.LoopConfig.from_config(config), directory, hooks)
  return _summarize(exp, directory, summary, ledger, save_local_models, started)
