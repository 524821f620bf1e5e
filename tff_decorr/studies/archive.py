"""A study's compact copy, to commit (bin/report --archive_dir).

The manifest, and per finished run its config, summary, metrics and spectra.json: a few KB a run,
no SavedModel, checkpoint or log. tff_decorr/studies/report.py's `build` reads an archive back as
it reads the study itself.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from tff_decorr.run_files import run_dir as run_dir_lib
from tff_decorr.studies import aggregate
from tff_decorr.studies import run_spectra
from tff_decorr.studies import study

ARCHIVED_FILES = ('config.json', 'summary.json', 'metrics.csv')


def archive(study_dir: str, archive_dir: str,
            source: aggregate.SpectraInput = aggregate.SpectraInput(),
            log: Callable[[str], None] = print,
            manifest: Optional[Mapping[str, Any]] = None) -> List[str]:
  """Copies the study's finished runs into `archive_dir` as a study `report.build` reads.

  study.json holds the study's cells merged with those the archive already holds, so runs archived
  from other machines stay; per run go config.json, summary.json, metrics.csv and spectra.json
  (run_spectra; computed from the exports over `source` unless the run has one).

  Args:
    study_dir: a bin/study directory ('' with `manifest` of bin/train run directories).
    archive_dir: where the copy goes (created; an archive there is added to).
    source: what spectra are measured on for runs that have no spectra.json.
    log: where progress lines go.
    manifest: the study's instead of <study_dir>/study.json (bin/train run directories:
      `aggregate.manifest_of_runs`).

  Returns:
    The names of the runs archived now.

  Raises:
    study.StudyError: `study_dir` is no study and no `manifest` is given.
  """
  manifest = manifest if manifest is not None else study.read_manifest(study_dir)
  runs = {r.name: r for r in aggregate.load_runs(study_dir, manifest)}
  os.makedirs(archive_dir, exist_ok=True)
  old = study.read_json(os.path.join(archive_dir, study.MANIFEST)) or {}
  cells = {c['name']: c for c in old.get('cells', [])}
  archived, datasets = [], {}
  for cell in manifest['cells']:
    run = runs[cell['name']]
    if not run.done:
      continue
    dest = os.path.join(archive_dir, study.RUNS, run.name)
    # Archived before from the same finished run (the same summary): its measures are reused.
    same = study.read_json(os.path.join(dest, 'summary.json')) == run.summary
    _copy_run(run, dest, same, lambda r: aggregate.compute_measures(r, datasets, source))
    # Paths relative to the archive; the command and log of the machine that ran it are dropped.
    entry = {**{k: v for k, v in cell.items() if k not in ('command', 'log', 'pid')},
             'run_dir': os.path.join(study.RUNS, run.name),
             'log': os.path.join(study.LOGS, f'{run.name}.log'), 'status': 'done'}
    # The same finished run archived again from a later sitting, whose manifest may lack what the
    # sitting that ran it recorded (exit code, wall time): keep the archive's.
    cells[run.name] = {**cells[run.name], **entry} if same and run.name in cells else entry
    archived.append(run.name)
    log(f'archived {run.name} -> {dest}')
  run_dir_lib.write_json_atomic(os.path.join(archive_dir, study.MANIFEST),
                                _merged_manifest(old, manifest, cells))
  return archived


def _copy_run(run: aggregate.Run, dest: str, same: bool,
              compute: Callable[[aggregate.Run], dict]) -> None:
  """Writes `run`'s ARCHIVED_FILES and spectra.json into `dest`: the run's own spectra.json, else
  the one `dest` holds from the same finished run (`same`), else `compute(run)`'s."""
  os.makedirs(dest, exist_ok=True)
  measures = run_spectra.read(run.path) or (run_spectra.read(dest) if same else None)
  for name in ARCHIVED_FILES:
    with open(os.path.join(run.path, name), 'rb') as f:
      data = f.read()
    run_dir_lib.atomic_write(os.path.join(dest, name), lambda out, d=data: out.write(d), 'wb')
  if measures is None:
    measures = compute(run)
  run_spectra.write(dest, {'version': run_spectra.VERSION,
                           'global': {str(r): v.tolist() for r, v in measures['global'].items()},
                           'local': [dict(i, sv=i['sv'].tolist()) for i in measures['local']]})


def _merged_manifest(old: Mapping[str, Any], manifest: Mapping[str, Any],
                     cells: Dict[str, dict]) -> dict:
  """The archive's study.json over `cells`: its axes are the flags whose values differ between the
  cells (one study's grid may have held a single seed; together they hold several)."""
  names = list(dict.fromkeys([*(old.get('axes') or []), *(manifest.get('axes') or []),
                              *(f for c in cells.values() for f in c['flags'])]))
  grid = {n: list(dict.fromkeys(c['flags'].get(n, '') for c in cells.values())) for n in names}
  axes = [n for n in names if len(grid[n]) > 1]
  return {'version': study.MANIFEST_VERSION, 'updated': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
          'command': [], 'grid': grid, 'axes': axes, 'notes': manifest.get('notes', []),
          'cells': list(cells.values())}
