"""The training program as a library call: `tff_decorr.run.training.train(config)` (also
`tff_decorr.train`). bin/train is its command line: flags -> `cli.resolve_configs` -> `train`.

The run from start to end, in three modules: this one prepares the run directory (lock, compare,
config.json once every check has passed), has the run's pieces composed (tff_decorr.run.composition:
data, model, algorithm, runtime), hands them to the round loop (tff_decorr.run.round_loop, which
writes each round's metrics, checkpoints and exports, and evaluates: each client's own model for
personalised algorithms), and writes summary.json.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import time
from typing import Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr.federated import aggregation
from tff_decorr.models import precision
from tff_decorr.run_files import client_state
from tff_decorr.configs import config as config_lib
from tff_decorr.run import composition
from tff_decorr.run import personalized
from tff_decorr.run import phases
from tff_decorr.run_files import privacy_ledger
from tff_decorr.run import round_loop
from tff_decorr.run_files import run_dir


def _versions() -> dict:
  return {'python': platform.python_version(), 'tensorflow': tf.__version__,
          'tensorflow_federated': tff.__version__}


def _local_model_rounds(config, save_local_models, save_local_rounds) -> list:
  """--save_local_rounds as integers, after checking --save_local_models names real clients."""
  try:
    rounds = [int(r) for r in save_local_rounds]
  except ValueError as e:
    raise ValueError(f'--save_local_rounds: {save_local_rounds} are not round '
                     'numbers.') from e
  bad = [c for c in save_local_models if not c.isdigit() or int(c) >= config.num_clients]
  if bad:
    raise ValueError(f'--save_local_models: {bad} are not client ids (0..'
                     f'{config.num_clients - 1}).')
  return rounds


def _has_checkpoint(output_dir: str, overwrite: bool, log) -> bool:
  """Whether a run with this configuration resumes from a checkpoint, decided before anything is
  written. An unreadable newest checkpoint is refused with advice (round_loop.CheckpointError), and
  with --overwrite, which that advice offers, the run is moved aside and a new one starts. A run
  without checkpoints starts from round 1 with its earlier results set aside (one warning)."""
  try:
    if round_loop.newest_checkpoint_round(output_dir) > 0:
      if overwrite:
        log(f'--overwrite: {output_dir} holds a run with the same configuration; resuming it '
            '(--overwrite moves aside only a run with a different configuration or an unreadable '
            'checkpoint).')
      return True
  except round_loop.CheckpointError:
    if not overwrite:
      raise
    aside = run_dir.move_aside(output_dir)  # Never deleted: the old run is kept whole.
    log(f'--overwrite: the checkpoint of {output_dir} cannot be read; moved the run to {aside} '
        'and starting a new one.')
    return False
  run_dir.set_aside_results(output_dir, log=log)
  return False


def _finished_summary(config: config_lib.Config) -> Optional[dict]:
  """The summary.json of a run that already finished `config.rounds` rounds (its newest checkpoint
  is that round's and its summary says so) and holds its exports, else None: a run whose final
  model or a personalised run's client models are missing exports them again on a re-run."""
  try:
    with open(os.path.join(config.output_dir, 'summary.json')) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(summary, dict) or summary.get('final_round') != config.rounds:
    return None
  exports = [os.path.join(config.output_dir, 'export', 'saved_model')]
  if 'per_client_test_accuracy' in summary:
    exports += [personalized.client_export_dir(config.output_dir, cid)
                for cid in range(config.num_clients)]
  if not all(os.path.isdir(path) for path in exports):
    return None
  # Read in full: a finished run whose checkpoint is damaged is not complete; the start that
  # follows refuses it with advice (or, under --overwrite, moves it aside), as any other run.
  try:
    newest = round_loop.newest_checkpoint_round(config.output_dir)
  except round_loop.CheckpointError:
    return None
  return summary if newest == config.rounds else None


def _checkpoint_round(output_dir: str) -> int:
  """The round a resumed run continues after (its newest checkpoint's; read in full before)."""
  versions = asyncio.run(round_loop.checkpoint_manager(output_dir).get_versions()) or []
  return int(max(versions)) if versions else 0


def _record_dp_releases(exp: composition.Experiment, runtime, log, save_local_models=(),
                        resumed_round: int = 0):
  """Under --aggregator=dp: says which clipping runs, what epsilon assumes and omits (the
  un-noised per-client outputs of this run included), says whether this data has been released
  before and whether its ledger lost releases, and records every round of this run in the data's
  privacy ledger."""
  c = exp.config
  clipping = exp.aggregator.clipping()
  if clipping['dp_clipping'] == 'adaptive':
    log('Privacy: adaptive clipping (TFF estimates the clip each round).')
  else:
    log(f'Privacy: fixed L2 clip {clipping["dp_clip"]:g}'
        + (f' ({clipping["dp_clipping_note"]}).' if 'dp_clipping_note' in clipping else '.'))
  log('Privacy: --aggregator=dp\'s epsilon assumes ' + '; '.join(aggregation.DP_ASSUMES) + '.')
  log('Privacy: it does not cover ' + '; '.join(exp.dp_not_covered(save_local_models)) + '.')
  ledger = exp.ledger
  # The ledger, the count beside it, and the records of this and the sibling run directories.
  account = privacy_ledger.account(ledger, c.output_dir, resumed_round)
  log(f'Privacy: the ledger of this data is {ledger.path}.')
  if account.releases:
    log(f'Privacy: {len(account.releases)} DP rounds were released on this data before this '
        f'start (ledger {ledger.path}); summary.json\'s dp_epsilon_all_releases counts them with '
        'this run\'s.')
  if account.unreadable_lines:
    log(f'Privacy: warning: {account.unreadable_note()}.')
  if account.missing:
    log(f'Privacy: warning: {account.note()}.')
  known = account.known
  privacy_ledger.record_run(ledger, c.output_dir, known)
  hp = c.component_hparams('aggregator')
  return ledger, privacy_ledger.RecordingRuntime(
      runtime, ledger, run=c.output_dir, noise_multiplier=hp.noise_multiplier,
      clients_per_round=c.clients_per_round, num_clients=c.num_clients, known=known)


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
      unreadable checkpoint (round_loop.CheckpointError); the message says what to do.
    round_loop.NonFiniteError: the loss or weights became NaN or Inf.
    round_loop.DiskFullError: the disk filled up while writing the run.
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
  # Lock and compare first; config.json is written only once every check below has passed, so a
  # start that fails (bad partition, too many clients, ...) leaves nothing that refuses the
  # corrected command.
  resumed = run_dir.prepare(config.output_dir, config.to_dict(), overwrite=overwrite, log=log,
                            migrate=config_lib.migrate_dict)
  finished = _finished_summary(config) if resumed else None
  if finished is not None:  # Nothing to train, evaluate or export: said, and the results named.
    run_dir.unlock(config.output_dir)
    log(f'{config.output_dir} is already complete: it finished its {config.rounds} rounds '
        f'(final test accuracy {finished["final_test_accuracy"]:.4f}); nothing was trained or '
        f'exported again. Its results: {os.path.join(config.output_dir, "summary.json")}, '
        f'metrics.csv, export/saved_model (its report: bin/report --run_dir={config.output_dir}). '
        'To train on, give a larger --rounds.')
    return finished
  try:
    exp = composition.Experiment(config, log=log)
    if config.precision != 'float32':
      if tf.config.list_physical_devices('GPU'):
        where = 'on the GPU (fast on Ampere or newer)'
      elif precision.native_bfloat16_cpu():
        where = 'this CPU has bfloat16 instructions'
      else:
        where = 'this CPU has no bfloat16 instructions: oneDNN emulates them, slower than float32'
      log(f'Precision: {config.precision} (layers compute in bfloat16, weights stay float32; '
          f'{where})')
    timer.add('setup', time.perf_counter() - setup_start)
    with timer('client_data'):
      exp.prepare_client_data()
    # Built before config.json is written: an aggregator that cannot take this algorithm's update
    # fails here. (The TFF worker starts on the first call, not here.)
    with timer('build'):
      runtime = exp.runtime(config.output_dir)
    if resumed:  # Same configuration: resume only from a checkpoint that can be read.
      resumed = _has_checkpoint(config.output_dir, overwrite, log)
  except BaseException:
    run_dir.unlock(config.output_dir, remove_if_unused=True)
    raise
  run_dir.write_config(config.output_dir, config.to_dict())
  log(('Resuming' if resumed else 'Configuration') + ' (saved to ' +
      run_dir.config_path(config.output_dir) + '):')
  log(json.dumps(config.to_dict(), indent=None, sort_keys=True))
  if aggregation.note(config.aggregator):
    log(f'Note: --aggregator={config.aggregator} is {aggregation.note(config.aggregator)}.')
  ledger = None
  if isinstance(exp.aggregator, aggregation.AccountedDpFactory):
    ledger, runtime = _record_dp_releases(
        exp, runtime, log, save_local_models,
        resumed_round=_checkpoint_round(config.output_dir) if resumed else 0)
  evaluator = exp.evaluator()
  test_ds = exp.test_dataset()
  initial_weights = exp.algorithm.initial_weights()
  initial_client_state = lambda: exp.algorithm.initial_client_state(initial_weights)
  # Only an algorithm with per-client state writes client_states/ (FedBN, SCAFFOLD, MOON, ...).
  store = (client_state.ClientStateStore(os.path.join(config.output_dir, 'client_states'),
                                         initial_fn=initial_client_state)
           if exp.algorithm.stateful else client_state.NoClientStates(initial_client_state))

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
    from tff_decorr.run import collapse_tracking  # pylint: disable=g-import-not-at-top
    on_round_end = collapse_tracking.tracker(exp, evaluator, test_ds, config.eval_every,
                                             config.rounds)

  before_round = None
  if save_local_models or config.track_collapse:
    from tff_decorr.run import collapse_tracking  # pylint: disable=g-import-not-at-top
    before_round = collapse_tracking.LocalModels(exp, evaluator, test_ds,
                                                 save_local_models, local_rounds,
                                                 track=config.track_collapse)

  loop = round_loop.LoopConfig(rounds=config.rounds, num_clients=config.num_clients,
                            clients_per_round=config.clients_per_round, seed=config.seed,
                            eval_every=config.eval_every, export_every=config.export_every)
  t0 = time.time()
  summary = round_loop.run(runtime=runtime, algorithm=exp.algorithm, store=store, loop=loop,
                        output_dir=config.output_dir, evaluate_fn=evaluate,
                        export_fn=exp.export, on_round_end=on_round_end,
                        before_round=before_round, check_clients=exp.check_client_data,
                        config=config.to_dict(), log=log, timer=timer)
  if summary is None:  # More rounds done than --rounds: nothing trained, nothing (re)written.
    return None
  summary.update(exp.privacy(summary['final_round'], ledger, save_local_models))
  if 'dp_note' in summary:
    log(f'Privacy: {summary["dp_note"]}.')
  if 'dp_ledger_note' in summary:
    log(f'Privacy: warning: {summary["dp_ledger_note"]}.')
  summary.update({'config': config.to_dict(), 'versions': _versions(),
                  'wall_time_s': time.time() - t0})
  summary_path = os.path.join(config.output_dir, 'summary.json')
  with timer('summary'):
    summary['phases_s'] = timer.ordered()  # Without the summary's own write: a few ms.
    with round_loop.writing(summary_path, summary['final_round']):
      run_dir.write_json_atomic(summary_path, summary)
  log(timer.line())
  return summary
