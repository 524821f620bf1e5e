r"""The combination matrix: every algorithm x every aggregator x both runtimes.

Each cell either TRAINS on the embedded default (digits, small_cnn, Dirichlet 0.5, client SGD at
momentum 0.9: the task's defaults) for --rounds and reports its final test accuracy, whether every
round's training loss was finite and its wall time; or is REFUSED with a ValueError before anything
is written: `config.make` (what bin/train's flags go through) refuses it, the training program
refuses the same combination when handed a Config that skipped validation, and the cell's output
directory does not exist afterwards. The one-line reason is recorded.

Every cell is the training program itself (`tff_decorr.program.training.train`, what bin/train
runs), in this process, one after the other (the TFF worker of a cell is stopped before the next
starts). What a cell needs follows from its algorithm's declared class attributes, never from a
list of names (`requires_decomposed`: --decomposed). DP runs with a fixed clip (--dp_clip=1.0) and
a small noise multiplier (--dp_noise_multiplier=0.01): the point is that the combination computes
the right thing, not privacy (DP with real noise does not train at 10 clients; docs/benchmarks.md
§9). FedBN's accuracy is its clients' own models (docs/algorithms.md, "What is evaluated").
Chance on digits is 0.1.

  .venv/bin/python -m bench.accuracy.matrix                     # the table in docs/benchmarks.md
  .venv/bin/python -m bench.accuracy.matrix --algorithms=fednova,scaffold --aggregators=mean,robust

Writes bench/results/<--output_name>.json after every cell (an interrupted run resumes and skips
the cells already in it, when the settings are the same) and prints a Markdown table: algorithms
as rows, aggregator/runtime as columns, the final test accuracy (mean over --seeds) or "refused";
then the refusals' reasons and the trained cells' wall times.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags

# TensorFlow before absl's app.run (Keras 2.14 otherwise builds functional models from graph
# tensors: "'SymbolicTensor' object has no attribute 'node'").
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

CHANCE = 0.1  # digits: 10 balanced classes.


def cell_settings(algorithm: str, aggregator: str, runtime: str, base: dict, dp: dict) -> dict:
  """The config.make keywords of one cell: `base` (the settings every cell shares) plus what the
  cell needs, read from the algorithm's declared attributes (requires_decomposed) and the
  aggregator (`dp`: DP's settings by flag name). Shared with tests/matrix_test.py."""
  from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
  settings = dict(base, algorithm=algorithm, aggregator=aggregator, runtime=runtime)
  if algorithms.algorithm_class(algorithm).requires_decomposed:
    settings['decomposed'] = True
  if aggregator == 'dp':
    settings.update(dp)
  return settings


def _flag_settings(algorithm: str, aggregator: str, runtime: str, seed: int) -> dict:
  """cell_settings at this invocation's flags."""
  base = dict(task='digits', regularizer=FLAGS.regularizer, momentum=FLAGS.momentum,
              rounds=FLAGS.rounds, num_clients=FLAGS.num_clients,
              clients_per_round=FLAGS.num_clients, seed=seed, eval_every=FLAGS.rounds,
              cache_dir=os.path.join(tempfile.gettempdir(), 'tff_decorr_matrix_cache'))
  if FLAGS.local_epochs:
    base['local_epochs'] = FLAGS.local_epochs
  return cell_settings(algorithm, aggregator, runtime, base,
                       dict(dp_clip=FLAGS.dp_clip, dp_noise_multiplier=FLAGS.dp_noise_multiplier))


def unvalidated(settings: dict):
  """The cell's Config as a hand-written config.json (or code building a Config directly) would
  give it, skipping `config.make`'s validation: the same combination resolved with the plain sum
  and the aggregator put back afterwards, with its settings."""
  from tff_decorr import aggregators  # pylint: disable=g-import-not-at-top
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  base = {k: v for k, v in settings.items() if not k.startswith(settings['aggregator'] + '_')}
  c = config_lib.make(**{**base, 'aggregator': 'mean', 'runtime': 'tff'})
  hparams = {k: v for k, v in c.hparams.items() if k != 'mean'}
  agg = settings['aggregator']
  given = {k[len(agg) + 1:]: v for k, v in settings.items() if k.startswith(agg + '_')}
  hparams[agg] = aggregators.hparams_class(agg).from_mapping(given)
  return dataclasses.replace(c, aggregator=agg, runtime=settings['runtime'], hparams=hparams)


def refused_by_program(settings: dict, out: str) -> str:
  """The training program's error for a Config that skipped validation ('' if it trained)."""
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import training  # pylint: disable=g-import-not-at-top
  c = dataclasses.replace(unvalidated(settings), output_dir=out)
  try:
    training.train(c, log=lambda s: None)
  except ValueError as e:
    return str(e)
  finally:
    tff_context.stop_all()
  return ''


def run_cell(algorithm: str, aggregator: str, runtime: str, seeds, root: str) -> dict:
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
  from tff_decorr.program import training  # pylint: disable=g-import-not-at-top
  out = os.path.join(root, f'{algorithm}-{aggregator}-{runtime}')
  try:
    config = config_lib.make(**_flag_settings(algorithm, aggregator, runtime, seeds[0]),
                             output_dir=out)
  except ValueError as e:
    reason = str(e)
    program_reason = refused_by_program(
        _flag_settings(algorithm, aggregator, runtime, seeds[0]), out)
    return {'status': 'refused', 'stage': 'config', 'reason': reason,
            'program_reason': program_reason, 'same_reason': program_reason == reason,
            'nothing_written': not os.path.exists(out)}
  runs = []
  for seed in seeds:
    config = config_lib.make(**_flag_settings(algorithm, aggregator, runtime, seed),
                             output_dir=f'{out}-seed{seed}')
    t0 = time.time()
    try:
      summary = training.train(config, log=lambda s: None)
    except ValueError as e:  # Refused when the pieces were built (process construction).
      return {'status': 'refused', 'stage': 'process', 'reason': str(e),
              'nothing_written': not os.path.exists(config.output_dir)}
    except round_loop.NonFiniteError as e:
      runs.append({'seed': seed, 'final_test_accuracy': None, 'finite': False, 'error': str(e),
                   'wall_s': time.time() - t0})
      continue
    finally:
      tff_context.stop_all()
    with open(os.path.join(config.output_dir, 'metrics.csv')) as f:
      losses = [float(r['train_loss']) for r in csv.DictReader(f)]
    runs.append({'seed': seed, 'final_test_accuracy': summary['final_test_accuracy'],
                 'evaluated_model': summary['evaluated_model'], 'train_loss': losses,
                 'finite': len(losses) == config.rounds and all(map(math.isfinite, losses)),
                 'wall_s': time.time() - t0})
    shutil.rmtree(config.output_dir, ignore_errors=True)
  accs = [r['final_test_accuracy'] for r in runs]
  ok = all(r['finite'] for r in runs)
  return {'status': 'trained', 'runs': runs, 'finite': ok,
          'final_test_accuracy': statistics.mean(accs) if ok else None,
          'above_chance': ok and all(a > CHANCE for a in accs),
          'wall_s': sum(r['wall_s'] for r in runs)}


def _key(algorithm, aggregator, runtime):
  return f'{algorithm}|{aggregator}|{runtime}'


def _cell_text(cell) -> str:
  if cell['status'] == 'refused':
    return 'refused'
  if not cell['finite']:
    return 'NON-FINITE'
  accs = [r['final_test_accuracy'] for r in cell['runs']]
  text = f'{cell["final_test_accuracy"]:.3f}'
  if len(accs) > 1:
    text += f' ({min(accs):.3f}-{max(accs):.3f})'
  return text


def print_tables(results, algs, aggs, runtimes) -> None:
  columns = [(a, r) for a in aggs for r in runtimes]
  print('| algorithm | ' + ' | '.join(f'{a} / {r}' for a, r in columns) + ' |')
  print('|' + ' --- |' * (1 + len(columns)))
  for alg in algs:
    print(f'| {alg} | ' + ' | '.join(_cell_text(results[_key(alg, a, r)]) for a, r in columns)
          + ' |')
  reasons = {}
  for key, cell in results.items():
    if cell['status'] == 'refused' and key.split('|')[0] in algs:
      reasons.setdefault(cell['reason'], []).append(key.replace('|', ' / '))
  print('\nRefusals (cells: reason):')
  for reason, keys in reasons.items():
    print(f'- {", ".join(keys)}: {reason}')
  print('\nWall time of trained cells (s, all seeds):')
  print('| algorithm | ' + ' | '.join(f'{a} / {r}' for a, r in columns) + ' |')
  print('|' + ' --- |' * (1 + len(columns)))
  for alg in algs:
    cells = [results[_key(alg, a, r)] for a, r in columns]
    print(f'| {alg} | ' + ' | '.join(f'{c["wall_s"]:.0f}' if c['status'] == 'trained' else '-'
                                     for c in cells) + ' |')


def main(argv):
  del argv
  from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
  from tff_decorr import aggregators  # pylint: disable=g-import-not-at-top
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  algs = FLAGS.algorithms or list(algorithms.names())
  aggs = FLAGS.aggregators or list(aggregators.names())
  for name, chosen, known in (('algorithms', algs, algorithms.names()),
                              ('aggregators', aggs, aggregators.names()),
                              ('runtimes', FLAGS.runtimes, ('tff', 'tf'))):
    unknown = [x for x in chosen if x not in known]
    if unknown:
      raise app.UsageError(f'--{name}: unknown {unknown}; choose from {", ".join(known)}.')
  if FLAGS.rounds < 1 or not FLAGS.seeds:
    raise app.UsageError('--rounds must be >= 1 and --seeds non-empty.')
  seeds = [int(s) for s in FLAGS.seeds]
  settings = {'rounds': FLAGS.rounds, 'seeds': seeds, 'num_clients': FLAGS.num_clients,
              'local_epochs': FLAGS.local_epochs or 'task default', 'momentum': FLAGS.momentum,
              'regularizer': FLAGS.regularizer, 'dp_noise_multiplier': FLAGS.dp_noise_multiplier,
              'dp_clip': FLAGS.dp_clip}
  path = os.path.join(_common.ROOT, 'bench', 'results', f'{FLAGS.output_name}.json')
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get('settings') == settings:
      results = saved['cells']
  report = {'task': 'digits', 'settings': settings, 'chance': CHANCE,
            'machine': _common.machine(), 'cells': results}
  grid = [(a, g, r) for a in algs for g in aggs for r in FLAGS.runtimes]
  root = tempfile.mkdtemp(prefix='tff_decorr_matrix_')
  t0 = time.time()
  for n, (alg, agg, rt) in enumerate(grid, 1):
    key = _key(alg, agg, rt)
    if key in results:
      continue
    results[key] = run_cell(alg, agg, rt, seeds, root)
    cell = results[key]
    detail = (cell['reason'][:110] if cell['status'] == 'refused'
              else f'{_cell_text(cell)} in {cell["wall_s"]:.0f}s')
    print(f'[{n}/{len(grid)}] {alg} / {agg} / {rt}: {cell["status"]}: {detail} '
          f'({time.time() - t0:.0f}s elapsed)', flush=True)
    _common.write(FLAGS.output_name, report)
  shutil.rmtree(root, ignore_errors=True)
  report['elapsed_s_this_invocation'] = time.time() - t0
  _common.write(FLAGS.output_name, report)
  print()
  print_tables(results, algs, aggs, FLAGS.runtimes)
  trained = [c for k, c in results.items() if c['status'] == 'trained']
  refused = [c for k, c in results.items() if c['status'] == 'refused']
  print(f'\n{len(trained)} trained ({sum(c["finite"] for c in trained)} finite, '
        f'{sum(bool(c["above_chance"]) for c in trained)} above chance {CHANCE}), '
        f'{len(refused)} refused ({sum(c["nothing_written"] for c in refused)} with nothing '
        f'written); {time.time() - t0:.0f}s; wrote {path}; worker_binary processes of this '
        f'process still running: {tff_context.worker_pids()}')


def define_flags() -> None:
  # Defined only when run as a program: tests/matrix_test.py imports cell_settings and unvalidated.
  flags.DEFINE_list('algorithms', [], 'Algorithms (default: every registered one).')
  flags.DEFINE_list('aggregators', [], 'Aggregators (default: every registered one).')
  flags.DEFINE_list('runtimes', ['tff', 'tf'], 'Runtimes.')
  flags.DEFINE_list('seeds', ['0'], 'Seeds; a trained cell reports the mean over them.')
  flags.DEFINE_integer('rounds', 5, 'Rounds per trained cell.')
  flags.DEFINE_integer('num_clients', 10, 'Clients (all sampled every round).')
  flags.DEFINE_integer('local_epochs', 0, 'Local epochs per round (0: the task default, 5).')
  flags.DEFINE_float('momentum', 0.9, 'Client SGD momentum.')
  flags.DEFINE_string('regularizer', 'feddecorr', 'Regulariser of every cell.')
  flags.DEFINE_float('dp_noise_multiplier', 0.01, 'Noise multiplier of --aggregator=dp cells.')
  flags.DEFINE_float('dp_clip', 1.0, 'Fixed L2 clip of --aggregator=dp cells.')
  flags.DEFINE_string('output_name', 'matrix', 'bench/results/<name>.json.')


if __name__ == '__main__':
  define_flags()
  app.run(main)
