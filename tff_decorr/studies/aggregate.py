"""A study's runs read from their files and folded over seeds: the rows of bin/report's table.

The study's manifest (tff_decorr/studies/study.py, study.json) says which runs belong to it and how
they differ; each run's own files say how far it got. A row is one configuration of the grid with
every seed folded in: mean and sample standard deviation (ddof=1, as papers report over seeds) of
the final and best test accuracy of its *finished* runs only. A run that has not finished (not
started, stopped part-way, failed) is listed in its row, never averaged in. Run directories
bin/train wrote are read as a study too (`manifest_of_runs`).

Spectra use the collapse measures of tff_decorr/collapse/analysis.py on each finished run's exported
SavedModel over its task's test split, as bin/analyze computes them, at every round the run exported
(`--export_every`) or tracked (`--track_collapse`), and the local-vs-global gap of the clients whose
local models it saved (tff_decorr/studies/run_spectra.py).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_decorr.studies import run_spectra
from tff_decorr.studies import study

SEED = 'seed'
BASELINE = 'none'  # The regulariser every other one is compared with.


@dataclasses.dataclass
class Run:
  """One cell of the study and what its run directory holds."""
  name: str
  path: str
  flags: Dict[str, str]
  rounds: int
  status: str                  # 'done', 'incomplete', 'not started', 'failed'
  rounds_done: int
  log: str
  error: str = ''
  summary: Optional[dict] = None
  config: Optional[dict] = None
  spectrum: Optional[np.ndarray] = None
  spectrum_summary: Optional[dict] = None
  # run_spectra's measures: {'global': {round: singular values}, 'local': [{'client', 'round',
  # 'sv', 'gap'}]}.
  measures: Optional[dict] = None

  @property
  def done(self) -> bool:
    return self.status == 'done'

  def describe(self) -> str:
    """'seed=2: incomplete (1/2 rounds)'; failures with their error and log."""
    what = self.status if self.status != 'incomplete' else (
        f'incomplete ({self.rounds_done}/{self.rounds} rounds)')
    if self.status == 'failed':
      what = f'failed after {self.rounds_done}/{self.rounds} rounds: {self.error} (log {self.log})'
    return f'{SEED}={self.flags.get(SEED, "?")}: {what}'


def load_runs(study_dir: str, manifest: Mapping[str, Any]) -> List[Run]:
  """Every cell of the manifest with its state read from its run directory."""
  runs = []
  for cell in manifest['cells']:
    path = os.path.join(study_dir, cell['run_dir'])
    rounds = int(cell['rounds'])
    summary = study.read_json(os.path.join(path, 'summary.json'))
    done = bool(summary) and int(summary.get('final_round', 0)) >= rounds
    rounds_done = int(summary['final_round']) if done else study.completed_rounds(path)
    if done:
      status = 'done'
    elif cell.get('status') == study.FAILED:
      status = 'failed'
    elif os.path.isdir(path):
      status = 'incomplete'
    else:
      status = 'not started'
    runs.append(Run(name=cell['name'], path=path, flags=dict(cell['flags']), rounds=rounds,
                    status=status, rounds_done=rounds_done,
                    log=os.path.join(study_dir, cell['log']), error=cell.get('error') or '',
                    summary=summary if done else None,
                    config=study.read_json(os.path.join(path, 'config.json'))))
  return runs


# ---- run directories (bin/train) read as a study ----

# Columns a table always has for run directories, so that it says what ran even when every run
# ran the same algorithm or regulariser.
_ALWAYS_SHOWN = ('algorithm', 'regularizer')


def run_flags(config: Mapping[str, Any]) -> Dict[str, str]:
  """A run's config.json as the bin/train flags that set what it computed, {flag: text}: its
  generic settings (not where its files are or how it was executed: config.RESUMABLE_KEYS but
  --rounds) and its components' settings under their flag names (--dirichlet_alpha)."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  skip = set(config_lib.RESUMABLE_KEYS) - {'rounds'}
  text = lambda v: ('true' if v else 'false') if isinstance(v, bool) else str(v)
  out = {k: text(v) for k, v in config.items() if k != 'hparams' and k not in skip}
  names = {(component, spec.field): spec.name
           for _, component, spec in config_lib.component_flag_specs()}
  for component, settings in (config.get('hparams') or {}).items():
    for field, value in (settings or {}).items():
      out[names.get((component, field), f'{component}_{field}')] = text(value)
  return out


def _config_of_run_dir(path: str, flag: str) -> dict:
  """config.json of a bin/train run directory; StudyError naming `flag` and the fix otherwise."""
  if not os.path.isdir(path):
    raise study.StudyError(f'{flag}={path} does not exist; give a run directory bin/train wrote '
                           '(it holds config.json).')
  config = study.read_json(os.path.join(path, 'config.json'))
  if isinstance(config, dict):
    return config
  if os.path.exists(os.path.join(path, 'config.json')):
    raise study.StudyError(f'{flag}={path}: its config.json cannot be read; re-run the bin/train '
                           'command that wrote it (the run resumes and writes it again).')
  if os.path.exists(os.path.join(path, study.MANIFEST)):
    raise study.StudyError(f'{flag}={path} is a bin/study directory; give --study_dir={path}.')
  raise study.StudyError(f'{flag}={path} has no config.json; give a run directory bin/train '
                         'wrote (runs/<task>-<algorithm>-<regularizer>-<hash> or its '
                         '--output_dir).')


def manifest_of_runs(run_dirs: Sequence[str], flag: str = '--run_dir') -> dict:
  """A study manifest (study.json's form, in memory) of bin/train run directories, which
  `build_runs` reports as it reports a study: a cell per directory with its config.json as flags
  (`run_flags`), the rounds its configuration asks for, and as axes the flags whose values differ
  between the runs (the algorithm and regulariser always), the seed last. Runs that differ only in
  their seed fold into one row. A note lists what every run has in common. Raises StudyError
  (naming `flag`) for a directory that is not a run directory."""
  paths = list(dict.fromkeys(os.path.abspath(p) for p in run_dirs))
  if not paths:
    raise study.StudyError(f'{flag}: no run directory given; give one or more run directories '
                           'bin/train wrote (--run_dir=runs/a,runs/b).')
  configs = [_config_of_run_dir(p, flag) for p in paths]
  flags_of = [run_flags(c) for c in configs]
  base = [os.path.basename(p) for p in paths]
  names = base if len(set(base)) == len(base) else [os.path.relpath(p) for p in paths]
  order = list(dict.fromkeys(k for f in flags_of for k in f))
  differ = [k for k in order if len({f.get(k, '') for f in flags_of}) > 1]
  axes = [k for k in order if (k in differ or k in _ALWAYS_SHOWN) and k != SEED]
  axes += [SEED] if SEED in differ else []
  common = [f'{k}={flags_of[0][k]}' for k in order
            if k not in axes and all(k in f for f in flags_of)]
  cells = [{'name': name, 'run_dir': path, 'log': '', 'flags': f, 'rounds': int(c['rounds'])}
           for name, path, f, c in zip(names, paths, flags_of, configs)]
  # By seed, so each row lists its seeds in order (rows come in the order of their lowest seed).
  cells.sort(key=lambda c: int(c['flags'][SEED]) if c['flags'].get(SEED, '').isdigit() else 0)
  return {'version': study.MANIFEST_VERSION, 'axes': axes, 'cells': cells,
          'notes': [f'Settings every run has: {" ".join(common)}.'] if common else []}


@dataclasses.dataclass
class Row:
  """One configuration over its seeds."""
  key: Tuple[Tuple[str, str], ...]   # (axis, value) of the grid's axes other than the seed
  runs: List[Run]
  stats: Dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def label(self) -> str:
    return ' '.join(f'{a}={v}' for a, v in self.key if v) or 'all runs'

  def value(self, axis: str) -> str:
    return dict(self.key).get(axis, '')


def _mean_std(values: Sequence[float]) -> Tuple[float, float]:
  """Mean and sample standard deviation (nan for fewer than two values)."""
  if not values:
    return math.nan, math.nan
  a = np.asarray(values, dtype=np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else math.nan


def rounds_to_reach(paths: Sequence[str], threshold: float) -> Tuple[float, float, int, int]:
  """(mean, std, runs that reached it, runs) of the first round whose test accuracy is at least
  `threshold` (a fraction), over the runs whose metrics.csv are in `paths`; a run that never
  reached it is counted in the last number only."""
  firsts = []
  for path in paths:
    x, y = read_curve(path)
    hit = np.flatnonzero(y >= threshold)
    if hit.size:
      firsts.append(float(x[hit[0]]))
  mean, std = _mean_std(firsts)
  return mean, std, len(firsts), len(paths)


def _effective_rank(sv) -> float:
  from tff_decorr.collapse import analysis  # pylint: disable=g-import-not-at-top
  return analysis.effective_rank(sv)


def group(runs: Sequence[Run], axes: Sequence[str],
          thresholds: Sequence[float] = ()) -> List[Row]:
  """Runs folded over seeds, in the manifest's order; statistics of the finished runs only.
  `thresholds`: test accuracies (fractions) whose first round is averaged (`rounds_to_reach`)."""
  keyed: Dict[tuple, Row] = {}
  columns = [a for a in axes if a != SEED]
  for run in runs:
    # A setting a run does not have (--fedprox_mu of a FedAvg run) is '' in its key.
    key = tuple((a, run.flags.get(a, '')) for a in columns)
    keyed.setdefault(key, Row(key=key, runs=[])).runs.append(run)
  rows = list(keyed.values())
  for row in rows:
    done = [r for r in row.runs if r.done]
    s = row.stats
    s['n_done'], s['n_runs'] = len(done), len(row.runs)
    s['seeds_done'] = [r.flags.get(SEED, '') for r in done]
    for metric in ('final_test_accuracy', 'best_test_accuracy'):
      s[f'{metric}_mean'], s[f'{metric}_std'] = _mean_std([r.summary[metric] for r in done])
    ranks = [r.spectrum_summary['effective_rank'] for r in done if r.spectrum_summary]
    s['effective_rank_mean'], s['effective_rank_std'] = _mean_std(ranks)
    s['n_spectra'] = len(ranks)
    s['not_done'] = [r.describe() for r in row.runs if not r.done]
    s['rounds_to'] = {t: rounds_to_reach([r.path for r in done], t) for t in thresholds}
    by_round: Dict[int, List[float]] = {}
    gaps: Dict[Tuple[str, int], List[Tuple[float, float]]] = {}
    for r in done:
      for rnd, sv in ((r.measures or {}).get('global') or {}).items():
        by_round.setdefault(rnd, []).append(_effective_rank(sv))
      for item in (r.measures or {}).get('local') or []:
        gaps.setdefault((item['client'], item['round']), []).append(
            (item['gap'], _effective_rank(item['sv'])))
    s['effective_rank_by_round'] = {rnd: (*_mean_std(v), len(v))
                                    for rnd, v in sorted(by_round.items())}
    s['local_gap'] = {k: (*_mean_std([g for g, _ in v]), *_mean_std([e for _, e in v]), len(v))
                      for k, v in sorted(gaps.items())}
  if 'regularizer' in columns:
    baselines = [row for row in rows if row.value('regularizer') == BASELINE]
    for row in rows:
      if row.value('regularizer') == BASELINE:
        continue
      # The same configuration with no regulariser; a setting the baseline does not have (the
      # row's --feddecorr_beta) does not tell them apart.
      base = next((b for b in baselines if all(
          b.value(a) in (v, '') for a, v in row.key if a != 'regularizer')), None)
      for metric in ('final_test_accuracy', 'best_test_accuracy'):
        delta = math.nan
        if base is not None and row.stats['n_done'] and base.stats['n_done']:
          delta = row.stats[f'{metric}_mean'] - base.stats[f'{metric}_mean']
        row.stats[f'{metric}_delta_vs_none'] = delta
  return rows


# ---- curves ----

def read_curve(path: str, column: str = 'test_accuracy') -> Tuple[np.ndarray, np.ndarray]:
  """(rounds, values) of a run's metrics.csv, rounds where the column was recorded."""
  xs, ys = [], []
  try:
    with open(os.path.join(path, 'metrics.csv'), newline='') as f:
      for row in csv.DictReader(f):
        if row.get(column) not in (None, ''):
          xs.append(int(float(row['round'])))
          ys.append(float(row[column]))
  except OSError:
    pass
  order = np.argsort(xs, kind='stable')
  return np.asarray(xs)[order], np.asarray(ys, dtype=np.float64)[order]


# ---- spectra ----

@dataclasses.dataclass(frozen=True)
class SpectraInput:
  """What a run's spectra are measured on when it has no spectra.json: its task's test split."""
  data_dir: Optional[str] = None      # TFDS data directory; None: the run's config.json's.
  max_examples: Optional[int] = None  # Cap on the test examples; None: all of them.
  batch_size: int = 256               # Batch size of the forward passes.


def add_spectra(runs: Sequence[Run], source: SpectraInput = SpectraInput(),
                log: Callable[[str], None] = print) -> List[str]:
  """Each finished run's collapse measures (run_spectra): its spectra.json where it has one (an
  archived study), else computed from its exports over `source` (as bin/analyze).
  `run.spectrum` is the last round's. Returns notes on runs whose spectra could not be computed
  (the rest of the report stands)."""
  notes = []
  datasets: Dict[tuple, Any] = {}
  for run in runs:
    if not run.done:
      continue
    measures = run_spectra.read(run.path)
    if measures is None:
      try:
        measures = compute_measures(run, datasets, source)
      except (ValueError, KeyError, OSError) as e:  # A missing dataset, a damaged export.
        notes.append(f'{run.name}: no spectrum ({e})')
        continue
    if not measures['global']:
      continue
    run.measures = measures
    run.spectrum = measures['global'][max(measures['global'])]
    from tff_decorr.collapse import analysis  # pylint: disable=g-import-not-at-top
    run.spectrum_summary = analysis.spectrum_summary(run.spectrum)
    log(f'spectrum of {run.name}: effective rank {run.spectrum_summary["effective_rank"]:.2f} '
        f'of {run.spectrum.size} (rounds {", ".join(map(str, sorted(measures["global"])))})')
  return notes


def compute_measures(run: Run, datasets: Dict[tuple, Any], source: SpectraInput) -> dict:
  """run_spectra.compute for `run` over `source`, its task's test split loaded once per (task, data
  dir) into `datasets`."""
  # TensorFlow only when there is something to load: the table and curves need none.
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  config = run.config or (run.summary or {}).get('config') or {}
  task = task_registry.get(config.get('task', 'digits'))
  where = (task.name, source.data_dir or config.get('data_dir') or None)

  def dataset():
    if where not in datasets:
      datasets[where] = task.test_dataset(where[1], source.batch_size)
    return datasets[where]

  def load(model_dir):
    fn, meta = export.load_serving(model_dir, flag=run.name)
    export.check_compatible(fn, meta, task.num_classes, task.input_shape, task.name, run.name)
    return fn

  final_round = int((run.summary or {}).get('final_round', run.rounds))
  measures = run_spectra.compute(run.path, final_round, dataset, load, source.max_examples)
  return run_spectra.read_measures(measures)

