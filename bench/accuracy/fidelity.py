r"""Fidelity to the PyTorch reference at the fidelity setting, as mean +- std over seeds.

The setting (bench/settings.py's FIDELITY: the reference's main.py with its CIFAR-10 scripts'
hyper-parameters, scaled to a CPU): the shared CIFAR-10 (10,000 train images, official order),
ResNet20, Dirichlet alpha 0.05 (and 0.5), 10 clients all participating, 10 rounds x 1 local epoch,
lr 0.01, momentum 0.9, weight decay 1e-5, batch 64; FedAvg and FedAvg + FedDecorr (beta 0.1). Each
run is `tff_decorr.program.training.train` (what bin/train runs); its summary.json gives the final
test accuracy on the 10,000 test images.

`--inits` runs the same grid with other initialisations: `keras` is what the project used before it
matched the reference's (Glorot-uniform), `reference` the model's default now (the reference's
Kaiming-normal for ResNet20). Same seeds, same partitions and batches: the difference between the
two rows is the effect of the initialisation alone. The reference's own figures at alpha 0.05 (seeds
1 and 2, measured with its main.py on the same data when the comparison began) are printed beside
them.

  .venv/bin/python -m bench.accuracy.fidelity                 # alpha 0.05, seeds 0-2, both inits
  .venv/bin/python -m bench.accuracy.fidelity --alphas=0.05,0.5 --inits=reference

Runs already finished are reused (bin/train resumes), so an interrupted benchmark continues.
Writes bench/results/fidelity_alpha<alphas>.json.

Other algorithms, and the reference measured here: `--algorithms` (any of fedavg,
fedprox, fedavgm, fedadam, fedexp, moon, fedlc, fedrs, fedsam) and `--sides=project,reference` run each
algorithm on both sides at the same setting, `--regularizers` none and/or feddecorr (feddecorr
only where the reference's approach has it: not fedlc, fedrs, fedsam). The reference side is its
own main.py, one subprocess of the PyTorch environment per seed (`--torch_python`,
bench/reference/reference_main.py, which says how to install that environment and what it changes:
data from an .npz, evaluations other than the global test one skipped, .cuda() the identity); the
algorithm's values on both sides are bench/reference/reference_main.ALGORITHMS' (the reference's
CIFAR-10 scripts and defaults; FedAvgM with the reference's form and `--fedavgm_bn=reference`). The
model starts from its default (the reference's) initialisation; `--inits` is for the table above
only.

  .venv/bin/python -m bench.accuracy.fidelity --algorithms=fedprox,fedavgm \
      --sides=project,reference --seeds=0,1,2 --regularizers=none

Finished runs are reused (project: its summary.json; reference: its JSON under
<output_dir>/r<rounds>/reference/), so the grid can be spread over sessions; FedAvg's project
runs are the table above's (same directories). Prints a table per algorithm (project and
reference mean +- std over the seeds, their difference, whether |difference| <= the reference's
std) and merges it into bench/results/fidelity_algorithms.json (fidelity_algorithms_r<rounds>.json
for --rounds other than 10). The default (`--algorithms=fedavg --sides=project`) is the table
above, unchanged.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

from absl import app
from absl import flags

# TensorFlow before absl's app.run (see bench/accuracy/feddecorr_cifar10.py).
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top
from bench import settings  # pylint: disable=g-import-not-at-top
from bench.reference import reference_main  # pylint: disable=g-import-not-at-top
from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
from tff_decorr.program import training  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
_ROOT = _common.ROOT

# The reference (bytedance/FedDecorr main.py) at this setting, final test accuracy %: measured
# with its own main.py on the same data before bench/reference/reference_main.py existed, not re-run
# here.
REFERENCE = {('0.05', 'none'): {1: 17.6, 2: 21.8}, ('0.05', 'feddecorr'): {1: 15.7, 2: 19.6}}

flags.DEFINE_string('data_dir', os.path.join(os.path.dirname(_ROOT), 'shared', 'data', 'tfds'),
                    'TFDS data dir holding cifar10.')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_fidelity', 'Where the runs go.')
flags.DEFINE_list('alphas', ['0.05'], 'Dirichlet alphas.')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
flags.DEFINE_list('inits', ['reference', 'keras'],
                  'Initialisations: reference (the model default) and/or keras, torch, '
                  'kaiming_normal.')
flags.DEFINE_integer('rounds', 10, 'Communication rounds.')
flags.DEFINE_enum('runtime', 'tff', ['tff', 'tf'], 'Runtime (tff is faster on a CPU).')
flags.DEFINE_list('algorithms', ['fedavg'], 'Algorithms: ' + ', '.join(reference_main.ALGORITHMS)
                  + '. Anything but fedavg alone (or --sides with reference) gives the '
                  'per-algorithm table.')
flags.DEFINE_list('sides', ['project'], 'project and/or reference (the PyTorch main.py).')
flags.DEFINE_list('regularizers', ['none', 'feddecorr'],
                  'The per-algorithm table\'s regularisers: none and/or feddecorr.')
flags.DEFINE_string('reference_dir', reference_main.DEFAULT_REFERENCE_DIR,
                    'Checkout of bytedance/FedDecorr (reference side).')
flags.DEFINE_string('torch_python', '/tmp/torchenv/bin/python',
                    'Python of the PyTorch environment (bench/reference/reference_main.py says '
                    'which).')
flags.DEFINE_string('reference_data', '', 'The shared CIFAR-10 as an .npz for the reference '
                    '(default <output_dir>/ref_cifar10.npz, exported here when missing).')


# How the results JSON names the setting: bench/settings.py's, --rounds and --alphas apart.
_SETTING = 'fidelity (bench/settings.py): ' + ' '.join(
    f for f in settings.flags(settings.FIDELITY)
    if not f.startswith(('--rounds=', '--dirichlet_alpha=')))


def _stats(values):
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _project_run(out, alpha, reg, seed, **extra):
  """The project's run in `out` (trained unless its summary.json exists): its summary."""
  path = os.path.join(out, 'summary.json')
  if not os.path.exists(path):
    # The algorithms' own settings (`extra`: a mapping's, --init) go over the named setting's.
    values = {**settings.FIDELITY, 'dirichlet_alpha': float(alpha), 'rounds': FLAGS.rounds,
              **extra}
    config = config_lib.make(
        **values, data_dir=os.path.abspath(FLAGS.data_dir), runtime=FLAGS.runtime,
        regularizer=reg, seed=int(seed), eval_every=FLAGS.rounds, output_dir=out,
        cache_dir=os.path.join(FLAGS.output_dir, 'cache'),
        **({'feddecorr_beta': settings.FEDDECORR_BETA} if reg == 'feddecorr' else {}))
    training.train(config, log=lambda s: None)  # Resumes an interrupted run.
    tff_context.stop_all()  # One TFF worker per run, as bin/train: none left behind.
  with open(path) as f:
    return json.load(f)


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.algorithms) - set(reference_main.ALGORITHMS))
  if unknown or not set(FLAGS.sides) <= {'project', 'reference'} or not set(
      FLAGS.regularizers) <= {'none', 'feddecorr'}:
    raise app.UsageError(f'--algorithms from {", ".join(reference_main.ALGORITHMS)} (unknown: '
                         f'{unknown}); --sides from project, reference; --regularizers from '
                         'none, feddecorr.')
  if FLAGS.algorithms == ['fedavg'] and FLAGS.sides == ['project']:
    _inits_table()
  else:
    _algorithms_table()


def _inits_table():
  for init in FLAGS.inits:
    if init != 'reference':
      config_lib.make(task='cifar10', model='resnet20', init=init)  # --init is checked here.
  t0 = time.time()
  results = {}
  for alpha in FLAGS.alphas:
    for init in FLAGS.inits:
      for reg in ('none', 'feddecorr'):
        accs = []
        for seed in FLAGS.seeds:
          out = os.path.join(FLAGS.output_dir, f'r{FLAGS.rounds}', f'a{alpha}-{init}-{reg}-s{seed}')
          acc = 100.0 * _project_run(out, alpha, reg, seed, **(
              {} if init == 'reference' else {'init': init}))['final_test_accuracy']
          accs.append(acc)
          print(f'alpha={alpha} init={init} {reg} seed={seed}: {acc:.2f}% '
                f'({time.time() - t0:.0f}s elapsed)', flush=True)
        mean, std = _stats(accs)
        results[f'{alpha}/{init}/{reg}'] = {'seeds': [int(s) for s in FLAGS.seeds],
                                            'accuracy': accs, 'mean': mean, 'std': std}
  report = {'setting': _SETTING, 'rounds': FLAGS.rounds, 'runtime': FLAGS.runtime,
            'results': results, 'reference': {f'{a}/{r}': v for (a, r), v in REFERENCE.items()},
            'wall_time_s': time.time() - t0, 'load_avg_end': os.getloadavg()}
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', f'fidelity_alpha{"_".join(FLAGS.alphas)}.json')
  with open(path, 'w') as f:
    json.dump(report, f, indent=2)
  print('\nfinal test accuracy %, mean +- std over seeds ' + ','.join(FLAGS.seeds))
  print('| alpha | init | FedAvg | FedAvg + FedDecorr | FedDecorr - FedAvg |')
  print('| --- | --- | --- | --- | --- |')
  for alpha in FLAGS.alphas:
    rows = [(init, results[f'{alpha}/{init}/none'], results[f'{alpha}/{init}/feddecorr'])
            for init in FLAGS.inits]
    if (alpha, 'none') in REFERENCE:
      ref = {r: list(REFERENCE[(alpha, r)].values()) for r in ('none', 'feddecorr')}
      rows.append(('PyTorch reference (seeds 1, 2)',
                   dict(zip(('mean', 'std'), _stats(ref['none'])), accuracy=ref['none']),
                   dict(zip(('mean', 'std'), _stats(ref['feddecorr'])), accuracy=ref['feddecorr'])))
    for name, a, b in rows:
      diff = [y - x for x, y in zip(a['accuracy'], b['accuracy'])]
      d_mean, d_std = _stats(diff)
      print(f'| {alpha} | {name} | {a["mean"]:.2f} ± {a["std"]:.2f} | '
            f'{b["mean"]:.2f} ± {b["std"]:.2f} | {d_mean:+.2f} ± {d_std:.2f} |')
  print(f'wrote {path}')



def _reference_data():
  path = FLAGS.reference_data or os.path.join(FLAGS.output_dir, 'ref_cifar10.npz')
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    reference_main.export(path, os.path.abspath(FLAGS.data_dir))
  return path


def _reference_run(path, algorithm, alpha, reg, seed):
  """The reference's main.py run whose JSON is `path` (run unless that exists): its JSON."""
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    argv = reference_main.reference_argv(algorithm, int(seed), reg, float(alpha), FLAGS.rounds)
    log_path = os.path.splitext(path)[0] + '.stdout'
    with open(log_path, 'w') as log:
      rc = subprocess.run([FLAGS.torch_python, os.path.join(_ROOT, 'bench', 'reference', 'reference_main.py'),
                           f'--reference_dir={os.path.abspath(FLAGS.reference_dir)}',
                           f'--data={os.path.abspath(_reference_data())}', f'--out={path}', '--',
                           *argv], stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc or not os.path.exists(path):
      raise RuntimeError(f'the reference\'s run {path} failed (exit {rc}); see {log_path}')
  with open(path) as f:
    return json.load(f)


def _algorithms_table():
  t0 = time.time()
  rounds_dir = os.path.join(FLAGS.output_dir, f'r{FLAGS.rounds}')
  results, skipped = {}, []
  for alpha in FLAGS.alphas:
    for alg in FLAGS.algorithms:
      mapping = reference_main.ALGORITHMS[alg]
      for reg in FLAGS.regularizers:
        if reg == 'feddecorr' and not mapping.feddecorr:
          skipped.append(f'{alg} + feddecorr (the reference\'s {mapping.approach} has no FedDecorr)')
          continue
        cell = {'project': {'accuracy': [], 'wall_s': []},
                'reference': {'accuracy': [], 'wall_s': [], 'cpu_s': []},
                'seeds': [int(s) for s in FLAGS.seeds],
                'reference_argv': {s: reference_main.reference_argv(
                    alg, int(s), reg, float(alpha), FLAGS.rounds) for s in FLAGS.seeds},
                'project_settings': {'algorithm': alg, **mapping.project}, 'note': mapping.note}
        for seed in FLAGS.seeds:
          if 'project' in FLAGS.sides:  # FedAvg's directories are the inits table's.
            name = (f'a{alpha}-reference-{reg}-s{seed}' if alg == 'fedavg' else
                    f'{alg}-a{alpha}-{reg}-s{seed}')
            summary = _project_run(os.path.join(rounds_dir, name), alpha, reg, seed,
                                   algorithm=alg, **mapping.project)
            cell['project']['accuracy'].append(100.0 * summary['final_test_accuracy'])
            cell['project']['wall_s'].append(summary.get('wall_time_s'))
            print(f'project   {alg} alpha={alpha} {reg} seed={seed}: '
                  f'{cell["project"]["accuracy"][-1]:.2f}% ({time.time() - t0:.0f}s elapsed)',
                  flush=True)
          if 'reference' in FLAGS.sides:
            r = _reference_run(os.path.join(rounds_dir, 'reference',
                                            f'{alg}-a{alpha}-{reg}-s{seed}.json'),
                               alg, alpha, reg, seed)
            cell['reference']['accuracy'].append(100.0 * r['final_test_accuracy'])
            cell['reference']['wall_s'].append(r['wall_s'])
            cell['reference']['cpu_s'].append(r['cpu_s'])
            print(f'reference {alg} alpha={alpha} {reg} seed={seed}: '
                  f'{cell["reference"]["accuracy"][-1]:.2f}% ({time.time() - t0:.0f}s elapsed)',
                  flush=True)
        for side in ('project', 'reference'):
          if cell[side]['accuracy']:
            cell[side]['mean'], cell[side]['std'] = _stats(cell[side]['accuracy'])
          else:
            del cell[side]
        results[f'{alpha}/{alg}/{reg}'] = cell
  name = 'fidelity_algorithms' + ('' if FLAGS.rounds == 10 else f'_r{FLAGS.rounds}') + '.json'
  path = os.path.join(_ROOT, 'bench', 'results', name)
  report = {'setting': _SETTING + '; reference: its main.py (bench/reference/reference_main.py)',
            'rounds': FLAGS.rounds, 'runtime': FLAGS.runtime, 'results': {}}
  if os.path.exists(path):  # Cells of earlier invocations are kept; this one's replace theirs.
    with open(path) as f:
      report = json.load(f)
  for key, cell in results.items():  # A side not run now is kept from the same setting's cell;
    # then the two sides are compared.
    old = report['results'].get(key, {})
    same = {'project': old.get('project_settings') == cell['project_settings'],
            'reference': old.get('reference_argv') == cell['reference_argv']}
    for side in ('project', 'reference'):
      if side not in cell and side in old and same[side] and old.get('seeds') == cell['seeds']:
        cell[side] = old[side]
    if 'project' in cell and 'reference' in cell:
      cell['difference'] = cell['project']['mean'] - cell['reference']['mean']
      cell['within_reference_std'] = abs(cell['difference']) <= cell['reference']['std']
  report['results'].update(results)
  report.update(wall_time_s=time.time() - t0, load_avg_end=os.getloadavg())
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(report, f, indent=2)
  print(f'\nfinal test accuracy % after {FLAGS.rounds} rounds, mean +- std over seeds '
        + ','.join(FLAGS.seeds))
  print('| alpha | algorithm | regularizer | project | reference | project - reference | '
        'within the reference\'s std |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  fmt = lambda c, side: f'{c[side]["mean"]:.2f} ± {c[side]["std"]:.2f}' if side in c else '-'
  for key, c in results.items():
    alpha, alg, reg = key.split('/')
    diff = f'{c["difference"]:+.2f}' if 'difference' in c else '-'
    within = {True: 'yes', False: 'no', None: '-'}[c.get('within_reference_std')]
    print(f'| {alpha} | {alg} | {reg} | {fmt(c, "project")} | {fmt(c, "reference")} | {diff} | '
          f'{within} |')
  for alg in FLAGS.algorithms:
    if reference_main.ALGORITHMS[alg].note:
      print(f'{alg}: {reference_main.ALGORITHMS[alg].note}')
  for line in skipped:
    print(f'skipped: {line}')
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
