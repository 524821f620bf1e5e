r"""Round-time benchmarks (docs/benchmarks.md), each measured within one invocation:

  overhead       FedAvg vs FedAvg+FedDecorr vs FedProx vs MOON vs FedAvg+FedUV, rounds alternating,
                 ratios to FedAvg (min/median/max over repeats; the tracing round excluded).
  orchestration  the same FedAvg round under --runtime=tff (TFF's C++ runtime) and --runtime=tf
                 (the same functions in-process), alternating; first (tracing) rounds separately.

  .venv/bin/python -m bench.rounds --bench=overhead --data_dir=../shared/data/tfds
  .venv/bin/python -m bench.rounds --bench=orchestration --data_dir=../shared/data/tfds

--scale=paper uses the paper's setting (MobileNetV2, 10 local epochs, the full CIFAR-10 train split
in --data_dir), which is meant for a GPU machine with --runtime=tf.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

FLAGS = flags.FLAGS
flags.DEFINE_enum('bench', 'overhead', ['overhead', 'orchestration'], 'Which benchmark.')
flags.DEFINE_string('data_dir', os.path.join('..', 'shared', 'data', 'tfds'), 'TFDS data dir.')
flags.DEFINE_enum('scale', 'cpu', ['cpu', 'paper'], 'cpu: small_cnn, 1 local epoch; paper: '
                  'MobileNetV2, 10 local epochs (GPU).')
flags.DEFINE_integer('repeats', 5, 'Timed rounds per variant (after one untimed tracing round).')
flags.DEFINE_enum('runtime', 'tf', ['tf', 'tff'], 'Runtime for --bench=overhead.')
flags.DEFINE_integer('num_clients', 10, 'Clients (all sampled).')

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**kw):
  from tff_decorr import experiment  # pylint: disable=g-import-not-at-top
  paper = FLAGS.scale == 'paper'
  base = dict(task='cifar10', data_dir=os.path.abspath(FLAGS.data_dir),
              model='mobilenet_v2_cifar' if paper else 'small_cnn',
              local_epochs=10 if paper else 1, batch_size=64, client_lr=0.01, momentum=0.9,
              weight_decay=1e-5, alpha=0.5, num_clients=FLAGS.num_clients,
              clients_per_round=FLAGS.num_clients, seed=0,
              cache_dir=os.path.join(tempfile.gettempdir(), 'tff_decorr_bench_cache'))
  base.update(kw)
  return experiment.Config(**base)


class _Runner:
  """One variant: its runtime, state and inputs; `step()` runs and times one round."""

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

  def step(self) -> float:
    self.round += 1
    c = self.exp.config
    ids = self._program.sample_clients(c.num_clients, c.clients_per_round, c.seed, self.round)
    inputs = [(str(i), self._program.client_seed(c.seed, self.round, i)) for i in ids]
    states = [self.client_states[i] for i in ids]
    t0 = time.perf_counter()
    self.state, new_states, _ = self.runtime.run_round(self.state, inputs, states)
    elapsed = time.perf_counter() - t0
    for i, s in zip(ids, new_states):
      self.client_states[i] = s
    return elapsed


def _alternate(runners: dict, repeats: int):
  first = {name: r.step() for name, r in runners.items()}
  times = {name: [] for name in runners}
  for _ in range(repeats):
    for name, r in runners.items():
      times[name].append(r.step())
  return first, times


def _summary(times, baseline):
  out = {}
  for name, ts in times.items():
    ratios = [t / b for t, b in zip(ts, times[baseline])]
    out[name] = {'median_s': statistics.median(ts), 'min_s': min(ts), 'max_s': max(ts),
                 'ratio_min': min(ratios), 'ratio_median': statistics.median(ratios),
                 'ratio_max': max(ratios), 'times_s': ts}
  return out


def _machine():
  model = ''
  try:
    with open('/proc/cpuinfo') as f:
      model = next(l.split(':', 1)[1].strip() for l in f if l.startswith('model name'))
  except (OSError, StopIteration):
    pass
  return {'cpus': os.cpu_count(), 'cpu_model': model, 'python': platform.python_version(),
          'gpus': [d.name for d in tf.config.list_physical_devices('GPU')],
          'load_avg_start': os.getloadavg()}


def main(argv):
  del argv
  from tff_decorr import program  # pylint: disable=g-import-not-at-top
  program.set_gpu_memory_growth()
  machine = _machine()
  if FLAGS.bench == 'overhead':
    variants = {
        'fedavg': _config(algorithm='fedavg', regularizer='none', runtime=FLAGS.runtime),
        'fedavg+feddecorr': _config(algorithm='fedavg', regularizer='feddecorr', beta=0.1,
                                    runtime=FLAGS.runtime),
        'fedprox': _config(algorithm='fedprox', regularizer='none', mu=1e-3,
                           runtime=FLAGS.runtime),
        'moon': _config(algorithm='moon', regularizer='none', mu=1.0, temperature=0.5,
                        runtime=FLAGS.runtime),
        'fedavg+feduv': _config(algorithm='fedavg', regularizer='feduv', runtime=FLAGS.runtime),
    }
    baseline = 'fedavg'
  else:
    # The TFF runner first: TFF traces Keras models inside a graph, which invalidates Keras models
    # created earlier outside it (Keras 2.14); models created afterwards are unaffected.
    variants = {'tff': _config(algorithm='fedavg', regularizer='none', runtime='tff'),
                'tf': _config(algorithm='fedavg', regularizer='none', runtime='tf')}
    baseline = 'tf'
  runners = {name: _Runner(c) for name, c in variants.items()}
  first, times = _alternate(runners, FLAGS.repeats)
  machine['load_avg_end'] = os.getloadavg()
  summary = _summary(times, baseline)
  report = {'bench': FLAGS.bench, 'scale': FLAGS.scale, 'runtime': FLAGS.runtime,
            'repeats': FLAGS.repeats, 'num_clients': FLAGS.num_clients,
            'model': variants[baseline].model, 'local_epochs': variants[baseline].local_epochs,
            'machine': machine, 'first_round_s': first, 'results': summary}
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', f'{FLAGS.bench}_{FLAGS.scale}.json')
  with open(path, 'w') as f:
    json.dump(report, f, indent=2)
  print(f'\n{FLAGS.bench} ({FLAGS.scale} scale: {variants[baseline].model}, '
        f'{variants[baseline].local_epochs} local epoch(s), {FLAGS.num_clients} clients, '
        f'cifar10 from {FLAGS.data_dir}); {FLAGS.repeats} timed rounds each, alternating')
  print(f'| variant | first round s | median s/round | ratio to {baseline} min / median / max |')
  print('| --- | --- | --- | --- |')
  for name, s in summary.items():
    print(f'| {name} | {first[name]:.2f} | {s["median_s"]:.2f} | {s["ratio_min"]:.3f} / '
          f'{s["ratio_median"]:.3f} / {s["ratio_max"]:.3f} |')
  print(f'load average start {machine["load_avg_start"][0]:.2f}, end '
        f'{machine["load_avg_end"][0]:.2f}; wrote {path}')


if __name__ == '__main__':
  app.run(main)
