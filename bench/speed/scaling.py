r"""Client-population scaling: time per round and peak memory with 10 clients sampled per round
while the population grows (10, 100, 1000) on CIFAR-10 (the train split in --data_dir).

  .venv/bin/python -m bench.speed.scaling                # --runtime=tf
  .venv/bin/python -m bench.speed.scaling --runtime=tff

Every client holds the same number of examples (--examples_per_client, default 10) in every
setting, so a round does the same work (10 sampled clients x 10 examples) whatever the population,
and only the population changes. The clients are the first `population` parts of the library's
IID partition of the train split into (train size / examples_per_client) parts: 10,000 images give
1,000 clients of 10. (The task's Dirichlet partition cannot give 1,000 clients its 10-example
minimum from 10,000 images at any useful skew, and an IID split of the whole train split among the
population would shrink every client's data as the population grows, so rounds would not be
comparable.)

Each setting runs in a fresh subprocess through the project's training loop
(tff_decorr.program.round_loop.run: client sampling, the per-client state store, a checkpoint every
round), FedAvg + FedDecorr with small_cnn; evaluation and export are skipped, so the round time is
the federated round plus saving the sampled clients' states. Peak RSS is the subprocess's ru_maxrss;
under --runtime=tff the TFF worker's resident set, sampled after every round, is reported too.
Writes bench/results/scaling_<runtime>.json.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# TensorFlow at import time, before absl runs main: imported inside main, Keras functional models
# fail to build ("'SymbolicTensor' object has no attribute 'node'", Keras 2.14).
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top

_ROOT = _common.ROOT

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', os.path.join(os.path.dirname(_ROOT), 'shared', 'data', 'tfds'),
                    'TFDS data dir holding cifar10.')
flags.DEFINE_list('populations', ['10', '100', '1000'], 'Client populations.')
flags.DEFINE_integer('rounds', 8, 'Rounds per setting (the first, tracing, round is excluded).')
flags.DEFINE_enum('runtime', 'tf', ['tf', 'tff'], 'Runtime.')
flags.DEFINE_integer('per_round', 10, 'Clients sampled per round.')
flags.DEFINE_integer('examples_per_client', 10, 'Examples every client holds.')
flags.DEFINE_integer('child_population', 0, 'Internal: run one setting in this process.')
flags.DEFINE_string('child_out', '', 'Internal: output directory of the child setting.')


def child(pop: int, out: str) -> None:
  """One setting: writes out/result.json."""
  import psutil  # pylint: disable=g-import-not-at-top
  from tff_decorr.tasks import client_data  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import run_directory  # pylint: disable=g-import-not-at-top
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import experiment  # pylint: disable=g-import-not-at-top
  from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top

  k = FLAGS.examples_per_client
  config = config_lib.make(
      task='cifar10', data_dir=os.path.abspath(FLAGS.data_dir), model='small_cnn',
      algorithm='fedavg', regularizer='feddecorr', feddecorr_beta=0.1, partition='iid', num_clients=pop,
      clients_per_round=FLAGS.per_round, rounds=FLAGS.rounds, local_epochs=1, batch_size=64,
      seed=0, runtime=FLAGS.runtime, output_dir=out)
  exp = experiment.Experiment(config, log=lambda s: None)
  images, labels, _ = exp.task.load_split('train', config.data_dir)
  if pop * k > len(labels):
    raise ValueError(f'--populations: {pop} clients x --examples_per_client={k} is more than the '
                     f'{len(labels)} training examples; lower one of them.')
  parts = partitions.iid_partition(len(labels), len(labels) // k, seed=0)[:pop]
  shard_dir = os.path.join(tempfile.gettempdir(), 'tff_decorr_scaling_shards', f'k{k}-n{pop}')
  client_data.write_client_shards(images, labels, parts, shard_dir)
  del images, labels
  exp.partition = parts
  exp.client_dataset_fn = exp.task.client_dataset_fn(shard_dir, batch_size=config.batch_size,
                                                     epochs=1)
  runtime = exp.runtime(out)
  initial = exp.algorithm.initial_weights()
  directory = run_directory.RunDirectory(out, config.rounds, log=lambda s: None)
  # Every client's state on disk, as a stateful algorithm's: the store's cost is measured too.
  directory.open_client_states(True, lambda: exp.algorithm.initial_client_state(initial))
  worker_rss = []

  def on_round_end(round_num, server_state):
    del round_num, server_state
    rss = [p.memory_info().rss for p in psutil.Process().children(recursive=True)
           if p.name() == 'worker_binary']
    if rss:
      worker_rss.append(max(rss))

  loop = round_loop.LoopConfig(num_clients=pop, clients_per_round=config.clients_per_round,
                               seed=0, eval_every=config.rounds)
  hooks = round_loop.RoundHooks(evaluate=lambda s, r: {}, export=lambda *args: None,
                                on_round_end=on_round_end)
  round_loop.train_rounds(runtime, exp.algorithm, loop, directory, hooks)
  with open(os.path.join(out, 'metrics.csv')) as f:
    metrics = list(csv.DictReader(f))
  times = [float(m['round_time_s']) for m in metrics]
  result = {'clients': pop, 'first_round_s': times[0], 'steady_round_s': times[1:],
            'median_round_s': statistics.median(times[1:]),
            'examples_per_round': statistics.median(float(m['train_examples'])
                                                    for m in metrics),
            'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            'worker_peak_rss_mb': max(worker_rss) / 2**20 if worker_rss else None,
            'load_avg_end': os.getloadavg()}
  with open(os.path.join(out, 'result.json'), 'w') as f:
    json.dump(result, f)


def main(argv):
  del argv
  if FLAGS.child_population:
    child(FLAGS.child_population, FLAGS.child_out)
    return
  if FLAGS.rounds < 2:
    raise ValueError(f'--rounds: must be >= 2 (the first round is excluded), got {FLAGS.rounds}.')
  pops = [int(p) for p in FLAGS.populations]
  if any(p < FLAGS.per_round for p in pops):
    raise ValueError(f'--populations: every population must be >= --per_round={FLAGS.per_round}.')
  out_root = tempfile.mkdtemp(prefix='tff_decorr_scaling_')
  load_start = os.getloadavg()
  rows = []
  for pop in pops:
    out = os.path.join(out_root, f'n{pop}')
    cmd = [sys.executable, '-m', 'bench.speed.scaling', f'--child_population={pop}',
           f'--child_out={out}', f'--data_dir={FLAGS.data_dir}', f'--rounds={FLAGS.rounds}',
           f'--runtime={FLAGS.runtime}', f'--per_round={FLAGS.per_round}',
           f'--examples_per_client={FLAGS.examples_per_client}']
    proc = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f'{" ".join(cmd)}\n{proc.stderr[-3000:]}')
    with open(os.path.join(out, 'result.json')) as f:
      rows.append(json.load(f))
    print({k: v for k, v in rows[-1].items() if k != 'steady_round_s'}, flush=True)
  shutil.rmtree(out_root, ignore_errors=True)
  base = rows[0]
  for r in rows:
    r['round_ratio'] = r['median_round_s'] / base['median_round_s']
    r['rss_ratio'] = r['peak_rss_mb'] / base['peak_rss_mb']
  flat = all(abs(r['round_ratio'] - 1) <= 0.2 and abs(r['rss_ratio'] - 1) <= 0.2 for r in rows)
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', f'scaling_{FLAGS.runtime}.json')
  with open(path, 'w') as f:
    json.dump({'runtime': FLAGS.runtime, 'rounds': FLAGS.rounds, 'per_round': FLAGS.per_round,
               'examples_per_client': FLAGS.examples_per_client, 'rows': rows,
               'within_20_percent': flat, 'nproc': os.cpu_count(), 'load_avg_start': load_start,
               'load_avg_end': os.getloadavg()}, f, indent=2)
  print(f'\nscaling (--runtime={FLAGS.runtime}, {FLAGS.per_round} sampled x '
        f'{FLAGS.examples_per_client} examples per round, {FLAGS.rounds} rounds, first excluded)')
  print('| clients | first round s | median s/round (min-max) | ratio | peak RSS MB | ratio |'
        + (' TFF worker peak RSS MB |' if FLAGS.runtime == 'tff' else ''))
  print('| --- | --- | --- | --- | --- | --- |' + (' --- |' if FLAGS.runtime == 'tff' else ''))
  for r in rows:
    line = (f'| {r["clients"]} | {r["first_round_s"]:.2f} | {r["median_round_s"]:.2f} '
            f'({min(r["steady_round_s"]):.2f}-{max(r["steady_round_s"]):.2f}) | '
            f'{r["round_ratio"]:.2f} | {r["peak_rss_mb"]:.0f} | {r["rss_ratio"]:.2f} |')
    if FLAGS.runtime == 'tff':
      line += f' {r["worker_peak_rss_mb"] or 0:.0f} |'
    print(line)
  print(f'within 20 % of the 10-client setting: {flat}; load average start {load_start[0]:.2f}, '
        f'end {os.getloadavg()[0]:.2f}; wrote {path}')


if __name__ == '__main__':
  app.run(main)
