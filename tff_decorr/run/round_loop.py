"""The training program's round loop: sampling, checkpoints, metrics, evaluation, export. A round's
metrics are written here (`Metrics`: metrics.csv and TensorBoard), as are its checkpoint and export.

It is independent of tasks, models and runtimes: it drives any runtime with `initialize()` and
`run_round(server_state, client_inputs, client_states)` (the TFF iterative process and the in-process
TF runtime both provide them), so a run checkpointed under one runtime resumes under the other.

Resumption is exact: client sampling and each client's data-shuffling/augmentation seed are pure
functions of (seed, round, client id), and the program state saved after every round holds
everything else (server state, and which version of each client's state is current). Program state
is written by `checkpoint_files.ArrayFileProgramStateManager` (TFF's file program state manager,
one file of arrays per round), into a temporary directory that is renamed when complete, so a kill
at any moment leaves either the previous or the new version, never half of one.

Evaluation overlaps training. A round's evaluation (the global model on the test set, about a fifth
of a CIFAR run) runs in a second thread while the next round trains, filling the cores one client's
training leaves idle. The round is committed (metrics, export, checkpoint, its progress line) when
its evaluation is done, after the next round has trained and before that round's client states are
written, so every checkpoint still names exactly its own round's client states. If the next round
fails or is interrupted, the evaluated round is committed first: a failure still leaves the last
trained round checkpointed. The first evaluation of an invocation traces the evaluator in that
thread too, beside the next round (a first run's largest fixed cost otherwise, docs/benchmarks.md
§3); only the last round's, with no round after it, runs in the loop's own thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import csv
import dataclasses
import errno
import glob
import io
import math
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr.configs import cli
from tff_decorr.run_files import checkpoint_files
from tff_decorr.run_files import graph_check
from tff_decorr.run import phases as phases_lib
from tff_decorr.run import personalized
from tff_decorr.run_files import run_dir
from tff_decorr.run_files import tensorboard_hparams


class CheckpointError(ValueError):
  """A checkpoint exists but cannot be read; the message says how to proceed."""


class NonFiniteError(cli.RunFailedError):  # A RuntimeError.
  """Training produced a non-finite loss or global weights; the previous checkpoint is kept."""


class DiskFullError(cli.RunFailedError):  # A RuntimeError.
  """A write found no space left; the last completed round's checkpoint is intact."""


class Interrupted(cli.RunInterrupted):  # Not a KeyboardInterrupt subclass.
  """The user interrupted the run (Ctrl-C); `completed_round` is the last checkpointed round."""


def sample_clients(num_clients: int, clients_per_round: int, seed: int, round_num: int) -> list:
  """The clients of round `round_num` (1-based): a seeded draw without replacement, sorted."""
  if clients_per_round >= num_clients:
    return list(range(num_clients))
  rng = np.random.default_rng([seed, round_num, 0x5A4D])
  return sorted(int(i) for i in rng.choice(num_clients, clients_per_round, replace=False))


def client_seed(seed: int, round_num: int, client_id: int) -> int:
  """Seed of a client's data pipeline (shuffle + augmentation) in a round."""
  return int(np.random.SeedSequence([seed, round_num, client_id]).generate_state(1, np.uint32)[0])


@dataclasses.dataclass
class LoopConfig:
  rounds: int
  num_clients: int
  clients_per_round: int
  seed: int
  eval_every: int = 1
  export_every: int = 0  # 0: export only at the end


class Metrics:
  """Per-round metrics to CSV (TFF's release manager) and TensorBoard, and a progress line.

  TensorBoard's events are flushed every round, before the round's checkpoint: they are the copy
  `repair_metrics` rebuilds a cut or deleted metrics.csv from (a writer left to flush on its own
  would lose the newest rounds to a kill). The run's hyper-parameters and final metrics go to the
  same directory for TensorBoard's HParams dashboard (tensorboard_hparams).
  """

  def __init__(self, output_dir: str):
    self._csv = tff.program.CSVFileReleaseManager(
        os.path.join(output_dir, 'metrics.csv'), key_fieldname='round')
    self._tb = tf.summary.create_file_writer(os.path.join(output_dir, 'tensorboard'))

  def release(self, values: dict, round_num: int) -> None:
    clean = {k: float(v) for k, v in values.items() if v is not None}
    asyncio.run(self._csv.release(clean, key=round_num))
    with self._tb.as_default():
      for name, value in clean.items():
        tf.summary.scalar(name, value, step=round_num)
    self._tb.flush()

  def hparams(self, config: Mapping[str, Any], trial_id: str) -> None:
    tensorboard_hparams.write_run(self._tb, config, trial_id)

  def final(self, summary: Mapping[str, Any]) -> None:
    tensorboard_hparams.write_final(self._tb, summary)


def _round_list(rounds: Sequence[int]) -> str:
  """'1-3, 5': rounds as ranges, for messages."""
  parts, rounds = [], sorted(rounds)
  i = 0
  while i < len(rounds):
    j = i
    while j + 1 < len(rounds) and rounds[j + 1] == rounds[j] + 1:
      j += 1
    parts.append(str(rounds[i]) if i == j else f'{rounds[i]}-{rounds[j]}')
    i = j + 1
  return ', '.join(parts)


def _read_metrics_csv(path: str):
  """(fieldnames, {round: row of strings}, damaged) of metrics.csv as written. A row is damaged
  when it has another number of fields than the header, a value that is not a number, or is the
  last line of a file that does not end with a newline (cut mid-line: its last number may be
  cut short too)."""
  if not os.path.exists(path):
    return [], {}, False
  with open(path, newline='') as f:
    text = f.read()
  records = list(csv.reader(io.StringIO(text)))
  if not records:
    return [], {}, bool(text)
  header, records = records[0], records[1:]
  cut_last = not text.endswith('\n')
  if not records and cut_last:  # The header itself is cut.
    return [], {}, True
  rows, damaged = {}, False
  for i, record in enumerate(records):
    try:
      if len(record) != len(header) or (cut_last and i == len(records) - 1):
        raise ValueError('cut row')
      for v in record[1:]:
        if v:
          float(v)
      rows[int(record[0])] = dict(zip(header, record))
    except ValueError:
      damaged = True
  return header, rows, damaged


def _tensorboard_rows(tb_dir: str, rounds: Sequence[int]) -> dict:
  """{round: {tag: value}} from the event files under `tb_dir`: the newest value of each round's
  scalar (a round run again after a crash was written twice). A truncated event file gives what
  it holds before the cut. The run's HParams records (its hyper-parameters, its final metrics) are
  not per-round metrics and are left out."""
  wanted, newest = set(rounds), {}
  for path in sorted(glob.glob(os.path.join(tb_dir, 'events.out.tfevents.*'))):
    try:
      for record in tf.data.TFRecordDataset(path):
        event = tf.compat.v1.Event.FromString(record.numpy())
        if event.step not in wanted:
          continue
        for v in event.summary.value:
          if (v.tag in tensorboard_hparams.FINAL_TAGS or
              v.metadata.plugin_data.plugin_name == 'hparams'):
            continue
          value = (float(tf.make_ndarray(v.tensor)) if v.HasField('tensor')
                   else float(v.simple_value))
          key = (int(event.step), v.tag)
          if key not in newest or event.wall_time >= newest[key][0]:
            newest[key] = (event.wall_time, value)
    except (tf.errors.DataLossError, tf.errors.OpError, ValueError):
      continue  # What was read before the damage is kept.
  out: dict = {}
  for (step, tag), (_, value) in newest.items():
    out.setdefault(step, {})[tag] = value
  return out


def repair_metrics(output_dir: str, completed_round: int, log=print) -> None:
  """Before resuming after `completed_round`: metrics.csv must hold a whole row for each of rounds
  1..completed_round. Rows that are missing (the file deleted) or damaged (cut mid-line) are rebuilt
  from tensorboard/, which holds the same per-round scalars (as float32); rounds neither holds are
  named as lost, in one warning line. Rows after `completed_round` belong to a round that is run
  again: they are dropped, as TFF's CSV manager would drop them.
  """
  if completed_round < 1:
    return
  path = os.path.join(output_dir, 'metrics.csv')
  existed = os.path.exists(path)
  header, rows, damaged = _read_metrics_csv(path)
  missing = [r for r in range(1, completed_round + 1) if r not in rows]
  if not missing and not damaged:
    return
  rebuilt = _tensorboard_rows(os.path.join(output_dir, 'tensorboard'), missing)
  lost = [r for r in missing if r not in rebuilt]
  fieldnames = ['round'] + [f for f in header if f != 'round']
  for r in sorted(rebuilt):
    fieldnames += [t for t in rebuilt[r] if t not in fieldnames]
  out = {r: row for r, row in rows.items() if r <= completed_round}
  for r, values in rebuilt.items():
    out[r] = {'round': str(r), **{t: repr(v) for t, v in values.items()}}

  def write(f):
    writer = csv.DictWriter(f, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(out[r] for r in sorted(out))
  run_dir.atomic_write(path, write)
  if not missing:  # Only the row of a round that is run again was cut: nothing is lost.
    return
  cause = ('does not exist' if not existed else
           'has cut or unreadable rows' if damaged else 'lacks rows')
  said = [f'warning: {path} {cause} for round(s) {_round_list(missing)} of the '
          f'{completed_round} completed']
  if rebuilt:
    said.append(f'rebuilt round(s) {_round_list(sorted(rebuilt))} from '
                f'{os.path.join(output_dir, "tensorboard")} (float32 precision)')
  if lost:
    said.append(f'the metrics of round(s) {_round_list(lost)} are lost (tensorboard/ does not '
                'hold them either); the run itself resumes from its checkpoint')
  log('; '.join(said) + '.')


def _fmt_eta(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m:d}:{s:02d}'


def summarize_train_metrics(m: dict) -> dict:
  """Turns the runtime's summed client metrics into per-example means."""
  examples = max(float(m.get('examples', 0.0)), 1.0)
  out = {
      'train_loss': float(m.get('loss_sum', 0.0)) / examples,
      'train_ce': float(m.get('ce_sum', 0.0)) / examples,
      'train_regularizer': float(m.get('reg_sum', 0.0)) / examples,
      'train_accuracy': float(m.get('correct', 0.0)) / examples,
      'train_examples': float(m.get('examples', 0.0)),
      'local_steps': float(m.get('steps', 0.0)),
  }
  for k in ('extra_sum',):
    if k in m:
      out['train_algorithm_term'] = float(m[k]) / examples
  for k in ('bytes_up', 'bytes_down', 'clients', 'bytes_up_float32'):
    if k in m:
      out[k] = float(m[k])
  # A tff.aggregators factory's measurements (--aggregator): clipping norms, dp_epsilon, ...; the
  # server step's scalars (runtimes/rounds.py): FedExP's eta_g, the server optimisers' norms.
  out.update({k: float(v) for k, v in m.items() if k.startswith(('aggregator/', 'server/'))})
  return out


def checkpoint_manager(output_dir: str) -> checkpoint_files.ArrayFileProgramStateManager:
  # The two newest rounds (TFF's default keep_first=True would keep round 1 and the newest only),
  # so removing a damaged newest checkpoint resumes from the one before it.
  return checkpoint_files.ArrayFileProgramStateManager(
      os.path.join(output_dir, 'checkpoints'), prefix='round_', keep_total=2, keep_first=False)


def client_manifest_path(output_dir: str, round_num: int) -> str:
  return os.path.join(output_dir, 'checkpoints', f'client_states_{round_num}.json')


def _checkpoint_structure(initial_server_state) -> dict:
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
def writing(path: str, completed_round: int):
  """Turns a full disk while writing `path` into DiskFullError: one line that names the file the
  run was writing (not TensorFlow's temporary file) and the round that stays resumable."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless the disk is full)
    if not is_disk_full(e):
      raise
    raise DiskFullError(disk_full_message(path, completed_round)) from e


def load_checkpoint(output_dir: str, initial_server_state) -> Optional[dict]:
  """The latest program state of a run (None for a new run); CheckpointError if unreadable,
  graph_check.UnsafeGraphError if it names operations tff_decorr never writes."""
  versions = asyncio.run(checkpoint_manager(output_dir).get_versions()) or []
  if versions:
    path = os.path.join(output_dir, 'checkpoints', f'round_{max(versions)}')
    graph_check.check(path, f'the checkpoint {path}')
  try:
    saved, _ = asyncio.run(checkpoint_manager(output_dir).load_latest(
        _checkpoint_structure(initial_server_state)))
  except Exception as e:  # Any failure to read is reported the same way: never train over it.
    raise CheckpointError(
        f'the checkpoint in {output_dir}/checkpoints cannot be read ({type(e).__name__}: '
        f'{str(e)[:160]}); {_recovery_advice(output_dir)}.') from e
  return saved


def is_finite_weights(weights: Sequence) -> bool:
  return all(np.all(np.isfinite(np.asarray(w))) for w in weights)


@dataclasses.dataclass
class _Trained:
  """A trained round not yet committed (evaluated, released, checkpointed)."""
  round_num: int
  server_state: Any
  values: dict
  round_time: float
  num_clients: int
  evaluation: Optional[concurrent.futures.Future] = None


def _done(value) -> concurrent.futures.Future:
  f = concurrent.futures.Future()
  f.set_result(value)
  return f


def run(*, runtime, algorithm, store, loop: LoopConfig, output_dir: str,
        evaluate_fn: Callable[[Any, int], dict],
        export_fn: Callable[[list, str, Optional[dict]], None],
        on_round_end: Optional[Callable[[int, Any], None]] = None,
        before_round: Optional[Callable[..., Optional[dict]]] = None,
        check_clients: Optional[Callable[[Sequence[str]], None]] = None,
        config: Optional[Mapping[str, Any]] = None, log=print,
        timer: Optional[phases_lib.Phases] = None,
        overlap_evaluation: bool = True) -> Optional[dict]:
  """Runs (or resumes) the federated training loop. Returns the final summary dict.

  Args:
    runtime: object with `initialize()` and `run_round(server_state, client_inputs, client_states)`.
    algorithm: gives `global_weights(server_state)` and `initial_client_state(weights)`.
    store: the per-client state store (`tff_decorr.run_files.client_state.ClientStateStore`); its
      manifest is saved beside each checkpoint so a resumed run sees exactly that round's client
      states.
    evaluate_fn: (server state, round) -> dict of test metrics: scalars ('test_accuracy' is the
      headline: the global model's, or for a personalised algorithm the clients' own models'
      mean) and optionally 'per_client_test_accuracy' (a list in client-id order, written to the
      metrics as client_<i>_test_accuracy and to the summary).
    before_round: optional (round, server_state, client_inputs, client_states) -> metrics dict,
      called before the round runs (e.g. to reproduce and save chosen clients' local models).
    export_fn: (weights, directory, extra metadata or None) -> writes a SavedModel there. A
      personalised algorithm also exports each client's own model (personalized.client_export_dir).
    check_clients: optional (client ids) -> None, raising with a clear message when a sampled
      client's data is unusable (e.g. a missing cache shard), before the round starts.
    config: optional resolved configuration (`Config.to_dict()`): written to tensorboard/ as the
      run's hyper-parameters, with its final metrics at the end (TensorBoard's HParams dashboard).
    timer: optional phases.Phases, given the wall time of each phase of the loop.
    overlap_evaluation: evaluate round r in a second thread while round r+1 trains (module
      docstring); ignored with on_round_end, and with a before_round hook unless it has
      `shares_evaluator = False`.

  Returns the summary, or None when the run already holds more rounds than `loop.rounds` (nothing
  is trained or written). Raises NonFiniteError (the last finite round stays checkpointed) and
  Interrupted (Ctrl-C; the last completed round is checkpointed).
  """
  timer = timer or phases_lib.Phases()
  ckpt_dir = os.path.join(output_dir, 'checkpoints')
  ckpt = checkpoint_manager(output_dir)
  manifest = lambda r: client_manifest_path(output_dir, r)
  with timer('initialize'):
    initial_state = runtime.initialize()
    structure = _checkpoint_structure(initial_state)
    saved = load_checkpoint(output_dir, initial_state)
  if saved is None:
    state = structure
    log(f'Starting a new run in {output_dir}')
  else:
    state = saved
    try:
      store.load_manifest(manifest(int(state['round'])))
    except (OSError, ValueError) as e:
      raise CheckpointError(f'the client states of the checkpoint in {ckpt_dir} are incomplete '
                            f'({e}); {_recovery_advice(output_dir)}.') from e
    log(f'Resuming {output_dir} after round {int(state["round"])}')
    if int(state['round']) > loop.rounds:
      log(f'warning: the run already completed {int(state["round"])} rounds, more than '
          f'--rounds={loop.rounds}; nothing to do (its summary.json is left as it is).')
      return None
  completed = int(state['round'])  # The newest checkpointed round: what a failure leaves.
  guard = lambda path: writing(os.path.join(output_dir, path), completed)
  with guard('metrics.csv'):
    repair_metrics(output_dir, completed, log)
    metrics_io = Metrics(output_dir)
    if config is not None:  # On every start: TensorBoard shows the first one a run recorded.
      metrics_io.hparams(config, trial_id=os.path.basename(os.path.normpath(output_dir)))
  start_round = completed + 1
  server_state = state['server_state']
  # Evaluation of round r overlaps round r+1's training (module docstring) unless a hook shares
  # the evaluator or the round's state with it. A before_round hook that does not may say so
  # (`shares_evaluator = False`: collapse_tracking.LocalModels when it only saves local models);
  # one that does not say is taken to share it.
  overlap = (overlap_evaluation and not getattr(before_round, 'shares_evaluator', True) and
             on_round_end is None) if before_round is not None else (
                 overlap_evaluation and on_round_end is None)
  evaluations = concurrent.futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix='tff_decorr_evaluation') if overlap else None
  times = []
  last_test = {}
  pending = None  # The trained round whose evaluation runs while the next round trains.

  def commit(p: _Trained):
    """Round p's evaluation (waited for), metrics, export, checkpoint and progress line."""
    nonlocal state, completed, last_test
    values, test = p.values, {}
    if p.evaluation is not None:
      with timer('evaluation'):  # An overlapped one: the time waited for it.
        test = last_test = p.evaluation.result()
      values.update({k: v for k, v in test.items() if np.isscalar(v)})
      for i, a in enumerate(test.get('per_client_test_accuracy', [])):
        values[f'client_{i}_test_accuracy'] = a
      acc = np.float64(test.get('test_accuracy', -1.0))
      state['last_accuracy'] = acc
      if acc > state['best_accuracy']:
        state['best_accuracy'], state['best_round'] = acc, p.round_num
    if on_round_end is not None:
      with guard('collapse'):
        extra = on_round_end(p.round_num, p.server_state)
      if extra:
        values.update(extra)
    with guard('metrics.csv'), timer('metrics'):  # and tensorboard/
      metrics_io.release(values, p.round_num)
    if loop.export_every and p.round_num % loop.export_every == 0:
      with guard(os.path.join('export', f'round_{p.round_num}')), timer('export'):
        export_fn(algorithm.global_weights(p.server_state),
                  os.path.join(output_dir, 'export', f'round_{p.round_num}'), None)
    state = {'round': p.round_num, 'server_state': p.server_state,
             'best_accuracy': np.float64(state['best_accuracy']),
             'best_round': int(state['best_round']),
             'last_accuracy': np.float64(state['last_accuracy'])}
    with guard(os.path.join('checkpoints', f'round_{p.round_num}')), timer('checkpoints'):
      store.save_manifest(manifest(p.round_num), prune=False)
      asyncio.run(ckpt.save(state, p.round_num))  # The commit point of the round.
    completed = p.round_num
    with guard('checkpoints'), timer('checkpoints'):
      # Prune client states no kept checkpoint refers to (this one and the previous one).
      store.save_manifest(manifest(p.round_num), prune=True,
                          keep=store.read_manifest(manifest(p.round_num - 1)))
    stale = manifest(p.round_num - 2)
    if os.path.exists(stale):
      os.remove(stale)
    steady = times[1:] or times
    eta = (loop.rounds - p.round_num) * float(np.median(steady))
    line = (f'round {p.round_num}/{loop.rounds}  clients {p.num_clients}  '
            f'train_loss {values["train_loss"]:.4f}  train_acc {values["train_accuracy"]:.4f}  '
            f'reg {values["train_regularizer"]:.4f}')
    if test:
      line += f'  test_acc {float(test.get("test_accuracy", float("nan"))):.4f}'
    if 'aggregator/dp_epsilon' in values:
      line += f'  epsilon {values["aggregator/dp_epsilon"]:.3g}'
    line += f'  {p.round_time:.1f}s  ETA {_fmt_eta(eta)}'
    log(line)

  try:
    try:
      for round_num in range(start_round, loop.rounds + 1):
        clients = sample_clients(loop.num_clients, loop.clients_per_round, loop.seed, round_num)
        client_inputs = [(str(c), client_seed(loop.seed, round_num, c)) for c in clients]
        ids = [cid for cid, _ in client_inputs]
        if check_clients is not None:
          check_clients(ids)
        with timer('client_states'):
          client_states = store.load_many(ids)  # Those `pending` saved: the store is up to date.
        with guard('local_models'):
          pre_round = (before_round(round_num, server_state, client_inputs, client_states)
                       if before_round is not None else None)
        t0 = time.perf_counter()  # Round time: the federated round alone.
        # The first round of an invocation traces and compiles: timed apart from the steady ones.
        with timer('first_round' if round_num == start_round else 'steady_rounds'):
          server_state, new_states, train_metrics = runtime.run_round(server_state, client_inputs,
                                                                      client_states)
        round_time = time.perf_counter() - t0
        if pending is not None:  # Before this round's client states are written.
          p, pending = pending, None
          commit(p)
        loss = float(train_metrics.get('loss_sum', 0.0))
        if not math.isfinite(loss) or not is_finite_weights(algorithm.global_weights(server_state)):
          what = 'training loss' if not math.isfinite(loss) else 'global model weights'
          raise NonFiniteError(
              f'round {round_num}: the {what} became non-finite (NaN or inf); stopped without '
              'saving it. ' + (f'The checkpoint of round {round_num - 1} is kept. '
                               if round_num > 1 else '') +
              'Lower --client_lr (or the regulariser/algorithm coefficients) and start a new '
              '--output_dir.')
        with guard('client_states'), timer('client_states'):
          store.save_many(ids, new_states, round_num)
        times.append(round_time)
        values = summarize_train_metrics(train_metrics)
        values['round_time_s'] = round_time
        if pre_round:
          values.update(pre_round)
        trained = _Trained(round_num, server_state, values, round_time, len(clients))
        if round_num % max(loop.eval_every, 1) == 0 or round_num == loop.rounds:
          # Overlapped when a round follows in this invocation; the first also traces the
          # evaluator there (the runtime traced in round 1, so nothing else traces beside it).
          if overlap and round_num < loop.rounds:
            trained.evaluation = evaluations.submit(evaluate_fn, server_state, round_num)
            pending = trained
            continue
          with timer('evaluation'):
            trained.evaluation = _done(evaluate_fn(server_state, round_num))
        commit(trained)
    finally:  # Also when a round fails or is interrupted: the evaluated round is committed first.
      if pending is not None:
        p, pending = pending, None
        commit(p)
  except KeyboardInterrupt:
    raise Interrupted(_completed_round(output_dir)) from None
  finally:
    if evaluations is not None:
      evaluations.shutdown(wait=True, cancel_futures=True)
  with guard('export'), timer('export'):
    summary = _finish(algorithm, store, loop, output_dir, evaluate_fn, export_fn, server_state,
                      state, last_test)
  with guard('tensorboard'), timer('metrics'):
    metrics_io.final(summary)
  return summary


def _completed_round(output_dir: str) -> int:
  try:
    versions = asyncio.run(checkpoint_manager(output_dir).get_versions()) or []
  except Exception:  # pylint: disable=broad-except
    versions = []
  return int(max(versions)) if versions else 0


def _finish(algorithm, store, loop, output_dir, evaluate_fn, export_fn, server_state, state,
            last_test):
  """Exports the final model(s) and returns the summary."""
  final_weights = algorithm.global_weights(server_state)
  export_dir = os.path.join(output_dir, 'export', 'saved_model')
  export_fn(final_weights, export_dir, {'personalized': bool(algorithm.personalized)})
  summary = {
      'final_test_accuracy': float(state['last_accuracy']),
      'final_round': int(state['round']),
      'best_test_accuracy': float(state['best_accuracy']),
      'best_round': int(state['best_round']),
      'saved_model': export_dir,
      'evaluated_model': 'global',
  }
  if algorithm.personalized:
    if not last_test and int(state['round']) > 0:  # Resumed after the last round: evaluate again.
      last_test = evaluate_fn(server_state, int(state['round']))
    summary['evaluated_model'] = ('per client: shared weights + the client\'s own local part, '
                                  'mean weighted by test examples')
    summary['per_client_test_accuracy'] = list(last_test.get('per_client_test_accuracy', []))
    summary['client_saved_models'] = []
    for cid in range(loop.num_clients):
      path = personalized.client_export_dir(output_dir, cid)
      export_fn(algorithm.client_weights(server_state, store.load(str(cid))), path,
                {'personalized': True, 'client_id': cid})
      summary['client_saved_models'].append(path)
  return summary


def set_gpu_memory_growth() -> list:
  """Memory growth on every GPU (no pre-allocation), so several runs and evaluation can share it."""
  gpus = tf.config.list_physical_devices('GPU')
  for gpu in gpus:
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # Already initialised: the setting can no longer change; harmless.
      logging.warning('GPU %s was initialised before memory growth could be set.', gpu.name)
  return gpus

