r"""Time per round: single process vs one / two TFF workers on loopback (docs/remote_workers.md).

  .venv/bin/python -m bench.speed.remote_overhead [--rounds=4] [--local_epochs=1]

Starts two TFF workers (worker_binary, owned by this process) on free ports, runs the same bin.train
config three times (no --workers, --workers=A, --workers=A,B) and prints each run's round-1 time
(includes compiling the computation) and mean time of the later rounds, with ratios to the
single-process run. One invocation each; on a shared 2-core machine expect noise of ~20%.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

from bench import _common
from tff_decorr.worker import tff_context

flags.DEFINE_integer('rounds', 4, 'Rounds per run.')
flags.DEFINE_integer('local_epochs', 1, 'Local epochs.')
flags.DEFINE_integer('num_clients', 4, 'Clients (all sampled every round).')
FLAGS = flags.FLAGS
REPO = _common.ROOT


def _run(tmp, name, extra):
  out = os.path.join(tmp, name)
  cmd = [sys.executable, '-m', 'bin.train', '--task=digits', '--regularizer=none',
         f'--num_clients={FLAGS.num_clients}', f'--clients_per_round={FLAGS.num_clients}',
         f'--rounds={FLAGS.rounds}', f'--local_epochs={FLAGS.local_epochs}', '--runtime=tff',
         f'--eval_every={FLAGS.rounds}', f'--cache_dir={os.path.join(tmp, "cache")}',
         f'--output_dir={out}', *extra]
  print(' '.join(cmd[1:]), flush=True)
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  if proc.returncode:
    sys.exit(f'{name} failed:\n{proc.stderr[-2000:]}')
  with open(os.path.join(out, 'metrics.csv')) as f:
    times = [float(r['round_time_s']) for r in csv.DictReader(f)]
  return times[0], sum(times[1:]) / len(times[1:])


def main(argv):
  del argv
  if FLAGS.rounds < 2:
    raise app.UsageError('--rounds must be >= 2 (round 1 includes compilation).')
  tff_context.install()  # Replaces TFF's import-time default context (it starts nothing itself).
  workers = [tff_context.WorkerProcess() for _ in range(2)]
  addresses = [w.address for w in workers]
  with tempfile.TemporaryDirectory() as tmp:
    results = {
        'single process': _run(tmp, 'single', []),
        '1 worker': _run(tmp, 'one', [f'--workers={addresses[0]}']),
        '2 workers': _run(tmp, 'two', [f'--workers={",".join(addresses)}']),
    }
  tff_context.stop_all()
  base_first, base_later = results['single process']
  print(f'\n{"":16}{"round 1 (s)":>12}{"later (s/round)":>17}{"ratio later":>13}')
  for name, (first, later) in results.items():
    print(f'{name:16}{first:12.2f}{later:17.2f}{later / base_later:13.2f}')


if __name__ == '__main__':
  app.run(main)
