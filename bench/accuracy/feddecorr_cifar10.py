r"""Reduced-scale accuracy on real CIFAR-10: FedAvg vs FedAvg + FedDecorr over alphas and seeds.

Each run is `tff_decorr.program.training.train` (what bin/train runs) with the in-process runtime;
its summary.json gives the final test accuracy on the full 10,000-image test split. Prints mean and
std per (alpha, method) and writes bench/results/accuracy_<scale>.json. Runs already finished are
reused (bin/train resumes), so an interrupted benchmark continues where it stopped.

  .venv/bin/python -m bench.accuracy.feddecorr_cifar10 --data_dir=../shared/data/tfds  # CPU scale
  .venv/bin/python -m bench.accuracy.feddecorr_cifar10 --data_dir=/data/tfds --scale=paper
      # GPU, the paper's Table 1 rows
"""

from __future__ import annotations

import json
import os
import statistics
import time

from absl import app
from absl import flags

# TensorFlow must be imported before absl's app.run (Keras 2.14 otherwise builds functional models
# from graph tensors: "'SymbolicTensor' object has no attribute 'node'").
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top
from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
from tff_decorr.program import training  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
_ROOT = _common.ROOT

flags.DEFINE_string('data_dir', os.path.join(os.path.dirname(_ROOT), 'shared', 'data', 'tfds'),
                    'TFDS data dir holding cifar10.')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_accuracy', 'Where the runs go.')
flags.DEFINE_enum('scale', 'cpu', ['cpu', 'paper'], 'cpu: small_cnn, --rounds x --local_epochs; '
                  'paper: the task defaults (MobileNetV2, 100 rounds x 10 epochs).')
# 10 rounds of 1 epoch: twelve runs fit in about 30 minutes on 2 cores (one epoch over the 10,000
# images takes about 13 s with small_cnn on this machine, bench.speed.overhead).
flags.DEFINE_integer('rounds', 10, 'Rounds at --scale=cpu.')
flags.DEFINE_integer('local_epochs', 1, 'Local epochs at --scale=cpu.')
flags.DEFINE_list('alphas', ['0.05', '0.5'], 'Dirichlet alphas.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_float('beta', 0.1, 'FedDecorr coefficient.')


def main(argv):
  del argv
  if FLAGS.rounds < 1 or FLAGS.local_epochs < 1:
    raise app.UsageError(f'--rounds and --local_epochs must be >= 1, got {FLAGS.rounds} and '
                         f'{FLAGS.local_epochs}.')
  scale = (dict(model='small_cnn', rounds=FLAGS.rounds, local_epochs=FLAGS.local_epochs,
                eval_every=FLAGS.rounds) if FLAGS.scale == 'cpu' else {})
  # Settings in the path: bin/train refuses a different configuration in an existing run dir.
  setting = (f'cpu-r{FLAGS.rounds}-e{FLAGS.local_epochs}' if FLAGS.scale == 'cpu' else 'paper')
  results = {}
  t0 = time.time()
  for alpha in FLAGS.alphas:
    for reg in ('none', 'feddecorr'):
      accs = []
      for seed in FLAGS.seeds:
        out = os.path.join(FLAGS.output_dir, setting, f'a{alpha}-{reg}-s{seed}')
        config = config_lib.make(
            task='cifar10', data_dir=os.path.abspath(FLAGS.data_dir), runtime='tf',
            dirichlet_alpha=float(alpha), regularizer=reg, seed=int(seed), output_dir=out,
            cache_dir=os.path.join(FLAGS.output_dir, 'cache'), **scale,
            **({'feddecorr_beta': FLAGS.beta} if reg == 'feddecorr' else {}))
        training.train(config, log=lambda s: None)  # Resumes (or just reads) a finished run.
        with open(os.path.join(out, 'summary.json')) as f:
          acc = json.load(f)['final_test_accuracy']
        accs.append(acc)
        print(f'alpha={alpha} {reg} seed={seed}: final test accuracy {acc:.4f} '
              f'({time.time() - t0:.0f}s elapsed)', flush=True)
      results[f'alpha={alpha} {reg}'] = {
          'accuracies': accs, 'mean': statistics.mean(accs),
          'std': statistics.stdev(accs) if len(accs) > 1 else 0.0}
  report = {'scale': FLAGS.scale, 'settings': scale, 'seeds': FLAGS.seeds, 'beta': FLAGS.beta,
            'results': results, 'wall_time_s': time.time() - t0, 'load_avg_end': os.getloadavg()}
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', f'accuracy_{FLAGS.scale}.json')
  with open(path, 'w') as f:
    json.dump(report, f, indent=2)
  print('| alpha | FedAvg mean ± std | FedAvg + FedDecorr mean ± std |')
  print('| --- | --- | --- |')
  for alpha in FLAGS.alphas:
    a, b = results[f'alpha={alpha} none'], results[f'alpha={alpha} feddecorr']
    print(f'| {alpha} | {a["mean"]:.4f} ± {a["std"]:.4f} | {b["mean"]:.4f} ± {b["std"]:.4f} |')
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
