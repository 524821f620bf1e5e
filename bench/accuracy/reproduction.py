r"""The paper's claim at the reproduction setting: FedAvg against FedAvg + FedDecorr, the project
and the PyTorch reference's main.py, results committed as each run finishes (docs/reproduction.md).

The setting is bench/settings.py's `reproduction` (ResNet20, the shared 10k CIFAR-10, Dirichlet
alpha 0.05, 10 clients all taking part, 30 rounds x 5 local epochs, lr 0.01, momentum 0.9, weight
decay 1e-5, batch 64, beta 0.1). Project runs go through bin/study with the test accuracy every
round, the global model exported every 10 rounds and client 0's local model of the last round
saved, so bin/report gives the spectra at rounds 10, 20, 30 and the local-vs-global gap.

  .venv/bin/python -m bench.accuracy.reproduction --sides=project --seeds=0,1,2  # a seed at a time
  .venv/bin/python -m bench.accuracy.reproduction --sides=reference --seeds=0    # its main.py
  .venv/bin/python -m bench.accuracy.reproduction --figures           # from the committed files
  .venv/bin/python -m bench.accuracy.reproduction --rounds=50 --seeds=5,6  # 30-round runs go on
  .venv/bin/python -m bench.accuracy.reproduction --rounds=50 --seeds=5 --from_scratch  # round 1 on

Each finished run is archived at once into bench/results/reproduction/alpha<alpha>/ (bin/report
--archive_dir: config, summary, metrics.csv and spectra.json a run; the reference's JSON under
reference/), so the study survives losing the machine: the same command on another machine skips
what the archive holds and runs the rest. Run it from a worktree at a fixed commit (autograph
re-reads source files, so code edited under a running job reaches it), one run at a time.
`--figures` needs nothing but the archive: bin/report's page in docs/reproduction/report/ and the
project-versus-reference curves, docs/reproduction/curves.png. `--rounds=50` copies each seed's
finished 30-round runs (their study in --work_dir, checkpoints included) into a study of its own and
trains them on to round 50, archived under alpha<alpha>-r50/ (`--from_scratch`: from round 1 when
their checkpoints are gone); its `--figures` adds windows.md, the gain over each 10 rounds, and
first_rounds.md, its runs' first rounds against the archived ones, which docs/reproduction.md shows.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

import numpy as np

from absl import app
from absl import flags

from bench import _common
from bench import settings

_ROOT = _common.ROOT
METHODS = ('none', 'feddecorr')
LABELS = {'none': 'FedAvg', 'feddecorr': 'FedAvg + FedDecorr'}

_SIDES = flags.DEFINE_list('sides', ['project'], 'project and/or reference.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds, run in this order, both methods each.')
_ALPHA = flags.DEFINE_string('alpha', '0.05', 'Dirichlet alpha (0.5: the paper\'s less '
                             'heterogeneous contrast).')
_LOCAL_EPOCHS = flags.DEFINE_integer('local_epochs', settings.REPRODUCTION['local_epochs'],
                                     'Local epochs a round (the paper\'s next axis: 10).')
_MODEL = flags.DEFINE_string('model', settings.REPRODUCTION['model'],
                             'Model (the paper\'s: mobilenet_v2_cifar).')
_ROUNDS = flags.DEFINE_integer(
    'rounds', settings.REPRODUCTION['rounds'], 'Rounds a run trains. More than the setting\'s '
    'continues each seed\'s finished runs of the setting (their study under --work_dir must still '
    'hold their checkpoints; else see --from_scratch) in a study and archive of their own, named '
    '-r<rounds>.')
_FROM_SCRATCH = flags.DEFINE_bool(
    'from_scratch', False, 'With --rounds above the setting\'s: a seed whose finished runs of the '
    'setting are not in --work_dir (a fresh machine keeps none) trains both runs from round 1 '
    'instead of being refused; --figures then checks their first rounds against the archived '
    'runs of the setting.')
_FIGURES = flags.DEFINE_bool('figures', False, 'Only draw the figures and tables from the archive.')
_SNAPSHOT = flags.DEFINE_bool('snapshot', False, 'Only archive: the finished runs of the study, and '
                              'the metrics.csv of each run still training into in_progress/ '
                              '(drawn dotted by --figures, never averaged in).')
_STUDY_DIR = flags.DEFINE_string('study_dir', '', 'The project\'s study (default '
                                 '<work_dir>/alpha<alpha>/study).')
_WORK_DIR = flags.DEFINE_string('work_dir', '/tmp/tff_decorr_reproduction',
                                'Where the runs train (run directories, exports, the reference\'s '
                                'working files); only the archive is kept.')
_DATA_DIR = flags.DEFINE_string('data_dir', os.path.join(os.path.dirname(_ROOT), 'shared', 'data',
                                                         'tfds'), 'TFDS data dir holding cifar10.')
_TORCH_PYTHON = flags.DEFINE_string('torch_python', '/tmp/torchenv/bin/python',
                                    'Python of the PyTorch environment '
                                    '(bench/reference/reference_main.py).')
_REFERENCE_DIR = flags.DEFINE_string('reference_dir', '/tmp/FedDecorr',
                                     'Checkout of the reference '
                                     '(bench/reference/reference_main.py).')
_REFERENCE_PARALLEL = flags.DEFINE_integer(
    'reference_parallel', 1, 'Reference runs at once, the cores split between them. 1: a run '
    'cannot resume, so finishing one before the next loses less to a cut-short session; two at '
    'once took about 385 CPU-s a round each with one thread, against about 340 with two.')


def variant() -> str:
  """The archive's folder name: alpha, and what differs from the reproduction setting."""
  name = f'alpha{_ALPHA.value}'
  if _LOCAL_EPOCHS.value != settings.REPRODUCTION['local_epochs']:
    name += f'-e{_LOCAL_EPOCHS.value}'
  if _MODEL.value != settings.REPRODUCTION['model']:
    name += f'-{_MODEL.value}'
  if _ROUNDS.value != settings.REPRODUCTION['rounds']:
    name += f'-r{_ROUNDS.value}'
  return name


def base_variant() -> str:
  """The variant whose runs a longer one continues: the same one at the setting's rounds."""
  suffix = f'-r{_ROUNDS.value}'
  name = variant()
  return name[:-len(suffix)] if name.endswith(suffix) else name


def archive_dir() -> str:
  return os.path.join(_ROOT, 'bench', 'results', 'reproduction', variant())


def _run(argv, log_path=None):
  print('$ ' + ' '.join(argv), flush=True)
  if log_path:
    with open(log_path, 'a') as log:
      return subprocess.run(argv, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
  return subprocess.run(argv, cwd=_ROOT).returncode


def study_dir() -> str:
  return _STUDY_DIR.value or os.path.join(_WORK_DIR.value, variant(), 'study')


def _archive_finished() -> None:
  rc = _run([sys.executable, '-m', 'bin.report', f'--study_dir={study_dir()}',
             f'--archive_dir={archive_dir()}', f'--data_dir={_DATA_DIR.value}'])
  if rc:
    raise SystemExit(f'bin/report --archive_dir exited {rc}.')


def _snapshot() -> None:
  """Finished runs archived; a run still training leaves its metrics.csv and config.json in
  in_progress/<name>/ (replaced by its archived run once it finishes)."""
  _archive_finished()
  runs = os.path.join(study_dir(), 'runs')
  for name in sorted(os.listdir(runs)):
    dest = os.path.join(archive_dir(), 'in_progress', name)
    if os.path.exists(os.path.join(archive_dir(), 'runs', name)):
      shutil.rmtree(dest, ignore_errors=True)
      continue
    if os.path.exists(os.path.join(runs, name, 'metrics.csv')):
      os.makedirs(dest, exist_ok=True)
      for f in ('metrics.csv', 'config.json'):
        shutil.copyfile(os.path.join(runs, name, f), os.path.join(dest, f))
      pack(os.path.join(runs, name), os.path.join(dest, RESUME_PACK))
      print(f'in progress: {name} -> {dest}', flush=True)
  _snapshot_reference()


# A run cut short on one machine resumes on another from this: the run directory with only its
# newest checkpoint (about 1.5 MB for ResNet20), committed beside the run's metrics.csv.
RESUME_PACK = 'resume.tar.gz'


def pack(run_path: str, dest: str) -> None:
  """Writes run_path as a tar.gz, keeping of checkpoints/ only the newest round's files."""
  ckpt = os.path.join(run_path, 'checkpoints')
  rounds = [int(n[len('round_'):]) for n in os.listdir(ckpt)
            if n.startswith('round_') and n[len('round_'):].isdigit()] if os.path.isdir(ckpt) else []
  keep = {f'round_{max(rounds)}', f'client_states_{max(rounds)}.json'} if rounds else set()
  def only_newest(info):
    parts = info.name.split('/')
    if len(parts) > 1 and parts[1] == 'checkpoints' and len(parts) > 2 and parts[2] not in keep:
      return None
    return info
  with tarfile.open(dest + '.tmp', 'w:gz') as tar:
    tar.add(run_path, arcname=os.path.basename(run_path), filter=only_newest)
  os.replace(dest + '.tmp', dest)


def unpack_resume_packs(archive: str, runs: str) -> None:
  """Puts each in-progress run committed in `archive` back into the study's `runs` folder, unless
  the study has it already or the archive holds it finished; tarfile's 'data' filter refuses
  links, devices and paths outside."""
  folder = os.path.join(archive, 'in_progress')
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    path = os.path.join(folder, name, RESUME_PACK)
    if (not os.path.exists(path) or os.path.exists(os.path.join(runs, name))
        or os.path.exists(os.path.join(archive, 'runs', name))):
      continue
    os.makedirs(runs, exist_ok=True)
    with tarfile.open(path) as tar:
      if any(m.name.split('/')[0] != name for m in tar.getmembers()):
        raise SystemExit(f'{path}: holds files outside {name}/; not unpacked.')
      tar.extractall(runs, filter='data')
    print(f'resuming {name} from {path}', flush=True)


def restore_archived(archive: str, runs: str) -> None:
  """Puts each finished run `archive` holds back into the study's `runs` as its archived files
  (config, summary, metrics, spectra), unless the study has it already: bin/study then counts it
  done instead of training it again on a machine that never held it, as when a seed's first run
  finished on one machine and its second goes on from a resume pack on another. Archiving the
  study again finds the same summary and keeps what the archive holds."""
  folder = os.path.join(archive, 'runs')
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    dest = os.path.join(runs, name)
    if os.path.exists(dest):
      continue
    os.makedirs(runs, exist_ok=True)
    shutil.copytree(os.path.join(folder, name), dest + '.tmp')
    os.replace(dest + '.tmp', dest)
    print(f'{name}: finished in {archive}; put back into the study, not trained again', flush=True)


def _snapshot_reference() -> None:
  """A reference run still training leaves its rounds so far in reference/in_progress/."""
  ref_dir = os.path.join(archive_dir(), 'reference')
  work = os.path.join(_WORK_DIR.value, variant(), 'reference')
  for name in sorted(os.listdir(work)) if os.path.isdir(work) else []:
    if not name.endswith('.progress.json'):
      continue
    final = name.replace('.progress.json', '.json')
    dest = os.path.join(ref_dir, 'in_progress', final)
    if os.path.exists(os.path.join(ref_dir, final)):
      if os.path.exists(dest):
        os.remove(dest)
      continue
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(os.path.join(work, name), dest + '.tmp')
    os.replace(dest + '.tmp', dest)
    print(f'in progress: reference {final} -> {dest}', flush=True)


def _project(seeds) -> None:
  study = study_dir()
  grid = settings.flags(settings.REPRODUCTION, dirichlet_alpha=_ALPHA.value,
                        local_epochs=_LOCAL_EPOCHS.value, model=_MODEL.value,
                        rounds=_ROUNDS.value)
  common = [sys.executable, '-m', 'bin.study', f'--study_dir={study}', *grid,
            '--algorithm=fedavg', f'--regularizer={",".join(METHODS)}',
            f'--feddecorr_beta={settings.FEDDECORR_BETA}', f'--data_dir={_DATA_DIR.value}',
            '--runtime=tf', '--eval_every=1', f'--export_every={10}', '--save_local_models=0',
            f'--save_local_rounds={_ROUNDS.value}']
  done_before = _archived_seeds()
  unpack_resume_packs(archive_dir(), os.path.join(study, 'runs'))
  restore_archived(archive_dir(), os.path.join(study, 'runs'))
  for i, seed in enumerate(seeds):
    if all((m, seed) in done_before for m in METHODS):
      print(f'seed {seed}: both methods already archived in {archive_dir()}', flush=True)
      continue
    if variant() != base_variant():
      continue_from_base(seed, os.path.join(_WORK_DIR.value, base_variant(), 'study'),
                         os.path.join(study, 'runs'), from_scratch=_FROM_SCRATCH.value)
    # The grid grows a seed at a time (earlier seeds are finished and skipped), so study.json
    # always lists every seed run so far.
    rc = _run([*common, f'--seed={",".join(seeds[:i + 1])}'])
    if rc:
      raise SystemExit(f'bin/study exited {rc}; see {study}/logs; re-run the same command.')
    _snapshot()


def continue_from_base(seed: str, base_study: str, runs: str, from_scratch: bool = False) -> bool:
  """Copies `seed`'s finished runs of the base study into the longer study's `runs`, where
  bin/study trains them on from their last checkpoint (--rounds and --save_local_rounds may change
  on resume: a run's directory name leaves them out, so the copy keeps its name).

  Args:
    seed: the seed, as in --seeds.
    base_study: the study of the setting's rounds, under --work_dir.
    runs: the longer study's runs folder.
    from_scratch: when the base study does not hold both finished runs, copy nothing (bin/study
      then trains the seed's runs from round 1) instead of refusing. A run the longer study holds
      already is never replaced either way.

  Returns:
    True when both runs continue from the base study, False when they train from round 1.

  Raises:
    SystemExit: the base study does not hold a finished run of `seed` with its checkpoints for
      each method (they are gone with the machine that trained it, or it never ran), and not
      `from_scratch`.
  """
  manifest = os.path.join(base_study, 'study.json')
  cells = []
  if os.path.exists(manifest):
    with open(manifest) as f:
      cells = [c for c in json.load(f)['cells'] if str(c['flags'].get('seed')) == seed]
  sources = {}
  for method in METHODS:
    names = [c['name'] for c in cells if c['flags'].get('regularizer') == method]
    source = os.path.join(base_study, 'runs', names[0]) if names else ''
    # A finished run put back from the archive (restore_archived) has no checkpoint to go on from.
    if names and all(os.path.exists(os.path.join(source, f)) for f in ('summary.json',
                                                                         'checkpoints')):
      sources[method] = names[0]
      continue
    if from_scratch:
      print(f'seed {seed}: no finished {settings.REPRODUCTION["rounds"]}-round runs of both '
            f'methods in {base_study}; both train from round 1 (--from_scratch)', flush=True)
      return False
    raise SystemExit(
        f'seed {seed}, {LABELS[method]}: no finished {settings.REPRODUCTION["rounds"]}-round '
        f'run of it in {base_study} to continue to --rounds={_ROUNDS.value}; its checkpoints '
        f'live only on the machine that trained it. Add --from_scratch to train both of the '
        f'seed\'s runs from round 1 (--figures then checks their first rounds against the '
        f'archive), or leave it out of --seeds.')
  for method, name in sources.items():
    source = os.path.join(base_study, 'runs', name)
    dest = os.path.join(runs, name)
    if not os.path.exists(dest):
      os.makedirs(runs, exist_ok=True)
      shutil.copytree(source, dest + '.tmp', symlinks=True)
      os.replace(dest + '.tmp', dest)
      print(f'seed {seed}, {LABELS[method]}: continues {source} in {dest}', flush=True)
  return True


def _archived_seeds():
  manifest = os.path.join(archive_dir(), 'study.json')
  if not os.path.exists(manifest):
    return set()
  with open(manifest) as f:
    return {(c['flags'].get('regularizer'), c['flags'].get('seed')) for c in json.load(f)['cells']}


def _reference(seeds) -> None:
  from bench.reference import reference_main  # pylint: disable=g-import-not-at-top
  out_dir = os.path.join(archive_dir(), 'reference')
  os.makedirs(out_dir, exist_ok=True)
  work = os.path.join(_WORK_DIR.value, variant(), 'reference')
  os.makedirs(work, exist_ok=True)
  data = os.path.join(_WORK_DIR.value, 'ref_cifar10.npz')
  if not os.path.exists(data):
    reference_main.export(data, _DATA_DIR.value)
  if _MODEL.value != 'resnet20':
    raise SystemExit('the reference side runs ResNet20 only here (its MobileNetV2 is another '
                     'main.py --model); give --sides=project.')
  jobs = []
  for seed in seeds:
    for method in METHODS:
      dest = os.path.join(out_dir, f'fedavg-{method}-s{seed}.json')
      if os.path.exists(dest):
        print(f'{dest}: already archived', flush=True)
        continue
      argv = reference_main.reference_argv('fedavg', int(seed), method, float(_ALPHA.value),
                                           _ROUNDS.value, _LOCAL_EPOCHS.value)
      jobs.append((seed, method, dest, argv))
  # Runs `--reference_parallel` at a time, the cores split between them (torch's intra-op threads):
  # both methods of a seed advance together, so a run cut short leaves two curves of one length.
  parallel = max(1, _REFERENCE_PARALLEL.value)
  threads = max(1, (os.cpu_count() or 1) // parallel)
  while jobs:
    batch, jobs = jobs[:parallel], jobs[parallel:]
    procs = []
    for seed, method, dest, argv in batch:
      tmp = os.path.join(work, os.path.basename(dest))
      cmd = [_TORCH_PYTHON.value, os.path.join(_ROOT, 'bench', 'reference', 'reference_main.py'),
             f'--reference_dir={_REFERENCE_DIR.value}', f'--data={data}', f'--out={tmp}',
             f'--progress={_progress_path(seed, method)}', '--', *argv]
      print('$ ' + ' '.join(cmd), flush=True)
      log = open(tmp + '.stdout', 'a')  # pylint: disable=consider-using-with
      env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
      procs.append((seed, method, dest, tmp, log, time.time(),
                    subprocess.Popen(cmd, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     env=env)))
    for seed, method, dest, tmp, log, t0, proc in procs:
      rc = proc.wait()
      log.close()
      if rc or not os.path.exists(tmp):
        raise SystemExit(f'the reference\'s run failed (exit {rc}); see {tmp}.stdout')
      shutil.copyfile(tmp, dest + '.tmp')
      os.replace(dest + '.tmp', dest)
      print(f'reference {method} seed {seed}: archived {dest} ({time.time() - t0:.0f} s)',
            flush=True)


def _progress_path(seed, method) -> str:
  return os.path.join(_WORK_DIR.value, variant(), 'reference', f'fedavg-{method}-s{seed}.progress.json')


def _reference_curves():
  """{method: [(seed, rounds, accuracies, finished)]} of the archived reference runs, those still
  training (reference/in_progress/) included when no finished run of theirs is archived."""
  out = {}
  ref_dir = os.path.join(archive_dir(), 'reference')
  for method in METHODS:
    prefix = f'fedavg-{method}-s'
    for folder, finished in ((ref_dir, True), (os.path.join(ref_dir, 'in_progress'), False)):
      for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not (name.startswith(prefix) and name.endswith('.json')):
          continue
        seed = name[len(prefix):-5]
        if not finished and any(s == seed for s, *_ in out.get(method, [])):
          continue
        with open(os.path.join(folder, name)) as f:
          r = json.load(f)
        acc = [x['test_accuracy'] for x in r['rounds'] if 'test_accuracy' in x]
        out.setdefault(method, []).append((seed, list(range(1, len(acc) + 1)), acc, finished))
  return out


def _late_rounds_table(runs, path: str) -> None:
  """Means over the last third of the rounds, and over its odd and even rounds apart.

  At this setting FedAvg's curve swings by 4-6 points with a period of two rounds
  (docs/reproduction.md), so the last round's accuracy depends on which phase it falls in; a
  mean over whole periods does not.
  """
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  total = _ROUNDS.value
  first = total - total // 3 + 1
  lines = [f'| run | seed | rounds | final | best | mean, rounds {first}-{total} | '
           f'odd rounds {first}-{total} | even rounds {first}-{total} |', '|---' * 8 + '|']
  rows = []
  for r in runs:
    x, y = aggregate.read_curve(r.path)
    rows.append((f'{LABELS[r.flags.get("regularizer")]}, project', r.flags.get('seed', '?'), x, y))
  for method in METHODS:
    for seed, x, y, finished in _reference_curves().get(method, []):
      rows.append((f'{LABELS[method]}, reference' + ('' if finished else ' (training)'), seed,
                   np.asarray(x), np.asarray(y)))
  for name, seed, x, y in rows:
    late = {int(a): float(b) for a, b in zip(x, y) if a >= first}
    def mean(keep):
      v = [b for a, b in late.items() if keep(a)]
      return f'{100 * statistics.mean(v):.2f}' if v else '—'
    lines.append(f'| {name} | {seed} | {len(x)} | {100 * y[-1]:.2f} | {100 * max(y):.2f} | '
                 f'{mean(lambda a: True)} | {mean(lambda a: a % 2)} | '
                 f'{mean(lambda a: not a % 2)} |' if len(y) else f'| {name} | {seed} | 0 |')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n\nTest accuracy (%) of the global model; written by '
            '`python -m bench.accuracy.reproduction --figures` from the committed archive.\n')
  print(f'wrote {path}')


MEASURES = (('final', 'final test accuracy (%)'), ('best', 'best test accuracy (%)'),
            ('late', 'mean test accuracy of the last third of the rounds (%)'),
            ('rank', 'effective rank of the global representation at the last round'))


def seed_measures(runs) -> dict:
  """{method: {seed: {measure: value}}} of the finished project runs (accuracies in %)."""
  from tff_decorr.collapse import analysis  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import run_spectra  # pylint: disable=g-import-not-at-top
  out = {}
  for r in runs:
    x, y = aggregate.read_curve(r.path)
    if not y.size:
      continue
    total = int(r.flags.get('rounds', x[-1]))
    first = total - total // 3 + 1
    values = {'final': 100 * float(y[-1]), 'best': 100 * float(y.max()),
              'late': 100 * float(np.mean(y[x >= first]))}
    spectra = run_spectra.read(r.path)
    if spectra and spectra['global']:
      values['rank'] = analysis.effective_rank(spectra['global'][max(spectra['global'])])
    out.setdefault(r.flags.get('regularizer'), {})[r.flags.get('seed', '?')] = values
  return out


def effects_markdown(runs) -> str:
  """The paired comparison of FedAvg + FedDecorr with FedAvg over the seeds both finished: per
  measure, each method's mean ± std, the mean difference with its 95 % interval, the paired
  t-test, the exact sign-flip test and the wins; then each seed's differences."""
  from bench.accuracy import paired  # pylint: disable=g-import-not-at-top
  by = seed_measures(runs)
  base, other = (by.get(m, {}) for m in METHODS)
  seeds = sorted(set(base) & set(other), key=int)
  if not seeds:
    return 'No seed has both methods finished yet.\n'
  total = _ROUNDS.value
  first = total - total // 3 + 1
  lines = [f'Seeds {", ".join(seeds)} (n = {len(seeds)}), each running both methods; differences '
           f'are FedAvg + FedDecorr minus FedAvg, paired by seed. "Last third" is rounds '
           f'{first}-{total}.', '',
           '| measure | FedAvg | FedAvg + FedDecorr | difference | 95 % interval | paired t '
           '(df) | p (t) | p (sign-flip, exact) | FedDecorr ahead |', '|---' * 9 + '|']
  per_seed = []
  for key, label in MEASURES:
    if not all(key in base[s] and key in other[s] for s in seeds):
      continue
    a = [base[s][key] for s in seeds]
    b = [other[s][key] for s in seeds]
    e = paired.paired_effect(a, b)
    def ms(v):
      return f'{np.mean(v):.2f} ± {np.std(v, ddof=1):.2f}' if len(v) > 1 else f'{v[0]:.2f}'
    lines.append(f'| {label} | {ms(a)} | {ms(b)} | {e.mean:+.2f} | '
                 f'[{e.ci95[0]:+.2f}, {e.ci95[1]:+.2f}] | {e.t:.2f} ({e.n - 1}) | {e.p_t:.3f} | '
                 f'{e.p_sign_flip:.3f} | {e.wins} of {e.n} |')
    per_seed.append(f'| {label} | ' + ' | '.join(f'{d:+.2f}' for d in e.differences) + ' |')
  lines += ['', '| per seed: difference | ' + ' | '.join(f'seed {s}' for s in seeds) + ' |',
            '|---' * (len(seeds) + 1) + '|', *per_seed, '',
            'Written by `python -m bench.accuracy.reproduction --figures` from the committed '
            'archive (bench/accuracy/paired.py: t-test with n - 1 degrees of freedom; the '
            'sign-flip test counts all 2^n sign patterns of the differences).']
  return '\n'.join(lines) + '\n'


def windows_markdown(runs, width: int = 10) -> str:
  """Whether the gain grows with training: per window of `width` rounds, each method's mean test
  accuracy over the window (mean ± std over the seeds both finished) and the paired difference.

  Every window is read from the same runs, so a longer variant (-r50) sets its late rounds against
  its own rounds 21-30.
  """
  from bench.accuracy import paired  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  curves = {}
  for r in runs:
    x, y = aggregate.read_curve(r.path)
    if y.size:
      curves.setdefault(r.flags.get('regularizer'), {})[r.flags.get('seed', '?')] = (x, y)
  base, other = (curves.get(m, {}) for m in METHODS)
  seeds = sorted(set(base) & set(other), key=int)
  if not seeds:
    return 'No seed has both methods finished yet.\n'
  last = min(int(max(c[0])) for c in [*base.values(), *other.values()])
  lines = [f'Mean test accuracy (%) over each window of {width} rounds, seeds {", ".join(seeds)} '
           f'(n = {len(seeds)}); differences are FedAvg + FedDecorr minus FedAvg, paired by seed.',
           '', '| rounds | FedAvg | FedAvg + FedDecorr | difference | 95 % interval | p (t) | '
           'p (sign-flip, exact) | FedDecorr ahead | per seed |', '|---' * 9 + '|']
  for lo in range(1, last + 1, width):
    hi = min(lo + width - 1, last)
    def window(c):
      x, y = c
      return 100 * float(np.mean(y[(x >= lo) & (x <= hi)]))
    a = [window(base[s]) for s in seeds]
    b = [window(other[s]) for s in seeds]
    e = paired.paired_effect(a, b)
    spread = (lambda v: f'{np.mean(v):.2f} ± {np.std(v, ddof=1):.2f}') if len(seeds) > 1 else (
        lambda v: f'{v[0]:.2f}')
    interval = f'[{e.ci95[0]:+.2f}, {e.ci95[1]:+.2f}]' if len(seeds) > 1 else '—'
    p_t = f'{e.p_t:.3f}' if len(seeds) > 1 else '—'
    lines.append(f'| {lo}-{hi} | {spread(a)} | {spread(b)} | {e.mean:+.2f} | {interval} | {p_t} | '
                 f'{e.p_sign_flip:.3f} | {e.wins} of {e.n} | '
                 + ', '.join(f'{d:+.2f}' for d in e.differences) + ' |')
  lines += ['', 'Written by `python -m bench.accuracy.reproduction --figures` from the committed '
            'archive; "per seed" lists the differences in the order of the seeds above.']
  return '\n'.join(lines) + '\n'


def first_rounds_markdown(longer, base) -> str:
  """Whether a longer variant's runs trained their first rounds as the archived runs did.

  A run trained from round 1 again (--from_scratch) runs the code that trained the archived run,
  from the same seed, so where training is deterministic its metrics are the archived ones round
  by round: the test accuracy (a count of test images) and the training loss, which any
  difference in the weights a round starts from would move. A continued run holds the archived
  rounds as copied.

  Args:
    longer: {(method, seed): (run directory, status)} of the longer variant's runs, finished or
      still training; status is '' or what to say of a run still training.
    base: {(method, seed): run directory} of the archived runs of the setting.

  Returns:
    A markdown table: per run, the rounds both metrics.csv files hold, in how many of them the two
    test accuracies and the two training losses are equal (as metrics.csv records them), and the
    largest test-accuracy difference in points.
  """
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  rows = []
  for (method, seed), (path, status) in sorted(
      longer.items(), key=lambda kv: (int(kv[0][1]), METHODS.index(kv[0][0]))):
    if (method, seed) not in base:
      continue
    cells = []
    for column in ('test_accuracy', 'train_loss'):
      (x, y), (bx, by) = (aggregate.read_curve(p, column) for p in (path, base[method, seed]))
      common, i, j = np.intersect1d(x, bx, return_indices=True)
      d = np.abs(y[i] - by[j])
      cells.append((common, d))
    (common, d), (loss_rounds, loss_d) = cells
    if not common.size:
      continue
    rows.append(f'| {seed} | {LABELS[method]}{status} | {int(common[0])}-{int(common[-1])} | '
                f'{int(np.sum(d == 0))} of {common.size} | {100 * float(d.max()):.2f} | '
                f'{int(np.sum(loss_d == 0))} of {loss_rounds.size} |')
  if not rows:
    return 'No run of this variant has rounds to compare with the archive yet.\n'
  return '\n'.join([
      'Each run against the archived run of the same seed and method (the runs of the setting, '
      'above), in the rounds both hold:', '',
      '| seed | run | rounds | the same test accuracy | largest difference (points) | '
      'the same training loss |', '|---' * 6 + '|', *rows, '',
      'Written by `python -m bench.accuracy.reproduction --figures` from the committed archives; '
      '"the same" is equal as metrics.csv records it.']) + '\n'


def readme_table(runs) -> str:
  """The README's first-screen table: each method's mean ± std over the finished seeds (final,
  best, last third), the paired difference with its 95 % interval, and the reference's runs."""
  from bench.accuracy import paired  # pylint: disable=g-import-not-at-top
  by = seed_measures(runs)
  base, other = (by.get(m, {}) for m in METHODS)
  seeds = sorted(set(base) & set(other), key=int)
  total = _ROUNDS.value
  first = total - total // 3 + 1
  lines = ['| test accuracy (%) | FedAvg | FedAvg + FedDecorr | gain [95 % interval] | p (paired t) |',
           '|---|---|---|---|---|']
  names = {'final': 'final', 'best': 'best', 'late': f'mean of rounds {first}-{total}'}
  for key in ('final', 'best', 'late'):
    if len(seeds) < 2:
      break
    a = [base[s][key] for s in seeds]
    b = [other[s][key] for s in seeds]
    e = paired.paired_effect(a, b)
    lines.append(f'| this project, seeds {",".join(seeds)}: {names[key]} | '
                 f'{np.mean(a):.2f} ± {np.std(a, ddof=1):.2f} | '
                 f'{np.mean(b):.2f} ± {np.std(b, ddof=1):.2f} | '
                 f'{e.mean:+.2f} [{e.ci95[0]:+.2f}, {e.ci95[1]:+.2f}] | {e.p_t:.2f} |')
  ref = {m: {seed: y for seed, _, y, finished in c if finished}
         for m, c in _reference_curves().items()}
  for seed in sorted(set(ref.get('none', {})) & set(ref.get('feddecorr', {})), key=int):
    a, b = (100 * float(np.mean(ref[m][seed][first - 1:])) for m in METHODS)
    lines.append(f'| the reference\'s main.py, seed {seed}: mean of rounds {first}-{total} | '
                 f'{a:.2f} | {b:.2f} | {b - a:+.2f} | — |')
  return '\n'.join(lines) + '\n'


BEGIN = '<!-- {name}: generated by python -m bench.accuracy.reproduction --figures -->'
END = '<!-- {name}: end -->'


def replace_block(path: str, name: str, text: str) -> bool:
  """Replaces what lies between the BEGIN and END markers named `name` in `path` by `text`;
  False (and nothing written) when the file has no such markers."""
  begin, end = BEGIN.format(name=name), END.format(name=name)
  with open(path) as f:
    doc = f.read()
  i, j = doc.find(begin), doc.find(end)
  if i < 0 or j < i:
    return False
  new = doc[:i + len(begin)] + '\n' + text + doc[j:]
  if new != doc:
    with open(path, 'w') as f:
      f.write(new)
  return True


def archived_first_rounds(runs) -> str:
  """first_rounds_markdown of this longer variant's runs (archived or in_progress/) against the
  archived runs of the setting."""
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import study  # pylint: disable=g-import-not-at-top
  base_dir = os.path.join(_ROOT, 'bench', 'results', 'reproduction', base_variant())
  base = {(r.flags.get('regularizer'), str(r.flags.get('seed'))): r.path
          for r in aggregate.load_runs(base_dir, study.read_manifest(base_dir)) if r.done}
  longer = {(r.flags.get('regularizer'), str(r.flags.get('seed'))): (r.path, '') for r in runs}
  for path, config in _in_progress_runs():
    x, _ = aggregate.read_curve(path)
    longer[config['regularizer'], str(config['seed'])] = (
        path, f' (training: {len(x)}/{config["rounds"]} rounds)')
  return first_rounds_markdown(longer, base)


def _in_progress_runs():
  """(run folder, its config.json) of each run still training that --snapshot left in
  in_progress/."""
  in_progress = os.path.join(archive_dir(), 'in_progress')
  for name in sorted(os.listdir(in_progress)) if os.path.isdir(in_progress) else []:
    path = os.path.join(in_progress, name)
    with open(os.path.join(path, 'config.json')) as f:
      yield path, json.load(f)


def _figures() -> None:
  from tff_decorr.collapse import plots  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import aggregate  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import report  # pylint: disable=g-import-not-at-top
  from tff_decorr.studies import study  # pylint: disable=g-import-not-at-top
  docs = os.path.join(_ROOT, 'docs', 'reproduction', variant())
  os.chdir(_ROOT)  # The page names the archive by its path in the repository.
  os.makedirs(docs, exist_ok=True)
  written, runs = {}, []
  if (study.read_json(os.path.join(archive_dir(), 'study.json')) or {}).get('cells'):
    written = report.build(os.path.relpath(archive_dir(), _ROOT), os.path.join(docs, 'report'),
                           spectra=True, thresholds=(0.2, 0.25, 0.3), log=lambda s: None)
    for kind in [k for k in written if k.endswith(('_svg', '_pdf'))]:
      os.remove(written.pop(kind))  # The page shows the PNGs (report.html embeds them).
    manifest = study.read_manifest(archive_dir())
    runs = [r for r in aggregate.load_runs(archive_dir(), manifest) if r.done]
  else:  # Only runs still training (in_progress/), or none: the report page waits for one.
    print(f'{archive_dir()}: no finished run archived yet; no report page')
  panel = []
  # The mean curves are over the seeds both methods finished, so the two bands compare the same
  # seeds; a finished run whose pair is still training is drawn on its own.
  by_method = {m: {r.flags.get('seed', '?'): r for r in runs if r.flags.get('regularizer') == m}
               for m in METHODS}
  paired_seeds = sorted(set.intersection(*(set(v) for v in by_method.values())), key=int)
  for k, method in enumerate(METHODS):
    curves = [aggregate.read_curve(by_method[method][s].path) for s in paired_seeds]
    curves = [c for c in curves if c[0].size]
    if curves:
      common = sorted(set.intersection(*(set(x.tolist()) for x, _ in curves)))
      ys = [[float(v) for v in y[:len(common)]] for _, y in curves]
      mean = [statistics.mean(col) for col in zip(*ys)]
      std = [statistics.stdev(col) for col in zip(*ys)] if len(ys) > 1 else None
      which = (f'mean ± std of seeds {", ".join(paired_seeds)}' if len(ys) > 1
               else f'seed {paired_seeds[0]}')
      panel.append({'label': f'{LABELS[method]}, project ({which})', 'color': f'C{k}',
                    'x': common, 'y': mean, 'std': std})
    for seed in sorted(set(by_method[method]) - set(paired_seeds), key=int):
      x, y = aggregate.read_curve(by_method[method][seed].path)
      panel.append({'label': f'{LABELS[method]}, project seed {seed} (its pair not finished)',
                    'color': f'C{k}', 'x': x, 'y': y, 'linestyle': ':'})
  for path, config in _in_progress_runs():
    x, y = aggregate.read_curve(path)
    k = METHODS.index(config['regularizer'])
    panel.append({'label': f'{LABELS[config["regularizer"]]}, project seed {config["seed"]} '
                           f'(training: {len(x)}/{config["rounds"]} rounds)', 'color': f'C{k}',
                  'x': x, 'y': y, 'incomplete': True})
  for k, method in enumerate(METHODS):
    for seed, x, y, finished in _reference_curves().get(method, []):
      status = '' if finished else f' (training: {len(x)}/{_ROUNDS.value} rounds)'
      panel.append({'label': f'{LABELS[method]}, reference seed {seed}{status}', 'color': f'C{k}',
                    'x': x, 'y': y, 'linestyle': '--'})
  _late_rounds_table(runs, os.path.join(docs, 'late_rounds.md'))
  effects = effects_markdown(runs)
  windows = windows_markdown(runs)
  files = [('effects.md', effects), ('windows.md', windows)]
  page = os.path.join('docs', 'reproduction.md')
  # A variant's window table goes on the page where the page made room for it (its markers).
  blocks = [(page, f'reproduction-windows-{variant()}', windows)]
  if variant() != base_variant():
    first = archived_first_rounds(runs)
    files.append(('first_rounds.md', first))
    blocks.append((page, f'reproduction-first-rounds-{variant()}', first))
  for name, text in files:
    with open(os.path.join(docs, name), 'w') as f:
      f.write(text)
    print(f'wrote {os.path.join(docs, name)}')
  if variant() == 'alpha0.05':  # The setting the README and docs/reproduction.md present.
    blocks += [('README.md', 'reproduction-table', readme_table(runs)),
               (page, 'reproduction-effects', effects)]
  for path, name, text in blocks:
    print(f'{path}: block {name} ' + ('updated' if replace_block(path, name, text)
                                      else 'not found (no markers): left as it is'))
  path = os.path.join(docs, 'curves.png')
  plots.plot_curves({f'CIFAR-10, ResNet20, alpha {_ALPHA.value}, E={_LOCAL_EPOCHS.value}': panel},
                    path, formats=('png',))
  print(f'wrote {path}')
  for kind, p in written.items():
    print(f'wrote {kind}: {p}')


def main(argv):
  del argv
  if not set(_SIDES.value) <= {'project', 'reference'}:
    raise app.UsageError(f'--sides from project, reference; got {_SIDES.value}.')
  if _FROM_SCRATCH.value and _ROUNDS.value <= settings.REPRODUCTION['rounds']:
    raise app.UsageError(f'--from_scratch trains a longer variant from round 1; it needs --rounds '
                         f'above the setting\'s {settings.REPRODUCTION["rounds"]} (got '
                         f'--rounds={_ROUNDS.value}). Leave --from_scratch out, or add '
                         f'--rounds=50.')
  if _FIGURES.value:
    _figures()
    return
  if _SNAPSHOT.value:
    _snapshot()
    return
  seeds = [str(int(s)) for s in _SEEDS.value]
  if 'project' in _SIDES.value:
    _project(seeds)
  if 'reference' in _SIDES.value:
    _reference(seeds)


if __name__ == '__main__':
  app.run(main)
