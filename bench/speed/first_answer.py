r"""Time to first answer of every bin/ program, next to the time to import TensorFlow.

  .venv/bin/python -m bench.speed.first_answer [--repeats=3] [--programs=train,study]

Runs each program as a user does (`python -m bin.<program>` from the repository root) with
--help and with a mistyped flag, and `python -c "import tensorflow"`, each --repeats times in this
one invocation, alternating, so all share the machine's load. Prints the median wall and CPU
seconds (user + system of the child, os.wait4) of each, and each program's wall time as a
fraction of TensorFlow's import. The target is under 1.5 s wall (docs/benchmarks.md, §3).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from bench import _common

_PROGRAMS = ('train', 'evaluate', 'analyze', 'partition', 'report', 'study', 'worker')
flags.DEFINE_integer('repeats', 3, 'Runs of each command (the median is printed).')
flags.DEFINE_list('programs', list(_PROGRAMS), 'The bin/ programs to time.')
FLAGS = flags.FLAGS


def timed(argv) -> tuple[float, float, int]:
  """(wall seconds, CPU seconds, exit code) of one run of argv from the repository root."""
  start = time.perf_counter()
  proc = subprocess.Popen(argv, cwd=_common.ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - start
  proc.returncode = os.waitstatus_to_exitcode(status)
  return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def main(argv):
  del argv
  unknown = set(FLAGS.programs) - set(_PROGRAMS)
  if unknown:
    raise app.UsageError(f'--programs: unknown {sorted(unknown)}; choose from {_PROGRAMS}.')
  commands = {'import tensorflow': [sys.executable, '-c', 'import tensorflow']}
  for program in FLAGS.programs:
    commands[f'{program} --help'] = [sys.executable, '-m', f'bin.{program}', '--help']
    commands[f'{program} --mistyped'] = [sys.executable, '-m', f'bin.{program}', '--mistyped=1']
  runs = {name: [] for name in commands}
  for _ in range(FLAGS.repeats):
    for name, command in commands.items():
      runs[name].append(timed(command))
  tf_wall = statistics.median(r[0] for r in runs['import tensorflow'])
  print(f'{"command":<22} {"wall s":>7} {"CPU s":>6} {"/ TF import":>10}  exit')
  for name, results in runs.items():
    wall = statistics.median(r[0] for r in results)
    cpu = statistics.median(r[1] for r in results)
    codes = ','.join(sorted({str(r[2]) for r in results}))
    print(f'{name:<22} {wall:7.2f} {cpu:6.2f} {wall / tf_wall:10.2f}  {codes}')
  answers = [statistics.median(r[0] for r in results) for name, results in runs.items()
             if name != 'import tensorflow']
  print(f'slowest answer {max(answers):.2f} s wall (target < 1.5 s); TensorFlow import '
        f'{tf_wall:.2f} s; {FLAGS.repeats} runs each, medians, {os.cpu_count()} cores')


if __name__ == '__main__':
  app.run(main)
