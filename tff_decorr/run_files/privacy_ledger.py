"""Every differentially private release made on one data set, whichever run made it.

A run's own epsilon (`dp_epsilon`) counts the rounds in its model's lineage. The same clients can
have been released before: a run started again with --overwrite (the old run is moved aside, its
model still exists), a run whose checkpoints/ were deleted, a crash after a round's noised
aggregate was computed but before its checkpoint (the round is run again with fresh noise), or
another run on the same examples (another --seed, partition or --num_clients: the clients differ,
but the people behind the examples do not). An adversary who sees all those outputs learns more
than one run's epsilon says. So each DP round is appended to a ledger, before its checkpoint is
written, and the run reports the epsilon of every release in the ledger together
(`dp_epsilon_all_releases`) beside its own, and says in its log when earlier releases exist.

Where: outside every cache, in the user's data folder,
`$XDG_DATA_HOME/tff_decorr/privacy_ledgers/<task>-<hash>.jsonl` (XDG_DATA_HOME defaults to
~/.local/share), one file per data set. The key is the data's identity: the task and a hash of
its training examples (pixels and labels, `tasks.client_data.examples_hash`), not the seed, the
partition or the number of clients. Rebuilding or deleting the client-data cache
(tasks/client_data.py replaces a damaged cache folder whole) never touches it. A ledger that
earlier releases wrote beside the cache's shards (`<cache_dir>/<task>/<partition>-<key>/
dp_releases.jsonl`, before this module kept them here) is moved into it on first use
(`migrate_from`).

A ledger can still be deleted or cut by hand. Two counts of the releases ever recorded on the
data survive that: one beside the ledger (`<task>-<hash>.seen`, raised under the ledger's lock with
every append, which a deleted .jsonl leaves behind) and one in each run directory
(`dp_ledger.json`). A ledger holding fewer releases than either says, or fewer of a run's own
rounds than its checkpoint has, is reported in the log and in summary.json
(`dp_ledger_missing_releases`, `dp_ledger_note`): dp_epsilon_all_releases then undercounts.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import time
from typing import Iterable

FILE_NAME = 'dp_releases.jsonl'  # the ledger's name beside a cache's shards, before this module
RUN_RECORD = 'dp_ledger.json'  # in a run directory: the ledger it uses, the releases it has seen


def data_root() -> str:
  """`$XDG_DATA_HOME/tff_decorr` (~/.local/share/tff_decorr without it, or with a relative one,
  which the XDG specification says to ignore)."""
  base = os.environ.get('XDG_DATA_HOME', '')
  if not os.path.isabs(base):
    base = os.path.join(os.path.expanduser('~'), '.local', 'share')
  return os.path.join(base, 'tff_decorr')


def data_key(task: str, examples_hash: str) -> str:
  """The ledger's name for a data set: its task and its examples' content hash."""
  return f'{task}-{examples_hash[:24]}'


@contextlib.contextmanager
def _locked(path: str):
  """An exclusive lock on `path` + '.lock' (runs on the same data share one ledger)."""
  with open(path + '.lock', 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _read_count(path: str) -> int:
  try:
    with open(path) as f:
      return int(json.load(f).get('releases_seen', 0))
  except (OSError, ValueError, AttributeError, TypeError):
    return 0


def _write_json(path: str, value: dict) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(value, f, sort_keys=True)
  os.replace(tmp, path)


class Ledger:
  """An append-only JSON-lines file of DP rounds: one line per round, fsynced before the round's
  checkpoint, so no release can be made without being recorded."""

  def __init__(self, path: str):
    self.path = path
    self.seen_path = os.path.splitext(path)[0] + '.seen'

  @classmethod
  def for_data(cls, task: str, examples_hash: str) -> 'Ledger':
    directory = os.path.join(data_root(), 'privacy_ledgers')
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return cls(os.path.join(directory, data_key(task, examples_hash) + '.jsonl'))

  def entries(self) -> tuple[list[dict], int]:
    """The recorded releases, and the number of lines that cannot be read (a line cut by a crash
    while it was written; the log says they are not counted)."""
    if not os.path.exists(self.path):
      return [], 0
    out, unreadable = [], 0
    with open(self.path) as f:
      for line in f:
        if not line.strip():
          continue
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          unreadable += 1
    return out, unreadable

  def _lines(self) -> int:
    if not os.path.exists(self.path):
      return 0
    with open(self.path) as f:
      return sum(1 for line in f if line.strip())

  def _append_lines(self, lines: list[str]) -> None:
    """Appends under the caller's lock, and raises the .seen count by as many lines (or to the
    ledger's length, when that is larger: a ledger older than its .seen file)."""
    known = max(self.seen(), self._lines())
    with open(self.path, 'a') as f:
      f.write(''.join(lines))
      f.flush()
      os.fsync(f.fileno())
    _write_json(self.seen_path, {'releases_seen': known + len(lines), 'ledger': self.path})

  def append(self, *, run: str, noise_multiplier: float, clients_per_round: int,
             num_clients: int) -> None:
    entry = {'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'run': os.path.abspath(run),
             'noise_multiplier': float(noise_multiplier),
             'clients_per_round': int(clients_per_round), 'num_clients': int(num_clients)}
    with _locked(self.path):
      self._append_lines([json.dumps(entry, sort_keys=True) + '\n'])

  def seen(self) -> int:
    """The releases ever recorded in this ledger, by its .seen file (0 without one)."""
    return _read_count(self.seen_path)

  def migrate_from(self, directory: str, log=print) -> int:
    """Moves the ledger an earlier release kept beside a cache's shards (`directory`/FILE_NAME)
    into this one: its lines are appended, marked with where they came from, and the old file is
    renamed so they are counted once. Returns the number of lines moved."""
    old = os.path.join(directory, FILE_NAME)
    if not os.path.exists(old):
      return 0
    with _locked(self.path):
      if not os.path.exists(old):  # another run on the same data moved it meanwhile
        return 0
      lines = []
      with open(old) as f:
        for line in f:
          if not line.strip():
            continue
          try:
            entry = json.loads(line)
            entry['migrated_from'] = old
            lines.append(json.dumps(entry, sort_keys=True) + '\n')
          except json.JSONDecodeError:
            lines.append(line if line.endswith('\n') else line + '\n')  # still unreadable
      self._append_lines(lines)
      os.replace(old, old + '.moved')
    log(f'Privacy: moved {len(lines)} DP releases recorded in {old} (beside the client-data '
        f'cache, which a rebuild deletes) to the ledger {self.path}.')
    return len(lines)


def grouped(entries: Iterable[dict]) -> list[tuple[float, int, int, int]]:
  """(noise_multiplier, clients_per_round, num_clients, count) per distinct setting."""
  counts = collections.Counter(
      (e['noise_multiplier'], e['clients_per_round'], e['num_clients']) for e in entries)
  return [(*k, n) for k, n in sorted(counts.items())]


def _run_record(run: str, ledger: Ledger) -> int:
  """The releases on the data the run directory has known of (0: none, or another ledger)."""
  path = os.path.join(run, RUN_RECORD)
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return 0
  return _read_count(path) if record.get('ledger') == ledger.path else 0


def missing_releases(ledger: Ledger, run: str, run_rounds: int) -> tuple[int, str]:
  """How many releases the ledger lacks (0: none known), and how that is known: fewer lines than
  its .seen file or the run directory's record count, or fewer of this run's own rounds than the
  `run_rounds` its checkpoint (or its end) has."""
  entries, unreadable = ledger.entries()
  count = len(entries) + unreadable
  own = sum(1 for e in entries if e.get('run') == os.path.abspath(run))
  seen, record = ledger.seen(), _run_record(run, ledger)
  evidence = [(seen - count,
               f'{ledger.seen_path} counts {seen} releases, the ledger holds {count}'),
              (record - count, f'{os.path.join(run, RUN_RECORD)} counts {record} releases, the '
               f'ledger holds {count}'),
              (run_rounds - own, f'this run has made {run_rounds} rounds, the ledger holds {own} '
               'of them')]
  missing, why = max(evidence, key=lambda e: e[0])
  return (missing, why) if missing > 0 else (0, '')


def record_run(ledger: Ledger, run: str, known: int) -> None:
  """Writes the run directory's count of the releases on the data (`known`: this run's own
  lower bound), unless it already holds more."""
  path = os.path.join(run, RUN_RECORD)
  if known > _run_record(run, ledger):
    _write_json(path, {'releases_seen': int(known), 'ledger': ledger.path})


class RecordingRuntime:
  """A runtime whose every round is recorded in `ledger` once it has been computed (the noised
  aggregate exists from then on, whether or not its checkpoint is ever written), and counted in
  the run directory's record (`known`: the releases on the data known at the start)."""

  def __init__(self, runtime, ledger: Ledger, *, run: str, noise_multiplier: float,
               clients_per_round: int, num_clients: int, known: int = 0):
    self._runtime = runtime
    self._ledger = ledger
    self._run = run
    self._known = known
    self._entry = dict(run=run, noise_multiplier=noise_multiplier,
                       clients_per_round=clients_per_round, num_clients=num_clients)

  def __getattr__(self, name):
    return getattr(self._runtime, name)

  def run_round(self, *args, **kwargs):
    result = self._runtime.run_round(*args, **kwargs)
    self._ledger.append(**self._entry)
    self._known += 1
    record_run(self._ledger, self._run, self._known)
    return result


def open_for_run(task: str, examples_hash: str, legacy_dirs: Iterable[str] = (),
                 log=print) -> Ledger:
  """The ledger of a data set, with any ledger an earlier release kept in `legacy_dirs` (cache
  folders) moved into it."""
  ledger = Ledger.for_data(task, examples_hash)
  for directory in legacy_dirs:
    ledger.migrate_from(directory, log=log)
  return ledger
