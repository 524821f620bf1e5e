"""Studies: a grid of bin/train configurations, each run as its own resumable run directory.

A study directory holds
  study.json         the manifest (`MANIFEST`): the grid, every cell's bin/train flags, run
                     directory, log and status; bin/report reads it to know what belongs to the study
  events.out.tfevents.*  TensorBoard's HParams experiment: the axes and metrics
                     (`write_tensorboard_config`; each run writes its own values in its tensorboard/)
  runs/<name>/       one bin/train run directory per cell; <name> is the one bin/train gives a run
                     by default (<task>-<algorithm>-<regularizer>-<config hash>)
  logs/<name>.log    everything the cell's bin/train printed, appended on every attempt

Every cell is checked as bin/train checks its flags (the same flag definitions,
`cli.define_train_flags`, and `cli.resolve_configs`) before anything runs, and every cell is run as
a `python -m tff_decorr.bin.train` child process, so a crash stays in its cell and the run-directory
lock keeps two processes (local jobs, a Slurm array, a second study) from running one cell at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from absl import flags

from tff_decorr.configs import cli
from tff_decorr.configs import config as config_lib
from tff_decorr.run_files import run_dir

MANIFEST = 'study.json'
MANIFEST_VERSION = 1
RUNS = 'runs'
LOGS = 'logs'
# The repository root (this file is tff_decorr/studies/study.py): children run `python -m bin.train`
# from there (through Bazel's runfiles symlinks to the source tree, like tests/testutil.py).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# bin/train flags whose one value may hold commas (paths, host lists, id lists): given whole to
# every cell, never split into a grid axis.
WHOLE_FLAGS = ('data_dir', 'cache_dir', 'workers', 'save_local_models', 'save_local_rounds')
_PATH_FLAGS = ('data_dir', 'cache_dir')
# Set by the study: each cell's run directory is its own, and a study never moves a run aside.
STUDY_OWNED = ('output_dir', 'overwrite')
# What bin/train prints when another process holds a run directory's lock (run_dir.lock).
_BUSY_WORDS = 'is in use by another run'

# Statuses of a cell in the manifest.
DONE, PENDING, PLANNED, RUNNING, FAILED, BUSY, INTERRUPTED = (
    'done', 'pending', 'planned', 'running', 'failed', 'busy', 'interrupted')


class StudyError(ValueError):
  """A study cannot run as given; the message names the flag and the fix (exit 2)."""


def split_values(text: str) -> List[str]:
  """'a, b,a' -> ['a', 'b']: each value once, in order (`--seed=0,0` is one run, not two)."""
  return list(dict.fromkeys(v.strip() for v in str(text).split(',') if v.strip()))


def _as_text(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  return str(value)


def grid_flag_names(train_flags: flags.FlagValues) -> List[str]:
  """The bin/train flags a study takes, in bin/train's order: all but the ones the study sets
  itself."""
  skip = set(STUDY_OWNED)
  names = []
  for name in train_flags:
    flag = train_flags[name]
    if name != flag.name or name in skip or name in names:  # Short names; each flag once.
      continue
    names.append(name)
  return names


def new_train_flags() -> flags.FlagValues:
  """A FlagValues with every bin/train flag defined, nothing parsed."""
  fv = flags.FlagValues()
  cli.define_train_flags(fv)
  return fv


def read_study_file(path: str, allowed: Sequence[str]) -> Dict[str, Any]:
  """A study file: a JSON object {bin/train flag name: value or list of values}, e.g.
  {"algorithm": ["fedavg", "fedprox"], "seed": [0, 1, 2], "rounds": 100}."""
  try:
    with open(path) as f:
      data = json.load(f)
  except FileNotFoundError:
    raise StudyError(f'--study_file={path} does not exist; give a JSON file of bin/train flags '
                     'and their values.') from None
  except (OSError, json.JSONDecodeError) as e:
    raise StudyError(f'--study_file={path} cannot be read as JSON ({e}); give a JSON object such '
                     'as {"algorithm": ["fedavg", "fedprox"], "seed": [0, 1]}.') from None
  if not isinstance(data, dict):
    raise StudyError(f'--study_file={path} holds a {type(data).__name__}, not a JSON object of '
                     'bin/train flags and their values.')
  unknown = [k for k in data if k not in allowed]
  if unknown:
    raise StudyError(f'--study_file={path}: {", ".join(map(repr, unknown))} not bin/train flag(s) '
                     'a study takes (see bin/study --helpfull); the study sets --output_dir itself.')
  for key, value in data.items():
    if isinstance(value, (dict, type(None))) or (isinstance(value, list) and any(
        isinstance(v, (dict, list, type(None))) for v in value)):
      raise StudyError(f'--study_file={path}: "{key}" must be a value or a list of values, got '
                       f'{json.dumps(value)}.')
  return data


def build_grid(given: Mapping[str, Any], order: Sequence[str]) -> Dict[str, List[str]]:
  """{flag: [values]} in bin/train's flag order, seeds last (cells of one setting stay together).

  Args:
    given: {flag: a comma-separated string or a list of values (from a study file)}; WHOLE_FLAGS
      keep their one value, with paths made absolute (the children run from the repository root).
    order: bin/train's flag names in their order; every flag of `given` is among them.

  Returns:
    {flag: [values as strings]}, each value once.

  Raises:
    StudyError: a WHOLE_FLAGS flag given several values, or an empty value (naming the flag).
    ValueError: a flag of `given` not in `order`.
  """
  grid: Dict[str, List[str]] = {}
  for name in sorted(given, key=lambda n: (n == 'seed', order.index(n))):
    value = given[name]
    if name in WHOLE_FLAGS:
      values = [_as_text(value[0] if isinstance(value, list) and len(value) == 1 else value)]
      if isinstance(value, list) and len(value) > 1:
        raise StudyError(f'--{name}: one value for every run (a grid over --{name} is not '
                         f'supported), got {value}.')
      if name in _PATH_FLAGS and values[0]:
        values = [cli.user_path(values[0])]
    elif isinstance(value, list):
      values = list(dict.fromkeys(_as_text(v).strip() for v in value))
    else:
      values = split_values(_as_text(value))
    if not values or any(v == '' for v in values):
      raise StudyError(f'--{name}: empty value; give one or more comma-separated values, or leave '
                       'the flag out.')
    grid[name] = values
  return grid


def expand(grid: Mapping[str, Sequence[str]]) -> List[Dict[str, str]]:
  """The Cartesian product of the grid, the last flag varying fastest."""
  names = list(grid)
  return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


@dataclasses.dataclass
class Cell:
  """One configuration of the grid: one bin/train run."""
  name: str                       # its run directory's name under runs/
  flags: Dict[str, str]           # bin/train flags of the run, without --output_dir
  rounds: int                     # the rounds the run must complete to be done
  not_applied: List[str] = dataclasses.field(default_factory=list)  # ['--fedprox_mu=0.1', ...]
  config: Any = None              # the resolved config_lib.Config (not in the manifest)

  def run_dir(self, study_dir: str) -> str:
    return os.path.join(study_dir, RUNS, self.name)

  def log_path(self, study_dir: str) -> str:
    return os.path.join(study_dir, LOGS, f'{self.name}.log')

  def argv(self, study_dir: str, python: str = sys.executable) -> List[str]:
    return [python, '-m', 'tff_decorr.bin.train', *(f'--{k}={v}' for k, v in self.flags.items()),
            f'--output_dir={self.run_dir(study_dir)}']

  def command(self, study_dir: str, python: str = sys.executable) -> str:
    """One shell line that runs the cell from anywhere (for xargs or a Slurm array)."""
    return (f'cd {shlex.quote(REPO_ROOT)} && ' +
            ' '.join(shlex.quote(a) for a in self.argv(study_dir, python)))


@dataclasses.dataclass
class Plan:
  grid: Dict[str, List[str]]
  cells: List[Cell]
  errors: List[str]   # one line per cell that cannot run, naming the flag
  notes: List[str]    # settings applied to some cells only, cells that are the same run

  @property
  def axes(self) -> List[str]:
    """The flags whose value differs between cells (the table's columns in bin/report)."""
    names = list(dict.fromkeys([*self.grid, *(k for c in self.cells for k in c.flags)]))
    return [n for n in names if len({c.flags.get(n) for c in self.cells}) > 1]


def _parse(argv_flags: Mapping[str, str]) -> flags.FlagValues:
  fv = new_train_flags()
  fv(['bin/train', *(f'--{k}={v}' for k, v in argv_flags.items())])
  return fv


def _component_of_flag() -> Dict[str, str]:
  return {spec.name: name for _, name, spec in config_lib.component_flag_specs()}


def make_plan(grid: Mapping[str, Sequence[str]]) -> Plan:
  """Every cell of the grid checked as bin/train would check it, before anything runs.

  A component setting (`--fedprox_mu`) is given only to cells whose algorithm, regulariser,
  partition or aggregator is that component (bin/train refuses a setting its run does not use);
  cells that are then the same run are planned once. Without --regularizer, each cell runs the
  task's default regularisers (the embedded task: none and feddecorr), as bin/train does.

  Args:
    grid: {flag: [values]}, as `build_grid` returns it.

  Returns:
    The Plan: its cells (each a bin/train command and run directory), the errors of the cells that
    cannot run (one line each, naming the flag; nothing is refused by raising) and notes.

  Raises:
    Nothing for a bad cell (it is in `errors`).
  """
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  component_of = _component_of_flag()
  resumable_axes = [n for n, v in grid.items() if n in config_lib.RESUMABLE_KEYS and len(v) > 1]
  cells: List[Cell] = []
  errors: List[str] = []
  names = set()
  dropped: Dict[str, set] = {}
  duplicates = 0
  applied = set()  # Component settings given to at least one cell.
  combos = expand(grid)
  for i, combo in enumerate(combos):
    where = f'cell {i + 1} of {len(combos)} ({" ".join(f"--{k}={v}" for k, v in combo.items())})'
    try:
      fv = _parse(combo)
      task = task_registry.get(fv.task)
    except (flags.Error, ValueError, KeyError) as e:
      errors.append(f'{where}: {e}')
      continue
    regs = ([combo['regularizer']] if 'regularizer' in combo else
            split_values(task.defaults.get('regularizer', config_lib.Config.regularizer)))
    generic = config_lib.generic_values(
        task, {n: fv[n].value for n in config_lib.GENERIC_FIELDS if n in fv})
    for reg in regs:
      used = {generic['algorithm'], generic['partition'], generic['aggregator'], reg,
              *config_lib.FIXED_COMPONENTS.values()}
      cell_flags, left_out = _cell_flags({**combo, 'regularizer': reg}, used, component_of)
      applied.update(cell_flags)
      for k in left_out:
        dropped.setdefault(k, set()).add(component_of[k])
      try:
        configs = cli.resolve_configs(_parse(cell_flags))
      except (flags.Error, ValueError, KeyError) as e:
        errors.append(f'{where[:-1]} --regularizer={reg}): {e}' if 'regularizer' not in combo
                      else f'{where}: {e}')
        continue
      c = configs[0]
      # bin/train's default run-directory name; settings that may change on resume (--rounds,
      # --runtime, ...) are not in its hash, so a grid over one of them names it in the directory.
      name = os.path.basename(c.output_dir) + ''.join(
          f'-{k}{cell_flags[k]}' for k in resumable_axes if k in cell_flags)
      if name in names:
        duplicates += 1
        continue
      names.add(name)
      cells.append(Cell(name=name, flags=cell_flags, rounds=int(c.rounds),
                        not_applied=[f'--{k}={v}' for k, v in left_out.items()], config=c))
  for k in grid:
    if k in component_of and k not in applied:
      # Given for a component no run uses: a mistake (a typo in --algorithm, a missing value),
      # as bin/train says for one run; never silently dropped from the whole study.
      errors.append(f'--{k}: sets {component_of[k]}, which no run of this grid uses; drop it or '
                    f'add {component_of[k]} to the grid.')
  return Plan(grid=dict(grid), cells=cells, errors=errors,
              notes=_plan_notes(dropped, cells, duplicates))


def _cell_flags(flags_of_cell: Mapping[str, str], used: set, component_of: Mapping[str, str]):
  """({flag: value} the cell's run uses, {flag: value} of component settings it does not use)."""
  cell_flags, left_out = {}, {}
  for k, v in flags_of_cell.items():
    if k in component_of and component_of[k] not in used:
      left_out[k] = v
    else:
      cell_flags[k] = v
  return cell_flags, left_out


def _plan_notes(dropped: Mapping[str, set], cells: Sequence[Cell], duplicates: int) -> List[str]:
  """The plan's notes: settings given only to the cells they apply to, and runs planned once."""
  notes = []
  for k, components in dropped.items():
    users = sum(1 for c in cells if k in c.flags)
    notes.append(f'--{k} applies only to cells that use {"/".join(sorted(components))}: given to '
                 f'{users} of {len(cells)} cells, left out of the others.')
  if duplicates:
    notes.append(f'{duplicates} grid combination(s) are the same run as another once settings '
                 'that do not apply are left out; each run is planned once.')
  return notes


# ---- the state of a cell on disk ----

def read_json(path: str) -> Optional[dict]:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def completed_rounds(path: str) -> int:
  """Rounds a run directory has recorded in metrics.csv (0 when it has none)."""
  try:
    with open(os.path.join(path, 'metrics.csv')) as f:
      return max(0, sum(1 for line in f if line.strip()) - 1)
  except OSError:
    return 0


def is_done(path: str, rounds: int) -> bool:
  """The run has written its summary after at least `rounds` rounds (bin/train's last act)."""
  summary = read_json(os.path.join(path, 'summary.json'))
  return bool(summary) and int(summary.get('final_round', 0)) >= rounds


# ---- the manifest ----

def write_manifest(study_dir: str, plan: Plan, statuses: Mapping[str, dict],
                   command: Sequence[str] = ()) -> str:
  """study.json: what belongs to the study, where each run is, and its last known status (paths
  relative to the study directory, so a study copied from a cluster still reads)."""
  cells = []
  for c in plan.cells:
    entry = {'name': c.name, 'run_dir': os.path.join(RUNS, c.name),
             'log': os.path.join(LOGS, f'{c.name}.log'), 'flags': dict(c.flags),
             'rounds': c.rounds, 'not_applied': list(c.not_applied),
             'command': c.command(study_dir)}
    entry.update(statuses.get(c.name, {}))
    cells.append(entry)
  path = os.path.join(study_dir, MANIFEST)
  run_dir.write_json_atomic(path, {
      'version': MANIFEST_VERSION, 'updated': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      'command': list(command), 'grid': plan.grid, 'axes': plan.axes, 'notes': plan.notes,
      'cells': cells})
  return path


def write_tensorboard_config(study_dir: str, plan: Plan) -> str:
  """The study's HParams experiment at its root (tensorboard_hparams.write_study): its axes with
  the values of its runs' resolved configurations, so `tensorboard --logdir=<study_dir>` shows
  the grid. Returns the event file written."""
  from tff_decorr.run_files import tensorboard_hparams  # pylint: disable=g-import-not-at-top
  return tensorboard_hparams.write_study(study_dir, plan.axes,
                                         [c.config.to_dict() for c in plan.cells if c.config])


def read_manifest(study_dir: str, flag: str = '--study_dir') -> dict:
  """A study's manifest (study.json: its grid, cells and their status).

  Args:
    study_dir: the study's directory (bin/study's --study_dir).
    flag: the flag named in errors.

  Returns:
    The manifest, a dict with at least 'cells' (a list).

  Raises:
    StudyError: the directory or its study.json does not exist, cannot be read, or was written by
      a newer version (the message says what to do).
  """
  path = os.path.join(study_dir, MANIFEST)
  if not os.path.isdir(study_dir):
    raise StudyError(f'{flag}={study_dir} does not exist; give the --study_dir of a bin/study run.')
  if not os.path.exists(path):
    raise StudyError(f'{flag}={study_dir} has no {MANIFEST}; give the --study_dir of a bin/study '
                     'run (bin/study --print_plan writes it too).')
  manifest = read_json(path)
  if not isinstance(manifest, dict) or not isinstance(manifest.get('cells'), list):
    raise StudyError(f'{path} cannot be read; re-run the bin/study command to write it again '
                     '(its runs are kept).')
  if manifest.get('version', 0) > MANIFEST_VERSION:
    raise StudyError(f'{path} was written by a newer version (manifest version '
                     f'{manifest["version"]}); update tff_decorr.')
  return manifest


def dropped_cells(study_dir: str, plan: Plan) -> List[str]:
  """Names of cells in the existing manifest that the new plan does not have."""
  old = read_json(os.path.join(study_dir, MANIFEST)) or {}
  names = {c.name for c in plan.cells}
  return [c['name'] for c in old.get('cells', []) if isinstance(c, dict) and
          c.get('name') not in names]


# ---- running ----

def _fmt_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}:{m:02d}:{s:02d}'


def _error_line(log_path: str, offset: int) -> str:
  """The line bin/train ended with in this attempt's part of the log ('train: error: ...')."""
  try:
    with open(log_path, errors='replace') as f:
      f.seek(offset)
      lines = [l.strip() for l in f.read().splitlines() if l.strip()]
  except OSError:
    return ''
  for line in reversed(lines):
    if line.startswith('train: '):
      return line
  return lines[-1] if lines else ''


@dataclasses.dataclass
class _Job:
  cell: Cell
  process: subprocess.Popen
  log_file: Any
  offset: int
  started: float


class Runner:
  """Runs a plan's unfinished cells, `jobs` at a time, each a `python -m tff_decorr.bin.train`
  child (`run()`), recording their status in the study's manifest.

  Args:
    study_dir: the study's directory (runs/, logs/ and study.json are written there).
    plan: the Plan of `make_plan`.
    jobs: how many children at a time.
    command: the bin/study command line, recorded in the manifest.
    log: where progress lines go.
    python: the interpreter the children run with.
    poll_seconds: how often the children are polled.

  Raises:
    Nothing when made; `run()` raises KeyboardInterrupt after stopping the children on Ctrl-C or
    SIGTERM.
  """

  # Seven parameters: the study's two inputs, then five independent run options with defaults.
  def __init__(self, study_dir: str, plan: Plan, jobs: int = 1, command: Sequence[str] = (),
               log: Callable[[str], None] = print, python: str = sys.executable,
               poll_seconds: float = 0.5):
    self.study_dir = study_dir
    self.plan = plan
    self.jobs = jobs
    self.command = list(command)
    self.log = log
    self.python = python
    self.poll_seconds = poll_seconds
    self.status: Dict[str, dict] = {}
    self.durations: List[float] = []
    self._started: Dict[str, float] = {}  # run name -> start time, of the running ones
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    # tff_context's child set-up (SIGKILL when this process dies; its own process group): a killed
    # study leaves no bin/train behind holding a cell's lock when the study is resumed, and Ctrl-C
    # reaches the children only through the study, which stops them (_stop). Imported here, not in
    # the child between fork and exec.
    self._preexec = tff_context._die_with_parent  # pylint: disable=protected-access

  def _save(self) -> None:
    write_manifest(self.study_dir, self.plan, self.status, self.command)

  def _counts(self) -> Dict[str, int]:
    counts = {s: 0 for s in (DONE, RUNNING, PENDING, FAILED, BUSY, INTERRUPTED)}
    for c in self.plan.cells:
      counts[self.status[c.name]['status']] += 1
    return counts

  def _progress(self, event: str) -> None:
    n = self._counts()
    line = (f'{n[DONE]}/{len(self.plan.cells)} done, {n[RUNNING]} running, {n[PENDING]} left'
            + (f', {n[FAILED]} failed' if n[FAILED] else '')
            + (f', {n[BUSY]} busy elsewhere' if n[BUSY] else ''))
    if self.durations and (n[PENDING] or n[RUNNING]):
      # Runs of one study cost about the same: the mean time of a finished run, for each run left
      # and for what the running ones have not yet used of it, shared by the job slots.
      mean = sum(self.durations) / len(self.durations)
      now = time.monotonic()
      work = n[PENDING] * mean + sum(max(mean - (now - t), 0.0) for t in self._started.values())
      line += f', ETA {_fmt_duration(work / self.jobs)}'
    elif n[PENDING] or n[RUNNING]:
      line += ', ETA after the first run'
    self.log(f'[{line}] {event}')

  def run(self) -> Dict[str, int]:
    """Runs every cell not yet done; returns the counts by status. Raises KeyboardInterrupt
    after stopping the children (they checkpoint their last round) on Ctrl-C or SIGTERM."""
    os.makedirs(os.path.join(self.study_dir, RUNS), exist_ok=True)
    os.makedirs(os.path.join(self.study_dir, LOGS), exist_ok=True)
    todo = []
    # A finished run is skipped, so this sitting measures nothing of it: keep the exit code and
    # wall time that the sitting which finished it recorded.
    before = {c.get('name'): c for c in (read_json(os.path.join(self.study_dir, MANIFEST)) or {})
              .get('cells', []) if isinstance(c, dict) and c.get('status') == DONE}
    for c in self.plan.cells:
      if is_done(c.run_dir(self.study_dir), c.rounds):
        kept = {k: before[c.name][k] for k in ('exit_code', 'wall_time_s')
                if k in before.get(c.name, {})}
        self.status[c.name] = {'status': DONE, **kept}
      else:
        self.status[c.name] = {'status': PENDING}
        todo.append(c)
    skipped = len(self.plan.cells) - len(todo)
    self._save()
    self._progress(f'study of {len(self.plan.cells)} runs in {self.study_dir}'
                   + (f'; {skipped} already finished (skipped)' if skipped else '')
                   + f'; {self.jobs} at a time')
    running: List[_Job] = []
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
      while todo or running:
        while todo and len(running) < self.jobs:
          running.append(self._start(todo.pop(0)))
        time.sleep(self.poll_seconds)
        for job in [j for j in running if j.process.poll() is not None]:
          running.remove(job)
          self._finish(job)
    except KeyboardInterrupt:
      self._stop(running)
      raise
    finally:
      signal.signal(signal.SIGTERM, previous)
    return self._counts()

  def _start(self, cell: Cell) -> _Job:
    log_path = cell.log_path(self.study_dir)
    log_file = open(log_path, 'ab')  # pylint: disable=consider-using-with  (closed in _finish)
    argv = cell.argv(self.study_dir, self.python)
    log_file.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} bin/study: '
                   f'{shlex.join(argv)}\n'.encode())
    log_file.flush()
    offset = log_file.tell()
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, preexec_fn=self._preexec)
    self.status[cell.name] = {'status': RUNNING, 'pid': process.pid}
    self._started[cell.name] = time.monotonic()
    self._save()
    self._progress(f'started {cell.name} (PID {process.pid}; log {log_path})')
    return _Job(cell, process, log_file, offset, time.monotonic())

  def _finish(self, job: _Job) -> None:
    job.log_file.close()
    cell, code = job.cell, job.process.returncode
    self._started.pop(cell.name, None)
    seconds = time.monotonic() - job.started
    log_path = cell.log_path(self.study_dir)
    path = cell.run_dir(self.study_dir)
    if code == 0 and is_done(path, cell.rounds):
      self.durations.append(seconds)
      summary = read_json(os.path.join(path, 'summary.json')) or {}
      self.status[cell.name] = {'status': DONE, 'exit_code': 0, 'wall_time_s': seconds}
      self._save()
      self._progress(f'finished {cell.name} in {_fmt_duration(seconds)}: final test accuracy '
                     f'{summary.get("final_test_accuracy", float("nan")):.4f}')
      return
    error = _error_line(log_path, job.offset) or f'exit code {code}'
    if code == 0:
      error = f'bin/train exited 0 but {path} has no summary.json for {cell.rounds} rounds'
    status = BUSY if _BUSY_WORDS in error else FAILED
    self.status[cell.name] = {'status': status, 'exit_code': code, 'error': error,
                              'wall_time_s': seconds}
    self._save()
    self._progress(f'{"busy" if status == BUSY else "FAILED"} {cell.name} (exit {code}): '
                   f'{error} [log: {log_path}]')

  def _stop(self, running: List[_Job]) -> None:
    """Ctrl-C to each child (own process groups): bin/train stops after checkpointing."""
    for job in running:
      try:
        job.process.send_signal(signal.SIGINT)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + 60
    for job in running:
      try:
        job.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
      except subprocess.TimeoutExpired:
        job.process.kill()
        job.process.wait()
      job.log_file.close()
      self.status[job.cell.name] = {'status': INTERRUPTED, 'exit_code': job.process.returncode}
    self._save()
    self._progress(f'interrupted; stopped {len(running)} running run(s); re-run the same command '
                   'to resume')


def _raise_interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt()
