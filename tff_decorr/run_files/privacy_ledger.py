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

A ledger can still be deleted or cut by hand. Three copies survive that, and each run checks them
(`account`): a count beside the ledger (`<task>-<hash>.seen`, raised under the ledger's lock with
every append, which a deleted .jsonl leaves behind), and, in every run directory, a count of the
releases on the data it has known of (`dp_ledger.json`) and the releases it made itself, each
with the id it has in the ledger (`dp_ledger_releases.jsonl`). The run directories read are the
current one and its siblings: every directory beside it under the parent of --output_dir (a
study's runs/ folder, and where --overwrite moves an old run), owned by the user. A release found
in a run directory and not in the ledger is counted in dp_epsilon_all_releases (once: by its id);
a ledger holding fewer releases than any count says, or fewer of a run's own rounds than its
checkpoint has, is reported in the log and in summary.json (`dp_ledger_missing_releases`,
`dp_ledger_note`, `dp_ledger_found_in_run_dirs`). Lost for good: releases recorded only in run
directories that were deleted too, or that lie outside that parent.

A ledger line that is not a release (not JSON, not an object, a setting missing or of the wrong
type) is counted as unreadable: the run says so in a warning and does not count it in the epsilon.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import time
import uuid
from typing import Any, Iterable, Mapping

FILE_NAME = 'dp_releases.jsonl'  # the ledger's name beside a cache's shards, before this module
RUN_RECORD = 'dp_ledger.json'  # in a run directory: the ledger it uses, the releases it has seen
RUN_RELEASES = 'dp_ledger_releases.jsonl'  # in a run directory: the releases it made, with ids
_SETTINGS = ('noise_multiplier', 'clients_per_round', 'num_clients')
_NAMED = 8  # run directories named in a note; more are counted


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
  except (OSError, ValueError, AttributeError, TypeError, RecursionError):
    return 0


def _write_json(path: str, value: dict) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(value, f, sort_keys=True)
  os.replace(tmp, path)


def is_release(entry) -> bool:
  """Whether a parsed ledger line is a release the accountant can count: an object whose
  noise_multiplier is a finite number >= 0 and whose clients_per_round and num_clients are
  integers with 1 <= clients_per_round <= num_clients; its run, id and time, if any, strings."""
  if not isinstance(entry, dict):
    return False
  z, m, n = (entry.get(k) for k in _SETTINGS)
  if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z < 0:
    return False
  if any(isinstance(v, bool) or not isinstance(v, int) for v in (m, n)) or not 1 <= m <= n:
    return False
  return all(isinstance(entry.get(k, ''), str) for k in ('run', 'id', 'time', 'data'))


def _parsed_lines(path: str) -> list[tuple[int, str, dict | None]]:
  """(number from 1, text, the release or None when the line is not one: `is_release`) of each
  non-blank line of a JSON-lines file; [] without it."""
  out = []
  try:
    # errors='replace': bytes that are not UTF-8 make their line unreadable, not the file.
    with open(path, errors='replace') as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          entry = json.loads(line)
        except (ValueError, RecursionError):
          entry = None
        out.append((number, line, entry if is_release(entry) else None))
  except FileNotFoundError:
    pass
  return out


def _read_releases(path: str) -> tuple[list[dict], list[int]]:
  """The releases in a JSON-lines file, and the numbers of its lines that are not one (cut by a
  crash while written, edited by hand). ([], []) without it."""
  lines = _parsed_lines(path)
  return ([e for _, _, e in lines if e is not None],
          [number for number, _, e in lines if e is None])


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

  @property
  def key(self) -> str:
    """The data set's key (`data_key`): the ledger's file name without .jsonl."""
    return os.path.splitext(os.path.basename(self.path))[0]

  def entries(self) -> tuple[list[dict], int]:
    """The recorded releases, and the number of lines that cannot be read as one (a line cut by a
    crash while it was written, or edited by hand; the log says they are not counted)."""
    out, bad = _read_releases(self.path)
    return out, len(bad)

  def _lines(self) -> int:
    if not os.path.exists(self.path):
      return 0
    with open(self.path, errors='replace') as f:
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
             num_clients: int) -> dict:
    """Records one release; returns its line (with the `id` its copy in the run directory
    carries)."""
    entry = {'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'run': os.path.abspath(run),
             'id': uuid.uuid4().hex, 'data': self.key,
             'noise_multiplier': float(noise_multiplier),
             'clients_per_round': int(clients_per_round), 'num_clients': int(num_clients)}
    with _locked(self.path):
      self._append_lines([json.dumps(entry, sort_keys=True) + '\n'])
    return entry

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
      for _, line, entry in _parsed_lines(old):
        if entry is not None:
          lines.append(json.dumps({**entry, 'migrated_from': old}, sort_keys=True) + '\n')
        else:  # still unreadable
          lines.append(line if line.endswith('\n') else line + '\n')
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


def _owned_file(path: str) -> bool:
  """A regular file of this user's (a record another user placed beside a run is not read)."""
  try:
    st = os.stat(path)
  except OSError:
    return False
  return os.path.isfile(path) and st.st_uid == os.getuid()


def _run_record(run: str, ledger: Ledger) -> int:
  """The releases on the data the run directory has known of (0: none, or another data set)."""
  path = os.path.join(run, RUN_RECORD)
  if not _owned_file(path):
    return 0
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError, RecursionError):
    return 0
  if not isinstance(record, dict) or not isinstance(record.get('ledger'), str):
    return 0
  same_data = os.path.basename(record['ledger']) == os.path.basename(ledger.path)
  return _read_count(path) if same_data else 0


def run_directories(run: str) -> list[str]:
  """The run directories whose records a run on `run` reads: `run` and every directory beside it
  (under the parent of its path, one level) holding a record file of the user's; sorted."""
  run = os.path.abspath(run)
  parent = os.path.dirname(run)
  try:
    names = os.listdir(parent)
  except OSError:
    names = []
  siblings = [os.path.join(parent, name) for name in names]
  return sorted({run} | {d for d in siblings if os.path.isdir(d) and any(
      _owned_file(os.path.join(d, f)) for f in (RUN_RECORD, RUN_RELEASES))})


@dataclasses.dataclass(frozen=True)
class Account:
  """What a run knows of the releases on its data: the ledger, the count beside it, and the
  records of the run directories (`run_directories`)."""
  ledger: str                     # the ledger's path
  releases: list                  # the ledger's releases, then those only run directories hold
  in_ledger: int                  # how many of `releases` the ledger holds
  unreadable_lines: list          # numbers of the ledger's lines that are not a release
  found_in_runs: dict             # run directory -> its releases the ledger lacks (by id)
  missing: int                    # at least this many releases the ledger lacks (0: none known)
  why: str                        # how that is known

  @property
  def known(self) -> int:
    """The releases on the data this account knows of, unreadable lines included."""
    return self.in_ledger + len(self.unreadable_lines) + self.missing

  def note(self) -> str:
    """What the ledger lacks, and whether dp_epsilon_all_releases counts it ('' when nothing)."""
    if not self.missing:
      return ''
    text = (f'the ledger {self.ledger} lacks at least {self.missing} DP releases made on this data '
            f'({self.why}): it was deleted or cut')
    found = sum(self.found_in_runs.values())
    if not found:
      return text + ', and dp_epsilon_all_releases does not count them'
    named = [f'{d} ({n})' for d, n in sorted(self.found_in_runs.items())]
    if len(named) > _NAMED:
      named = named[:_NAMED] + [f'{len(named) - _NAMED} more']
    text += (f'; dp_epsilon_all_releases counts the {found} of them recorded in the run '
             f'directories {", ".join(named)}')
    uncounted = self.missing - found
    return text + (f', not the other {uncounted}' if uncounted > 0 else '')

  def unreadable_note(self) -> str:
    """Which ledger lines are not counted ('' when every line is a release)."""
    if not self.unreadable_lines:
      return ''
    lines = ', '.join(str(n) for n in self.unreadable_lines[:_NAMED])
    more = f' and {len(self.unreadable_lines) - _NAMED} more' if len(
        self.unreadable_lines) > _NAMED else ''
    return (f'{len(self.unreadable_lines)} lines of the ledger {self.ledger} are not a release '
            f'(line {lines}{more}: not JSON, not an object, or noise_multiplier, '
            'clients_per_round or num_clients missing or of the wrong type); they are not '
            'counted in dp_epsilon_all_releases')


def account(ledger: Ledger, run: str, run_rounds: int) -> Account:
  """Every release on the ledger's data that the ledger and the run directories beside `run`
  record (each once, by its id), and how many the ledger lacks: fewer lines than its .seen file
  or a run directory's record count, releases a run directory made that it does not hold, or
  fewer of this run's own rounds than the `run_rounds` its checkpoint (or its end) has.

  The run directories are read before the ledger, and a release is written to the ledger before
  its run directory, so a run on the same data that records a round meanwhile is not reported as
  missing."""
  directories = run_directories(run)
  records = {d: _run_record(d, ledger) for d in directories}
  made = {}  # id -> (run directory, release), the first directory holding it
  for d in directories:
    if _owned_file(os.path.join(d, RUN_RELEASES)):
      for entry in _read_releases(os.path.join(d, RUN_RELEASES))[0]:
        if entry.get('data') == ledger.key and entry.get('id'):
          made.setdefault(entry['id'], (d, entry))
  if os.path.isdir(os.path.dirname(ledger.path)):
    with _locked(ledger.path):  # the ledger and its .seen count as one append left them
      seen = ledger.seen()
      entries, bad = _read_releases(ledger.path)
  else:
    seen, (entries, bad) = 0, ([], [])
  count = len(entries) + len(bad)
  ids = {e.get('id') for e in entries}
  only_in_runs = [(d, e) for i, (d, e) in made.items() if i not in ids]
  found = collections.Counter(d for d, _ in only_in_runs)
  own = sum(1 for e in entries if e.get('run') == os.path.abspath(run))
  evidence = [(seen - count,
               f'{ledger.seen_path} counts {seen} releases, the ledger holds {count}'),
              (run_rounds - own, f'this run has made {run_rounds} rounds, the ledger holds {own} '
               'of them'),
              (len(only_in_runs), f'{len(only_in_runs)} releases recorded in {len(found)} run '
               f'directories are not in it')]
  evidence += [(n - count, f'{os.path.join(d, RUN_RECORD)} counts {n} releases, the ledger holds '
                f'{count}') for d, n in records.items()]
  missing, why = max(evidence, key=lambda e: e[0])
  return Account(ledger=ledger.path, releases=entries + [e for _, e in only_in_runs],
                 in_ledger=len(entries), unreadable_lines=bad, found_in_runs=dict(found),
                 missing=max(missing, 0), why=why if missing > 0 else '')


def record_run(ledger: Ledger, run: str, known: int) -> None:
  """Writes the run directory's count of the releases on the data (`known`: this run's own
  lower bound), unless it already holds more."""
  path = os.path.join(run, RUN_RECORD)
  if known > _run_record(run, ledger):
    _write_json(path, {'releases_seen': int(known), 'ledger': ledger.path})


def _record_release(run: str, entry: dict) -> None:
  """Appends a release the run made (its ledger line, id included) to the run directory's own
  copy, fsynced: a ledger deleted later leaves it there."""
  with open(os.path.join(run, RUN_RELEASES), 'a') as f:
    f.write(json.dumps(entry, sort_keys=True) + '\n')
    f.flush()
    os.fsync(f.fileno())


class ReleaseHook:
  """A run directory's hook (run_directory.RunDirectory.hooks) that records every round of a run
  in `ledger` once it has been computed (the noised aggregate exists from then on, whether or not
  its checkpoint is ever written), then in the run directory's own copy, and counts it in the run
  directory's record (`known`: the releases on the data known at the start)."""

  def __init__(self, ledger: Ledger, *, run: str, noise_multiplier: float,
               clients_per_round: int, num_clients: int, known: int = 0):
    self._ledger = ledger
    self._run = run
    self._known = known
    self._entry = dict(run=run, noise_multiplier=noise_multiplier,
                       clients_per_round=clients_per_round, num_clients=num_clients)

  @classmethod
  def start(cls, ledger: Ledger, run: str, resumed_round: int, entry: Mapping[str, Any],
            log=print) -> 'ReleaseHook':
    """The hook of a run starting (or resuming after `resumed_round`) in `run`: says where its
    ledger is, whether this data was released before and whether the ledger lost releases, and
    records the count it knows in the run directory. `entry`: noise_multiplier,
    clients_per_round and num_clients of each round's release."""
    seen = account(ledger, run, resumed_round)
    log(f'Privacy: the ledger of this data is {ledger.path}.')
    if seen.releases:
      log(f'Privacy: {len(seen.releases)} DP rounds were released on this data before this '
          f'start (ledger {ledger.path}); summary.json\'s dp_epsilon_all_releases counts them with '
          'this run\'s.')
    if seen.unreadable_lines:
      log(f'Privacy: warning: {seen.unreadable_note()}.')
    if seen.missing:
      log(f'Privacy: warning: {seen.note()}.')
    record_run(ledger, run, seen.known)
    return cls(ledger, run=run, known=seen.known, **entry)

  def released(self, round_num: int) -> None:
    del round_num  # One release per round; its ledger line names the run, not the round.
    _record_release(self._run, self._ledger.append(**self._entry))
    self._known += 1
    record_run(self._ledger, self._run, self._known)


def open_for_run(task: str, examples_hash: str, legacy_dirs: Iterable[str] = (),
                 log=print) -> Ledger:
  """The ledger of a data set, with any ledger an earlier release kept in `legacy_dirs` (cache
  folders) moved into it."""
  ledger = Ledger.for_data(task, examples_hash)
  for directory in legacy_dirs:
    ledger.migrate_from(directory, log=log)
  return ledger
