r"""What the isolated worker's Unix-socket bridge costs per round, against a loopback TCP worker.

  .venv/bin/python -m bench.speed.worker_bridge [--repeats=12] [--round_repeats=2] [--rounds=4]
  .venv/bin/python -m bench.speed.worker_bridge --setting=fidelity --rounds=3 \
      --resnet20_round_s=24.5

The local TFF worker runs in a network namespace of its own and is reached through a Unix socket
that `tff_decorr/worker/netns_bridge.py` forwards to its port (docs/security.md); before, it
listened on 127.0.0.1 (the loopback library, still the fallback). Two measurements, each side
alternating with the other so that the load of the machine falls on both alike:

1. Transfer: one federated computation that sends a ResNet20's weights (float32, the project's
   `resnet20` for CIFAR-10) to each of --clients clients and gets them back (what a round moves:
   the broadcast and the uploads), through each worker; median wall time of --repeats calls.
   Its difference is the bridge's cost for a round of the fidelity setting (ResNet20, 10 clients);
  the minimum is printed too, the figure least touched by other load on the machine.
   A small call (3 clients, one int32 each) times what the bridge adds to a round trip's latency,
   and the bridge process's CPU time per transfer is what it costs whatever the load.
2. Round: `bin.train` under --runtime=tff (--setting: digits, or the fidelity setting itself),
   --rounds rounds, once with the namespace's worker and once with TFF_DECORR_WORKER_NAMESPACE=0
   (the loopback worker), --round_repeats times; median of the rounds after the first (which
   compiles).

Prints each figure, the difference and the ratio, and the transfer difference as a share of the
round and of a ResNet20 round (--resnet20_round_s: a fidelity-setting round's wall time on this
machine, docs/benchmarks.md §3).
"""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from tff_decorr import tf_env  # pylint: disable=g-bad-import-order,unused-import  (before TF)
import numpy as np
import tensorflow_federated as tff

from bench import _common
from bench import settings
from tff_decorr import models
from tff_decorr.worker import netns
from tff_decorr.worker import tff_context

flags.DEFINE_integer('repeats', 12, 'Transfer calls per worker (alternating).')
flags.DEFINE_integer('clients', 10, 'Clients of the transfer computation.')
flags.DEFINE_integer('round_repeats', 2, 'bin.train runs per worker (alternating); 0: skip.')
flags.DEFINE_integer('rounds', 4, 'Rounds per bin.train run.')
flags.DEFINE_enum('setting', 'digits', ['digits', 'fidelity'],
                  'The bin.train runs: digits (4 clients, a minute a run) or fidelity '
                  '(bench/settings.py: ResNet20, the shared CIFAR-10 10k split, 10 clients; '
                  'minutes a run).')
flags.DEFINE_float('resnet20_round_s', 0.0, 'Wall seconds of one fidelity-setting round (ResNet20, '
                   '10 clients) here, to state the transfer difference as its share; 0: not '
                   'stated.')
FLAGS = flags.FLAGS
REPO = _common.ROOT


def _resnet20_size() -> int:
  model = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3))
  return int(sum(np.prod(w.shape) for w in model.weights))


def _transfer_computation(size: int):
  @tff.tensorflow.computation(tff.TensorType(np.float32, [size]))
  def touch(weights):
    return weights + 1.0  # Computed, so the value is really materialised on the worker.

  @tff.federated_computation(tff.FederatedType(tff.TensorType(np.float32, [size]), tff.CLIENTS))
  def round_trip(weights):
    return tff.federated_map(touch, weights)
  return round_trip


def _small_computation():
  @tff.tensorflow.computation(np.int32)
  def add_one(x):
    return x + 1

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def total(xs):
    return tff.federated_sum(tff.federated_map(add_one, xs))
  return total


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of `pid` so far (/proc/<pid>/stat)."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _loopback_worker() -> tff_context.WorkerProcess:
  saved = netns._available  # pylint: disable=protected-access
  netns._available = (False, 'bench: the loopback worker')  # pylint: disable=protected-access
  try:
    return tff_context.WorkerProcess(without_namespace=True)
  finally:
    netns._available = saved  # pylint: disable=protected-access


def _transfers(size: int) -> dict:
  workers = {'namespace + bridge': tff_context.WorkerProcess(), 'loopback TCP': _loopback_worker()}
  assert workers['namespace + bridge'].isolation == 'namespace', 'no user namespaces here'
  bridge = workers['namespace + bridge'].process.pid
  computation = _transfer_computation(size)
  small = _small_computation()
  value = [np.full([size], i, np.float32) for i in range(FLAGS.clients)]
  times = {name: [] for name in workers}
  small_times = {name: [] for name in workers}
  for name, w in workers.items():  # Warm-up: the first call compiles and connects.
    tff_context.install(workers=[w.address])
    computation(value)
    small([1, 2, 3])
  bridge_cpu = 0.0
  for _ in range(FLAGS.repeats):
    for name, w in workers.items():
      tff_context.install(workers=[w.address])
      cpu = _cpu_seconds(bridge)
      start = time.perf_counter()
      out = computation(value)
      times[name].append(time.perf_counter() - start)
      if w.process.pid == bridge:
        bridge_cpu += _cpu_seconds(bridge) - cpu
      assert float(out[-1][0]) == FLAGS.clients, out[-1][0]
      start = time.perf_counter()
      assert small([1, 2, 3]) == 9
      small_times[name].append(time.perf_counter() - start)
  tff_context.stop_all()
  return ({name: (statistics.median(t), min(t)) for name, t in times.items()},
          {name: (statistics.median(t), min(t)) for name, t in small_times.items()},
          bridge_cpu / FLAGS.repeats)


def _setting_flags(rounds: int) -> list[str]:
  if FLAGS.setting == 'digits':
    return ['--task=digits', '--regularizer=none', '--num_clients=4', '--clients_per_round=4',
            '--local_epochs=1', f'--rounds={rounds}']
  # The fidelity setting (bench/settings.py), shortened to `rounds`.
  return settings.flags(settings.FIDELITY, rounds=rounds, data_dir=_common.DEFAULT_DATA_DIR,
                        regularizer='none', seed=1)


def _round_time(tmp: str, name: str, env: dict, rounds: int = 0) -> float:
  out = os.path.join(tmp, name)
  rounds = rounds or FLAGS.rounds
  cmd = [sys.executable, '-m', 'bin.train', *_setting_flags(rounds), '--runtime=tff',
         f'--eval_every={rounds}',
         f'--cache_dir={os.path.join(tmp, "cache")}', f'--output_dir={out}',
         '--worker_without_namespace']  # Used only where netns.DISABLE_ENV=0 is set.
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, **env))
  if proc.returncode:
    sys.exit(f'{name} failed:\n{proc.stderr[-2000:]}')
  with open(os.path.join(out, 'metrics.csv')) as f:
    times = [float(r['round_time_s']) for r in csv.DictReader(f)]
  return statistics.median(times[1:] or times)


def main(argv):
  del argv
  if FLAGS.rounds < 2 or FLAGS.repeats < 1:
    raise app.UsageError('--rounds must be >= 2 (round 1 compiles) and --repeats >= 1.')
  if not netns.available()[0]:
    sys.exit(f'worker_bridge: no user namespaces here ({netns.available()[1]}): nothing to measure')
  tff_context.install()
  size = _resnet20_size()
  transfer, small, bridge_cpu = _transfers(size)
  (ns, ns_min), (lo, lo_min) = transfer['namespace + bridge'], transfer['loopback TCP']
  mb = size * 4 * FLAGS.clients * 2 / 1e6
  print(f'transfer: ResNet20 weights ({size} float32) to and from {FLAGS.clients} clients, '
        f'{mb:.1f} MB a call, {FLAGS.repeats} calls each:')
  for what, a, b in (('median', ns, lo), ('minimum', ns_min, lo_min)):
    print(f'  {what:8} namespace + bridge {a * 1000:8.1f} ms   loopback TCP {b * 1000:8.1f} ms   '
          f'difference {(a - b) * 1000:+7.1f} ms   ratio {a / b:.3f}')
  print(f'  the bridge process\'s CPU time per transfer call: {bridge_cpu * 1000:.1f} ms')
  print(f'small call (3 clients, int32; the latency of a few gRPC round trips), {FLAGS.repeats} '
        'calls each:')
  (a_med, a_min), (b_med, b_min) = small['namespace + bridge'], small['loopback TCP']
  for what, a, b in (('median', a_med, b_med), ('minimum', a_min, b_min)):
    print(f'  {what:8} namespace + bridge {a * 1000:8.1f} ms   loopback TCP {b * 1000:8.1f} ms   '
          f'difference {(a - b) * 1000:+7.1f} ms   ratio {a / b:.3f}')
  rounds = {}
  if FLAGS.round_repeats:
    with tempfile.TemporaryDirectory() as tmp:
      _round_time(tmp, 'warm-up', {}, rounds=1)  # Builds the client shards, outside the timings.
      for i in range(FLAGS.round_repeats):
        for name, env in (('namespace + bridge', {}),
                          ('loopback TCP', {netns.DISABLE_ENV: '0'})):
          rounds.setdefault(name, []).append(_round_time(tmp, f'{i}-{name[:4]}', env))
    r_ns = statistics.median(rounds['namespace + bridge'])
    r_lo = statistics.median(rounds['loopback TCP'])
    print(f'{FLAGS.setting} round under --runtime=tff, median of rounds 2-{FLAGS.rounds} over '
          f'{FLAGS.round_repeats} runs each:')
    print(f'  namespace + bridge {r_ns:8.3f} s    loopback TCP {r_lo:8.3f} s    '
          f'difference {(r_ns - r_lo) * 1000:+7.1f} ms   ratio {r_ns / r_lo:.3f}')
    print(f'  runs: {rounds}')
    print(f'round difference as a share of the loopback round: {(r_ns - r_lo) / r_lo:+.2%}; '
          f'transfer difference as a share of it: {(ns - lo) / r_lo:+.2%}')
  if FLAGS.resnet20_round_s > 0:
    print(f'transfer difference as a share of a {FLAGS.resnet20_round_s:.0f} s ResNet20 round: '
          f'{(ns - lo) / FLAGS.resnet20_round_s:+.3%}')


if __name__ == '__main__':
  app.run(main)
