"""Shared pieces of the round-time benchmarks (bench.overhead, bench.orchestration): one runner per
variant, rounds alternating between variants within one process, ratios per repeat, machine facts.

Ratios are computed per repeat (variant time / baseline time of the same repeat, measured back to
back), so load changes on a shared machine affect both sides of each ratio alike; absolute seconds
are reported for context only.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA_DIR = '/work/shared/data/tfds'


def cache_dir() -> str:
  return os.path.join(tempfile.gettempdir(), 'tff_decorr_bench_cache')


class Runner:
  """One variant: its Experiment, runtime, server state and client states; `step()` times a round.

  Rounds sample clients exactly as tff_decorr.program.run does (sample_clients, client_seed), so
  each variant sees the same clients, data order and augmentation in the same round."""

  def __init__(self, config):
    from tff_decorr import experiment  # pylint: disable=g-import-not-at-top
    from tff_decorr import program  # pylint: disable=g-import-not-at-top
    self.exp = experiment.Experiment(config, log=lambda s: None)
    self.exp.prepare_client_data()
    self.runtime = self.exp.runtime()
    self.state = self.runtime.initialize()
    alg = self.exp.algorithm
    init = alg.initial_weights()
    self.client_states = [alg.initial_client_state(init) for _ in range(config.num_clients)]
    self.round = 0
    self._program = program

  def inputs(self):
    c = self.exp.config
    ids = self._program.sample_clients(c.num_clients, c.clients_per_round, c.seed, self.round + 1)
    inputs = [(str(i), self._program.client_seed(c.seed, self.round + 1, i)) for i in ids]
    return ids, inputs

  def step(self) -> float:
    ids, inputs = self.inputs()
    self.round += 1
    states = [self.client_states[i] for i in ids]
    t0 = time.perf_counter()
    self.state, new_states, _ = self.runtime.run_round(self.state, inputs, states)
    elapsed = time.perf_counter() - t0
    for i, s in zip(ids, new_states):
      self.client_states[i] = s
    return elapsed


def alternate(runners: dict, repeats: int, log=print):
  """Round 1 of every variant (tracing), then `repeats` rounds of each, in turn."""
  first = {}
  for name, r in runners.items():
    first[name] = r.step()
    log(f'  first round {name}: {first[name]:.2f}s')
  times = {name: [] for name in runners}
  for k in range(repeats):
    for name, r in runners.items():
      times[name].append(r.step())
    log('  repeat %d: %s' % (k + 1, ', '.join(f'{n} {t[-1]:.2f}s' for n, t in times.items())))
  return first, times


def summarize(times: dict, baseline: str) -> dict:
  out = {}
  for name, ts in times.items():
    ratios = [t / b for t, b in zip(ts, times[baseline])]
    out[name] = {'median_s': statistics.median(ts), 'min_s': min(ts), 'max_s': max(ts),
                 'ratio_min': min(ratios), 'ratio_median': statistics.median(ratios),
                 'ratio_max': max(ratios), 'ratios': ratios, 'times_s': ts}
  return out


def machine() -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  model = ''
  try:
    with open('/proc/cpuinfo') as f:
      model = next(l.split(':', 1)[1].strip() for l in f if l.startswith('model name'))
  except (OSError, StopIteration):
    pass
  return {'nproc': os.cpu_count(), 'cpu_model': model, 'python': platform.python_version(),
          'tensorflow': tf.__version__, 'tensorflow_federated': tff.__version__,
          'gpus': [d.name for d in tf.config.list_physical_devices('GPU')],
          'load_avg_start': os.getloadavg()}


def write(name: str, report: dict) -> str:
  report.setdefault('machine', {})['load_avg_end'] = os.getloadavg()
  os.makedirs(os.path.join(ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(ROOT, 'bench', 'results', f'{name}.json')
  with open(path, 'w') as f:
    json.dump(report, f, indent=2)
  return path


def print_table(summary: dict, first: dict, baseline: str) -> None:
  print(f'| variant | first round s | median s/round | ratio to {baseline} min / median / max |')
  print('| --- | --- | --- | --- |')
  for name, s in summary.items():
    print(f'| {name} | {first[name]:.2f} | {s["median_s"]:.2f} | {s["ratio_min"]:.3f} / '
          f'{s["ratio_median"]:.3f} / {s["ratio_max"]:.3f} |')


def worker_pids() -> set:
  """PIDs of running TFF worker_binary processes (to check that a benchmark left none behind)."""
  import psutil  # pylint: disable=g-import-not-at-top
  pids = set()
  for p in psutil.process_iter(['pid', 'cmdline']):
    cmd = p.info.get('cmdline') or []
    if cmd and os.path.basename(cmd[0]) == 'worker_binary':
      pids.add(p.info['pid'])
  return pids
