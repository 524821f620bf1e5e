"""A study's report (bin/report): a paper-style table, accuracy curves, collapse spectra, one page.

`build` reports a bin/study directory (or its archive, tff_decorr/studies/archive.py), `build_runs`
bin/train run directories read as a study. The runs are read and folded over seeds by
tff_decorr/studies/aggregate.py, drawn by figures.py (through tff_decorr/collapse/plots.py) and
written by tables.py (CSV, LaTeX) and page.py (Markdown, HTML).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from tff_decorr.collapse import plots
from tff_decorr.studies import aggregate
from tff_decorr.studies import figures
from tff_decorr.studies import page
from tff_decorr.studies import study
from tff_decorr.studies import tables


@dataclasses.dataclass(frozen=True)
class _Options:
  """`build`'s keyword arguments (documented there)."""
  spectra: bool = True
  data_dir: Optional[str] = None
  max_examples: Optional[int] = None
  batch_size: int = 256
  log: Callable[[str], None] = print
  latex_table: bool = False
  thresholds: Sequence[float] = ()


# Nine parameters: the public API (docs/api.md), one keyword per bin/report flag.
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
    latex_table: also write table.tex (`tables.latex`).
    thresholds: test accuracies (fractions) whose first round each configuration reached, as a
      table (`tables.progress_table`).

  Returns:
    {kind: path} of the files written ('csv', 'markdown', 'html', the figures' formats).

  Raises:
    study.StudyError: `study_dir` is no study (no study.json) or lists no runs; the message says
      what to do.
  """
  manifest = study.read_manifest(study_dir)
  runs = aggregate.load_runs(study_dir, manifest)
  if not runs:
    raise study.StudyError(f'--study_dir={study_dir}: study.json lists no runs; run bin/study '
                           'first.')
  title = f'Study {os.path.basename(os.path.normpath(study_dir))}'
  options = _Options(spectra=spectra, data_dir=data_dir, max_examples=max_examples,
                     batch_size=batch_size, log=log, latex_table=latex_table,
                     thresholds=thresholds)
  return _build(runs, manifest, output_dir, title, study_dir, options)


def build_runs(run_dirs: Sequence[str], output_dir: str, **kwargs) -> Dict[str, str]:
  """Writes the report of bin/train run directories to `output_dir`, as `build` writes a study's.

  The runs are read as a study (`aggregate.manifest_of_runs`): a row per configuration, folded
  over seeds.

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
  manifest = aggregate.manifest_of_runs(run_dirs)
  runs = aggregate.load_runs('', manifest)
  names = [r.name for r in runs]
  title = f'Run {names[0]}' if len(names) == 1 else f'Runs {", ".join(names)}'
  where = ', '.join(r.path for r in runs)
  return _build(runs, manifest, output_dir, title, where, _Options(**kwargs))


def _build(runs: Sequence[aggregate.Run], manifest: Mapping[str, Any], output_dir: str,
           title: str, where: str, options: _Options) -> Dict[str, str]:
  """The report of `runs` (a study's manifest, or `manifest_of_runs`') in `output_dir`."""
  axes = list(manifest.get('axes') or [])
  spectra_notes = []
  if options.spectra:
    source = aggregate.SpectraInput(options.data_dir, options.max_examples, options.batch_size)
    spectra_notes = aggregate.add_spectra(runs, source, options.log)
  have_spectra = any(r.spectrum is not None for r in runs)
  rows = aggregate.group(runs, axes, options.thresholds)
  os.makedirs(output_dir, exist_ok=True)
  written = {'csv': tables.write_csv(os.path.join(output_dir, 'table.csv'), rows, axes)}
  images = _draw(rows, axes, output_dir, written)
  extra: List[page.Table] = []
  if options.thresholds:
    extra.append(('Rounds to reach a test accuracy',
                  *tables.progress_table(rows, axes, options.thresholds)))
  if any(r.measures for r in runs):
    extra.append(('Collapse by round', *tables.collapse_table(rows, axes)))
  notes = (_notes(runs, rows, axes, where, have_spectra) + list(manifest.get('notes', []))
           + spectra_notes)
  header, body = tables.table(rows, axes, have_spectra)
  files = {'markdown': ('table.md', page.markdown(title, header, body, notes, images, extra)),
           'html': ('report.html', page.html_page(title, header, body, notes, images, extra))}
  if options.latex_table:
    files['latex'] = ('table.tex', tables.latex(rows, axes, have_spectra))
  for kind in ('markdown', 'latex', 'html'):  # The order bin/report lists them in.
    if kind in files:
      written[kind] = os.path.join(output_dir, files[kind][0])
      with open(written[kind], 'w') as f:
        f.write(files[kind][1])
  return written


def _draw(rows: Sequence[aggregate.Row], axes: Sequence[str], output_dir: str,
          written: Dict[str, str]) -> Dict[str, str]:
  """Draws the figures into `output_dir`, adding their files to `written`; {caption: PNG path}."""
  images = {}

  def draw(name, caption, plot):
    path = os.path.join(output_dir, f'{name}.png')
    images[caption] = plot(path)
    written.update({f'{name}_{f}': p for f, p in plots.figure_paths(path).items()})

  def spectra(panels):
    top = max(item['sv'].size for items in panels.values() for item in items)
    return lambda path: plots.plot_spectra_panels(panels, path, top=top, formats=plots.FORMATS)

  panels = figures.curves(rows, axes)
  if panels:
    draw('curves', 'Test accuracy per round (mean ± std over seeds)',
         lambda path: plots.plot_curves(panels, path, formats=plots.FORMATS))
  spectrum_panels = figures.spectra_panels(rows, axes)
  if spectrum_panels:
    draw('spectra', 'Representation spectrum (mean over seeds, relative to its largest value)',
         spectra(spectrum_panels))
  by_round = figures.spectra_by_round_panels(rows, axes)
  if len(by_round) > len(spectrum_panels):  # More than the last round's: spectra over rounds.
    draw('spectra_by_round', 'Representation spectrum by round (mean over seeds, relative to its '
         'largest value; dashed: a client\'s local model of that round)', spectra(by_round))
  return images


def _notes(runs: Sequence[aggregate.Run], rows: Sequence[aggregate.Row], axes: Sequence[str],
           where: str, have_spectra: bool) -> List[str]:
  """The notes under the table: what the runs are and how each column is computed."""
  counts = {s: sum(r.status == s for r in runs) for s in ('done', 'incomplete', 'not started',
                                                         'failed')}
  done_text = ', '.join(f'{n} {s}' for s, n in counts.items() if n)
  notes = [f'{len(runs)} runs ({done_text}) in {where}; generated '
           f'{time.strftime("%Y-%m-%d %H:%M:%S")}.',
           'Accuracy: test accuracy of the global model (personalised algorithms: the mean of the '
           "clients' own models), in percent; mean ± sample standard deviation (ddof=1) over the "
           'finished runs of each row only; unfinished runs are listed in their row and drawn '
           'dotted in the curves, never averaged in.']
  if tables.compares_regularizers(rows, axes):
    notes.append('Δ vs none: the row\'s mean minus the mean of the same configuration with '
                 '--regularizer=none (percentage points).')
  if have_spectra:
    notes.append('Effective rank: exp(entropy) of the normalised singular values of the '
                 "representation covariance over the task's test split (docs/analysis.md).")
  return notes
