r"""A whole run against the reference's main.py, one after the other on this machine.

For each seed, at the fidelity setting (bench/settings.py: ResNet20, the shared CIFAR-10 at
10,000 train images, Dirichlet alpha 0.05, 10 clients all participating, 10 rounds of one local
epoch, batch 64, lr 0.01, momentum 0.9, weight decay 1e-5), FedAvg, the global model's test
evaluation every round:
- the reference: its own main.py (bench/reference/reference_main.py: evaluations other than the
  global test one skipped, as bench/accuracy/fidelity.py runs it; wall time from the script's first
  line, imports and data included), one process of the PyTorch environment;
- the project: `python -m bin.train` as a user types it (bench/speed/run_phases.run_once: wall time
  from spawn to exit, on an empty client-data cache, i.e. a first run).
The two alternate which goes first from seed to seed, so a drift of the machine's speed falls on
both sides. Printed per seed: both wall and CPU times and their ratios; then the mean ratio.

  .venv/bin/python -m bench.speed.whole_run_ratio --seeds=1,2,3       # about 15 minutes a seed
  .venv/bin/python -m bench.speed.whole_run_ratio --seeds=1 --runtime=tff
  .venv/bin/python -m bench.speed.whole_run_ratio --runtime=tf --precision=mixed_bfloat16

Run it alone on the machine. Pairs already measured (both JSONs in --output_dir) are reused, so an
interrupted invocation continues; delete the directory to measure again. Writes
bench/results/whole_run_ratio[_<runtime>].json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time

from absl import app
from absl import flags

from bench import _common
from bench.reference import reference_main
from bench.speed import run_phases

FLAGS = flags.FLAGS

flags.DEFINE_list('seeds', ['1', '2', '3'], 'Seeds (one reference run and one project run each).')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_whole_run', 'Where the runs go.')
flags.DEFINE_string('torch_python', '/tmp/torchenv/bin/python',
                    'Python of the PyTorch environment (bench/reference/reference_main.py says how '
                    'to make it).')
flags.DEFINE_enum('precision', 'float32', ['float32', 'mixed_bfloat16'],
                  "The project's --precision (its runs and the result file are named after it).")
flags.DEFINE_string('reference_dir', reference_main.DEFAULT_REFERENCE_DIR,
                    'Checkout of github.com/bytedance/FedDecorr.')


def _suffix() -> str:
  return '' if FLAGS.precision == 'float32' else f'_{FLAGS.precision}'


def _reference(seed: int, out: str, data: str) -> dict:
  if not os.path.exists(out):
    argv = reference_main.reference_argv('fedavg', seed, 'none', 0.05, 10)
    log_path = os.path.splitext(out)[0] + '.stdout'
    with open(log_path, 'w') as log:
      rc = subprocess.run([FLAGS.torch_python, os.path.join(_common.ROOT, 'bench', 'reference',
                                                            'reference_main.py'),
                           f'--reference_dir={os.path.abspath(FLAGS.reference_dir)}',
                           f'--data={data}', f'--out={out}', '--', *argv],
                          stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc or not os.path.exists(out):
      raise RuntimeError(f'the reference\'s run failed (exit {rc}); see {log_path}')
  with open(out) as f:
    r = json.load(f)
  return {'wall_s': r['wall_s'], 'cpu_s': r['cpu_s'],
          'final_test_accuracy': r['final_test_accuracy']}


def _project(seed: int, out: str) -> dict:
  if not os.path.exists(out):
    run_dir = os.path.join(os.path.dirname(out), 'project_run')
    cache = os.path.join(os.path.dirname(out), 'cache')
    for d in (run_dir, cache):  # A first run: its own partition, an empty cache.
      shutil.rmtree(d, ignore_errors=True)
    args = [a for a in run_phases.SETTINGS['fidelity'] if not a.startswith('--seed=')]
    result = run_phases.run_once(args + [f'--seed={seed}', f'--precision={FLAGS.precision}'],
                                 run_dir, cache)
    with open(out, 'w') as f:
      json.dump(result, f, indent=2)
  with open(out) as f:
    return json.load(f)


def main(argv):
  del argv
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  data = os.path.join(FLAGS.output_dir, 'ref_cifar10.npz')
  if not os.path.exists(data):
    reference_main.export(data, _common.DEFAULT_DATA_DIR)
  rows = {}
  for i, seed in enumerate(int(s) for s in FLAGS.seeds):
    d = os.path.join(FLAGS.output_dir, f'{FLAGS.runtime}{_suffix()}_seed{seed}')
    os.makedirs(d, exist_ok=True)
    sides = [('reference', lambda: _reference(seed, os.path.join(d, 'reference.json'), data)),
             ('project', lambda: _project(seed, os.path.join(d, 'project.json')))]
    if i % 2:
      sides.reverse()
    row = {'first': sides[0][0], 'load_avg_start': os.getloadavg()}
    for name, run in sides:
      t0 = time.time()
      row[name] = run()
      print(f'seed {seed} {name}: wall {row[name]["wall_s"]:.1f}s, CPU {row[name]["cpu_s"]:.1f}s, '
            f'accuracy {row[name]["final_test_accuracy"]:.4f} ({time.time() - t0:.0f}s now)',
            flush=True)
    row['wall_ratio'] = row['project']['wall_s'] / row['reference']['wall_s']
    row['cpu_ratio'] = row['project']['cpu_s'] / row['reference']['cpu_s']
    row['load_avg_end'] = os.getloadavg()
    rows[seed] = row
  print(f'\nthe fidelity setting, 10 rounds; project --runtime={FLAGS.runtime} '
        f'--precision={FLAGS.precision} vs the reference\'s main.py, one after the other')
  print('| seed | first | reference wall / CPU | project wall / CPU | wall ratio | CPU ratio | '
        'accuracy, reference / project |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  for seed, r in rows.items():
    print(f'| {seed} | {r["first"]} | {r["reference"]["wall_s"]:.0f} s / '
          f'{r["reference"]["cpu_s"]:.0f} s | {r["project"]["wall_s"]:.0f} s / '
          f'{r["project"]["cpu_s"]:.0f} s | {r["wall_ratio"]:.2f} | {r["cpu_ratio"]:.2f} | '
          f'{r["reference"]["final_test_accuracy"]:.3f} / '
          f'{r["project"]["final_test_accuracy"]:.3f} |')
  walls = [r['wall_ratio'] for r in rows.values()]
  cpus = [r['cpu_ratio'] for r in rows.values()]
  summary = {'wall_ratio_mean': statistics.mean(walls), 'cpu_ratio_mean': statistics.mean(cpus),
             'wall_ratio_max': max(walls)}
  for side in ('reference', 'project'):
    accuracies = [r[side]['final_test_accuracy'] for r in rows.values()]
    summary[f'accuracy_{side}_mean'] = statistics.mean(accuracies)
    summary[f'accuracy_{side}_std'] = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
  print(f'mean wall ratio {summary["wall_ratio_mean"]:.2f} (max {summary["wall_ratio_max"]:.2f}),'
        f' mean CPU ratio {summary["cpu_ratio_mean"]:.2f}; accuracy reference '
        f'{summary["accuracy_reference_mean"]:.4f} +- {summary["accuracy_reference_std"]:.4f}, '
        f'project {summary["accuracy_project_mean"]:.4f} +- {summary["accuracy_project_std"]:.4f}')
  path = os.path.join(_common.ROOT, 'bench', 'results',
                      f'whole_run_ratio_{FLAGS.runtime}{_suffix()}.json')
  with open(path, 'w') as f:
    json.dump({'machine': _common.machine(), 'runtime': FLAGS.runtime,
               'precision': FLAGS.precision, 'seeds': rows,
               'summary': summary}, f, indent=2)
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
