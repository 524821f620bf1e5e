r"""The report of bin/train runs or a bin/study study: table, accuracy curves, collapse spectra, one
HTML page.

  python -m bin.report runs/digits-fedavg-none-1a2b runs/digits-fedavg-feddecorr-3c4d \
      --output_dir=reports/digits               # run directories, positional or --run_dir=a,b
  python -m bin.report --run_dir=runs/<run>     # one run -> runs/<run>/report/
  python -m bin.report --study_dir=studies/alpha       # a study -> studies/alpha/report/
  python -m bin.report --study_dir=studies/alpha --nospectra --output_dir=/tmp/r
  python -m bin.report --study_dir=studies/alpha --archive_dir=results/alpha  # to commit

Run directories (what bin/train writes; --run_dir, or as arguments) are read as a study whose
runs are those directories: each run's config.json gives its settings, and the settings whose
values differ between the runs are the table's columns (the algorithm and regulariser always), so
runs that differ only in --seed fold into one row (mean ± std over seeds). A study is read from
<study_dir>/study.json (a run directory given as --study_dir is reported as --run_dir would).
Each run's summary.json and metrics.csv say how far it got. Writes table.md and table.csv (per
configuration, over seeds: mean ± std of the final and best test accuracy of the finished runs,
seeds done, each regulariser minus --regularizer=none), with --latex table.tex, curves.png (test
accuracy per round, mean with a ±std band), spectra.png (the representation spectrum of each
configuration's exported models over the task's test split, relative to its largest value, when
exports exist; spectra_by_round.png and a table of effective ranks and local-vs-global gaps when
runs exported several rounds or saved local models), with --thresholds a table of the rounds each
configuration took to reach those test accuracies, each figure also as .svg and .pdf, and
report.html (all of it on one self-contained page). --archive_dir copies the finished runs' small
files (spectra included) into a directory that this command reads back as a study. Unfinished runs
are listed, never averaged in. Bad input exits 2 with one line naming the flag. Logic:
tff_decorr/studies/report.py (archive.py for --archive_dir).
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from absl import app
from absl import flags

# Nothing imported here imports TensorFlow (the studies' modules load on first use): --help and a
# mistyped flag answer at once; cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import lazy
from tff_decorr import tf_env
from tff_decorr.configs import cli
from tff_decorr.studies import study

aggregate = lazy.lazy_module('tff_decorr.studies.aggregate')
archive = lazy.lazy_module('tff_decorr.studies.archive')
report = lazy.lazy_module('tff_decorr.studies.report')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

_RUN_DIR = flags.DEFINE_list('run_dir', [], 'Run directories bin/train wrote (comma-separated; '
                             'also accepted as arguments): their report, runs that differ only in '
                             '--seed folded into one row.')
_STUDY_DIR = flags.DEFINE_string('study_dir', None, 'Directory of a bin/study study (holds '
                                 'study.json).')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where the report goes (default '
                                  '<study_dir>/report, or <run_dir>/report for one run; required '
                                  'for several).')
_SPECTRA = flags.DEFINE_bool('spectra', True, 'Compute collapse spectra from the runs\' exported '
                             'models (loads each model and the task\'s test split).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'TFDS data dir for the spectra\' test split '
                                '(default: each run\'s own --data_dir).')
_MAX_EXAMPLES = flags.DEFINE_integer('max_examples', 0, 'Spectra over the first N test examples '
                                     'only (0: all).')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Test batch size of the spectra (memory '
                                   'only).')
_THRESHOLDS = flags.DEFINE_list('thresholds', [], 'Test accuracies in percent (e.g. 20,25,30): '
                                'a table of the first round each configuration reached each, '
                                'mean ± std over seeds.')
_ARCHIVE_DIR = flags.DEFINE_string('archive_dir', None, 'Instead of a report: copy the study\'s '
                                   'finished runs into this directory as a study bin/report '
                                   'reads (config, summary, metrics.csv and spectra.json a run, a '
                                   'few KB, no SavedModel), merged with what it holds; to commit.')
_LATEX = flags.DEFINE_bool('latex', False, 'Also write the table as LaTeX, table.tex (booktabs, '
                           'mean ± std, the best value of each column in bold).')


def main(argv: Sequence[str]) -> int:
  return cli.run_guarded('report', lambda: _main(list(argv[1:])))


def _main(arguments: Sequence[str]) -> int:
  run_dirs = [cli.user_path(p) for p in [*_RUN_DIR.value, *arguments] if p]
  if run_dirs and _STUDY_DIR.value:
    raise study.StudyError('--study_dir and --run_dir: give one of them (a study, or run '
                           'directories).')
  if not run_dirs and not _STUDY_DIR.value:
    raise study.StudyError('--run_dir or --study_dir is required: run directories bin/train wrote '
                           '(--run_dir=runs/a,runs/b), or the directory bin/study wrote.')
  study_dir = cli.user_path(_STUDY_DIR.value or '')
  if study_dir and (not os.path.exists(os.path.join(study_dir, study.MANIFEST)) and
                    os.path.exists(os.path.join(study_dir, 'config.json'))):
    run_dirs, study_dir = [study_dir], ''  # A run directory given as a study: its report.
  if _MAX_EXAMPLES.value < 0:
    raise study.StudyError(f'--max_examples must be >= 0 (0: all), got {_MAX_EXAMPLES.value}.')
  if _BATCH_SIZE.value < 1:
    raise study.StudyError(f'--batch_size must be >= 1, got {_BATCH_SIZE.value}.')
  thresholds = []
  for text in _THRESHOLDS.value:
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if not 0 < value <= 100:
      raise study.StudyError(f'--thresholds: {text!r} is not a test accuracy in percent in '
                             '(0, 100]; give e.g. --thresholds=20,25,30.')
    thresholds.append(value / 100)
  # Bad input fails before anything is created.
  manifest = (aggregate.manifest_of_runs(run_dirs) if run_dirs else study.read_manifest(study_dir))
  if _ARCHIVE_DIR.value:
    archive_dir = cli.user_path(_ARCHIVE_DIR.value)
    cli.ensure_writable_dir(archive_dir)
    source = aggregate.SpectraInput(data_dir=cli.user_path(_DATA_DIR.value or '') or None,
                                    max_examples=_MAX_EXAMPLES.value or None,
                                    batch_size=_BATCH_SIZE.value)
    names = archive.archive(study_dir, archive_dir, source, log=lambda s: print(s, flush=True),
                            manifest=manifest)
    print(f'archived {len(names)} finished run(s) of {study_dir or ", ".join(run_dirs)} in '
          f'{archive_dir}; report: python -m bin.report --study_dir={archive_dir}')
    return 0
  if _OUTPUT_DIR.value:
    output_dir = cli.user_path(_OUTPUT_DIR.value)
  elif len(run_dirs) > 1:
    raise study.StudyError(f'--output_dir is required with {len(run_dirs)} run directories: where '
                           'their report goes (e.g. --output_dir=reports/<name>).')
  else:
    output_dir = os.path.join(study_dir or run_dirs[0], 'report')
  cli.ensure_writable_dir(output_dir)
  options = dict(spectra=_SPECTRA.value, data_dir=cli.user_path(_DATA_DIR.value or '') or None,
                 max_examples=_MAX_EXAMPLES.value or None, batch_size=_BATCH_SIZE.value,
                 log=lambda s: print(s, flush=True), latex_table=_LATEX.value,
                 thresholds=thresholds)
  written = (report.build_runs(run_dirs, output_dir, **options) if run_dirs
             else report.build(study_dir, output_dir, **options))
  with open(written['markdown']) as f:
    print(f.read().split('\n- ')[0].rstrip())  # The table.
  for kind, path in written.items():
    print(f'wrote {kind}: {path}')
  return 0


def entry() -> None:
  """The program, as tff-decorr-report, `python -m bin.report` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('report', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
