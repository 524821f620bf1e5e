r"""Dimensional-collapse evidence on real CIFAR-10 at a CPU-feasible scale (docs/analysis.md).

Trains FedAvg with and without FedDecorr under several Dirichlet alphas (bin/train, tf runtime),
exports client 0's local model of the last round, then runs bin/analyze over the global models and
the local-vs-global pair. Prints a table and writes bench/results/collapse_evidence.json.

  .venv/bin/python -m bench.accuracy.collapse_evidence --data_dir=../shared/data/tfds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from bench import _common

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', os.path.join('..', 'shared', 'data', 'tfds'), 'TFDS data dir.')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_collapse', 'Where the runs go.')
flags.DEFINE_string('model', 'small_cnn', 'Model.')
flags.DEFINE_integer('rounds', 10, 'Rounds.')
flags.DEFINE_integer('local_epochs', 2, 'Local epochs.')
flags.DEFINE_list('alphas', ['0.05', '0.5', 'inf'], 'Dirichlet alphas (FedAvg).')
flags.DEFINE_list('decorr_alphas', ['0.05'], 'Alphas also run with FedDecorr.')
flags.DEFINE_float('beta', 0.1, 'FedDecorr coefficient.')
flags.DEFINE_integer('seed', 0, 'Seed.')

_ROOT = _common.ROOT


def _run(module, *args):
  cmd = [sys.executable, '-m', module, *args]
  print('$', ' '.join(cmd), flush=True)
  proc = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f'{module} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}')
  return proc.stdout


def main(argv):
  del argv
  data_dir = os.path.abspath(FLAGS.data_dir)
  runs = [(a, 'none') for a in FLAGS.alphas] + [(a, 'feddecorr') for a in FLAGS.decorr_alphas]
  results = {}
  t0 = time.time()
  for alpha, reg in runs:
    label = f'alpha={alpha} {reg}'
    out = os.path.join(FLAGS.output_dir, f'a{alpha}-{reg}')
    _run('bin.train', '--task=cifar10', f'--data_dir={data_dir}', f'--model={FLAGS.model}',
         '--runtime=tf', f'--rounds={FLAGS.rounds}', f'--local_epochs={FLAGS.local_epochs}',
         f'--dirichlet_alpha={alpha}', f'--regularizer={reg}', f'--feddecorr_beta={FLAGS.beta}',
         f'--seed={FLAGS.seed}', f'--eval_every={FLAGS.rounds}', '--save_local_models=0',
         f'--save_local_rounds={FLAGS.rounds}', f'--output_dir={out}',
         f'--cache_dir={os.path.join(FLAGS.output_dir, "cache")}')
    with open(os.path.join(out, 'summary.json')) as f:
      results[label] = {'run': out, 'test_accuracy': json.load(f)['final_test_accuracy']}
  analysis_dir = os.path.join(FLAGS.output_dir, 'analysis')
  _run('bin.analyze', '--saved_model=' + ','.join(r['run'] for r in results.values()),
       '--labels=' + ','.join(results), '--task=cifar10', f'--data_dir={data_dir}',
       f'--output_dir={analysis_dir}')
  with open(os.path.join(analysis_dir, 'summary.json')) as f:
    summary = json.load(f)
  for label, item in summary['runs'].items():
    results[label].update({k: item[k] for k in ('effective_rank', 'num_significant_normalized',
                                                'num_significant_absolute')})
  gaps = {}
  for label, r in results.items():
    local = os.path.join(r['run'], 'local_models', f'round_{FLAGS.rounds}', 'client_0')
    if not os.path.isdir(local):
      continue
    gap_dir = os.path.join(FLAGS.output_dir, 'analysis_local', label.replace(' ', '_'))
    _run('bin.analyze', f'--saved_model={r["run"]}', '--task=cifar10', f'--data_dir={data_dir}',
         f'--local_saved_model={local}', f'--global_saved_model={r["run"]}',
         f'--output_dir={gap_dir}')
    with open(os.path.join(gap_dir, 'summary.json')) as f:
      gaps[label] = json.load(f).get('local_global', {})
  report = {'results': results, 'local_global': gaps, 'wall_time_s': time.time() - t0,
            'flags': {k: FLAGS[k].value for k in ('model', 'rounds', 'local_epochs', 'alphas',
                                                   'decorr_alphas', 'beta', 'seed')}}
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  with open(os.path.join(_ROOT, 'bench', 'results', 'collapse_evidence.json'), 'w') as f:
    json.dump(report, f, indent=2)
  print('\nrun                     test_acc  eff_rank  significant(normalized)  significant(abs)')
  for label, r in results.items():
    print(f'{label:<22} {r["test_accuracy"]:.4f}  {r["effective_rank"]:8.2f}  '
          f'{r["num_significant_normalized"]:>23}  {r["num_significant_absolute"]:>16}')
  for label, g in gaps.items():
    print(f'local-vs-global {label}: {g}')
  print(f'plots: {analysis_dir}/spectra.png, {FLAGS.output_dir}/analysis_local/*/'
        'local_vs_global.png')


if __name__ == '__main__':
  app.run(main)
