r"""A whole bin/train run by phase: where the wall time a user waits for goes.

Runs `python -m bin.train` as a user would, in a child process, and reports each phase as seconds
and as a share of the run's wall time (spawn to exit): the program's own phases (summary.json's
`phases_s`: start-up = interpreter + imports + flags, setup, client data (partition and shard
cache), build (the computations), initialize (the worker's start and the first computation),
first round (tracing), steady rounds, client states, evaluation, metrics, checkpoints, export,
summary), plus teardown (summary.json written to process exit) and what no phase accounts for.
CPU seconds of the run and its children (TFF's worker) are reported beside the wall time.
The fixed cost is the wall time less what the run's rounds take at the steady pace, given twice:
against the mean steady round (rounds 2..N) and against the median one (metrics.csv's
round_time_s), which counts what one slower round hides, such as the first evaluation traced
beside round 2, as fixed.

Each setting is run twice: `first` on an empty client-data cache, `second` on the cache the first
left (what a resumed study or a second seed of the same partition finds); each into a fresh
output directory, so both train every round.

Settings:
- `fidelity`: bench/settings.py's FIDELITY (ResNet20 on the shared CIFAR-10, 10,000 train
  images, Dirichlet alpha 0.05, 10 clients all participating, 10 rounds x 1 local epoch, batch 64,
  lr 0.01, momentum 0.9, weight decay 1e-5), FedAvg, seed 1: bench/accuracy/fidelity.py's setting.
- `cross_device`: the shape of pfl-research's CIFAR-10 benchmark scaled to this machine: 1,000
  clients (10 images each of the 10,000), 50 sampled per round, 20 rounds, batch 10, small_cnn,
  IID, --runtime=tff.
- `digits`: the embedded task, 4 clients, 5 rounds: a quick look (about a minute).

  .venv/bin/python -m bench.speed.run_phases --settings=fidelity,cross_device
  .venv/bin/python -m bench.speed.run_phases --settings=digits --runtime=tf

Writes bench/results/run_phases_<settings>.json. Run it alone on the machine: two heavy jobs on
2 cores give both wrong numbers.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

from bench import _common
from bench import settings as bench_settings
from tff_decorr.program import phases

FLAGS = flags.FLAGS

SETTINGS = {
    'fidelity': [*bench_settings.flags(bench_settings.FIDELITY),
                 f'--data_dir={_common.DEFAULT_DATA_DIR}', '--regularizer=none', '--seed=1'],
    'cross_device': ['--task=cifar10', f'--data_dir={_common.DEFAULT_DATA_DIR}',
                     '--model=small_cnn', '--partition=iid', '--num_clients=1000',
                     '--clients_per_round=50', '--rounds=20', '--local_epochs=1',
                     '--batch_size=10', '--regularizer=none', '--seed=1', '--eval_every=5'],
    'digits': ['--task=digits', '--num_clients=4', '--clients_per_round=4', '--rounds=5',
               '--local_epochs=1', '--regularizer=none', '--seed=1'],
}

flags.DEFINE_list('settings', ['digits'], f'Settings to run: {", ".join(SETTINGS)}.')
flags.DEFINE_enum('runtime', 'tff', ['tff', 'tf'], 'bin/train --runtime.')
flags.DEFINE_list('extra', [], 'More bin/train flags for every run (e.g. --eval_every=10).')
flags.DEFINE_string('output_name', None, 'Result file name (default: run_phases_<settings>).')
flags.DEFINE_list('runs', ['first', 'second'],
                  'first: on an empty client-data cache; second: on the cache the first left (or '
                  'the one in --cache_dir).')
flags.DEFINE_string('cache_dir', None, 'Client-data cache to use (default: a new one per setting, '
                    'removed afterwards); keep one to compare environments on a warm cache.')


def _children_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_once(args, output_dir: str, cache_dir: str) -> dict:
  """One bin/train process; its phases, teardown, wall and CPU seconds."""
  argv = [sys.executable, '-m', 'bin.train', *args, f'--runtime={FLAGS.runtime}',
          f'--output_dir={output_dir}', f'--cache_dir={cache_dir}', *FLAGS.extra]
  cpu0, t0 = _children_cpu(), time.time()
  proc = subprocess.run(argv, cwd=_common.ROOT, capture_output=True, text=True)
  t1, cpu1 = time.time(), _children_cpu()
  if proc.returncode != 0:
    raise RuntimeError(f'bin/train failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
  summary_path = os.path.join(output_dir, 'summary.json')
  with open(summary_path) as f:
    summary = json.load(f)
  wall = t1 - t0
  phases = dict(summary['phases_s'])
  phases['teardown'] = max(0.0, t1 - os.path.getmtime(summary_path))
  phases['unaccounted'] = max(0.0, wall - sum(phases.values()))
  rounds = int(summary['final_round'])
  fixed = wall - phases.get('steady_rounds', 0.0) * rounds / max(rounds - 1, 1)
  with open(os.path.join(output_dir, 'metrics.csv')) as f:
    round_times = [float(row['round_time_s']) for row in csv.DictReader(f)]
  # The median steady round does not count what one slower round hides (the first evaluation,
  # tracing the evaluator beside round 2) as work of every round, as the mean does.
  median = float(np.median(round_times[1:] or round_times))
  fixed_median = wall - median * rounds
  return {'wall_s': wall, 'cpu_s': cpu1 - cpu0, 'phases_s': phases, 'rounds': rounds,
          'round_times_s': round_times,
          'steady_round_s': phases.get('steady_rounds', 0.0) / max(rounds - 1, 1),
          # Fixed cost: the run's wall time less what its rounds would take at the steady pace.
          'fixed_s': fixed, 'fixed_share': fixed / wall,
          'median_steady_round_s': median,
          'fixed_median_s': fixed_median, 'fixed_median_share': fixed_median / wall,
          'final_test_accuracy': summary['final_test_accuracy']}


def _table(name: str, runs: dict) -> str:
  names = [n for n in phases.ORDER + ('teardown', 'unaccounted')
           if any(n in r['phases_s'] for r in runs.values())]
  for r in runs.values():
    names += [n for n in r['phases_s'] if n not in names]
  lines = [f'\n{name} (runtime {FLAGS.runtime})', f'{"phase":<16}' + ''.join(
      f'{k:>22}' for k in runs)]
  for n in names:
    lines.append(f'{n:<16}' + ''.join(
        f'{r["phases_s"].get(n, 0.0):>12.1f}s {100 * r["phases_s"].get(n, 0.0) / r["wall_s"]:>6.1f}%'
        for r in runs.values()))
  for key, label in (('wall_s', 'wall'), ('cpu_s', 'CPU (all procs)'),
                     ('steady_round_s', 'steady round'), ('fixed_s', 'fixed cost'),
                     ('median_steady_round_s', 'median round'),
                     ('fixed_median_s', 'fixed (median)')):
    lines.append(f'{label:<16}' + ''.join(f'{r[key]:>21.1f}s' for r in runs.values()))
  for key, label in (('fixed_share', 'fixed share'), ('fixed_median_share', 'share (median)')):
    lines.append(f'{label:<16}' + ''.join(f'{100 * r[key]:>21.1f}%' for r in runs.values()))
  return '\n'.join(lines)


def main(argv):
  del argv
  unknown = [s for s in FLAGS.settings if s not in SETTINGS]
  if unknown:
    raise app.UsageError(f'--settings: unknown {unknown}; choose from {", ".join(SETTINGS)}.')
  report = {'machine': _common.machine(), 'runtime': FLAGS.runtime, 'settings': {}}
  tmp = tempfile.mkdtemp(prefix='run_phases_')
  try:
    for name in FLAGS.settings:
      cache = os.path.join(FLAGS.cache_dir or tmp, f'cache_{name}')
      runs = {}
      for which in ('first', 'second'):  # empty cache, then the cache the first one wrote
        if which in FLAGS.runs:
          runs[which] = run_once(SETTINGS[name], os.path.join(tmp, f'{name}_{which}'), cache)
      report['settings'][name] = {'args': SETTINGS[name] + FLAGS.extra, 'runs': runs}
      print(_table(name, runs), flush=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  out = _common.write(FLAGS.output_name or 'run_phases_' + '_'.join(FLAGS.settings), report)
  m = report['machine']
  print(f'\nload average start {m["load_avg_start"][0]:.2f}, end {m["load_avg_end"][0]:.2f}; '
        f'wrote {out}')


if __name__ == '__main__':
  app.run(main)
