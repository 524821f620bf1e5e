"""Every differentially private release made on one client data set, whichever run made it.

A run's own epsilon (`dp_epsilon`) counts the rounds in its model's lineage. The same clients can
have been released before: a run started again with --overwrite (the old run is moved aside, its
model still exists), a run whose checkpoints/ were deleted, or a crash after a round's noised
aggregate was computed but before its checkpoint, after which the round is run again with fresh
noise. An adversary who sees all those outputs learns more than one run's epsilon says. So each
DP round is appended here, before its checkpoint is written, to a ledger kept beside the client
data's shards (`<cache_dir>/<task>/<partition>-<key>/dp_releases.jsonl`: one file per partitioned
client data set, whatever run directory uses it), and the run reports the epsilon of every
release in the ledger together (`dp_epsilon_all_releases`) beside its own, and says in its log
when earlier releases exist. Deleting the cache deletes the ledger: the run's log says where it is.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Iterable

FILE_NAME = 'dp_releases.jsonl'


class Ledger:
  """An append-only JSON-lines file of DP rounds: one line per round, fsynced before the round's
  checkpoint, so no release can be made without being recorded."""

  def __init__(self, directory: str):
    self.path = os.path.join(directory, FILE_NAME)

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

  def append(self, *, run: str, noise_multiplier: float, clients_per_round: int,
             num_clients: int) -> None:
    entry = {'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'run': os.path.abspath(run),
             'noise_multiplier': float(noise_multiplier),
             'clients_per_round': int(clients_per_round), 'num_clients': int(num_clients)}
    with open(self.path, 'a') as f:
      f.write(json.dumps(entry, sort_keys=True) + '\n')
      f.flush()
      os.fsync(f.fileno())


def grouped(entries: Iterable[dict]) -> list[tuple[float, int, int, int]]:
  """(noise_multiplier, clients_per_round, num_clients, count) per distinct setting."""
  counts = collections.Counter(
      (e['noise_multiplier'], e['clients_per_round'], e['num_clients']) for e in entries)
  return [(*k, n) for k, n in sorted(counts.items())]


class RecordingRuntime:
  """A runtime whose every round is recorded in `ledger` once it has been computed (the noised
  aggregate exists from then on, whether or not its checkpoint is ever written)."""

  def __init__(self, runtime, ledger: Ledger, *, run: str, noise_multiplier: float,
               clients_per_round: int, num_clients: int):
    self._runtime = runtime
    self._ledger = ledger
    self._entry = dict(run=run, noise_multiplier=noise_multiplier,
                       clients_per_round=clients_per_round, num_clients=num_clients)

  def __getattr__(self, name):
    return getattr(self._runtime, name)

  def run_round(self, *args, **kwargs):
    result = self._runtime.run_round(*args, **kwargs)
    self._ledger.append(**self._entry)
    return result
