"""A run's output directory: its resolved configuration, and refusing to mix two runs in one dir.

Layout of a run directory:
  .lock                held (flock) by the process running it: one run per directory at a time
  config.json          the resolved configuration (flags + task defaults), written once every
                       check has passed, just before round 1
  checkpoints/         program state, one version per round (checkpoint_files: round_N/state.npz)
  client_states/       per-client state (FedBN BN, SCAFFOLD c_i, MOON previous model): stateful
                       algorithms only
  metrics.csv          one row per round (tff.program.CSVFileReleaseManager)
  tensorboard/         the same metrics for TensorBoard
  export/saved_model   the global model with a serving signature (logits + representation)
  summary.json         final and best test accuracy, configuration, versions
  previous-<time>/     results of rounds that have no checkpoint any more (checkpoints/ deleted),
                       moved here when the run starts again from round 1 (set_aside_results)
"""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import os
import shutil
import time
from typing import Any, Mapping

# Which configuration keys a resumed run may change: the configuration's rule (configs/config).
from tff_decorr.configs import config as config_lib
from tff_decorr.configs.config import OldConfigError, RESUMABLE_KEYS

LOCK_FILE = '.lock'
# Files a start leaves behind before config.json exists; a directory holding only these is empty.
_START_FILES = frozenset({LOCK_FILE})
_LOCKS: dict = {}  # output_dir -> open lock file (kept open: the kernel releases it at exit)
_CREATED: set = set()  # directories this process created (removed again if its start fails)


class RunDirError(ValueError):
  """The output directory cannot be used as asked; the message names the flag and the fix."""


def config_path(output_dir: str) -> str:
  return os.path.join(output_dir, 'config.json')


def atomic_write(path: str, write_fn, mode: str = 'w') -> None:
  """Writes `path` with write_fn(file) into a temporary beside it (`<path>.tmp-<pid>`, which
  clean_leftovers recognises), fsync, then an atomic rename: a crash or a full disk never leaves a
  half-written file. An OSError names `path`, not the temporary. The one writer of run files
  (config.json, summary.json, metrics.csv, client states and their manifests)."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with open(tmp, mode, **({} if 'b' in mode else {'newline': ''})) as f:
      write_fn(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError):
      raise OSError(e.errno, e.strerror, path) from e  # The file meant, not its temporary.
    raise


def write_json_atomic(path: str, value: Any) -> None:
  """Writes JSON atomically (atomic_write): never a half-written file."""
  def write(f):
    json.dump(value, f, indent=2, sort_keys=True, default=_json_default)
    f.write('\n')
  atomic_write(path, write)


def _json_default(value):
  if hasattr(value, 'item'):
    return value.item()
  if hasattr(value, 'tolist'):
    return value.tolist()
  return str(value)


def prepare(output_dir: str, config: Mapping[str, Any], overwrite: bool = False,
            log=print, migrate=None) -> bool:
  """Makes `output_dir` ready for a run with `config`, without writing config.json yet.

  Takes the directory's lock first (a second process is refused, naming the holder's PID), then
  compares with the run already there. Returns True when the directory holds this run (the caller
  resumes it from its checkpoint, or, with `overwrite` and an unreadable checkpoint, moves it
  aside with `move_aside`). A run with a different configuration is refused unless `overwrite`,
  which moves it aside (`<dir>.replaced-<time>-<pid>[-n]`, never deleted, never nested). Call
  `write_config` once every other check has passed, so a start that fails leaves nothing that
  refuses the corrected command. `migrate` completes a config.json written by an earlier release
before comparing (config.migrate_dict), or raises config.OldConfigError for one this release no
longer reads: refused with its message, or moved aside with `overwrite`.
  """
  if not output_dir:
    raise RunDirError('--output_dir is empty: give a directory for the run outputs.')
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise RunDirError(f'--output_dir={output_dir} is a file; give a directory.')
  if not os.path.exists(output_dir):
    os.makedirs(output_dir)
    _CREATED.add(os.path.abspath(output_dir))
  lock(output_dir)
  clean_leftovers(output_dir)
  path = config_path(output_dir)
  if not set(os.listdir(output_dir)) - _START_FILES:
    return False
  old = None
  if os.path.exists(path):
    try:
      with open(path) as f:
        old = json.load(f)
      old = migrate(old) if migrate else old
    except OldConfigError as e:  # Readable, but by an earlier release only: its message says how.
      if not overwrite:
        raise RunDirError(f'--output_dir={output_dir}: {e}.') from e
      aside = move_aside(output_dir)
      log(f'--overwrite: {output_dir} was written by an earlier release; moved it to {aside}')
      return False
    except (OSError, json.JSONDecodeError, ValueError) as e:
      if not overwrite:
        raise RunDirError(f'--output_dir={output_dir} has an unreadable config.json ({e}); '
                          'use another --output_dir, or pass --overwrite to move it aside.') from e
      aside = move_aside(output_dir)  # What the message above promises.
      log(f'--overwrite: {output_dir} had an unreadable config.json ({e}); moved it to {aside}')
      return False
  if old is not None and not differences(old, config):
    # With --overwrite the caller says what happens once it knows whether the checkpoint can be
    # read (resumed, or the run moved aside): saying 'resuming' here could be contradicted.
    return True
  if not overwrite:
    if old is None:
      raise RunDirError(f'--output_dir={output_dir} is not empty and holds no tff_decorr run; '
                        'use an empty or new directory, or pass --overwrite to move it aside.')
    diff = ', '.join(_describe(k, old, config) for k in differences(old, config))
    raise RunDirError(f'--output_dir={output_dir} holds a run with a different configuration '
                      f'({diff}); use another --output_dir, or pass --overwrite to move the old '
                      'run aside.')
  aside = move_aside(output_dir)
  log(f'--overwrite: moved the previous run to {aside}')
  return False


def write_config(output_dir: str, config: Mapping[str, Any]) -> None:
  """Records the run's configuration: from now on the directory belongs to this configuration."""
  write_json_atomic(config_path(output_dir), dict(config))


def move_aside(output_dir: str) -> str:
  """Renames the run directory to a fresh sibling name and re-creates it empty, locked.

  The new directory is created and locked under a temporary name first, so between the two renames
  every path another process may open is locked by this one. `os.rename` never moves a directory
  *into* an existing one (shutil.move does), and the name is unique per process and attempt.
  """
  base = output_dir.rstrip(os.sep)
  fresh = f'{base}.new-{os.getpid()}'
  os.makedirs(fresh)
  lock(fresh)
  stamp = f'{base}.replaced-{time.strftime("%Y%m%d-%H%M%S")}-{os.getpid()}'
  aside, n = stamp, 0
  while os.path.exists(aside):
    n += 1
    aside = f'{stamp}-{n}'
  os.rename(base, aside)
  os.rename(fresh, base)
  unlock(output_dir)  # The old lock file now lives in `aside`.
  _LOCKS[os.path.abspath(output_dir)] = _LOCKS.pop(os.path.abspath(fresh))
  return aside


# What a run writes besides config.json: set aside together when it restarts without a checkpoint.
RESULTS = ('metrics.csv', 'tensorboard', 'summary.json', 'export', 'client_states', 'collapse',
           'local_models', 'checkpoints')


def _results_rounds(output_dir: str) -> list:
  """What shows that rounds were completed in `output_dir`: ['metrics.csv up to round 3',
  'summary.json of round 3', 'export/'] (empty when nothing does)."""
  found = []
  try:
    with open(os.path.join(output_dir, 'metrics.csv'), newline='') as f:
      rounds = [int(r[0]) for r in list(csv.reader(f))[1:] if r and r[0].isdigit()]
    if rounds:
      found.append(f'metrics.csv up to round {max(rounds)}')
  except OSError:
    pass
  try:
    with open(os.path.join(output_dir, 'summary.json')) as f:
      found.append(f'summary.json of round {int(json.load(f)["final_round"])}')
  except (OSError, ValueError, KeyError, TypeError):
    if os.path.exists(os.path.join(output_dir, 'summary.json')):
      found.append('summary.json')
  if os.path.exists(os.path.join(output_dir, 'export')):
    found.append('export/')
  return found


def set_aside_results(output_dir: str, log=print) -> str | None:
  """For a run whose checkpoints are gone (deleted) but whose results are there: it starts again
  from round 1, so its results are moved, never deleted or overwritten, to
  `<output_dir>/previous-<time>[-n]`, with one warning line. Returns that directory (None when
  nothing shows a completed round: e.g. a run stopped in its first round)."""
  found = _results_rounds(output_dir)
  if not found:
    return None
  stamp = os.path.join(output_dir, f'previous-{time.strftime("%Y%m%d-%H%M%S")}')
  aside, n = stamp, 0
  while os.path.exists(aside):
    n += 1
    aside = f'{stamp}-{n}'
  os.makedirs(aside)
  for name in RESULTS:
    if os.path.exists(os.path.join(output_dir, name)):
      os.rename(os.path.join(output_dir, name), os.path.join(aside, name))
  log(f'warning: no checkpoint in {os.path.join(output_dir, "checkpoints")}, although the run '
      f'holds results ({", ".join(found)}); starting from round 1, with those results moved to '
      f'{aside}.')
  return aside


def lock(output_dir: str) -> None:
  """Exclusive lock on `<output_dir>/.lock` for this process's lifetime (flock: released by the
  kernel when the process dies, so a killed run never leaves a stale lock). Holds the PID."""
  key = os.path.abspath(output_dir)
  if key in _LOCKS:
    return
  path = os.path.join(output_dir, LOCK_FILE)
  f = open(path, 'a+')  # pylint: disable=consider-using-with  (held until exit)
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES):
      f.close()
      raise
    f.seek(0)
    holder = f.read().strip() or 'unknown'
    f.close()
    raise RunDirError(f'--output_dir={output_dir} is in use by another run (PID {holder}); wait '
                      'for it to finish, or use another --output_dir.') from None
  f.seek(0)
  f.truncate()
  f.write(f'{os.getpid()}\n')
  f.flush()
  _LOCKS[key] = f


def unlock(output_dir: str, remove_if_unused: bool = False) -> None:
  """Releases the lock; with `remove_if_unused`, also removes a directory that a failed start
  created and left with nothing but its lock file."""
  key = os.path.abspath(output_dir)
  f = _LOCKS.pop(key, None)
  created = key in _CREATED
  _CREATED.discard(key)
  if f is None:
    return
  if (remove_if_unused and created and os.path.isdir(output_dir)
      and not set(os.listdir(output_dir)) - _START_FILES):
    shutil.rmtree(output_dir, ignore_errors=True)
  f.close()


def clean_leftovers(output_dir: str, log=print) -> list:
  """Removes what an interrupted writer leaves (a kill, a full disk): temporary checkpoint
  directories, half-written exports and JSON temporaries. Only called with the lock held, so no
  other process is writing them."""
  removed = []
  candidates = []
  for sub, match in (('checkpoints', lambda n: '_temp' in n),
                     ('export', lambda n: '.tmp-' in n or '.old-' in n),
                     # JSON temporaries, and metrics.csv's (ours and TFF's CSV manager's).
                     ('', lambda n: '.json.tmp-' in n or n.startswith('metrics.csv.tmp-')
                      or n.startswith('metrics.csv_temp'))):
    d = os.path.join(output_dir, sub)
    if os.path.isdir(d):
      candidates += [os.path.join(d, n) for n in os.listdir(d) if match(n)]
  clients = os.path.join(output_dir, 'export', 'clients')
  if os.path.isdir(clients):
    for c in os.listdir(clients):
      d = os.path.join(clients, c)
      if os.path.isdir(d):
        candidates += [os.path.join(d, n) for n in os.listdir(d) if '.tmp-' in n or '.old-' in n]
  for path in candidates:
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)
    removed.append(path)
  if removed:
    log(f'removed {len(removed)} leftover temporary file(s) of an interrupted run in {output_dir}')
  return removed


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """The keys whose values differ, a component setting as 'hparams.<component>.<field>'."""
  keys = (set(old) | set(new)) - RESUMABLE_KEYS
  found = []
  for k in sorted(keys):
    a, b = old.get(k), new.get(k)
    if k == 'hparams' and isinstance(a, Mapping) and isinstance(b, Mapping):
      for name in sorted(set(a) | set(b)):
        fa, fb = a.get(name), b.get(name)
        if isinstance(fa, Mapping) and isinstance(fb, Mapping):
          found += [f'hparams.{name}.{f}' for f in sorted(set(fa) | set(fb))
                    if _norm(fa.get(f)) != _norm(fb.get(f))]
        elif _norm(fa) != _norm(fb):
          found.append(f'hparams.{name}')
    elif _norm(a) != _norm(b):
      found.append(k)
  return found


def _value_at(config: Mapping[str, Any], key: str) -> Any:
  for part in key.split('.'):
    config = config.get(part) if isinstance(config, Mapping) else None
  return config


def _describe(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
  """'--<flag>: old -> new', naming a component setting by its flag (--client_lr, not hparams)."""
  flag = key
  parts = key.split('.')
  if len(parts) == 3:
    flags = {(spec.component, spec.field): spec.name
             for _, _, spec in config_lib.component_flag_specs()}
    flag = flags.get((parts[1], parts[2]), key)
  return f'--{flag}: {_value_at(old, key)!r} -> {_value_at(new, key)!r}'


def _norm(v):
  # JSON turns tuples into lists and may write ints for integral floats.
  if isinstance(v, (list, tuple)):
    return [_norm(x) for x in v]
  if isinstance(v, bool) or v is None or isinstance(v, str):
    return v
  if isinstance(v, (int, float)):
    return float(v)
  return v


# How far above a model a run directory may be: <run>/export/clients/<id>/saved_model is 4 levels.
_RUN_LEVELS = 4


def find_run(path: str) -> tuple[str | None, dict]:
  """The run directory holding `path` and its config.json's contents, for the programs that take
  a model (bin/evaluate, bin/analyze) to default to the run's task and data directory.

  Args:
    path: a run directory, or a model inside one (<run>/export/saved_model,
      <run>/export/round_<r>, <run>/export/clients/<id>/saved_model,
      <run>/local_models/round_<r>/client_<id>).

  Returns:
    (run directory, its configuration as a dict), or (None, {}) when neither `path` nor a directory
    up to 4 levels above it holds a run's config.json (a model copied out of its run).
  """
  here = os.path.abspath(path)
  for _ in range(_RUN_LEVELS + 1):
    try:
      with open(config_path(here)) as f:
        config = json.load(f)
    except (OSError, ValueError):
      config = None
    if isinstance(config, dict) and 'task' in config and 'hparams' in config:
      return here, config
    parent = os.path.dirname(here)
    if parent == here:
      break
    here = parent
  return None, {}
