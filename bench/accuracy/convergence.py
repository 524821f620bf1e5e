r"""Convergence sanity check: every algorithm, with and without FedDecorr, on the digits task.

The first table a reviewer should look at: if a baseline diverges or ends far below FedAvg at the
same settings, every "with and without FedDecorr" comparison built on it is wrong. Settings are
those of the issue that found the SCAFFOLD/FedAvgM divergence: 10 clients, Dirichlet alpha in
{0.1, 0.5}, 12 rounds of 2 local epochs, client momentum 0.9 (the paper's), 3 seeds, the in-process
TF runtime. Each run is built in this process (no subprocess per run) with the same Experiment
pieces bin/train uses, and evaluated as bin/train does (FedBN: each client's own model).

  .venv/bin/python -m bench.accuracy.convergence            # full grid, about 40 minutes on 2 cores
  .venv/bin/python -m bench.accuracy.convergence --algorithms=scaffold,fedavg --seeds=1 --alphas=0.1

Writes bench/results/convergence_digits.json after every run (an interrupted benchmark resumes and
skips the runs already in it) and prints a Markdown table: final test accuracy mean ± std over
seeds, and how many runs ended with a non-finite training loss.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags

import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import  (before absl.app.run)

from bench import _common

FLAGS = flags.FLAGS
flags.DEFINE_list('algorithms', ['fedavg', 'fedprox', 'fedavgm', 'fedbn', 'moon', 'scaffold',
                                 'fednova'], 'Algorithms to run.')
flags.DEFINE_list('alphas', ['0.1', '0.5'], 'Dirichlet concentrations.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_list('regularizers', ['none', 'feddecorr'], 'Regularisers.')
flags.DEFINE_integer('rounds', 12, 'Rounds per run.')
flags.DEFINE_integer('local_epochs', 2, 'Local epochs per round.')
flags.DEFINE_string('output', os.path.join(_common.ROOT, 'bench', 'results',
                                           'convergence_digits.json'), 'Results JSON.')


def run_one(algorithm: str, alpha: float, seed: int, regularizer: str) -> dict:
  """Trains one configuration for --rounds; returns final accuracy and the loss trajectory."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import personalized  # pylint: disable=g-import-not-at-top
  config = config_lib.make(
      task='digits', algorithm=algorithm, regularizer=regularizer, dirichlet_alpha=alpha, seed=seed,
      rounds=FLAGS.rounds, local_epochs=FLAGS.local_epochs, runtime='tf', num_clients=10,
      clients_per_round=10, batch_size=32, client_lr=0.01, momentum=0.9, weight_decay=1e-5,
      **({'feddecorr_beta': 0.1} if regularizer == 'feddecorr' else {}),
      cache_dir=os.path.join(tempfile.gettempdir(), 'tff_decorr_convergence_cache'))
  runner = _common.Runner(config)
  alg = runner.exp.algorithm
  losses = []
  for _ in range(config.rounds):
    ids, inputs = runner.inputs()
    runner.round += 1
    runner.state, new_states, metrics = runner.runtime.run_round(
        runner.state, inputs, [runner.client_states[i] for i in ids])
    for i, s in zip(ids, new_states):
      runner.client_states[i] = s
    losses.append(float(metrics['loss_sum']) / max(float(metrics['examples']), 1.0))
  evaluator = runner.exp.evaluator()
  if alg.personalized:
    test = personalized.evaluate_clients(
        alg, runner.state, lambda cid: runner.client_states[int(cid)], config.num_clients,
        evaluator, personalized.client_test_datasets(runner.exp.task, None))
  else:
    test = evaluator.evaluate(alg.global_weights(runner.state), runner.exp.test_dataset())
  return {'final_test_accuracy': float(test['test_accuracy']), 'train_loss': losses,
          'finite': all(math.isfinite(l) for l in losses)}


def _key(algorithm, alpha, regularizer, seed):
  return f'{algorithm}|alpha={alpha}|{regularizer}|seed={seed}'


def main(argv):
  del argv
  results = {}
  if os.path.exists(FLAGS.output):
    with open(FLAGS.output) as f:
      saved = json.load(f)
    if saved.get('rounds') == FLAGS.rounds and saved.get('local_epochs') == FLAGS.local_epochs:
      results = saved['runs']
  t0 = time.time()
  grid = [(a, float(al), r, int(s)) for a in FLAGS.algorithms for al in FLAGS.alphas
          for r in FLAGS.regularizers for s in FLAGS.seeds]
  for n, (algorithm, alpha, reg, seed) in enumerate(grid, 1):
    key = _key(algorithm, alpha, reg, seed)
    if key in results:
      continue
    t = time.time()
    results[key] = run_one(algorithm, alpha, seed, reg)
    results[key]['seconds'] = time.time() - t
    print(f'[{n}/{len(grid)}] {key}: final test accuracy '
          f'{results[key]["final_test_accuracy"]:.4f}  last train loss '
          f'{results[key]["train_loss"][-1]:.4f}  ({results[key]["seconds"]:.0f}s, '
          f'{time.time() - t0:.0f}s elapsed)', flush=True)
    os.makedirs(os.path.dirname(FLAGS.output), exist_ok=True)
    with open(FLAGS.output, 'w') as f:
      json.dump({'task': 'digits', 'rounds': FLAGS.rounds, 'local_epochs': FLAGS.local_epochs,
                 'machine': _common.machine(),
                 'load_avg': os.getloadavg(), 'runs': results}, f, indent=1)
  header = '| algorithm | ' + ' | '.join(f'alpha {al}, {r}' for al in FLAGS.alphas
                                         for r in FLAGS.regularizers) + ' |'
  print(header)
  print('|' + ' --- |' * (1 + len(FLAGS.alphas) * len(FLAGS.regularizers)))
  for algorithm in FLAGS.algorithms:
    cells = []
    for al in FLAGS.alphas:
      for r in FLAGS.regularizers:
        runs = [results[_key(algorithm, float(al), r, int(s))] for s in FLAGS.seeds]
        accs = [x['final_test_accuracy'] for x in runs]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        bad = sum(not x['finite'] for x in runs)
        cells.append(f'{statistics.mean(accs):.3f} ± {std:.3f}' + (f' ({bad} NaN)' if bad else ''))
    print(f'| {algorithm} | ' + ' | '.join(cells) + ' |')
  print(f'wrote {FLAGS.output}')


if __name__ == '__main__':
  app.run(main)
