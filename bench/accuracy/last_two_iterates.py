r"""Test accuracy of a finished run's last iterate and of the average of its last two iterates.

FedExP's paper (Jhunjhunwala et al. 2023) reports the average of the last two global models,
(x_T + x_{T-1}) / 2, because FedExP's iterates oscillate; the reference evaluates the last one.
Training does not depend on what is evaluated, so a run that kept its last two checkpoints (every
run keeps two: tff_decorr.run_files.run_directory.checkpoint_manager) answers both without training
again.
This reads them and evaluates, on the run's test split as bin/train does, the last iterate, the one
before, their average over every variable (BN statistics included) and their average over the
trainable variables with the last iterate's BN statistics (as the FedExP authors' code averages its
parameters; tff_decorr's FedExP default, `--fedexp_evaluate=average_last_two`). The last iterate's
accuracy must equal the run's own summary.json for a run that evaluated the last iterate (printed
beside it: the check that the checkpoint was read right).

  .venv/bin/python -m bench.accuracy.last_two_iterates \
      --runs='/tmp/tff_decorr_server_defaults_fidelity/r10/*/s*'

Writes bench/results/last_two_iterates.json (one entry a run directory, merged; the commands that
wrote it) and prints a table by cell (the run directory's parent: one algorithm and form).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import statistics
import time

from absl import app
from absl import flags

import numpy as np
import tensorflow as tf  # pylint: disable=unused-import  (before absl.app.run)

from bench import _common

FLAGS = flags.FLAGS
flags.DEFINE_string('runs', '/tmp/tff_decorr_server_defaults_fidelity/r10/*/s*',
                    'Glob of finished run directories (each with summary.json and checkpoints).')
flags.DEFINE_string('output', os.path.join(_common.ROOT, 'bench', 'results',
                                           'last_two_iterates.json'), 'Results JSON.')


def global_models(run_dir: str):
  """(config, algorithm, experiment, [x_{T-1}, x_T]) of a finished run: the global weights at its
  two newest checkpoints, which must be consecutive rounds ending at the run's last."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import experiment  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import run_directory  # pylint: disable=g-import-not-at-top
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = config_lib.from_dict(json.load(f))
  exp = experiment.Experiment(config, log=lambda s: None)
  alg = exp.algorithm
  structure = run_directory.checkpoint_structure(
      alg.initial_server_state(alg.initial_weights()))
  manager = run_directory.checkpoint_manager(run_dir)
  versions = sorted(asyncio.run(manager.get_versions()) or [])
  if versions[-2:] != [config.rounds - 1, config.rounds]:
    raise ValueError(f'{run_dir}: checkpoints {versions}, not rounds {config.rounds - 1} and '
                     f'{config.rounds} (an unfinished run?)')
  weights = []
  for v in versions[-2:]:
    state = asyncio.run(manager.load(v, structure))['server_state']
    # A FedExP run that evaluated the average keeps x_{t-1} beside x_t: take the iterate itself.
    iterate = state['weights'] if 'previous_weights' in state else alg.global_weights(state)
    weights.append([np.asarray(w) for w in iterate])
  return config, alg, exp, weights


def measure(run_dir: str) -> dict:
  config, alg, exp, (previous, last) = global_models(run_dir)
  if alg.personalized:
    raise ValueError(f'{run_dir}: {config.algorithm} is evaluated per client, not as one model')
  average = [(a.astype(np.float64) + b.astype(np.float64)) / 2 for a, b in zip(previous, last)]
  average = [a.astype(b.dtype) for a, b in zip(average, last)]
  # The FedExP authors' code averages the parameters only (PyTorch's parameters(): the trainable
  # variables); the BN statistics are then the last iterate's.
  trainable_only = [a if t else b for a, b, t in zip(average, last, alg.spec.trainable)]
  evaluator = exp.evaluator()
  test = exp.test_dataset()
  acc = lambda w: float(evaluator.evaluate(w, test)['test_accuracy'])
  with open(os.path.join(run_dir, 'summary.json')) as f:
    summary = json.load(f)
  return {'algorithm': config.algorithm, 'seed': config.seed, 'rounds': config.rounds,
          'hparams': config.component_hparams('algorithm').to_dict(),
          'summary_final': float(summary['final_test_accuracy']),
          'last': acc(last), 'average_last_two': acc(average), 'previous': acc(previous),
          'average_last_two_trainable': acc(trainable_only)}


def main(argv):
  del argv
  runs = sorted(d for d in glob.glob(FLAGS.runs) if os.path.exists(os.path.join(d, 'summary.json')))
  if not runs:
    raise app.UsageError(f'--runs={FLAGS.runs}: no finished run directory (with summary.json).')
  results, commands = {}, []
  if os.path.exists(FLAGS.output):
    with open(FLAGS.output) as f:
      saved = json.load(f)
    results, commands = saved.get('runs', {}), saved.get('commands', [])
  command = 'python -m bench.accuracy.last_two_iterates --runs=' + FLAGS.runs
  commands = commands + [command] if command not in commands else commands
  t0 = time.time()
  for n, run_dir in enumerate(runs, 1):
    r = results[run_dir] = measure(run_dir)
    print(f'[{n}/{len(runs)}] {run_dir}: last {r["last"]:.4f} (summary {r["summary_final"]:.4f}), '
          f'previous {r["previous"]:.4f}, average of the two {r["average_last_two"]:.4f} '
          f'(trainable variables only {r["average_last_two_trainable"]:.4f})  '
          f'({time.time() - t0:.0f}s)', flush=True)
    os.makedirs(os.path.dirname(FLAGS.output), exist_ok=True)
    with open(FLAGS.output, 'w') as f:
      json.dump({'commands': commands, 'machine': _common.machine(),
                 'date': time.strftime('%Y-%m-%d'), 'runs': results}, f, indent=1, sort_keys=True)
  cells = {}
  for run_dir in runs:
    cells.setdefault(os.path.dirname(run_dir), []).append(results[run_dir])
  print('| cell | seeds | last iterate (%) | average of the last two (%) | the same, trainable '
        'variables only (%) |')
  print('| --- | --- | --- | --- | --- |')
  for cell, rs in cells.items():
    fmt = lambda k: (f'{100 * statistics.mean(r[k] for r in rs):.2f} ± '
                     f'{100 * (statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0):.2f}')
    print(f'| {os.path.basename(cell)} | {",".join(str(r["seed"]) for r in rs)} | '
          f'{fmt("last")} | {fmt("average_last_two")} | {fmt("average_last_two_trainable")} |')


if __name__ == '__main__':
  app.run(main)
