r"""Orchestration cost of TFF's runtime: one FedAvg round under --runtime=tff (the
IterativeProcess in TFF's C++ worker) against --runtime=tf (the in-process runtime calling the
very same algorithm functions and the same client-data pipeline, clients one after another), on
the same clients, data, seed and initial model; rounds alternate between the two within one
process. Reported: the first round of each (tracing, plus for TFF starting the worker's
computation) separately, then TFF / TF per repeat as min / median / max.

  .venv/bin/python -m bench.speed.orchestration              # CIFAR-10, small_cnn, 10 clients
  .venv/bin/python -m bench.speed.orchestration --max_concurrent_computation_calls=1

By default TFF's worker runs its clients as TFF chooses (max_concurrent_computation_calls=-1, as
bin/train), so on several cores it may run clients concurrently while the tf runtime runs them
one after another. When TensorFlow sees a GPU, the device placement of one tf-runtime client round
is logged to stderr (tf.debugging.set_log_device_placement); TFF 0.87's worker is CPU-only.
Writes bench/results/orchestration_<task>.json. No worker_binary process is left behind: the
TFF context (tff_decorr.worker.tff_context) stops its worker at exit, and the script checks that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from bench import _common  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', _common.DEFAULT_DATA_DIR, 'TFDS data dir holding cifar10.')
flags.DEFINE_enum('task', 'cifar10', ['cifar10', 'digits'], 'cifar10 (real data) or digits '
                  '(embedded, small: orchestration-dominated rounds).')
flags.DEFINE_string('model', 'small_cnn', 'Model.')
flags.DEFINE_integer('repeats', 6, 'Timed rounds per runtime after the tracing round.')
flags.DEFINE_integer('num_clients', 10, 'Clients (all sampled every round).')
flags.DEFINE_integer('local_epochs', 1, 'Local epochs.')
flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                     'TFF worker concurrency (-1: TFF decides, as bin/train).')
flags.DEFINE_string('child_pid_file', '', 'Internal: run the benchmark in this process and write '
                    'the PIDs of its worker_binary children to this file.')


def config(runtime: str):
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.make(
      task=FLAGS.task, data_dir=os.path.abspath(FLAGS.data_dir) if FLAGS.task != 'digits' else '',
      model=FLAGS.model, algorithm='fedavg', regularizer='none', local_epochs=FLAGS.local_epochs,
      batch_size=64, client_lr=0.01, momentum=0.9, weight_decay=1e-5, partition='dirichlet',
      dirichlet_alpha=0.5, num_clients=FLAGS.num_clients, clients_per_round=FLAGS.num_clients, seed=0,
      runtime=runtime, max_concurrent_computation_calls=FLAGS.max_concurrent_computation_calls,
      cache_dir=_common.cache_dir())


def log_device_placement(runner) -> str:
  """One tf-runtime round of one client with device placement logged (GPU machines only)."""
  gpus = tf.config.list_physical_devices('GPU')
  if not gpus:
    return 'no GPU visible to TensorFlow: device placement not logged'
  ids, inputs = runner.inputs()
  tf.debugging.set_log_device_placement(True)
  try:
    runner.runtime.run_round(runner.state, inputs[:1], [runner.client_states[ids[0]]])
  finally:
    tf.debugging.set_log_device_placement(False)
  return f'{len(gpus)} GPU(s): placement of one client round logged to stderr'


def child():
  from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
  round_loop.set_gpu_memory_growth()
  machine = _common.machine()
  # The TFF runner first: TFF traces Keras models inside a graph, which invalidates Keras models
  # created earlier outside it (Keras 2.14); models created afterwards are unaffected.
  runners = {'tff': _common.Runner(config('tff')), 'tf': _common.Runner(config('tf'))}
  placement = log_device_placement(runners['tf'])
  first, wall, cpu = _common.alternate(runners, FLAGS.repeats)
  summary = _common.summarize(wall, 'tf')
  cpu_summary = _common.summarize(cpu, 'tf')
  c = runners['tf'].exp.config
  examples = sum(len(p) for p in runners['tf'].exp.partition)
  import psutil  # pylint: disable=g-import-not-at-top
  workers = [p.pid for p in psutil.Process().children(recursive=True)
             if p.pid in _common.worker_pids()]
  with open(FLAGS.child_pid_file, 'w') as f:
    f.write(' '.join(map(str, workers)))
  report = {'bench': 'orchestration', 'task': c.task, 'model': c.model,
            'num_clients': c.num_clients, 'local_epochs': c.local_epochs,
            'train_examples': examples,
            'max_concurrent_computation_calls': c.max_concurrent_computation_calls,
            'repeats': FLAGS.repeats, 'device_placement': placement, 'machine': machine,
            'first_round_s': first, 'results': summary,
            'results_cpu': cpu_summary}
  suffix = '' if FLAGS.max_concurrent_computation_calls == -1 else (
      f'_conc{FLAGS.max_concurrent_computation_calls}')
  _common.report(f'orchestration_{c.task}{suffix}', report,
                 f'orchestration ({c.task}, {c.model}, {c.num_clients} clients x {examples} '
                 f'examples in all, {c.local_epochs} local epoch(s), FedAvg, TFF concurrency '
                 f'{c.max_concurrent_computation_calls}); {FLAGS.repeats} timed rounds each, '
                 'alternating', 'tf', extra=placement + '\n')

def main(argv):
  del argv  # absl passes only positional arguments; the child gets this run's flags from sys.argv.
  if FLAGS.repeats < 1:
    raise ValueError(f'--repeats: must be >= 1, got {FLAGS.repeats}.')
  if FLAGS.child_pid_file:
    child()
    return
  # The benchmark runs in a child process so that this one can check afterwards that the child's
  # TFF worker_binary processes are gone (workers of other processes are not ours to judge).
  with tempfile.NamedTemporaryFile('r', suffix='.pids') as f:
    proc = subprocess.run([sys.executable, '-m', 'bench.speed.orchestration',
                           f'--child_pid_file={f.name}', *sys.argv[1:]], cwd=_common.ROOT,
                          check=False)
    started = {int(p) for p in f.read().split()}
  left = started & _common.worker_pids()
  print(f'worker_binary processes of the benchmark: {sorted(started) or "none"}; still running '
        f'after it exited: {sorted(left) or "none"}')
  if proc.returncode:
    sys.exit(proc.returncode)
  if left:
    sys.exit('worker_binary left behind: ' + ', '.join(map(str, sorted(left))))


if __name__ == '__main__':
  app.run(main)
