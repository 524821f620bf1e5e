"""Shared pieces of the round-time benchmarks (bench.speed.overhead, bench.speed.orchestration): one
runner per variant, rounds alternating between variants within one process, ratios per repeat,
machine facts.

Ratios are computed per repeat (variant time / baseline time of the same repeat, measured back to
back), so load changes on a shared machine affect both sides of each ratio alike; absolute seconds
are reported for context only. Two clocks are kept for every round: wall time, and CPU time (user +
system seconds of this process and of its child processes, i.e. TFF's worker_binary, over the
round). On a machine shared with other jobs wall time also counts waiting for a core, which CPU
time does not, so CPU-time ratios are the steadier measure of the work a variant adds.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import tempfile
import time

# realpath: under Bazel this file is a link in a test's runfiles, and the results live in the tree.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# The shared real CIFAR-10 (10k train, 10k test) beside the repository.
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(ROOT), 'shared', 'data', 'tfds')


def cpu_seconds() -> float:
  """User + system CPU seconds used so far by this process and its live child processes."""
  import psutil  # pylint: disable=g-import-not-at-top
  me = psutil.Process()
  total = sum(me.cpu_times()[:2])
  for child in me.children(recursive=True):
    try:
      total += sum(child.cpu_times()[:2])
    except psutil.Error:
      pass
  return total


def server_metric_means(run_dir: str) -> dict:
  """The mean over rounds of each server/* column of a run's metrics.csv (FedExP's eta_g, the
  server optimisers' update norm); {} when it has none."""
  path = os.path.join(run_dir, 'metrics.csv')
  if not os.path.exists(path):
    return {}
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  keys = [k for k in (rows[0] if rows else {}) if k.startswith('server/')]
  return {k: statistics.mean(float(r[k]) for r in rows if r.get(k)) for k in keys}


def train_final_accuracy(config) -> tuple:
  """Trains `config` as bin/train does (resuming an interrupted run; a finished one is read back):
  (its final test accuracy as a fraction, ''), or (0.0, why) when training stopped on a non-finite
  value, so a diverged cell scores below every trained one and says so."""
  from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import training  # pylint: disable=g-import-not-at-top
  try:
    summary = training.train(config, log=lambda s: None)
  except round_loop.NonFiniteError as e:
    return 0.0, f'non-finite: {str(e)[:200]}'
  if summary is None:  # The directory holds a finished (or longer) run: what it finished.
    with open(os.path.join(config.output_dir, 'summary.json')) as f:
      summary = json.load(f)
  return float(summary['final_test_accuracy']), ''


def run_seeds(configs, label: str, after=lambda: None) -> dict:
  """One cell of an accuracy grid: each config (one a seed) trained by train_final_accuracy, then
  `after()` (e.g. stopping TFF workers). Its accuracies (fractions), mean and sample std,
  non-finite count and notes, seconds, and each run's server_metric_means."""
  accs, notes, seconds, server = [], [], [], []
  for config in configs:
    t0 = time.time()
    acc, note = train_final_accuracy(config)
    after()
    seconds.append(time.time() - t0)
    accs.append(acc)
    notes.append(note)
    server.append(server_metric_means(config.output_dir))
    print(f'  {label} seed={config.seed}: {acc:.4f}{" (" + note + ")" if note else ""}  '
          f'{seconds[-1]:.0f}s', flush=True)
  return {'accuracy': accs, 'mean': statistics.mean(accs),
          'std': statistics.stdev(accs) if len(accs) > 1 else 0.0,
          'non_finite': sum(1 for n in notes if n), 'notes': notes, 'seconds': seconds,
          'server_metric_means': server}


def cache_dir() -> str:
  return os.path.join(tempfile.gettempdir(), 'tff_decorr_bench_cache')


class Runner:
  """One variant: its Experiment, runtime, server state and client states; `step()` times a round.

  Rounds sample clients exactly as tff_decorr.program.round_loop.train_rounds does (sample_clients,
  client_seed), so each variant sees the same clients, data order and augmentation in the same
  round."""

  def __init__(self, config):
    from tff_decorr.program import experiment  # pylint: disable=g-import-not-at-top
    from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
    self.exp = experiment.Experiment(config, log=lambda s: None)
    self.exp.prepare_client_data()
    self.runtime = self.exp.runtime()
    self.state = self.runtime.initialize()
    alg = self.exp.algorithm
    init = alg.initial_weights()
    self.client_states = [alg.initial_client_state(init) for _ in range(config.num_clients)]
    self.round = 0
    self.metrics = None  # The last round's metrics (bytes_up, aggregator measurements, ...).
    self._round_loop = round_loop

  def inputs(self):
    c = self.exp.config
    ids = self._round_loop.sample_clients(c.num_clients, c.clients_per_round, c.seed,
                                          self.round + 1)
    inputs = [(str(i), self._round_loop.client_seed(c.seed, self.round + 1, i)) for i in ids]
    return ids, inputs

  def step(self):
    """Runs one round; returns (wall seconds, CPU seconds) of it."""
    ids, inputs = self.inputs()
    self.round += 1
    states = [self.client_states[i] for i in ids]
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    self.state, new_states, self.metrics = self.runtime.run_round(self.state, inputs, states)
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    for i, s in zip(ids, new_states):
      self.client_states[i] = s
    return elapsed, cpu


def check_flags(variants, known, repeats: int) -> None:
  """--variants names only known variants and --repeats is positive (one message each)."""
  unknown = [v for v in variants if v not in known]
  if unknown:
    raise ValueError(f'--variants: unknown {unknown}; choose from {", ".join(known)}.')
  if repeats < 1:
    raise ValueError(f'--repeats: must be >= 1, got {repeats}.')


def alternate(runners: dict, repeats: int, log=print):
  """Round 1 of every variant (tracing), then `repeats` rounds of each, in turn.

  Returns (first-round wall seconds, wall seconds per repeat, CPU seconds per repeat), each a dict
  keyed by variant."""
  first = {}
  for name, r in runners.items():
    first[name] = r.step()[0]
    log(f'  first round {name}: {first[name]:.2f}s')
  wall = {name: [] for name in runners}
  cpu = {name: [] for name in runners}
  for k in range(repeats):
    for name, r in runners.items():
      w, c = r.step()
      wall[name].append(w)
      cpu[name].append(c)
    log('  repeat %d: %s' % (k + 1, ', '.join(
        f'{n} {wall[n][-1]:.2f}s wall {cpu[n][-1]:.2f}s cpu' for n in runners)), flush=True)
  return first, wall, cpu


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


def print_table(wall: dict, cpu: dict, first: dict, baseline: str) -> None:
  print(f'| variant | first round wall s | median wall s | wall ratio to {baseline} min / median / '
        f'max | median CPU s | CPU ratio min / median / max |')
  print('| --- | --- | --- | --- | --- | --- |')
  for name, s in wall.items():
    c = cpu[name]
    print(f'| {name} | {first[name]:.2f} | {s["median_s"]:.2f} | {s["ratio_min"]:.3f} / '
          f'{s["ratio_median"]:.3f} / {s["ratio_max"]:.3f} | {c["median_s"]:.2f} | '
          f'{c["ratio_min"]:.3f} / {c["ratio_median"]:.3f} / {c["ratio_max"]:.3f} |')


def report(name: str, report_dict: dict, title: str, baseline: str, extra: str = '') -> str:
  """Writes bench/results/<name>.json, then prints the title, the wall/CPU table and the load."""
  path = write(name, report_dict)
  print('\n' + title)
  print_table(report_dict['results'], report_dict['results_cpu'], report_dict['first_round_s'],
              baseline)
  m = report_dict['machine']
  print(f'{extra}load average start {m["load_avg_start"][0]:.2f}, end '
        f'{m["load_avg_end"][0]:.2f}; wrote {path}', flush=True)
  return path


def worker_pids() -> set:
  """PIDs of running TFF worker_binary processes (to check that a benchmark left none behind)."""
  import psutil  # pylint: disable=g-import-not-at-top
  pids = set()
  for p in psutil.process_iter(['pid', 'cmdline']):
    cmd = p.info.get('cmdline') or []
    if cmd and os.path.basename(cmd[0]) == 'worker_binary':
      pids.add(p.info['pid'])
  return pids
