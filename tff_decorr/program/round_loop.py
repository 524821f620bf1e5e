"""The training program's round loop, in four steps a round: sample its clients, train it, evaluate
the global model, commit it (metrics, export, checkpoint, progress line) to the run directory's
owner (tff_decorr.run_files.run_directory.RunDirectory).

It is independent of tasks, models and runtimes: it drives any runtime with `initialize()` and
`run_round(server_state, client_inputs, client_states)` (the TFF iterative process and the
in-process TF runtime both provide them), so a run checkpointed under one runtime resumes under the
other.
Resumption is exact: client sampling and each client's data seed are pure functions of (seed,
round, client id), and the checkpoint holds everything else.

Evaluation overlaps training: round r's evaluation runs in a second thread while round r+1 trains,
filling the cores one client's training leaves idle (docs/benchmarks.md §3). Round r is committed
when its evaluation is done, after round r+1 has trained and before round r+1's client states are
written, so every checkpoint names exactly its own round's client states. If round r+1 fails or is
interrupted, round r is committed first: a failure still leaves the last trained round
checkpointed. Only the last round's evaluation, with no round after it, runs in the loop's thread.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from tff_decorr import _moved
from tff_decorr.configs import cli
from tff_decorr.program import personalized
from tff_decorr.run_files import run_directory


class NonFiniteError(cli.RunFailedError):  # A RuntimeError.
  """Training produced a non-finite loss or global weights; the previous checkpoint is kept."""


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
  """The loop's settings (the rounds to run are the run directory's: RunDirectory.rounds)."""
  num_clients: int
  clients_per_round: int
  seed: int
  eval_every: int = 1
  export_every: int = 0  # 0: export only at the end
  overlap_evaluation: bool = True  # evaluate round r while round r+1 trains (module docstring)

  @classmethod
  def from_config(cls, config) -> 'LoopConfig':
    """The loop's settings of a `tff_decorr.configs.config.Config`."""
    return cls(num_clients=config.num_clients, clients_per_round=config.clients_per_round,
               seed=config.seed, eval_every=config.eval_every, export_every=config.export_every)

  def client_inputs(self, round_num: int) -> list:
    """[(client id, its data seed)] of round `round_num`'s sampled clients."""
    return [(str(c), client_seed(self.seed, round_num, c))
            for c in sample_clients(self.num_clients, self.clients_per_round, self.seed, round_num)]


@dataclasses.dataclass
class RoundHooks:
  """What the loop calls besides the runtime.

  Attributes:
    evaluate: (server state, round) -> dict of test metrics: scalars ('test_accuracy' is the
      headline: the global model's, or for a personalised algorithm the clients' own models'
      mean) and optionally 'per_client_test_accuracy' (a list in client-id order, written to the
      metrics as client_<i>_test_accuracy and to the summary).
    export: (weights, directory, extra metadata or None) -> writes a SavedModel there. A
      personalised algorithm also exports each client's own model (personalized.client_export_dir).
    on_round_end: optional (round, server_state) -> metrics dict, called when a round is committed.
    on_evaluated: optional (round, server_state) -> metrics dict, called when a round the loop
      evaluated (every `eval_every` rounds, and the last) is committed, after that evaluation:
      it may read the evaluator's model, which holds the round's global weights.
    before_round: optional (round, server_state, client_inputs, client_states) -> metrics dict,
      called before the round runs (e.g. to reproduce and save chosen clients' local models).
    check_clients: optional (client ids) -> None, raising with a clear message when a sampled
      client's data is unusable (e.g. a missing cache shard), before the round starts.
  """
  evaluate: Callable[[Any, int], dict]
  export: Callable[[list, str, Optional[dict]], None]
  on_round_end: Optional[Callable[[int, Any], Optional[dict]]] = None
  on_evaluated: Optional[Callable[[int, Any], Optional[dict]]] = None
  before_round: Optional[Callable[..., Optional[dict]]] = None
  check_clients: Optional[Callable[[Sequence[str]], None]] = None

  def allow_overlap(self) -> bool:
    """Whether an evaluation may run beside the next round: not when a hook shares the evaluator
    or the round's state with it. A before_round hook that does not may say so
    (`shares_evaluator = False`: collapse_tracking.LocalModels when it only saves local models);
    one that does not say is taken to share it."""
    if self.on_round_end is not None or self.on_evaluated is not None:
      return False
    return self.before_round is None or not getattr(self.before_round, 'shares_evaluator', True)


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
  # server step's scalars (runtimes/federated_round.py): FedExP's eta_g, the server optimisers'
  # norms.
  out.update({k: float(v) for k, v in m.items() if k.startswith(('aggregator/', 'server/'))})
  return out


def _fmt_eta(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m:d}:{s:02d}'


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


class _RoundLoop:
  """One invocation's rounds: the steps sample, train, evaluate and commit, and the finish."""

  def __init__(self, runtime, algorithm, loop: LoopConfig, directory: run_directory.RunDirectory,
               hooks: RoundHooks):
    self.runtime, self.algorithm, self.loop, self.hooks = runtime, algorithm, loop, hooks
    self.dir = directory
    self.timer = directory.timer
    self.rounds = directory.rounds
    self.state: dict = {}  # The program state of the newest committed round.
    self.server_state = None  # The newest trained round's.
    self.times: list = []  # Round times of this invocation.
    self.last_test: dict = {}
    self.evaluations = None  # The evaluation thread, when evaluation overlaps training.

  def start(self) -> bool:
    """The state to continue from; False when the run already holds more rounds than asked."""
    with self.timer('initialize'):
      initial_state = self.runtime.initialize()
      saved = self.dir.load(initial_state)
    if saved is not None and int(saved['round']) > self.rounds:
      return False  # A start through RunDirectory.finished has said so, and stopped before here.
    state = self.dir.resume(saved, initial_state)
    self.state, self.server_state = state, state['server_state']
    if self.loop.overlap_evaluation and self.hooks.allow_overlap():
      self.evaluations = concurrent.futures.ThreadPoolExecutor(
          max_workers=1, thread_name_prefix='tff_decorr_evaluation')
    return True

  def sample(self, round_num: int) -> list:
    """Round `round_num`'s [(client id, data seed)], its clients' data checked."""
    client_inputs = self.loop.client_inputs(round_num)
    if self.hooks.check_clients is not None:
      self.hooks.check_clients([cid for cid, _ in client_inputs])
    return client_inputs

  def train(self, round_num: int, client_inputs: list, first: bool):
    """Runs the round: (its client states, train metrics, round time, before_round's metrics)."""
    ids = [cid for cid, _ in client_inputs]
    with self.timer('client_states'):
      client_states = self.dir.store.load_many(ids)  # Up to date: a pending round saved its own.
    with self.dir.writing('local_models'):
      before = self.hooks.before_round
      pre_round = (before(round_num, self.server_state, client_inputs, client_states)
                   if before is not None else None)
    t0 = time.perf_counter()  # Round time: the federated round alone.
    # The first round of an invocation traces and compiles: timed apart from the steady ones.
    with self.timer('first_round' if first else 'steady_rounds'):
      self.server_state, new_states, train_metrics = self.runtime.run_round(
          self.server_state, client_inputs, client_states)
      self.dir.released(round_num)
    return new_states, train_metrics, time.perf_counter() - t0, pre_round

  def keep(self, round_num: int, client_inputs: list, trained_round) -> _Trained:
    """Checks the round is finite and saves its client states: the round to evaluate, commit."""
    new_states, train_metrics, round_time, pre_round = trained_round
    loss = float(train_metrics.get('loss_sum', 0.0))
    weights = self.algorithm.global_weights(self.server_state)
    if not math.isfinite(loss) or not is_finite_weights(weights):
      what = 'training loss' if not math.isfinite(loss) else 'global model weights'
      raise NonFiniteError(
          f'round {round_num}: the {what} became non-finite (NaN or inf); stopped without '
          'saving it. ' + (f'The checkpoint of round {round_num - 1} is kept. '
                           if round_num > 1 else '') +
          'Lower --client_lr (or the regulariser/algorithm coefficients) and start a new '
          '--output_dir.')
    self.dir.write_client_states([cid for cid, _ in client_inputs], new_states, round_num)
    self.times.append(round_time)
    values = summarize_train_metrics(train_metrics)
    values['round_time_s'] = round_time
    if pre_round:
      values.update(pre_round)
    return _Trained(round_num, self.server_state, values, round_time, len(client_inputs))

  def evaluate(self, trained: _Trained) -> bool:
    """Starts the round's evaluation if it is due; True when it runs beside the next round (the
    round is committed after that one trains)."""
    r = trained.round_num
    if r % max(self.loop.eval_every, 1) != 0 and r != self.rounds:
      return False
    # The first overlapped evaluation also traces the evaluator in that thread (the runtime traced
    # in round 1, so nothing else traces beside it).
    if self.evaluations is not None and r < self.rounds:
      trained.evaluation = self.evaluations.submit(self.hooks.evaluate, trained.server_state, r)
      return True
    with self.timer('evaluation'):
      trained.evaluation = _done(self.hooks.evaluate(trained.server_state, r))
    return False

  def _test_metrics(self, p: _Trained) -> dict:
    """Round p's evaluation (waited for), added to its values and the best/last accuracy."""
    if p.evaluation is None:
      return {}
    with self.timer('evaluation'):  # An overlapped one: the time waited for it.
      test = self.last_test = p.evaluation.result()
    p.values.update({k: v for k, v in test.items() if np.isscalar(v)})
    for i, a in enumerate(test.get('per_client_test_accuracy', [])):
      p.values[f'client_{i}_test_accuracy'] = a
    acc = np.float64(test.get('test_accuracy', -1.0))
    self.state['last_accuracy'] = acc
    if acc > self.state['best_accuracy']:
      self.state['best_accuracy'], self.state['best_round'] = acc, p.round_num
    return test

  def commit(self, p: _Trained) -> None:
    """Round p's evaluation, metrics, export, checkpoint and progress line."""
    test = self._test_metrics(p)
    for hook, due in ((self.hooks.on_evaluated, p.evaluation is not None),
                      (self.hooks.on_round_end, True)):
      if hook is not None and due:
        with self.dir.writing('collapse'):
          p.values.update(hook(p.round_num, p.server_state) or {})
    self.dir.write_metrics(p.values, p.round_num)
    if self.loop.export_every and p.round_num % self.loop.export_every == 0:
      name = os.path.join('export', f'round_{p.round_num}')
      with self.dir.writing(name), self.timer('export'):
        self.hooks.export(self.algorithm.global_weights(p.server_state), self.dir.file(name), None)
    self.state = {'round': p.round_num, 'server_state': p.server_state,
                  'best_accuracy': np.float64(self.state['best_accuracy']),
                  'best_round': int(self.state['best_round']),
                  'last_accuracy': np.float64(self.state['last_accuracy'])}
    self.dir.checkpoint(self.state)  # The commit point of the round.
    self.dir.log(self._progress_line(p, test))

  def _progress_line(self, p: _Trained, test: dict) -> str:
    values = p.values
    eta = (self.rounds - p.round_num) * float(np.median(self.times[1:] or self.times))
    line = (f'round {p.round_num}/{self.rounds}  clients {p.num_clients}  '
            f'train_loss {values["train_loss"]:.4f}  train_acc {values["train_accuracy"]:.4f}  '
            f'reg {values["train_regularizer"]:.4f}')
    if test:
      line += f'  test_acc {float(test.get("test_accuracy", float("nan"))):.4f}'
    if 'aggregator/dp_epsilon' in values:
      line += f'  epsilon {values["aggregator/dp_epsilon"]:.3g}'
    return line + f'  {p.round_time:.1f}s  ETA {_fmt_eta(eta)}'

  def run_rounds(self) -> None:
    """Rounds after the checkpointed one up to the last, each sampled, trained, evaluated and
    committed; a round whose evaluation overlaps the next is committed after that one trains."""
    start = int(self.state['round']) + 1
    pending = None
    try:
      for round_num in range(start, self.rounds + 1):
        client_inputs = self.sample(round_num)
        trained_round = self.train(round_num, client_inputs, first=round_num == start)
        if pending is not None:  # Before this round's client states are written.
          p, pending = pending, None
          self.commit(p)
        trained = self.keep(round_num, client_inputs, trained_round)
        if self.evaluate(trained):
          pending = trained
        else:
          self.commit(trained)
    finally:  # Also when a round fails or is interrupted: the evaluated round is committed first.
      if pending is not None:
        self.commit(pending)

  def finish(self) -> dict:
    """Exports the final model(s) and returns the summary."""
    with self.dir.writing('export'), self.timer('export'):
      summary = self._export_final()
    self.dir.write_final_metrics(summary)
    return summary

  def _export_final(self) -> dict:
    alg, state, export = self.algorithm, self.state, self.hooks.export
    export_dir = self.dir.file('export', 'saved_model')
    export(alg.global_weights(self.server_state), export_dir,
           {'personalized': bool(alg.personalized)})
    summary = {
        'final_test_accuracy': float(state['last_accuracy']),
        'final_round': int(state['round']),
        'best_test_accuracy': float(state['best_accuracy']),
        'best_round': int(state['best_round']),
        'saved_model': export_dir,
        'evaluated_model': 'global',
    }
    if not alg.personalized:
      return summary
    last_test = self.last_test
    if not last_test and int(state['round']) > 0:  # Resumed after the last round: evaluate again.
      last_test = self.hooks.evaluate(self.server_state, int(state['round']))
    summary['evaluated_model'] = ('per client: shared weights + the client\'s own local part, '
                                  'mean weighted by test examples')
    summary['per_client_test_accuracy'] = list(last_test.get('per_client_test_accuracy', []))
    summary['client_saved_models'] = []
    for cid in range(self.loop.num_clients):
      path = personalized.client_export_dir(self.dir.path, cid)
      export(alg.client_weights(self.server_state, self.dir.store.load(str(cid))), path,
             {'personalized': True, 'client_id': cid})
      summary['client_saved_models'].append(path)
    return summary


def train_rounds(runtime, algorithm, loop: LoopConfig, directory: run_directory.RunDirectory,
        hooks: RoundHooks) -> Optional[dict]:
  """Runs (or resumes) the federated training loop in `directory`. Returns the final summary.

  Args:
    runtime: object with `initialize()` and `run_round(server_state, client_inputs, client_states)`.
    algorithm: gives `global_weights(server_state)` and `initial_client_state(weights)`.
    loop: the loop's settings.
    directory: the run directory's owner, its client states opened (`open_client_states`): it
      resumes, commits each round and times its writes (`directory.timer`).
    hooks: evaluation, export and the optional hooks (RoundHooks).

  Returns:
    The summary, or None when the run already holds more rounds than `directory.rounds` (nothing
    is trained or written).

  Raises:
    NonFiniteError: the loss or weights became non-finite (the last finite round stays
      checkpointed).
    Interrupted: Ctrl-C; the last completed round is checkpointed.
    run_directory.CheckpointError, run_directory.DiskFullError: from the run directory.
  """
  loop_ = _RoundLoop(runtime, algorithm, loop, directory, hooks)
  if not loop_.start():
    return None
  try:
    loop_.run_rounds()
  except KeyboardInterrupt:
    raise Interrupted(directory.checkpoint_round()) from None
  finally:
    if loop_.evaluations is not None:
      loop_.evaluations.shutdown(wait=True, cancel_futures=True)
  return loop_.finish()


def set_gpu_memory_growth() -> list:
  """Memory growth on every GPU (no pre-allocation), so several runs and evaluation can share it."""
  gpus = tf.config.list_physical_devices('GPU')
  for gpu in gpus:
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # Already initialised: the setting can no longer change; harmless.
      logging.warning('GPU %s was initialised before memory growth could be set.', gpu.name)
  return gpus


# round_loop.run, train_rounds' name before 0.4.0.
__getattr__ = _moved.renamed(__name__, {'run': 'train_rounds'}, globals())
