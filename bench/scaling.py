r"""Client-population scaling: time per round and peak RSS with 10 clients sampled per round while
the population grows (10, 100, 1000) on CIFAR-10. Each setting runs `bin.train` in a fresh
subprocess, so peak RSS (ru_maxrss of the finished child, which includes TFF's worker when it was
waited for) belongs to that setting alone.

  .venv/bin/python -m bench.scaling --data_dir=../shared/data/tfds

The partition is IID: the 10,000-image train split cannot give 1,000 clients the Dirichlet
partition's minimum of 10 examples each with any skew. With IID over a fixed split, a client holds
10,000 / population examples, so the work per round shrinks as the population grows (10 clients x
1,000 examples vs 10 x 10): the table reports examples per round and time per example next to the
round time. What is checked is that neither memory nor per-round overhead grows with the population.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', os.path.join('..', 'shared', 'data', 'tfds'), 'TFDS data dir.')
flags.DEFINE_list('populations', ['10', '100', '1000'], 'Client populations.')
flags.DEFINE_integer('rounds', 4, 'Rounds per setting (the first, tracing, round is excluded).')
flags.DEFINE_enum('runtime', 'tf', ['tf', 'tff'], 'Runtime.')
flags.DEFINE_integer('per_round', 10, 'Clients sampled per round.')

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
  del argv
  out_root = tempfile.mkdtemp(prefix='tff_decorr_scaling_')
  rows = []
  for pop in [int(p) for p in FLAGS.populations]:
    out = os.path.join(out_root, f'n{pop}')
    cmd = [sys.executable, '-m', 'bin.train', '--task=cifar10',
           f'--data_dir={os.path.abspath(FLAGS.data_dir)}', '--model=small_cnn',
           '--partition=iid', f'--num_clients={pop}', f'--clients_per_round={FLAGS.per_round}',
           f'--rounds={FLAGS.rounds}', '--local_epochs=1', '--regularizer=feddecorr',
           f'--runtime={FLAGS.runtime}', f'--eval_every={FLAGS.rounds}', f'--output_dir={out}',
           f'--cache_dir={os.path.join(out_root, "cache")}']
    # A fresh wrapper per setting: RUSAGE_CHILDREN's maximum only ever grows within a process.
    wrapper = ('import resource, subprocess, sys; '
               'p = subprocess.run(sys.argv[1:], capture_output=True, text=True); '
               'sys.stderr.write(p.stderr[-3000:]); '
               'print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); '
               'sys.exit(p.returncode)')
    proc = subprocess.run([sys.executable, '-c', wrapper, *cmd], cwd=_ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
      raise RuntimeError(f'{cmd}\n{proc.stderr[-2000:]}')
    peak_kb = int(proc.stdout.strip().splitlines()[-1])
    with open(os.path.join(out, 'metrics.csv')) as f:
      metrics = list(csv.DictReader(f))
    steady = [float(m['round_time_s']) for m in metrics[1:]]
    rows.append({'clients': pop, 'first_round_s': float(metrics[0]['round_time_s']),
                 'median_round_s': statistics.median(steady),
                 'examples_per_round': statistics.median(float(m['train_examples'])
                                                         for m in metrics),
                 'peak_rss_mb': peak_kb / 1024.0})
    rows[-1]['ms_per_example'] = 1000 * rows[-1]['median_round_s'] / rows[-1]['examples_per_round']
    print(rows[-1], flush=True)
  base = rows[0]
  for r in rows:
    r['round_ratio'] = r['median_round_s'] / base['median_round_s']
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', f'scaling_{FLAGS.runtime}.json')
  with open(path, 'w') as f:
    json.dump({'runtime': FLAGS.runtime, 'rounds': FLAGS.rounds, 'rows': rows,
               'load_avg_end': os.getloadavg()}, f, indent=2)
  print('| clients | sampled | examples/round | first round s | median s/round | ratio | '
        'ms/example | peak RSS MB |')
  print('| --- | --- | --- | --- | --- | --- | --- | --- |')
  for r in rows:
    print(f'| {r["clients"]} | {FLAGS.per_round} | {r["examples_per_round"]:.0f} | '
          f'{r["first_round_s"]:.2f} | {r["median_round_s"]:.2f} | {r["round_ratio"]:.2f} | '
          f'{r["ms_per_example"]:.2f} | {r["peak_rss_mb"]:.0f} |')
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
