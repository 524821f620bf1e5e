r"""Dimensional-collapse analysis of exported models: spectra CSV, JSON summary and figures.

  python -m bin.analyze --saved_model=runs/fedavg,runs/feddecorr --output_dir=analysis/cifar10

  # local (one client's model) vs global model of the same round, with the gap R; the run was
  # trained with --save_local_models=0 --save_local_rounds=30 --export_every=10:
  python -m bin.analyze --local_saved_model=runs/x/local_models/round_30/client_0 \
    --global_saved_model=runs/x/export/round_30 --output_dir=analysis/lg

  # add the nearest-class-mean probe (is a low accuracy the representation's or the head's?):
  python -m bin.analyze --saved_model=runs/fedavg,runs/feddecorr --output_dir=analysis/cifar10 \
    --probe

Each --saved_model is a SavedModel directory or a run directory holding `export/saved_model`
(contract in tff_decorr/run_files/export.py). A run writes its local models (--save_local_models,
--save_local_rounds) to <run>/local_models/round_<r>/client_<id>, its global model of round r
(--export_every) to <run>/export/round_<r>, and its final one to <run>/export/saved_model. The task
and its data directory are those of the runs the models belong to (their config.json) unless
--task or --data_dir is given. The covariance of its representations over the task's test split
is accumulated batch by batch (tff_decorr/collapse/analysis.py); quantities are defined in
docs/analysis.md. Writes <output_dir>/spectra.csv (one column per run), summary.json, spectra.png
(each spectrum relative to its largest value, cut at the floor bin/report's figures use) and, for
the local/global pair, local_global.csv and local_vs_global.png. Bad input exits with code 2 and a
one-line error naming the flag.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence

from absl import app
from absl import flags
import numpy as np

# Nothing imported here imports TensorFlow (analysis, export and plots are loaded on first use):
# --help and a mistyped flag answer at once; cli.parse_flags_or_exit imports TensorFlow once they
# are parsed.
from tff_decorr import collapse
from tff_decorr import lazy
from tff_decorr import tf_env
from tff_decorr.configs import cli
from tff_decorr.run_files import run_dir

analysis = lazy.lazy_module('tff_decorr.collapse.analysis')
export = lazy.lazy_module('tff_decorr.run_files.export')
plots = lazy.lazy_module('tff_decorr.collapse.plots')

_SAVED_MODEL = flags.DEFINE_string(
    'saved_model', None, 'Comma-separated SavedModel dirs, or run dirs containing export/saved_model.')
_LABELS = flags.DEFINE_string(
    'labels', None, 'Comma-separated labels, one per --saved_model (default: the run dir names).')
_TASK = flags.DEFINE_string('task', None, 'Task name from tasks.registry (gives the test split; '
                            'default: the task of the runs the models belong to, from their '
                            'config.json).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'TFDS data directory of the task (default: the '
                                'runs\' --data_dir, from their config.json).')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where the CSV, JSON and PNG files go.')
_LOG10_TAU = flags.DEFINE_float(
    'log10_tau', collapse.DEFAULT_LOG10_TAU, 'Significance threshold log10(tau) for num_significant.')
_TOP = flags.DEFINE_integer('top', collapse.DEFAULT_TOP, 'How many singular values to plot/list.')
_LOCAL = flags.DEFINE_string(
    'local_saved_model', None, 'Local model of the local-vs-global plot: '
    '<run>/local_models/round_<r>/client_<id> (bin/train --save_local_models, --save_local_rounds).')
_GLOBAL = flags.DEFINE_string(
    'global_saved_model', None, 'Global model of the local-vs-global plot: <run>/export/round_<r> '
    '(bin/train --export_every), or <run> for its final model.')
_GAP_K = flags.DEFINE_integer(
    'gap_k', collapse.DEFAULT_TOP, 'K of the gap R (top K values; capped at the dimension).')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Test batch size (memory only; no effect on '
                                   'the result).')
_MAX_EXAMPLES = flags.DEFINE_integer(
    'max_examples', 0, 'Use only the first N test examples (0 = all); for quick looks only.')
_TRUST = flags.DEFINE_bool(
    'trust_saved_model', False, 'Load SavedModels tff_decorr did not write (no tff_decorr.json '
    'naming their model, no run config.json) with TensorFlow, which runs the program each file '
    'holds (docs/security.md); bin/train\'s exports are read as data without it.')
_PROBE = flags.DEFINE_bool(
    'probe', False, 'Also the nearest-class-mean probe of each --saved_model: class means of its '
    'representations over the task\'s train split (no augmentation), the accuracy of the nearest '
    'mean on the test split, beside the head\'s accuracy and its predictions per class. Tells a '
    'representation that lost the classes from a head that favours one (docs/analysis.md). Costs '
    'one pass over the train split.')


class FlagError(ValueError):
  """Bad command-line input; the message starts with the flag name."""


def _split(value: Optional[str]) -> list[str]:
  return [v.strip() for v in (value or '').split(',') if v.strip()]


def default_label(path: str) -> str:
  """The run directory's name: `runs/fedavg` and `runs/fedavg/export/saved_model` -> 'fedavg'."""
  parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
  if len(parts) >= 3 and parts[-2:] == ['export', 'saved_model']:
    return parts[-3]
  return parts[-1]


def load_models(saved_models: Sequence[str], labels: Optional[Sequence[str]] = None,
                flag: str = '--saved_model',
                trust_saved_model: bool = False) -> dict[str, tuple[Any, dict]]:
  """label -> (serving function, metadata); raises FlagError/SavedModelError for bad input.
  `trust_saved_model`: export.load_serving's (a foreign SavedModel's program runs)."""
  if labels:
    if len(labels) != len(saved_models):
      raise FlagError(f'--labels has {len(labels)} entries but {flag} has {len(saved_models)}; '
                      'give one label per model.')
  else:
    labels = [default_label(p) for p in saved_models]
  if len(set(labels)) != len(labels):
    raise FlagError(f'--labels: duplicate labels {labels}; pass distinct --labels.')
  return {label: export.load_serving(path, flag, trust_saved_model)
          for label, path in zip(labels, saved_models)}


def spectrum(fn: Any, dataset: Iterable, max_examples: Optional[int] = None) -> np.ndarray:
  return analysis.singular_values(analysis.representation_covariance(fn, dataset, max_examples))


def _write_spectra_csv(path: str, spectra: Mapping[str, np.ndarray]) -> str:
  rows = max(sv.size for sv in spectra.values())
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['index', *spectra])
    for i in range(rows):
      writer.writerow([i + 1, *(repr(float(sv[i])) if i < sv.size else '' for sv in spectra.values())])
  return path


# Eleven parameters: one per bin/analyze flag, all after the first three keyword-only.
def analyze(models: Mapping[str, tuple[Any, dict]], dataset: Iterable, output_dir: str, *,
            local: Optional[tuple[Any, dict]] = None, global_: Optional[tuple[Any, dict]] = None,
            log10_tau: float = collapse.DEFAULT_LOG10_TAU, top: int = collapse.DEFAULT_TOP,
            gap_k: int = collapse.DEFAULT_TOP, max_examples: Optional[int] = None,
            settings: Optional[Mapping[str, Any]] = None,
            probe: Optional[tuple[Iterable, int]] = None) -> dict[str, str]:
  """Computes the spectra and writes the files; returns {kind: path} of what was written.

  `probe`: (train dataset, number of classes) to add each model's nearest-class-mean probe
  (analysis.nearest_class_mean_probe, over `dataset` as the test split) to its summary.

  Raises:
    FlagError: no model, only one of local and global_, or top or gap_k below 1.
  """
  if not models and local is None:
    raise FlagError('--saved_model: nothing to analyse; give --saved_model and/or the '
                    '--local_saved_model/--global_saved_model pair.')
  if (local is None) != (global_ is None):
    raise FlagError('--local_saved_model/--global_saved_model must be given together.')
  if top < 1:
    raise FlagError(f'--top must be positive; got {top}.')
  if gap_k < 1:
    raise FlagError(f'--gap_k must be positive; got {gap_k}.')
  os.makedirs(output_dir, exist_ok=True)
  spectra = _Spectra(dataset, max_examples, log10_tau, top, output_dir)
  summary: dict[str, Any] = {'settings': dict(settings or {}), 'runs': {}}
  summary['settings'].update({'log10_tau': log10_tau, 'top': top, 'max_examples': max_examples})
  written = _analyze_models(spectra, models, probe, summary)
  if local is not None:
    written.update(_analyze_local_global(spectra, local, global_, gap_k, summary))
  path = os.path.join(output_dir, 'summary.json')
  with open(path, 'w') as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  written['summary_json'] = path
  return written


@dataclasses.dataclass(frozen=True)
class _Spectra:
  """The settings every spectrum of one `analyze` call is computed, summarised and written with."""
  dataset: Iterable
  max_examples: Optional[int]
  log10_tau: float
  top: int
  output_dir: str

  def summary(self, sv: np.ndarray, meta: Mapping[str, Any]) -> dict:
    return dict(analysis.spectrum_summary(sv, self.log10_tau, self.top), metadata=_public(meta))

  def path(self, name: str) -> str:
    return os.path.join(self.output_dir, name)


def _analyze_models(spectra: _Spectra, models: Mapping[str, tuple[Any, dict]],
                    probe: Optional[tuple[Iterable, int]], summary: dict) -> dict[str, str]:
  """Each model's spectrum into summary['runs'], spectra.csv and spectra.png; returns the files."""
  svs = {}
  for label, (fn, meta) in models.items():
    stats = analysis.representation_stats(fn, spectra.dataset, spectra.max_examples)
    sv = analysis.singular_values(stats.covariance())
    svs[label] = sv
    summary['runs'][label] = dict(spectra.summary(sv, meta), examples=stats.count)
    if probe is not None:
      summary['runs'][label]['probe'] = analysis.nearest_class_mean_probe(
          fn, probe[0], spectra.dataset, probe[1], spectra.max_examples)
  if not svs:
    return {}
  return {
      'spectra_csv': _write_spectra_csv(spectra.path('spectra.csv'), svs),
      # As bin/report draws spectra: each relative to its largest value, cut at
      # plots.RELATIVE_FLOOR (the raw values of a float32 covariance run down to 1e-60 and hide
      # the shape that matters).
      'spectra_png': plots.plot_spectra_panels(
          {'': [{'label': label, 'sv': sv} for label, sv in svs.items()]},
          spectra.path('spectra.png'), top=spectra.top)}


def _analyze_local_global(spectra: _Spectra, local: tuple[Any, dict], global_: tuple[Any, dict],
                          gap_k: int, summary: dict) -> dict[str, str]:
  """The local/global gap into summary['local_global'] and its two files; returns the files."""
  sv_local = spectrum(local[0], spectra.dataset, spectra.max_examples)
  sv_global = spectrum(global_[0], spectra.dataset, spectra.max_examples)
  k = min(gap_k, sv_local.size, sv_global.size)
  r = analysis.local_global_gap(sv_local, sv_global, k=k)
  summary['local_global'] = {
      'k': k,
      'R': r,
      'R_normalized': analysis.local_global_gap(sv_local, sv_global, k=k, normalize=True),
      'rel_floor': analysis.DEFAULT_GAP_REL_FLOOR,
      'local': spectra.summary(sv_local, local[1]),
      'global': spectra.summary(sv_global, global_[1]),
  }
  return {
      'local_global_csv': _write_spectra_csv(spectra.path('local_global.csv'),
                                             {'local': sv_local, 'global': sv_global}),
      'local_vs_global_png': plots.plot_local_vs_global(
          sv_local, sv_global, spectra.path('local_vs_global.png'), r, top=spectra.top)}


def _public(meta: Mapping[str, Any]) -> dict:
  return {k: v for k, v in meta.items() if not k.startswith('_')}


def check_against_task(entries: Sequence[tuple[str, tuple[Any, dict]]], task: Any) -> None:
  """Refuses models whose input shape or class count differ from the task's (SavedModelError)."""
  for flag, (fn, meta) in entries:
    export.check_compatible(fn, meta, task.num_classes, task.input_shape, task.name, flag)


def task_and_data_dir(paths: Sequence[str], task: Optional[str],
                      data_dir: Optional[str]) -> tuple[str, Optional[str]]:
  """The task and TFDS data directory to analyse `paths` (models or run directories) on: an
  explicit --task / --data_dir, else those of the runs the models belong to (their config.json,
  run_dir.find_run). Raises FlagError when neither says, or the runs disagree."""
  configs = [c for c in (run_dir.find_run(p)[1] for p in paths) if c]
  if not task:
    tasks = sorted({c['task'] for c in configs})
    if len(tasks) > 1:
      raise FlagError(f'--task: the models come from runs of different tasks '
                      f'({", ".join(tasks)}); name the task whose test split to use, e.g. '
                      f'--task={tasks[0]}.')
    if not tasks:
      raise FlagError('--task is required: the models are not inside a run directory with a '
                      'config.json (a name from tasks.registry, e.g. --task=cifar10).')
    task = tasks[0]
  if data_dir is None:
    dirs = sorted({c.get('data_dir') or '' for c in configs if c['task'] == task})
    if len(dirs) > 1:
      raise FlagError(f'--data_dir: the runs read {task} from different data directories '
                      f'({", ".join(d or "(default)" for d in dirs)}); give --data_dir.')
    data_dir = dirs[0] if dirs and dirs[0] else None
  return task, data_dir


def _get_task(name: Optional[str]):
  if not name:
    raise FlagError('--task is required (a name from tasks.registry, e.g. --task=cifar10).')
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  try:
    return registry.get(name)
  except (KeyError, ValueError) as e:
    raise FlagError(f'--task={name}: {e}') from e


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  return cli.run_guarded('analyze', _main)


def _main() -> int:
  if not _OUTPUT_DIR.value:
    raise FlagError('--output_dir is required (where the CSV, JSON and PNG files go).')
  if bool(_LOCAL.value) != bool(_GLOBAL.value):
    raise FlagError('--local_saved_model/--global_saved_model must be given together.')
  trust = _TRUST.value
  models = load_models(_split(_SAVED_MODEL.value), _split(_LABELS.value), trust_saved_model=trust)
  local = (export.load_serving(_LOCAL.value, '--local_saved_model', trust)
           if _LOCAL.value else None)
  global_ = (export.load_serving(_GLOBAL.value, '--global_saved_model', trust)
             if _GLOBAL.value else None)
  if not models and local is None:
    raise FlagError('--saved_model is required (or the --local_saved_model/'
                    '--global_saved_model pair).')
  if _BATCH_SIZE.value < 1:
    raise FlagError(f'--batch_size must be positive; got {_BATCH_SIZE.value}.')
  if _MAX_EXAMPLES.value < 0:
    raise FlagError(f'--max_examples must be >= 0 (0 = all); got {_MAX_EXAMPLES.value}.')
  task_name, data_dir = task_and_data_dir(
      [*_split(_SAVED_MODEL.value), *filter(None, (_LOCAL.value, _GLOBAL.value))], _TASK.value,
      _DATA_DIR.value)
  task = _get_task(task_name)
  cli.ensure_writable_dir(_OUTPUT_DIR.value)
  check_against_task(
      [('--saved_model', m) for m in models.values()] +
      [(f, m) for f, m in (('--local_saved_model', local), ('--global_saved_model', global_)) if m],
      task)
  dataset = task.test_dataset(data_dir, _BATCH_SIZE.value)
  probe = ((task.split_dataset('train', data_dir, _BATCH_SIZE.value), task.num_classes)
           if _PROBE.value else None)
  written = analyze(
      models, dataset, _OUTPUT_DIR.value, local=local, global_=global_,
      log10_tau=_LOG10_TAU.value, top=_TOP.value, gap_k=_GAP_K.value,
      max_examples=_MAX_EXAMPLES.value or None,
      settings={'task': task.name, 'data_dir': data_dir,
                'saved_model': _split(_SAVED_MODEL.value),
                'local_saved_model': _LOCAL.value, 'global_saved_model': _GLOBAL.value},
      probe=probe)
  with open(written['summary_json']) as f:
    summary = json.load(f)
  for label, run in summary['runs'].items():
    print(f"{label}: effective_rank={run['effective_rank']:.2f} "
          f"num_significant(normalized)={run['num_significant_normalized']} "
          f"num_significant(absolute)={run['num_significant_absolute']} of {run['dim']}")
    if 'probe' in run:
      p = run['probe']
      print(f"{label}: nearest_class_mean_accuracy={p['nearest_class_mean_accuracy']:.4f} "
            f"head_accuracy={p['head_accuracy']:.4f} "
            f"largest_predicted_class_share={p['largest_predicted_class_share']:.3f}")
  if 'local_global' in summary:
    print(f"local vs global: R={summary['local_global']['R']:.4g} (K={summary['local_global']['k']})")
  for kind, path in written.items():
    print(f'wrote {kind}: {path}')
  return 0


def entry() -> None:
  """The program, as tff-decorr-analyze, `python -m bin.analyze` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('analyze', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
