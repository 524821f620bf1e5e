"""Every bin/ program answers --help, --helpfull, a mistyped flag and an invalid value before
TensorFlow is imported (tff_decorr/configs/flag_table.py, cli.parse_flags_or_exit).

Each program runs in a child process behind an import hook that ends the process at once, with
its own exit code, when anything imports tensorflow: an answer given after TensorFlow was loaded
(however deep the import, and even inside a try/except ImportError) fails here.
"""

import subprocess

from absl.testing import absltest
from absl.testing import parameterized

from tests import testutil

_TF_IMPORTED = 97
# Runs module argv[1] as __main__ (as `python -m` does) behind the hook.
_GUARD = r'''
import os, runpy, sys
class _NoTensorFlow:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in ('tensorflow', 'tensorflow_federated', 'keras'):
      sys.stderr.write(f'\nTENSORFLOW IMPORTED: {name}\n')
      sys.stderr.flush()
      os._exit(%d)
    return None
sys.meta_path.insert(0, _NoTensorFlow())
module = sys.argv.pop(1)
runpy.run_module(module, run_name='__main__', alter_sys=True)
''' % _TF_IMPORTED

# Per program: a mistyped flag and the flag absl suggests for it, and a flag with an invalid value.
_PROGRAMS = {
    'train': ('--round=2', 'rounds', '--rounds=two'),
    'evaluate': ('--saved_modle=x', 'saved_model', '--batch_size=big'),
    'analyze': ('--saved_modle=x', 'saved_model', '--top=many'),
    'partition': ('--num_client=3', 'num_clients', '--seed=one'),
    'report': ('--study_dri=x', 'study_dir', '--batch_size=big'),
    'study': ('--study_dri=x', 'study_dir', '--jobs=all'),
    'worker': ('--sockt=x', 'socket', '--port=high'),
}


def _run(program, *args, module=None):
  return subprocess.run([testutil.python(), '-c', _GUARD, module or f'bin.{program}', *args],
                        cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=120,
                        check=False)


class FirstAnswerTest(parameterized.TestCase):

  def check_no_tensorflow(self, proc):
    self.assertNotEqual(proc.returncode, _TF_IMPORTED,
                        f'TensorFlow imported before the answer:\n{proc.stderr[-2000:]}')
    self.assertNotIn('TENSORFLOW IMPORTED', proc.stderr)

  def test_the_hook_catches_an_import(self):
    """The guard itself: a module that imports TensorFlow is stopped with the guard's code."""
    proc = _run(None, module='tff_decorr.collapse.analysis')
    self.assertEqual(proc.returncode, _TF_IMPORTED, proc.stderr[-2000:])

  @parameterized.parameters(*_PROGRAMS)
  def test_help_exits_0(self, program):
    for flag in ('--help', '--helpfull'):
      proc = _run(program, flag)
      self.check_no_tensorflow(proc)
      self.assertEqual(proc.returncode, 0, f'{program} {flag}: {proc.stderr[-2000:]}')
      self.assertIn('--', proc.stdout + proc.stderr)

  @parameterized.parameters(*_PROGRAMS)
  def test_mistyped_flag(self, program):
    typo, meant, _ = _PROGRAMS[program]
    proc = _run(program, typo)
    self.check_no_tensorflow(proc)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    self.assertIn(f'Did you mean: {meant}', proc.stderr)
    self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)

  @parameterized.parameters(*_PROGRAMS)
  def test_invalid_value(self, program):
    _, _, bad = _PROGRAMS[program]
    proc = _run(program, bad)
    self.check_no_tensorflow(proc)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    self.assertIn(bad.split('=')[0], proc.stderr)

  def test_helpfull_lists_component_flags_help_the_generic_ones(self):
    """bin/train's docstring: --helpfull lists the per-component flags, --help the generic ones."""
    short, full = _run('train', '--help'), _run('train', '--helpfull')
    self.assertRegex(short.stdout, r'\n  --rounds: ')
    self.assertNotRegex(short.stdout, r'\n  --fedprox_mu: ')
    self.assertRegex(full.stdout, r'\n  --fedprox_mu: ')


if __name__ == '__main__':
  absltest.main()
