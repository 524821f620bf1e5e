"""Where a run's wall time goes, by phase: start-up, data, building the computations, the
first round (tracing), the steady rounds, evaluation, checkpoints, export, ...

Users wait for whole runs, and a study multiplies every fixed cost by its number of runs, so the
training program times its own phases (`Phases`), logs them in one line at the end and writes them
to summary.json (`phases_s`, this invocation only: a resumed run times what it did).
bench/speed/run_phases.py adds what a process cannot time about itself (its exit) and reports
shares.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Dict, Iterator

# The order phases are reported in; a phase not listed is reported after these.
ORDER = ('start_up', 'setup', 'client_data', 'build', 'initialize', 'first_round',
         'steady_rounds', 'client_states', 'evaluation', 'metrics', 'checkpoints', 'export',
         'summary')


class Phases:
  """Accumulates wall seconds per named phase."""

  def __init__(self):
    self.seconds: Dict[str, float] = {}

  def add(self, name: str, seconds: float) -> None:
    self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

  @contextlib.contextmanager
  def __call__(self, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self.add(name, time.perf_counter() - start)

  def ordered(self) -> Dict[str, float]:
    known = [n for n in ORDER if n in self.seconds]
    return {n: round(self.seconds[n], 3) for n in known + sorted(set(self.seconds) - set(known))}

  def line(self) -> str:
    items = self.ordered()
    total = sum(items.values())
    return ('Time by phase: ' + ', '.join(f'{n} {s:.1f}s' for n, s in items.items())
            + f' (total {total:.1f}s)')


def since_process_start() -> float | None:
  """Wall seconds since this process was created (interpreter start, imports, flag parsing), from
  /proc; None where that cannot be read."""
  try:
    with open('/proc/self/stat') as f:
      start_ticks = int(f.read().rsplit(')', 1)[1].split()[19])  # field 22: starttime
    with open('/proc/uptime') as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf('SC_CLK_TCK'))
  except (OSError, ValueError, IndexError):
    return None
