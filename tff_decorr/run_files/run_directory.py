"""The owner of a run directory's life (`RunDirectory`): where a run resumes, committing a round,
repairing what a crash left, and the summary.

A start asks it whether the directory holds a finished run, a run to resume (its newest
checkpoint read in full, before anything is written) or none; the round loop asks it for the state
to continue from, hands it each round to commit (the metrics row, the client states and the
checkpoint) and the summary at the end. The files themselves are written by the modules beside this
one: run_dir (lock, config.json, moving aside), checkpoint_files, client_state, metrics_log.

Resumption is exact: the program state saved after every round holds the server state and which
version of each client's state is current, so a resumed run continues as the uninterrupted one
would. A checkpoint is written into a temporary directory renamed when complete, so a kill at any
moment leaves either the previous or the new version, never half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tff_decorr.configs import cli
from tff_decorr.run_files import checkpoint_files
from tff_decorr.run_files import client_state
from tff_decorr.run_files import graph_check
from tff_decorr.run_files import metrics_log
from tff_decorr.run_files import run_dir


class CheckpointError(ValueError):
  """A checkpoint exists but cannot be read; the message says how to proceed."""


class DiskFullError(cli.RunFailedError):  # A RuntimeError.
  """A write found no space left; the last completed round's checkpoint is intact."""


def is_disk_full(e: BaseException) -> bool:
  """ENOSPC as Python raises it, or as TensorFlow's file I/O does (an OpError, often a
  ResourceExhaustedError, whose message carries the OS's words; a GPU's out-of-memory
  ResourceExhaustedError does not), also when wrapped by another exception."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return True
    if isinstance(e, tf.errors.OpError) and 'No space left on device' in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


def disk_full_message(path: str, completed_round: int) -> str:
  kept = (f'the checkpoint of round {completed_round} (the last completed round) is kept'
          if completed_round else 'no round was completed yet')
  return (f'no space left on the device while writing {path}; {kept}. Free some space and re-run '
          'the same command to ' + ('resume.' if completed_round else 'start.'))


@contextlib.contextmanager
def writing(path: str, completed_round: int) -> Iterator[None]:
  """Turns a full disk while writing `path` into DiskFullError: one line that names the file the
  run was writing (not TensorFlow's temporary file) and the round that stays resumable."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless the disk is full)
    if not is_disk_full(e):
      raise
    raise DiskFullError(disk_full_message(path, completed_round)) from e


def checkpoint_manager(output_dir: str) -> checkpoint_files.ArrayFileProgramStateManager:
  """The run's checkpoints: the two newest rounds, so that removing a damaged newest checkpoint
  resumes from the one before it (TFF's default keep_first=True would keep round 1 instead)."""
  return checkpoint_files.ArrayFileProgramStateManager(
      os.path.join(output_dir, 'checkpoints'), prefix='round_', keep_total=2, keep_first=False)


def client_manifest_path(output_dir: str, round_num: int) -> str:
  return os.path.join(output_dir, 'checkpoints', f'client_states_{round_num}.json')


def checkpoint_structure(initial_server_state) -> dict:
  """The program state a checkpoint holds, as a new run starts it."""
  # Accuracies are float64 so that a resumed run's summary equals the uninterrupted one exactly
  # (a Python float would be saved as float32).
  return {'round': 0, 'server_state': initial_server_state, 'best_accuracy': np.float64(0.0),
          'best_round': 0, 'last_accuracy': np.float64(-1.0)}


def _read_checkpoint(output_dir: str, version: int) -> None:
  """Reads checkpoint `version` in full, without the program's state structure; any damaged file
  fails here. A SavedModel checkpoint (written before checkpoint_files) is read as data too (its
  variables, with the checkpoint reader), after graph_check, whose refusal names what a file
  tff_decorr did not write holds."""
  manager = checkpoint_manager(output_dir)
  if not manager.is_saved_model(version):
    manager.read_leaves(version)
    return
  path = os.path.join(output_dir, 'checkpoints', f'round_{version}')
  graph_check.check(path, f'the checkpoint {path}')  # Reads the graph's proto; runs nothing.
  manager.read_saved_model_leaves(version)


def _recovery_advice(output_dir: str) -> str:
  """What to do when the newest checkpoint (or what it refers to) is damaged."""
  ckpt_dir = os.path.join(output_dir, 'checkpoints')
  try:
    versions = sorted(asyncio.run(checkpoint_manager(output_dir).get_versions()) or [])
  except Exception:  # pylint: disable=broad-except  (advice only; never hide the real error)
    versions = []
  previous_readable = False
  if len(versions) >= 2:
    try:
      _read_checkpoint(output_dir, versions[-2])
      previous_readable = True
    except Exception:  # pylint: disable=broad-except  (then no kept checkpoint can be resumed)
      pass
  if previous_readable:
    return (f'remove {ckpt_dir}/round_{versions[-1]} (the newest checkpoint) and re-run the same '
            f'command to resume from round {versions[-2]}, or use another --output_dir '
            '(nothing was changed)')
  return ('no kept checkpoint can be read: use another --output_dir, or re-run with --overwrite to '
          'move this run aside and start a new one (nothing was changed)')


def newest_checkpoint_round(output_dir: str) -> int:
  """The round of the run's newest checkpoint, read in full (0: there is none), so that a start
  decides between resuming and a new run before it writes anything. CheckpointError when it
  cannot be read, with advice that says how to go on."""
  if not os.path.isdir(os.path.join(output_dir, 'checkpoints')):
    return 0
  versions = asyncio.run(checkpoint_manager(output_dir).get_versions()) or []
  if not versions:
    return 0
  newest = os.path.join(output_dir, 'checkpoints', f'round_{max(versions)}')
  try:
    _read_checkpoint(output_dir, max(versions))
  except graph_check.UnsafeGraphError:
    raise  # Not damage: a checkpoint tff_decorr did not write. Its message says so.
  except Exception as e:  # Any failure to read is reported the same way: never train over it.
    # TensorFlow's own words about a damaged SavedModel name its internals, not the fix.
    raise CheckpointError(f'the newest checkpoint, {newest}, cannot be read (damaged or '
                          f'incomplete files: {type(e).__name__}); '
                          f'{_recovery_advice(output_dir)}.') from e
  return int(max(versions))


def load_checkpoint(output_dir: str, initial_server_state) -> Optional[dict]:
  """The latest program state of a run (None for a new run); CheckpointError if unreadable,
  graph_check.UnsafeGraphError if it names operations tff_decorr never writes."""
  versions = asyncio.run(checkpoint_manager(output_dir).get_versions()) or []
  if versions:
    path = os.path.join(output_dir, 'checkpoints', f'round_{max(versions)}')
    graph_check.check(path, f'the checkpoint {path}')
  try:
    saved, _ = asyncio.run(checkpoint_manager(output_dir).load_latest(
        checkpoint_structure(initial_server_state)))
  except Exception as e:  # Any failure to read is reported the same way: never train over it.
    raise CheckpointError(
        f'the checkpoint in {output_dir}/checkpoints cannot be read ({type(e).__name__}: '
        f'{str(e)[:160]}); {_recovery_advice(output_dir)}.') from e
  return saved


def checkpoint_round(output_dir: str) -> int:
  """The round of the newest checkpoint by its name, without reading it (0: none, or unlistable)."""
  try:
    versions = asyncio.run(checkpoint_manager(output_dir).get_versions()) or []
  except Exception:  # pylint: disable=broad-except  (said after an interruption: never hide it)
    versions = []
  return int(max(versions)) if versions else 0


class Finished(NamedTuple):
  """A run with nothing left to train (RunDirectory.finished): its summary.json's contents, or
  None when it holds more rounds than --rounds asks for."""
  summary: Optional[dict]


class RunDirectory:
  """One run directory, from the start that prepares it to the summary that closes it.

  Attributes:
    path: the directory (--output_dir).
    rounds: the rounds the run is to complete (--rounds).
    config: the resolved configuration (`Config.to_dict()`), or None (a loop run without one):
      written as config.json, and to tensorboard/ as the run's hyper-parameters.
    log: where its messages go.
    timer: a phases.Phases-like callable (name -> context manager) timing its writes, or None.
    completed: the newest checkpointed round: what a failure leaves.
    store: the client states (`open_client_states`).
    hooks: objects with `released(round_num)`, told each round once it has been computed (the
      privacy ledger, privacy_ledger.ReleaseHook).
  """

  def __init__(self, path: str, rounds: int, *, config: Optional[Mapping[str, Any]] = None,
               log: Callable[[str], None] = print, timer=None):
    self.path = path
    self.rounds = int(rounds)
    self.config = dict(config) if config is not None else None
    self.log = log
    self.timer = timer if timer is not None else (lambda name: contextlib.nullcontext())
    self.completed = 0
    self.store = None
    self.hooks: list = []
    self._metrics: Optional[metrics_log.Metrics] = None

  def file(self, *parts: str) -> str:
    return os.path.join(self.path, *parts)

  # The start: decided before anything is written.

  def prepare(self, overwrite: bool = False, migrate=None) -> bool:
    """Locks the directory and compares it with `config` (run_dir.prepare); True: it holds this
    configuration's run."""
    return run_dir.prepare(self.path, self.config, overwrite=overwrite, log=self.log,
                           migrate=migrate)

  def write_config(self) -> None:
    run_dir.write_config(self.path, self.config)

  def unlock(self, remove_if_unused: bool = False) -> None:
    run_dir.unlock(self.path, remove_if_unused=remove_if_unused)

  def finished(self, client_exports: Callable[[dict], list]) -> Optional[Finished]:
    """Whether the run has nothing left to train, and if so says why in the log.

    Asked by a start that found this configuration's run (`prepare` returned True), before anything
    is composed or written. It is the one place that compares the run with `rounds`: the round loop
    then trains the rounds after the newest checkpoint up to `rounds`.

    Args:
      client_exports: (summary) -> the directories of the client models a finished run exported
        (a personalised run's), which must exist for it to be complete.

    Returns:
      Finished(summary) when the run completed its `rounds` rounds (its newest checkpoint, read in
      full, is that round's; its summary.json says so; its exports are there): nothing is trained
      or exported again. Finished(None) when its newest checkpoint is of a later round: nothing is
      to be trained or written, its summary.json is left as it is. None when it trains on, or its
      newest checkpoint is damaged (the start that follows refuses it with advice, or under
      --overwrite moves it aside, as any other run).

    Raises:
      graph_check.UnsafeGraphError: the newest checkpoint names operations tff_decorr never writes.
    """
    try:
      newest = newest_checkpoint_round(self.path)
    except CheckpointError:
      return None
    if newest > self.rounds:
      self.log(f'warning: the run already completed {newest} rounds, more than '
               f'--rounds={self.rounds}; nothing to do (its summary.json is left as it is).')
      return Finished(None)
    summary = self._summary_of_round(newest)
    if summary is None:
      return None
    exports = [self.file('export', 'saved_model')] + list(client_exports(summary))
    if not all(os.path.isdir(path) for path in exports):
      return None  # A final model or client model is missing: exported again by the re-run.
    self.log(
        f'{self.path} is already complete: it finished its {self.rounds} rounds (final test '
        f'accuracy {summary["final_test_accuracy"]:.4f}); nothing was trained or exported again. '
        f'Its results: {self.file("summary.json")}, metrics.csv, export/saved_model (its '
        f'report: bin/report --run_dir={self.path}). To train on, give a larger --rounds.')
    return Finished(summary)

  def _summary_of_round(self, newest: int) -> Optional[dict]:
    """summary.json's contents when it closes round `rounds` and that is the newest checkpoint."""
    if newest != self.rounds:
      return None
    try:
      with open(self.file('summary.json')) as f:
        summary = json.load(f)
    except (OSError, ValueError):
      return None
    if not isinstance(summary, dict) or summary.get('final_round') != self.rounds:
      return None
    return summary

  def resumes(self, overwrite: bool) -> bool:
    """Whether this configuration's run resumes from a checkpoint. An unreadable newest checkpoint
    is refused with advice (CheckpointError), and with --overwrite, which that advice offers, the
    run is moved aside and a new one starts. A run without checkpoints starts from round 1 with
    its earlier results set aside (one warning)."""
    try:
      if newest_checkpoint_round(self.path) > 0:
        if overwrite:
          self.log(f'--overwrite: {self.path} holds a run with the same configuration; resuming '
                   'it (--overwrite moves aside only a run with a different configuration or an '
                   'unreadable checkpoint).')
        return True
    except CheckpointError:
      if not overwrite:
        raise
      aside = run_dir.move_aside(self.path)  # Never deleted: the old run is kept whole.
      self.log(f'--overwrite: the checkpoint of {self.path} cannot be read; moved the run to '
               f'{aside} and starting a new one.')
      return False
    run_dir.set_aside_results(self.path, log=self.log)
    return False

  def checkpoint_round(self) -> int:
    return checkpoint_round(self.path)

  def open_client_states(self, stateful: bool, initial_fn: Callable[[], Any]):
    """The client states: written under client_states/ only for an algorithm with per-client
    state (FedBN, SCAFFOLD, MOON, ...)."""
    self.store = (client_state.ClientStateStore(self.file('client_states'), initial_fn=initial_fn)
                  if stateful else client_state.NoClientStates(initial_fn))
    return self.store

  # Resuming, and repairing what a crash left.

  def load(self, initial_server_state) -> Optional[dict]:
    """The newest checkpoint's program state (None: a new run); CheckpointError if unreadable."""
    return load_checkpoint(self.path, initial_server_state)

  def resume(self, saved: Optional[dict], initial_server_state) -> dict:
    """The program state to continue from (`saved`, with its round's client states, or a new
    run's), after metrics.csv is repaired up to its round."""
    if saved is None:
      state = checkpoint_structure(initial_server_state)
      self.log(f'Starting a new run in {self.path}')
    else:
      state = saved
      try:
        self.store.load_manifest(client_manifest_path(self.path, int(state['round'])))
      except (OSError, ValueError) as e:
        raise CheckpointError(
            f'the client states of the checkpoint in {self.file("checkpoints")} are incomplete '
            f'({e}); {_recovery_advice(self.path)}.') from e
      self.log(f'Resuming {self.path} after round {int(state["round"])}')
    self.completed = int(state['round'])
    with self.writing('metrics.csv'):
      metrics_log.repair_metrics(self.path, self.completed, self.log)
      self._metrics = metrics_log.Metrics(self.path)
      if self.config is not None:  # On every start: TensorBoard shows the first one a run recorded.
        self._metrics.hparams(self.config, trial_id=os.path.basename(os.path.normpath(self.path)))
    return state

  def writing(self, name: str):
    """DiskFullError, naming `name` in the directory, for a full disk while writing it."""
    return writing(self.file(name), self.completed)

  # Committing a round.

  def released(self, round_num: int) -> None:
    """Round `round_num` has been computed: its hooks record it, whether or not it is committed."""
    for hook in self.hooks:
      hook.released(round_num)

  def write_client_states(self, ids, states, round_num: int) -> None:
    with self.writing('client_states'), self.timer('client_states'):
      self.store.save_many(ids, states, round_num)

  def write_metrics(self, values: Mapping[str, Any], round_num: int) -> None:
    """The round's row of metrics.csv and its TensorBoard scalars."""
    with self.writing('metrics.csv'), self.timer('metrics'):  # and tensorboard/
      self._metrics.release(dict(values), round_num)

  def checkpoint(self, state: dict) -> None:
    """Commits round `state['round']`: its client states' manifest, then its checkpoint (the
    commit point), then prunes client states and manifests no kept checkpoint refers to."""
    round_num = int(state['round'])
    manifest = lambda r: client_manifest_path(self.path, r)
    with self.writing(os.path.join('checkpoints', f'round_{round_num}')), \
        self.timer('checkpoints'):
      self.store.save_manifest(manifest(round_num), prune=False)
      asyncio.run(checkpoint_manager(self.path).save(state, round_num))
    self.completed = round_num
    with self.writing('checkpoints'), self.timer('checkpoints'):
      # Kept: this checkpoint's client states and the previous one's.
      self.store.save_manifest(manifest(round_num), prune=True,
                               keep=self.store.read_manifest(manifest(round_num - 1)))
    if os.path.exists(manifest(round_num - 2)):
      os.remove(manifest(round_num - 2))

  # The summary.

  def write_summary(self, summary: Mapping[str, Any]) -> None:
    """summary.json, written whole or not at all."""
    path = self.file('summary.json')
    with writing(path, summary['final_round']):
      run_dir.write_json_atomic(path, dict(summary))

  def write_final_metrics(self, summary: Mapping[str, Any]) -> None:
    """The run's final metrics beside its hyper-parameters, for TensorBoard's HParams."""
    with self.writing('tensorboard'), self.timer('metrics'):
      self._metrics.final(summary)
