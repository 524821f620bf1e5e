r"""A study: every combination of bin/train flag values, each as its own resumable run.

  .venv/bin/python -m bin.study --study_dir=studies/alpha --algorithm=fedavg,fedprox,moon \
    --regularizer=none,feddecorr --dirichlet_alpha=0.05,0.1,0.5 --seed=0,1,2 --rounds=100
  .venv/bin/python -m bin.study --study_dir=studies/alpha --study_file=alpha.json --jobs=4
  .venv/bin/python -m bin.study --study_dir=studies/alpha ... --print_plan > plan.txt  # a cluster

Every bin/train flag takes a comma-separated list (a study file, JSON {flag: value or list}, names
the same; a flag given on the command line replaces the file's); the runs are their Cartesian
product. A component setting (--fedprox_mu) goes only to runs whose component uses it, as the plan
says. Every run is checked as bin/train would check it before anything starts (exit 2, one line per
run that cannot start, naming the flag). Runs go to <study_dir>/runs/<name>, their output to
<study_dir>/logs/<name>.log, the grid and each run's status to <study_dir>/study.json (what
bin/report reads). Finished runs are skipped; re-running the same command resumes a killed study.
--print_plan prints one shell command per run left (for xargs or a Slurm array) instead of running.
Exit codes: 0 all runs done (or the plan printed), 2 bad flags, 3 a run failed (its log is named),
130 interrupted. The logic is tff_decorr/studies/study.py; docs/studies.md has the details.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
from absl import logging

# Nothing imported here imports TensorFlow: --help and a mistyped flag answer at once;
# cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import tf_env
from tff_decorr.configs import cli
from tff_decorr.studies import study

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FLAGS = flags.FLAGS
_STUDY_DIR = flags.DEFINE_string('study_dir', None, 'Directory of the study: study.json, runs/, '
                                 'logs/ (created if needed; the same command resumes it).')
_STUDY_FILE = flags.DEFINE_string('study_file', None, 'JSON object {bin/train flag: value or list '
                                  'of values}; flags on the command line replace its entries.')
_JOBS = flags.DEFINE_integer('jobs', 1, 'Runs at a time on this machine, each a bin/train process '
                             '(a run already uses every core it can: more than 1 is for machines '
                             'with more cores than one run uses).')
_PRINT_PLAN = flags.DEFINE_bool('print_plan', False, 'Write study.json and print one shell command '
                                'per run not yet finished (for xargs or a Slurm array); run '
                                'nothing.')


def _define_grid_flags() -> list:
  """One string flag per bin/train flag, with bin/train's name: a comma-separated list."""
  train_flags = study.new_train_flags()
  names = study.grid_flag_names(train_flags)
  for name in names:
    kind = ('one value for every run' if name in study.WHOLE_FLAGS else
            'comma-separated values, one run per value')
    flags.DEFINE_string(name, None, f'bin/train --{name} ({kind}): {train_flags[name].help}')
  return names


_GRID_FLAGS = _define_grid_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}; flags are --name=value.')
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.INFO)  # The progress lines are INFO.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (imported once flags are parsed)
  tf.get_logger().setLevel('ERROR')
  return cli.run_guarded('study', _main, interrupted_message='interrupted; the runs stopped after '
                         'their last completed round; re-run the same command to resume')


def _main() -> int:
  if not _STUDY_DIR.value:
    raise study.StudyError('--study_dir is required: the directory that holds (or will hold) the '
                           "study's runs and study.json.")
  if _JOBS.value < 1:
    raise study.StudyError(f'--jobs must be >= 1, got {_JOBS.value}.')
  study_dir = cli.user_path(_STUDY_DIR.value)
  if os.path.exists(study_dir) and not os.path.isdir(study_dir):
    raise study.StudyError(f'--study_dir={study_dir} is a file; give a directory.')
  given = {}
  if _STUDY_FILE.value:
    given.update(study.read_study_file(cli.user_path(_STUDY_FILE.value), _GRID_FLAGS))
  given.update({n: FLAGS[n].value for n in _GRID_FLAGS if FLAGS[n].value is not None})
  plan = study.make_plan(study.build_grid(given, _GRID_FLAGS))
  if plan.errors:
    for line in plan.errors:
      print(f'study: error: {line}', file=sys.stderr, flush=True)
    print(f'study: error: {len(plan.errors)} problem(s) above, each naming the '
          'flag; nothing was run. Fix those values and re-run.', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  try:
    cli.ensure_writable_dir(study_dir)
  except OSError as e:  # cli's OS messages advise --output_dir; here it is --study_dir.
    raise study.StudyError(f'--study_dir={study_dir} cannot be written ({e.strerror}); choose a '
                           'directory you can write.') from None
  for note in plan.notes:
    logging.info('plan: %s', note)
  study.write_tensorboard_config(study_dir, plan)  # tensorboard --logdir=<study_dir>: HParams.
  dropped = study.dropped_cells(study_dir, plan)
  if dropped:
    logging.warning('study.json listed %d run(s) this grid does not have (%s%s); the new grid '
                    'replaces it (their run directories stay in %s).', len(dropped),
                    ', '.join(dropped[:3]), ', ...' if len(dropped) > 3 else '',
                    os.path.join(study_dir, study.RUNS))
  if _PRINT_PLAN.value:
    return _print_plan(study_dir, plan)
  runner = study.Runner(study_dir, plan, jobs=_JOBS.value, command=sys.argv,
                        log=lambda s: logging.info('study: %s', s))
  counts = runner.run()
  not_done = len(plan.cells) - counts[study.DONE]
  if not not_done:
    logging.info('study: all %d runs done; report: python -m bin.report --study_dir=%s',
                 len(plan.cells), study_dir)
    return 0
  for c in plan.cells:
    s = runner.status[c.name]
    if s['status'] != study.DONE:
      print(f'study: {s["status"]}: {c.name}: {s.get("error", "")} (log: '
            f'{c.log_path(study_dir)})', file=sys.stderr, flush=True)
  print(f'study: error: {not_done} of {len(plan.cells)} runs did not finish (above); the others '
        'are done. Fix the cause and re-run the same command: finished runs are skipped.',
        file=sys.stderr, flush=True)
  return cli.EXIT_RUN_FAILED


def _print_plan(study_dir: str, plan: study.Plan) -> int:
  statuses, left = {}, []
  for c in plan.cells:
    done = study.is_done(c.run_dir(study_dir), c.rounds)
    statuses[c.name] = {'status': study.DONE if done else study.PLANNED}
    if not done:
      left.append(c)
  study.write_manifest(study_dir, plan, statuses, sys.argv)
  for c in left:
    print(c.command(study_dir), flush=True)
  logging.info('plan: %d runs, %d already finished (not printed), %d printed; manifest %s',
               len(plan.cells), len(plan.cells) - len(left), len(left),
               os.path.join(study_dir, study.MANIFEST))
  return 0


def entry() -> None:
  """The program, as tff-decorr-study, `python -m bin.study` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (KNOWN_NOISE)
  cli.run_program('study', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
