"""A study's report (bin/report): a paper-style table, accuracy curves, collapse spectra, one page.

The study's manifest (tff_decorr/studies/study.py, study.json) says which runs belong to it and how
they differ; each run's own files say how far it got. A row of the table is one configuration of the
grid with every seed folded in: mean and sample standard deviation (ddof=1, as papers report over
seeds) of the final and best test accuracy of its *finished* runs only. A run that has not finished
(not started, stopped part-way, failed) is listed in its row and drawn dotted in the curves, never
averaged in.

Spectra use the collapse measures of tff_decorr/collapse/analysis.py on each finished run's exported
SavedModel over its task's test split, as bin/analyze computes them, at every round the run exported
(`--export_every`) or tracked (`--track_collapse`), and the local-vs-global gap of the clients whose
local models it saved (tff_decorr/studies/run_spectra.py). `archive` writes a study's compact copy
(manifest, and per finished run its config, summary, metrics and spectra.json: a few KB, no
SavedModel) that `build` reads back as it reads the study itself.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import html
import io
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_decorr.collapse import plots
from tff_decorr.run_files import run_dir as run_dir_lib
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


def analysis_effective_rank(sv) -> float:
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
        by_round.setdefault(rnd, []).append(analysis_effective_rank(sv))
      for item in (r.measures or {}).get('local') or []:
        gaps.setdefault((item['client'], item['round']), []).append(
            (item['gap'], analysis_effective_rank(item['sv'])))
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


def _curve_axes(axes: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(axes told apart by line, axes told apart by panel): a panel compares algorithms and
  regularisers (with their own settings, e.g. --fedprox_mu) at one setting of everything else
  (the partition's --dirichlet_alpha, --client_lr, ...)."""
  from tff_decorr.configs import config  # pylint: disable=g-import-not-at-top
  own = {spec.name for kind, _, spec in config.component_flag_specs()
         if kind in ('algorithm', 'regularizer')}
  columns = [a for a in axes if a != SEED]
  lines = [a for a in columns if a in ('algorithm', 'regularizer') or a in own]
  panels = [a for a in columns if a not in lines]
  return (lines, panels) if lines else (panels, [])


@dataclasses.dataclass(frozen=True)
class Style:
  """How a configuration is drawn in every figure: its legend label and its colour."""
  label: str
  color: str


def _part(axis: str, value: str) -> str:
  return value if axis in ('algorithm', 'regularizer') else f'{axis}={value}'


def styles(rows: Sequence[Row], axes: Sequence[str]) -> Dict[tuple, Style]:
  """{line key: Style}: one colour per configuration (the values of the axes told apart by line,
  `line_key`), the same in the curves and the spectra, in the order configurations first appear.

  Labels name only what tells the configurations apart: an axis is left out of every label when
  the labels stay distinct without it (`fedprox_mu=0.01` beside `fedprox`, when FedProx has one
  value of it), the regulariser's and algorithm's names last of all."""
  line_axes, _ = _curve_axes(axes)
  keys = list(dict.fromkeys(line_key(row, line_axes) for row in rows))
  shown = list(line_axes)
  for axis in sorted(line_axes, key=lambda a: a in ('algorithm', 'regularizer')):
    rest = [a for a in shown if a != axis]
    labels = {tuple((a, dict(k).get(a, '')) for a in rest) for k in keys}
    if len(labels) == len(keys):
      shown = rest
  palette = [f'C{i}' for i in range(10)]
  if len(keys) > len(palette):  # More configurations than tab10 has colours: tab20's.
    from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
    palette = [colormaps['tab20'](i) for i in range(20)]
    palette = ['#%02x%02x%02x' % tuple(int(255 * c) for c in rgba[:3]) for rgba in palette]
  out = {}
  for i, key in enumerate(keys):
    values = dict(key)
    label = ' + '.join(_part(a, values[a]) for a in shown if values.get(a)) or 'mean over seeds'
    out[key] = Style(label=label, color=palette[i % len(palette)])
  return out


def line_key(row: Row, line_axes: Sequence[str]) -> tuple:
  """The values of the axes told apart by line (`_curve_axes`): the configuration a colour
  stands for."""
  return tuple((a, row.value(a)) for a in line_axes)


def panel_title(row: Row, panel_axes: Sequence[str]) -> str:
  """The setting of the axes told apart by panel, e.g. 'dirichlet_alpha=0.1' ('' for one panel)."""
  return ' '.join(f'{a}={row.value(a)}' for a in panel_axes if row.value(a))


def curves(rows: Sequence[Row], axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.curves_figure panels: per row, the mean test accuracy over its finished runs with a
  +-std band, on the rounds every one of them recorded; unfinished runs dotted, on their own.
  Labels and colours are `styles`'."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  panels: Dict[str, List[dict]] = {}
  for row in rows:
    s = style[line_key(row, line_axes)]
    out = panels.setdefault(panel_title(row, panel_axes), [])
    finished = [read_curve(r.path) for r in row.runs if r.done]
    finished = [c for c in finished if c[0].size]
    if finished:
      common = sorted(set.intersection(*(set(x.tolist()) for x, _ in finished)))
      ys = np.stack([y[np.isin(x, common)] for x, y in finished])
      out.append({'label': s.label, 'color': s.color, 'x': common, 'y': ys.mean(0),
                  'std': ys.std(0, ddof=1) if len(finished) > 1 else None})
    for r in row.runs:
      if not r.done:
        x, y = read_curve(r.path)
        if x.size:
          out.append({'label': f'{s.label}, {SEED}={r.flags.get(SEED, "?")} ({r.status}, '
                               f'{r.rounds_done}/{r.rounds} rounds)', 'color': s.color,
                      'x': x, 'y': y, 'incomplete': True})
  return {p: c for p, c in panels.items() if c}


# ---- spectra ----

def add_spectra(runs: Sequence[Run], data_dir: Optional[str] = None,
                max_examples: Optional[int] = None, batch_size: int = 256,
                log: Callable[[str], None] = print) -> List[str]:
  """Each finished run's collapse measures (run_spectra): its spectra.json where it has one (an
  archived study), else computed from its exports over its task's test split (as bin/analyze).
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
        measures = _compute_measures(run, datasets, data_dir, max_examples, batch_size)
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


def _compute_measures(run: Run, datasets: Dict[tuple, Any], data_dir: Optional[str],
                      max_examples: Optional[int], batch_size: int) -> dict:
  """run_spectra.compute for `run`, its task's test split loaded once per (task, data dir)."""
  # TensorFlow only when there is something to load: the table and curves need none.
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_decorr.run_files import export  # pylint: disable=g-import-not-at-top
  config = run.config or (run.summary or {}).get('config') or {}
  task = task_registry.get(config.get('task', 'digits'))
  where = (task.name, data_dir or config.get('data_dir') or None)

  def dataset():
    if where not in datasets:
      datasets[where] = task.test_dataset(where[1], batch_size)
    return datasets[where]

  def load(model_dir):
    fn, meta = export.load_serving(model_dir, flag=run.name)
    export.check_compatible(fn, meta, task.num_classes, task.input_shape, task.name, run.name)
    return fn

  final_round = int((run.summary or {}).get('final_round', run.rounds))
  measures = run_spectra.compute(run.path, final_round, dataset, load, max_examples)
  return run_spectra.read_measures(measures)


def mean_spectrum(row: Row) -> Optional[np.ndarray]:
  """The mean over a row's finished runs of their descending singular values, each divided by its
  largest (runs whose representations differ in scale weigh the same); None without spectra."""
  svs = [np.sort(r.spectrum)[::-1] for r in row.runs if r.done and r.spectrum is not None]
  svs = [s / s[0] for s in svs if s.size and s[0] > 0]
  if not svs or len({s.size for s in svs}) != 1:
    return None
  return np.mean(np.stack(svs), 0)


def spectra_panels(rows: Sequence[Row], axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.spectra_figure panels: per row with spectra, its mean normalised spectrum, in the
  panels of `curves` with `styles`' labels and colours."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  panels: Dict[str, List[dict]] = {}
  for row in rows:
    sv = mean_spectrum(row)
    if sv is not None:
      s = style[line_key(row, line_axes)]
      panels.setdefault(panel_title(row, panel_axes), []).append(
          {'label': s.label, 'color': s.color, 'sv': sv})
  return panels


# ---- rendering ----

def _pct(mean: float, std: float) -> str:
  if math.isnan(mean):
    return '—'
  return f'{100 * mean:.2f} ± {100 * std:.2f}' if not math.isnan(std) else f'{100 * mean:.2f}'


def _signed_pct(delta: float) -> str:
  return '—' if delta is None or math.isnan(delta) else f'{100 * delta:+.2f}'


def _num(mean: float, std: float) -> str:
  if math.isnan(mean):
    return '—'
  return f'{mean:.2f} ± {std:.2f}' if not math.isnan(std) else f'{mean:.2f}'


def compares_regularizers(rows: Sequence[Row], axes: Sequence[str]) -> bool:
  """Whether the table has the Δ vs --regularizer=none columns: it has more than one regulariser
  (a report of run directories shows the regulariser of a single one too)."""
  return 'regularizer' in axes and len({row.value('regularizer') for row in rows}) > 1


def table(rows: Sequence[Row], axes: Sequence[str], spectra: bool) -> Tuple[List[str], List[list]]:
  """(header, cells) of the paper-style table, accuracies in percent."""
  columns = [a for a in axes if a != SEED]
  deltas = compares_regularizers(rows, axes)
  header = [*columns, 'seeds done', 'final acc. (%)', 'best acc. (%)']
  if deltas:
    header += ['Δ final vs none', 'Δ best vs none']
  if spectra:
    header += ['effective rank']
  header += ['not finished']
  body = []
  for row in rows:
    s = row.stats
    cells = [row.value(a) or '—' for a in columns]
    cells += [f'{s["n_done"]}/{s["n_runs"]}',
              _pct(s['final_test_accuracy_mean'], s['final_test_accuracy_std']),
              _pct(s['best_test_accuracy_mean'], s['best_test_accuracy_std'])]
    if deltas:
      cells += [_signed_pct(s.get('final_test_accuracy_delta_vs_none')),
                _signed_pct(s.get('best_test_accuracy_delta_vs_none'))]
    if spectra:
      cells += [_num(s['effective_rank_mean'], s['effective_rank_std'])]
    cells += ['; '.join(s['not_done']) or '']
    body.append(cells)
  return header, body


def progress_table(rows: Sequence[Row], axes: Sequence[str],
                   thresholds: Sequence[float]) -> Tuple[List[str], List[list]]:
  """(header, cells): per configuration, the first round at which the test accuracy reached each
  threshold, mean ± std over the finished runs that reached it, and how many did."""
  columns = [a for a in axes if a != SEED]
  header = [*columns, *(f'rounds to {100 * t:g} %' for t in thresholds)]
  body = []
  for row in rows:
    cells = [row.value(a) or '—' for a in columns]
    for t in thresholds:
      mean, std, reached, n = row.stats['rounds_to'][t]
      cells.append(f'{_num(mean, std) if reached else "not reached"} ({reached}/{n} runs)')
    body.append(cells)
  return header, body


def collapse_table(rows: Sequence[Row], axes: Sequence[str]) -> Tuple[List[str], List[list]]:
  """(header, cells): per configuration, the global model's effective rank at each round that has
  spectra, and each saved local model's gap R to the global model of its round (analysis.
  local_global_gap: < 0 when the local model is the more collapsed) with its effective rank."""
  columns = [a for a in axes if a != SEED]
  rounds = sorted({r for row in rows for r in row.stats['effective_rank_by_round']})
  locals_ = sorted({k for row in rows for k in row.stats['local_gap']},
                   key=lambda k: (k[1], k[0]))
  header = [*columns, *(f'effective rank, round {r}' for r in rounds)]
  for client, rnd in locals_:
    header += [f'gap R local-global (client {client}, round {rnd})',
               f'local effective rank (client {client}, round {rnd})']
  body = []
  for row in rows:
    st = row.stats
    cells = [row.value(a) or '—' for a in columns]
    for r in rounds:
      mean, std, _ = st['effective_rank_by_round'].get(r, (math.nan, math.nan, 0))
      cells.append(_num(mean, std))
    for k in locals_:
      g_mean, g_std, e_mean, e_std, _ = st['local_gap'].get(k, (math.nan,) * 4 + (0,))
      cells += [_num(g_mean, g_std), _num(e_mean, e_std)]
    body.append(cells)
  return header, body


def spectra_by_round_panels(rows: Sequence[Row], axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.spectra_figure panels, one per round with spectra (and per panel of `curves` when the
  study has more than one): each configuration's mean normalised spectrum at that round, and the
  saved local models' of that round dashed."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  rounds = sorted({r for row in rows for run in row.runs if run.done and run.measures
                   for r in run.measures['global']})
  panels: Dict[str, List[dict]] = {}
  for rnd in rounds:
    for row in rows:
      s = style[line_key(row, line_axes)]
      title = ' '.join(filter(None, [f'round {rnd}', panel_title(row, panel_axes)]))
      svs = [run.measures['global'][rnd] for run in row.runs
             if run.done and run.measures and rnd in run.measures['global']]
      sv = _mean_normalised(svs)
      if sv is not None:
        panels.setdefault(title, []).append({'label': s.label, 'color': s.color, 'sv': sv})
      local = [item['sv'] for run in row.runs if run.done and run.measures
               for item in run.measures['local'] if item['round'] == rnd]
      sv = _mean_normalised(local)
      if sv is not None:
        panels.setdefault(title, []).append({'label': f'{s.label}, a local model',
                                             'color': s.color, 'sv': sv, 'linestyle': '--'})
  return panels


def _mean_normalised(svs: Sequence[np.ndarray]) -> Optional[np.ndarray]:
  svs = [np.sort(np.asarray(v))[::-1] for v in svs]
  svs = [v / v[0] for v in svs if v.size and v[0] > 0]
  if not svs or len({v.size for v in svs}) != 1:
    return None
  return np.mean(np.stack(svs), 0)


def write_csv(path: str, rows: Sequence[Row], axes: Sequence[str]) -> str:
  """Machine-readable table: accuracies as fractions, full precision, empty where undefined."""
  columns = [a for a in axes if a != SEED]
  fields = ['final_test_accuracy_mean', 'final_test_accuracy_std', 'best_test_accuracy_mean',
            'best_test_accuracy_std', 'final_test_accuracy_delta_vs_none',
            'best_test_accuracy_delta_vs_none', 'effective_rank_mean', 'effective_rank_std']
  with open(path, 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow([*columns, 'n_done', 'n_runs', 'seeds_done', *fields, 'not_done'])
    for row in rows:
      s = row.stats
      values = [s.get(k) for k in fields]
      w.writerow([*(row.value(a) for a in columns), s['n_done'], s['n_runs'],
                  ' '.join(s['seeds_done']),
                  *('' if v is None or math.isnan(v) else repr(float(v)) for v in values),
                  '; '.join(s['not_done'])])
  return path


_LATEX_SPECIAL = {'\\': r'\textbackslash{}', '&': r'\&', '%': r'\%', '$': r'\$', '#': r'\#',
                  '_': r'\_', '{': r'\{', '}': r'\}', '~': r'\textasciitilde{}',
                  '^': r'\textasciicircum{}', '—': '--', '±': r'$\pm$', 'Δ': r'$\Delta$'}


def latex_escape(text: str) -> str:
  return ''.join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_columns(spectra: bool, deltas: bool) -> List[Tuple[str, str, float]]:
  """(heading, stats key, scale) of the table's numeric columns, each with its mean and std in
  row.stats[key + '_mean' / '_std'] (the Δ columns: key alone, no std)."""
  columns = [('final acc. (%)', 'final_test_accuracy', 100.0),
             ('best acc. (%)', 'best_test_accuracy', 100.0)]
  if deltas:
    columns += [('Δ final vs none', 'final_test_accuracy_delta_vs_none', 100.0),
                ('Δ best vs none', 'best_test_accuracy_delta_vs_none', 100.0)]
  if spectra:
    columns += [('effective rank', 'effective_rank', 1.0)]
  return columns


def latex(rows: Sequence[Row], axes: Sequence[str], spectra: bool) -> str:
  """The table as a LaTeX tabular (booktabs: \\toprule, \\midrule, \\bottomrule): mean ± std
  per configuration, the best value of each numeric column in bold (the highest: accuracy, its
  difference from --regularizer=none, and the effective rank, which FedDecorr raises), compared as
  printed so ties are all bold. Needs \\usepackage{booktabs}."""
  grid = [a for a in axes if a != SEED]
  numeric = latex_columns(spectra, compares_regularizers(rows, axes))
  cells: List[List[str]] = []
  shown: List[List[Optional[float]]] = []  # The printed means, to find each column's best.
  for row in rows:
    st = row.stats
    texts, means = [], []
    for _, key, scale in numeric:
      delta = key.endswith('_delta_vs_none')
      mean = st.get(key if delta else f'{key}_mean', math.nan)
      std = math.nan if delta else st.get(f'{key}_std', math.nan)
      if mean is None or math.isnan(mean):
        texts.append('--')
        means.append(None)
        continue
      text = f'{scale * mean:+.2f}' if delta else f'{scale * mean:.2f}'
      means.append(float(text))
      text = text.replace('-', '$-$', 1)  # A minus sign, not a hyphen.
      texts.append(text + (f' $\\pm$ {scale * std:.2f}' if not math.isnan(std) else ''))
    cells.append(texts)
    shown.append(means)
  best = []
  for j in range(len(numeric)):
    values = [m[j] for m in shown if m[j] is not None]
    best.append(max(values) if len(values) > 1 else None)  # One value is no contest.
  lines = ['% ' + line for line in (
      'Generated by bin/report --latex; needs \\usepackage{booktabs}.',
      'Mean ± sample std (ddof=1) over the finished runs of each row (seeds); accuracies in %;',
      'bold: the best (highest) value of each column.')]
  lines.append('\\begin{tabular}{' + 'l' * len(grid) + 'c' + 'r' * len(numeric) + '}')
  lines.append('\\toprule')
  lines.append(' & '.join([*(latex_escape(a) for a in grid), 'seeds',
                          *(latex_escape(h) for h, _, _ in numeric)]) + r' \\')
  lines.append('\\midrule')
  for row, texts, means in zip(rows, cells, shown):
    values = [latex_escape(row.value(a) or '—') for a in grid]
    values.append(f'{row.stats["n_done"]}/{row.stats["n_runs"]}')
    for j, text in enumerate(texts):
      values.append(f'\\textbf{{{text}}}' if best[j] is not None and means[j] == best[j]
                    else text)
    lines.append(' & '.join(values) + r' \\')
  lines.append('\\bottomrule')
  lines.append('\\end{tabular}')
  return '\n'.join(lines) + '\n'


def _md_escape(text: str) -> str:
  return str(text).replace('|', '\\|')


Table = Tuple[str, Sequence[str], Sequence[list]]  # (title, header, rows of cells)


def _md_table(header: Sequence[str], body: Sequence[list]) -> List[str]:
  lines = ['| ' + ' | '.join(map(_md_escape, header)) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  return lines + ['| ' + ' | '.join(map(_md_escape, cells)) + ' |' for cells in body]


def markdown(title: str, header: Sequence[str], body: Sequence[list], notes: Sequence[str],
             images: Mapping[str, str], tables: Sequence[Table] = ()) -> str:
  """The page as Markdown: the main table first (bin/report prints it up to its notes), then the
  notes, the other `tables` and the images."""
  lines = [f'# {title}', '', *_md_table(header, body), '']
  lines += [f'- {n}' for n in notes]
  lines.append('')
  for name, extra_header, extra_body in tables:
    lines += [f'## {name}', '', *_md_table(extra_header, extra_body), '']
  lines += [f'![{name}]({os.path.basename(path)})' for name, path in images.items()]
  return '\n'.join(lines) + '\n'


def _data_uri(path: str) -> str:
  with open(path, 'rb') as f:
    return 'data:image/png;base64,' + base64.b64encode(f.read()).decode('ascii')


def _html_table(header: Sequence[str], body: Sequence[list]) -> str:
  e = html.escape
  out = '<table>\n<tr>' + ''.join(f'<th>{e(h)}</th>' for h in header) + '</tr>\n'
  for cells in body:
    out += '<tr>' + ''.join(
        f'<td class="num">{e(c)}</td>' if any(ch.isdigit() for ch in c[:2]) or c[:1] in '+-—'
        else f'<td>{e(c)}</td>' for c in map(str, cells)) + '</tr>\n'
  return out + '</table>\n'


def html_page(title: str, header: Sequence[str], body: Sequence[list], notes: Sequence[str],
              images: Mapping[str, str], tables: Sequence[Table] = ()) -> str:
  """One self-contained page: inline style, images as data: URIs, nothing fetched."""
  e = html.escape
  out = io.StringIO()
  out.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>{e(title)}</title><style>'
            'body{font-family:sans-serif;margin:2em;max-width:95em}'
            'table{border-collapse:collapse;font-size:0.9em}'
            'th,td{border:1px solid #bbb;padding:0.3em 0.6em;text-align:left}'
            'th{background:#eee}td.num{text-align:right;white-space:nowrap}'
            'img{max-width:100%;border:1px solid #ddd;margin:1em 0}'
            '</style></head><body>\n')
  out.write(f'<h1>{e(title)}</h1>\n' + _html_table(header, body))
  out.write('<ul>\n' + ''.join(f'<li>{e(n)}</li>\n' for n in notes) + '</ul>\n')
  for name, extra_header, extra_body in tables:
    out.write(f'<h2>{e(name)}</h2>\n' + _html_table(extra_header, extra_body))
  for name, path in images.items():
    out.write(f'<h2>{e(name)}</h2>\n<img alt="{e(name)}" src="{_data_uri(path)}">\n')
  out.write('</body></html>\n')
  return out.getvalue()


def build(study_dir: str, output_dir: str, spectra: bool = True, data_dir: Optional[str] = None,
          max_examples: Optional[int] = None, batch_size: int = 256,
          log: Callable[[str], None] = print, latex_table: bool = False,
          thresholds: Sequence[float] = ()) -> Dict[str, str]:
  """Writes the report of the study in `study_dir` to `output_dir`.

  The report: a table over seeds (Markdown, CSV), accuracy curves, collapse spectra and one
  self-contained HTML page (docs/studies.md).

  Args:
    study_dir: a bin/study directory (its study.json and runs/).
    output_dir: where the report's files go (created).
    spectra: measure each run's exported model (spectra.json, figures); False skips it.
    data_dir: the TFDS data directory of the test split (default: each run's config.json's).
    max_examples: cap on the test examples the spectra use, None for all.
    batch_size: batch size of the spectra's forward passes.
    log: where progress lines go.
    latex_table: also write table.tex (`latex`).
    thresholds: test accuracies (fractions) whose first round each configuration reached, as a
      table (`progress_table`).

  Returns:
    {kind: path} of the files written ('csv', 'markdown', 'html', the figures' formats).

  Raises:
    study.StudyError: `study_dir` is no study (no study.json) or lists no runs; the message says
      what to do.
  """
  manifest = study.read_manifest(study_dir)
  runs = load_runs(study_dir, manifest)
  if not runs:
    raise study.StudyError(f'--study_dir={study_dir}: study.json lists no runs; run bin/study '
                           'first.')
  title = f'Study {os.path.basename(os.path.normpath(study_dir))}'
  return _build(runs, manifest, output_dir, title, study_dir, spectra=spectra, data_dir=data_dir,
                max_examples=max_examples, batch_size=batch_size, log=log,
                latex_table=latex_table, thresholds=thresholds)


def build_runs(run_dirs: Sequence[str], output_dir: str, **kwargs) -> Dict[str, str]:
  """Writes the report of bin/train run directories to `output_dir`, as `build` writes a study's.

  The runs are read as a study (`manifest_of_runs`): a row per configuration, folded over seeds.

  Args:
    run_dirs: run directories bin/train (or tff_decorr.train) wrote, each holding config.json.
    output_dir: where the report's files go (created).
    **kwargs: `build`'s keyword arguments (spectra, data_dir, max_examples, batch_size, log,
      latex_table, thresholds).

  Returns:
    {kind: path} of the files written ('csv', 'markdown', 'html', the figures' formats).

  Raises:
    study.StudyError: no directory given, or one that is not a run directory (the message names
      --run_dir and the fix).
  """
  manifest = manifest_of_runs(run_dirs)
  runs = load_runs('', manifest)
  names = [r.name for r in runs]
  title = f'Run {names[0]}' if len(names) == 1 else f'Runs {", ".join(names)}'
  where = ', '.join(r.path for r in runs)
  return _build(runs, manifest, output_dir, title, where, **kwargs)


def _build(runs: Sequence[Run], manifest: Mapping[str, Any], output_dir: str, title: str,
           where: str, spectra: bool = True, data_dir: Optional[str] = None,
           max_examples: Optional[int] = None, batch_size: int = 256,
           log: Callable[[str], None] = print, latex_table: bool = False,
           thresholds: Sequence[float] = ()) -> Dict[str, str]:
  """The report of `runs` (a study's manifest, or `manifest_of_runs`') in `output_dir`."""
  axes = list(manifest.get('axes') or [])
  notes = []
  if spectra:
    notes += add_spectra(runs, data_dir, max_examples, batch_size, log)
  have_spectra = any(r.spectrum is not None for r in runs)
  rows = group(runs, axes, thresholds)
  os.makedirs(output_dir, exist_ok=True)
  written = {'csv': write_csv(os.path.join(output_dir, 'table.csv'), rows, axes)}
  images = {}
  panels = curves(rows, axes)
  if panels:
    path = os.path.join(output_dir, 'curves.png')
    images['Test accuracy per round (mean ± std over seeds)'] = plots.plot_curves(
        panels, path, formats=plots.FORMATS)
    written.update({f'curves_{f}': p for f, p in plots.figure_paths(path).items()})
  spectrum_panels = spectra_panels(rows, axes)
  if spectrum_panels:
    path = os.path.join(output_dir, 'spectra.png')
    top = max(item['sv'].size for items in spectrum_panels.values() for item in items)
    images['Representation spectrum (mean over seeds, relative to its largest value)'] = (
        plots.plot_spectra_panels(spectrum_panels, path, top=top, formats=plots.FORMATS))
    written.update({f'spectra_{f}': p for f, p in plots.figure_paths(path).items()})
  by_round = spectra_by_round_panels(rows, axes)
  if len(by_round) > len(spectrum_panels):  # More than the last round's: spectra over rounds.
    path = os.path.join(output_dir, 'spectra_by_round.png')
    top = max(item['sv'].size for items in by_round.values() for item in items)
    images['Representation spectrum by round (mean over seeds, relative to its largest value; '
           'dashed: a client\'s local model of that round)'] = plots.plot_spectra_panels(
               by_round, path, top=top, formats=plots.FORMATS)
    written.update({f'spectra_by_round_{f}': p for f, p in plots.figure_paths(path).items()})
  tables: List[Table] = []
  if thresholds:
    tables.append(('Rounds to reach a test accuracy', *progress_table(rows, axes, thresholds)))
  if any(r.measures for r in runs):
    tables.append(('Collapse by round', *collapse_table(rows, axes)))
  counts = {s: sum(r.status == s for r in runs) for s in ('done', 'incomplete', 'not started',
                                                         'failed')}
  done_text = ', '.join(f'{n} {s}' for s, n in counts.items() if n)
  notes = [f'{len(runs)} runs ({done_text}) in {where}; generated '
           f'{time.strftime("%Y-%m-%d %H:%M:%S")}.',
           'Accuracy: test accuracy of the global model (personalised algorithms: the mean of the '
           "clients' own models), in percent; mean ± sample standard deviation (ddof=1) over the "
           'finished runs of each row only; unfinished runs are listed in their row and drawn '
           'dotted in the curves, never averaged in.'] + (
               ['Δ vs none: the row\'s mean minus the mean of the same configuration with '
                '--regularizer=none (percentage points).'] if compares_regularizers(rows, axes)
               else []) + (
                    ['Effective rank: exp(entropy) of the normalised singular values of the '
                     "representation covariance over the task's test split (docs/analysis.md)."]
                    if have_spectra else []) + list(manifest.get('notes', [])) + notes
  header, body = table(rows, axes, have_spectra)
  md = markdown(title, header, body, notes, images, tables)
  written['markdown'] = os.path.join(output_dir, 'table.md')
  with open(written['markdown'], 'w') as f:
    f.write(md)
  if latex_table:
    written['latex'] = os.path.join(output_dir, 'table.tex')
    with open(written['latex'], 'w') as f:
      f.write(latex(rows, axes, have_spectra))
  written['html'] = os.path.join(output_dir, 'report.html')
  with open(written['html'], 'w') as f:
    f.write(html_page(title, header, body, notes, images, tables))
  return written


# ---- archive ----

ARCHIVED_FILES = ('config.json', 'summary.json', 'metrics.csv')


def archive(study_dir: str, archive_dir: str, data_dir: Optional[str] = None,
            max_examples: Optional[int] = None, batch_size: int = 256,
            log: Callable[[str], None] = print,
            manifest: Optional[Mapping[str, Any]] = None) -> List[str]:
  """Copies the study's finished runs into `archive_dir` as a study `build` reads: study.json (its
  cells, merged with those the archive already holds, so runs archived from other machines stay)
  and per run config.json, summary.json, metrics.csv and spectra.json (run_spectra; computed from
  the exports unless the run has one). Nothing else (no SavedModel, checkpoint or log): a few KB a
  run, to commit. `manifest`: the study's instead of <study_dir>/study.json (bin/train run
  directories: `manifest_of_runs`, with `study_dir` ''). Returns the names of the runs archived
  now."""
  manifest = manifest if manifest is not None else study.read_manifest(study_dir)
  runs = {r.name: r for r in load_runs(study_dir, manifest)}
  os.makedirs(archive_dir, exist_ok=True)
  old = study.read_json(os.path.join(archive_dir, study.MANIFEST)) or {}
  cells = {c['name']: c for c in old.get('cells', [])}
  archived, datasets = [], {}
  for cell in manifest['cells']:
    run = runs[cell['name']]
    if not run.done:
      continue
    dest = os.path.join(archive_dir, study.RUNS, run.name)
    os.makedirs(dest, exist_ok=True)
    # Archived before from the same finished run (the same summary): its measures are reused.
    same = study.read_json(os.path.join(dest, 'summary.json')) == run.summary
    measures = run_spectra.read(run.path) or (run_spectra.read(dest) if same else None)
    for name in ARCHIVED_FILES:
      with open(os.path.join(run.path, name), 'rb') as f:
        data = f.read()
      run_dir_lib.atomic_write(os.path.join(dest, name), lambda out, d=data: out.write(d), 'wb')
    if measures is None:
      measures = _compute_measures(run, datasets, data_dir, max_examples, batch_size)
    run_spectra.write(dest, {'version': run_spectra.VERSION,
                             'global': {str(r): v.tolist() for r, v in measures['global'].items()},
                             'local': [dict(i, sv=i['sv'].tolist()) for i in measures['local']]})
    # Paths relative to the archive; the command and log of the machine that ran it are dropped.
    entry = {**{k: v for k, v in cell.items() if k not in ('command', 'log', 'pid')},
             'run_dir': os.path.join(study.RUNS, run.name),
             'log': os.path.join(study.LOGS, f'{run.name}.log'), 'status': 'done'}
    # The same finished run archived again from a later sitting, whose manifest may lack what the
    # sitting that ran it recorded (exit code, wall time): keep the archive's.
    cells[run.name] = {**cells[run.name], **entry} if same and run.name in cells else entry
    archived.append(run.name)
    log(f'archived {run.name} -> {dest}')
  # The axes are the flags whose values differ between the archive's cells (one study's grid may
  # have held a single seed; together they hold several).
  names = list(dict.fromkeys([*(old.get('axes') or []), *(manifest.get('axes') or []),
                              *(f for c in cells.values() for f in c['flags'])]))
  grid = {n: list(dict.fromkeys(c['flags'].get(n, '') for c in cells.values())) for n in names}
  axes = [n for n in names if len(grid[n]) > 1]
  run_dir_lib.write_json_atomic(os.path.join(archive_dir, study.MANIFEST), {
      'version': study.MANIFEST_VERSION, 'updated': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      'command': [], 'grid': grid, 'axes': axes, 'notes': manifest.get('notes', []),
      'cells': list(cells.values())})
  return archived
