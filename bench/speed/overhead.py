r"""Time per round of FedAvg, FedAvg + FedDecorr, FedProx, MOON and FedAvg + FedUV: the same task,
model, partition, seed and sampled clients, rounds alternating between the variants within one
process; each variant's round time divided by FedAvg's round of the same repeat, reported as
min / median / max over the repeats. The first round of each variant (tf.function tracing) is
reported separately and excluded from the ratios.

  .venv/bin/python -m bench.speed.overhead                    # CPU scale, --runtime=tf
  .venv/bin/python -m bench.speed.overhead --runtime=tff      # the same under TFF's C++ runtime
  .venv/bin/python -m bench.speed.overhead --variants=fedavg+feddecorr,fedprox --repeats=15 \
      --output_name=overhead_cpu_tf_long                       # fewer variants, more repeats
  .venv/bin/python -m bench.speed.overhead --scale=paper --data_dir=DIR  # GPU: the paper's setting

CPU scale (default): CIFAR-10 from --data_dir (here the 10,000-image train split), small_cnn
(64-d representation), 10 clients all sampled, Dirichlet alpha=0.5, 1 local epoch, batch 64.
Paper scale: MobileNetV2 (1280-d), 10 local epochs, the full train split in --data_dir; the paper
reports, per round on a V100: FedDecorr 1.03x, FedProx 1.81x, MOON 1.82x FedAvg.
Hyper-parameters as the paper: beta=0.1, FedProx mu=1e-3, MOON mu=1, temperature 0.5 with a
256-d projection head (docs/reference.md §4), lr 0.01, momentum 0.9, weight decay 1e-5.
Writes bench/results/overhead_<scale>_<runtime>.json.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# TensorFlow at import time, before absl runs main: imported inside main, Keras functional models
# fail to build ("'SymbolicTensor' object has no attribute 'node'", Keras 2.14).
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', _common.DEFAULT_DATA_DIR, 'TFDS data dir holding cifar10.')
flags.DEFINE_enum('scale', 'cpu', ['cpu', 'paper'],
                  'cpu: small_cnn, 1 local epoch; paper: MobileNetV2, 10 local epochs (GPU).')
flags.DEFINE_enum('runtime', 'tf', ['tf', 'tff'], 'Runtime of every variant.')
flags.DEFINE_integer('repeats', 6, 'Timed rounds per variant after the untimed tracing round.')
flags.DEFINE_integer('num_clients', 10, 'Clients (all sampled every round).')
flags.DEFINE_list('variants', ['fedavg', 'fedavg+feddecorr', 'fedprox', 'moon', 'fedavg+feduv'],
                  'Variants to time (fedavg, the baseline, is always included).')
flags.DEFINE_string('output_name', '', 'Name of the JSON in bench/results (default '
                    'overhead_<scale>_<runtime>).')

VARIANTS = {
    'fedavg': dict(algorithm='fedavg', regularizer='none'),
    'fedavg+feddecorr': dict(algorithm='fedavg', regularizer='feddecorr', feddecorr_beta=0.1),
    'fedprox': dict(algorithm='fedprox', regularizer='none', fedprox_mu=1e-3),
    'moon': dict(algorithm='moon', regularizer='none', moon_mu=1.0, moon_temperature=0.5,
                 projection_dim=256),
    'fedavg+feduv': dict(algorithm='fedavg', regularizer='feduv'),
}


def config(**kw):
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  paper = FLAGS.scale == 'paper'
  base = dict(task='cifar10', data_dir=os.path.abspath(FLAGS.data_dir),
              model='mobilenet_v2_cifar' if paper else 'small_cnn',
              local_epochs=10 if paper else 1, batch_size=64, client_lr=0.01, momentum=0.9,
              weight_decay=1e-5, partition='dirichlet', dirichlet_alpha=0.5,
              num_clients=FLAGS.num_clients,
              clients_per_round=FLAGS.num_clients, seed=0, runtime=FLAGS.runtime,
              cache_dir=_common.cache_dir())
  base.update(kw)
  return config_lib.make(**base)


def main(argv):
  del argv
  _common.check_flags(FLAGS.variants, VARIANTS, FLAGS.repeats)
  from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
  round_loop.set_gpu_memory_growth()
  machine = _common.machine()
  names = ['fedavg'] + [v for v in FLAGS.variants if v != 'fedavg']
  workers_before = _common.worker_pids()
  runners = {n: _common.Runner(config(**VARIANTS[n])) for n in names}
  first, wall, cpu = _common.alternate(runners, FLAGS.repeats)
  summary = _common.summarize(wall, 'fedavg')
  cpu_summary = _common.summarize(cpu, 'fedavg')
  c = runners['fedavg'].exp.config
  examples = sum(len(p) for p in runners['fedavg'].exp.partition)
  report = {'bench': 'overhead', 'scale': FLAGS.scale, 'runtime': FLAGS.runtime,
            'repeats': FLAGS.repeats, 'num_clients': c.num_clients, 'model': c.model,
            'local_epochs': c.local_epochs, 'alpha': c.hparams['dirichlet'].alpha,
            'train_examples': examples,
            'variants': {n: VARIANTS[n] for n in names}, 'machine': machine,
            'first_round_s': first, 'results': summary,
            'results_cpu': cpu_summary}
  del runners
  _common.report(FLAGS.output_name or f'overhead_{FLAGS.scale}_{FLAGS.runtime}', report,
                 f'overhead ({FLAGS.scale} scale, --runtime={FLAGS.runtime}: {c.model}, '
                 f'{c.local_epochs} local epoch(s), {c.num_clients} clients x {examples} examples '
                 f'in all, cifar10); {FLAGS.repeats} timed rounds each, alternating', 'fedavg')
  if FLAGS.runtime == 'tff':
    print(f'worker_binary processes before {sorted(workers_before)}; this process stops its own '
          'at exit (tff_context)')


if __name__ == '__main__':
  app.run(main)
