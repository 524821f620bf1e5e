r"""The server-side baselines' defaults, confirmed at the fidelity setting.

bench.accuracy.server_defaults chooses each algorithm's default on digits (a small CNN, 12 rounds,
3 seeds). This runs what a user gets from those defaults at the fidelity setting (bench/settings.py
FIDELITY: ResNet20 on the shared CIFAR-10, Dirichlet 0.05 over 10 clients all taking part, 10
rounds x 1 local epoch), over seeds 0, 1, 2, with FedAvg beside them in the same invocation. Nothing
of an algorithm is set here: each run takes the task's and the code's defaults, as bin/train would,
and the JSON records the settings they resolved to. The bar (docs/algorithms.md): each trains above
FedAvg's mean minus 3 points.

  .venv/bin/python -m bench.accuracy.server_defaults_fidelity
  .venv/bin/python -m bench.accuracy.server_defaults_fidelity --algorithms=fedavg,fedexp --seeds=0
  .venv/bin/python -m bench.accuracy.server_defaults_fidelity --set=fedexp_step_counters=true
  .venv/bin/python -m bench.accuracy.server_defaults_fidelity --regularizer=feddecorr \
      --algorithms=fedavg,fedprox,fedavgm,moon,fedadam,fedexp

`--regularizer=feddecorr` adds FedDecorr (beta 0.1, bench/settings.py) to every run: the paper's
pairs, each baseline as a user gets it by default with and without FedDecorr (docs/benchmarks.md
§6). Its cells are keyed apart from the regulariser-free ones.

`--probe` adds, for each run, bin.analyze's nearest-class-mean probe and effective rank of its
exported global model (docs/analysis.md): whether a low test accuracy is the representation's or
the head's. Finished runs are read back, not trained again, so it can follow the training:

  .venv/bin/python -m bench.accuracy.server_defaults_fidelity --algorithms=fedavg,moon --probe
  .venv/bin/python -m bench.accuracy.server_defaults_fidelity --algorithms=fedavg,moon --probe \
      --regularizer=feddecorr

`--set` runs another form instead of the defaults (any bin/train component flag, e.g. the
reference's: `--set=fedadam_bn=reference,fedadam_server_lr=0.01`); its cells are keyed by what they
resolved to, so they never mix with the defaults' cells. Finished runs are reused (bin/train
resumes), so an interrupted invocation continues. Merges its cells into
bench/results/server_defaults_fidelity.json (one cell an algorithm and resolved form).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import statistics
import sys
import time
from typing import Any, Dict, Sequence

from absl import app
from absl import flags

import tensorflow as tf  # pylint: disable=unused-import  (before absl.app.run)

from bench import _common
from bench import settings as bench_settings

FLAGS = flags.FLAGS

# The server-side baselines whose defaults were chosen by measurement (the default grid), and the
# other baselines the paper pairs with FedDecorr.
DEFAULT_ALGORITHMS = ('fedavg', 'fedadam', 'fedyogi', 'fedadagrad', 'fedexp')
ALGORITHMS = DEFAULT_ALGORITHMS + ('fedprox', 'fedavgm', 'moon')

flags.DEFINE_list('algorithms', list(DEFAULT_ALGORITHMS), 'Algorithms (fedavg: the baseline), '
                  'from ' + ', '.join(ALGORITHMS) + '.')
flags.DEFINE_enum('regularizer', 'none', ['none', 'feddecorr'],
                  'Regulariser of every run: none, or FedDecorr with bench/settings.py\'s beta.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_integer('rounds', bench_settings.FIDELITY['rounds'], 'Rounds a run.')
flags.DEFINE_list('set', [], 'Component settings by flag name (name=value) given to every run '
                  'of an algorithm they belong to, instead of its defaults.')
flags.DEFINE_bool('probe', False, 'Also each run\'s nearest-class-mean probe and effective rank '
                  '(bin.analyze --probe) of its exported global model, into the cell.')
flags.DEFINE_enum('runtime', 'tf', ['tf', 'tff'], 'Runtime (bench.accuracy.server_defaults\'s).')
flags.DEFINE_string('data_dir', _common.DEFAULT_DATA_DIR, 'TFDS data dir holding cifar10.')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_server_defaults_fidelity', 'Where the runs go.')
flags.DEFINE_string('output', os.path.join(_common.ROOT, 'bench', 'results',
                                           'server_defaults_fidelity.json'), 'Results JSON.')


def _std(values: Sequence[float]) -> float:
  return statistics.stdev(values) if len(values) > 1 else 0.0


def _parse_set(items: Sequence[str]) -> Dict[str, str]:
  out = {}
  for item in items:
    name, sep, value = item.partition('=')
    if not sep or not name:
      raise app.UsageError(f'--set={item}: expected name=value, e.g. fedexp_step_counters=true.')
    out[name] = value
  return out


def _typed(value: str) -> Any:
  """A --set value as config_lib.make takes it (it validates the type against the HParams)."""
  if value.lower() in ('true', 'false'):
    return value.lower() == 'true'
  for kind in (int, float):
    try:
      return kind(value)
    except ValueError:
      pass
  return value


def make_config(name: str, extra: Dict[str, Any], seed: int, regularizer: str = 'none'):
  """The run's Config; its directory is keyed by the algorithm's resolved settings and the
  regulariser."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  values = dict(bench_settings.FIDELITY, rounds=FLAGS.rounds, algorithm=name, seed=seed,
                eval_every=FLAGS.rounds, runtime=FLAGS.runtime, regularizer=regularizer,
                data_dir=os.path.abspath(FLAGS.data_dir),
                cache_dir=os.path.join(FLAGS.output_dir, 'cache'), **extra)
  if regularizer == 'feddecorr':
    values['feddecorr_beta'] = bench_settings.FEDDECORR_BETA
  config = config_lib.make(**values)
  config.output_dir = os.path.join(
      FLAGS.output_dir, f'r{FLAGS.rounds}',
      cell_key(name, resolved_settings(config, name), regularizer), f's{seed}')
  return config


def cell_key(name: str, resolved: Dict[str, Any], regularizer: str = 'none') -> str:
  """A cell's name: the algorithm (with `+feddecorr` when regularised) and a hash of the
  settings it resolved to (its run directory and its key in the results JSON)."""
  digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:8]
  return f'{name}{"" if regularizer == "none" else "+" + regularizer}-{digest}'


def resolved_settings(config, name: str) -> Dict[str, Any]:
  hp = config.hparams.get(name)
  return json.loads(json.dumps(hp.to_dict() if hp is not None else {}, default=str))


def run_cell(name: str, extra: Dict[str, Any], configs: Sequence[Any],
             regularizer: str = 'none') -> Dict[str, Any]:
  """Trains the cell's runs (`configs`, one a seed, from make_config; finished runs are read
  back); its results (accuracy as a fraction, as bench.accuracy.server_defaults's)."""
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  seeds = [c.seed for c in configs]
  return {'algorithm': name, 'settings': resolved_settings(configs[0], name),
          'regularizer': regularizer, 'set': {k: str(v) for k, v in extra.items()},
          'seeds': list(seeds),
          # One TFF worker per run at most (--runtime=tff), none left behind.
          **_common.run_seeds(configs, name, after=tff_context.stop_all)}


def probe_runs(run_dirs: Sequence[str], task, data_dir: str,
               trust_saved_model: bool = False) -> Dict[str, Any]:
  """bin.analyze's nearest-class-mean probe and effective rank of each run's exported global model
  (lists, one entry a run; accuracies as fractions); `trust_saved_model`: export.load_serving's."""
  from tff_decorr.collapse import analysis  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  test = task.test_dataset(data_dir)
  train = task.split_dataset('train', data_dir)
  out = {k: [] for k in ('nearest_class_mean_accuracy', 'head_accuracy', 'effective_rank',
                         'largest_predicted_class_share')}
  for run_dir in run_dirs:
    fn, _ = export.load_serving(run_dir, trust_saved_model=trust_saved_model)
    probe = analysis.nearest_class_mean_probe(fn, train, test, task.num_classes)
    sv = analysis.singular_values(analysis.representation_covariance(fn, test))
    for key in out:
      out[key].append(analysis.effective_rank(sv) if key == 'effective_rank' else probe[key])
  return out


def main(argv):
  del argv
  unknown = [a for a in FLAGS.algorithms if a not in ALGORITHMS]
  if unknown:
    raise app.UsageError(f'--algorithms: unknown {unknown}; choose from {", ".join(ALGORITHMS)}.')
  given = _parse_set(FLAGS.set)
  seeds = [int(s) for s in FLAGS.seeds]
  report = {'setting': {**bench_settings.FIDELITY, 'rounds': FLAGS.rounds,
                        'runtime': FLAGS.runtime}, 'cells': {}}
  if os.path.exists(FLAGS.output):  # Cells of earlier invocations stay; this one's replace theirs.
    with open(FLAGS.output) as f:
      report = json.load(f)
  t0 = time.time()
  done = []
  for name in FLAGS.algorithms:
    extra = {k: _typed(v) for k, v in given.items() if k.startswith(f'{name}_')}
    print(f'{name}{" " + str(extra) if extra else " (defaults)"}, regularizer '
          f'{FLAGS.regularizer}:', flush=True)
    configs = [make_config(name, extra, seed, FLAGS.regularizer) for seed in seeds]
    finished = [os.path.exists(os.path.join(c.output_dir, 'summary.json')) for c in configs]
    cell = run_cell(name, extra, configs, FLAGS.regularizer)
    key = cell_key(name, cell['settings'], FLAGS.regularizer)
    old = report['cells'].get(key, {})
    for i, seed in enumerate(seeds):  # A run read back keeps the training time it was stored with.
      if finished[i] and seed in old.get('seeds', []):
        cell['seconds'][i] = old['seconds'][old['seeds'].index(seed)]
    if FLAGS.probe:
      from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
      cell['probe'] = probe_runs([c.output_dir for c in configs], registry.get(configs[0].task),
                                 os.path.abspath(FLAGS.data_dir))
    elif 'probe' in old and old['seeds'] == cell['seeds']:
      cell['probe'] = old['probe']
    cell['form'] = 'set' if extra else 'default'
    report['cells'][key] = cell
    done.append(key)
    report.update(command=' '.join(['.venv/bin/python -m bench.accuracy.server_defaults_fidelity']
                                   + [shlex.quote(a) for a in sys.argv[1:]]),
                  machine=_common.machine(), wall_time_s=time.time() - t0,
                  load_avg_end=os.getloadavg(), date=time.strftime('%Y-%m-%d'))
    os.makedirs(os.path.dirname(FLAGS.output), exist_ok=True)
    with open(FLAGS.output, 'w') as f:
      json.dump(report, f, indent=2)
  fedavg = [c for c in report['cells'].values() if c['algorithm'] == 'fedavg'
            and c.get('regularizer', 'none') == 'none']
  bar = 100.0 * fedavg[0]['mean'] - 3.0 if fedavg else None
  print(f'\nfinal test accuracy % after {FLAGS.rounds} rounds at the fidelity setting, mean ± std '
        f'over seeds {",".join(map(str, seeds))}' + (f'; bar (FedAvg - 3): {bar:.2f}' if bar else ''))
  probe = ' probe % | effective rank |' if FLAGS.probe else ''
  print('| algorithm | regularizer | form | settings | accuracy | above the bar |' + probe)
  print('| --- | --- | --- | --- | --- | --- |' + (' --- | --- |' if FLAGS.probe else ''))
  for key in done:
    c = report['cells'][key]
    above = '-' if bar is None or c['algorithm'] == 'fedavg' else (
        'yes' if 100.0 * c['mean'] > bar else 'no')
    settings = ', '.join(f'{k}={v}' for k, v in sorted(c['settings'].items())) or '-'
    row = (f'| {c["algorithm"]} | {c.get("regularizer", "none")} | {c["form"]} | {settings} | '
           f'{100 * c["mean"]:.2f} ± {100 * c["std"]:.2f} | {above} |')
    if FLAGS.probe:
      ncm = [100 * a for a in c['probe']['nearest_class_mean_accuracy']]
      rank = c['probe']['effective_rank']
      row += (f' {statistics.mean(ncm):.2f} ± {_std(ncm):.2f} | '
              f'{statistics.mean(rank):.2f} ± {_std(rank):.2f} |')
    print(row)
  print(f'wrote {FLAGS.output}')


if __name__ == '__main__':
  app.run(main)
