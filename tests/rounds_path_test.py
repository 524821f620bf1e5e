"""`--rounds`, followed from the command line to the round loop, enters each module once.

What is followed: each call of a function of the project whose code reads a name or attribute
spelled `rounds` (the
parsed flag, `Config.rounds`, `RunDirectory.rounds`, the aggregators' `RunShape.rounds`, a parameter
of that name), while bin/train's program trains the embedded digits task for one round in this
process. The modules of those reads, in the order they happen, with repeats in a row folded, name
no module twice: the value goes down from the flags to the round loop and never returns to a
module it has left. A name bound to something else (a module, a list of other rounds) would be
followed too, which is why none is spelled so.
"""

import dis
import os
import sys
import threading

from absl import flags
from absl.testing import absltest
# Imported before absltest.main's initialisation ends, as bin/train's parser does
# (tff_decorr.configs.cli._import_tensorflow says why): Keras builds no model otherwise.
import tensorflow  # pylint: disable=unused-import

from bin import train as train_bin
from tests import testutil

_PROJECT = ('tff_decorr', 'bin')


def _lines_reading_rounds(code) -> frozenset:
  """The source lines of `code` (not of the code objects nested in it) that load `rounds`."""
  if 'rounds' not in code.co_names + code.co_varnames + code.co_cellvars + code.co_freevars:
    return frozenset()
  return frozenset(ins.positions.lineno for ins in dis.get_instructions(code)
                   if ins.opname.startswith('LOAD') and ins.argval == 'rounds'
                   and ins.positions is not None)


class RoundsReads:
  """A profile function recording, in order, the module of each call of a project function whose
  own code reads `rounds` (sys.setprofile: Keras builds no model under sys.settrace's line
  events). A function counts whether or not the branch reading it runs: stricter, never laxer."""

  def __init__(self):
    self.modules = []
    self._reads = {}
    self._lock = threading.Lock()

  def __call__(self, frame, event, arg):
    del arg
    if event != 'call':
      return
    module = frame.f_globals.get('__name__', '')
    if not module.startswith(_PROJECT):
      return
    reads = self._reads.get(frame.f_code)
    if reads is None:
      reads = self._reads[frame.f_code] = bool(_lines_reading_rounds(frame.f_code))
    if reads:
      with self._lock:
        self.modules.append(module)

  def path(self) -> list:
    """The modules read in, repeats in a row folded into one."""
    return [m for i, m in enumerate(self.modules) if i == 0 or self.modules[i - 1] != m]


class RoundsPathTest(testutil.ClassTempDir, absltest.TestCase):

  def test_rounds_enters_each_module_once(self):
    fv = flags.FlagValues()
    train_bin.define_flags(fv)
    fv(['train', '--task=digits', '--rounds=1', '--runtime=tf', '--num_clients=2',
        '--clients_per_round=2', '--local_epochs=1', '--regularizer=feddecorr',
        f'--output_dir={os.path.join(self.tmp, "run")}',
        f'--cache_dir={os.path.join(self.tmp, "cache")}'])
    reads = RoundsReads()
    sys.setprofile(reads)
    threading.setprofile(reads)
    try:
      self.assertEqual(train_bin.run(fv), 0)
    finally:
      sys.setprofile(None)
      threading.setprofile(None)
    path = reads.path()
    print('--rounds went through: ' + ' -> '.join(path))
    again = sorted({m for m in path if path.count(m) > 1})
    self.assertEqual(again, [], f'--rounds returned to {again}: {" -> ".join(path)}')
    # The path the value must take (others may join it: the DP accountant's, for one).
    for earlier, later in (('tff_decorr.configs.config', 'tff_decorr.program.training'),
                           ('tff_decorr.program.training', 'tff_decorr.run_files.run_directory'),
                           ('tff_decorr.run_files.run_directory', 'tff_decorr.program.round_loop')):
      self.assertLess(path.index(earlier), path.index(later), path)


if __name__ == '__main__':
  absltest.main()
