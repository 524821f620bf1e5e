"""The wheel and the sdist build, and the wheel installs and trains from outside the checkout.

What README's "Use it in your own environment" does, offline and in seconds: the wheel is built
from a copy of the checkout's packaged files (pyproject.toml), installed with --no-deps into a
fresh venv (no system site-packages) whose lock is the project venv's: a .pth file adds the
project venv's site-packages, which hold exactly requirements.txt installed with --no-deps (make
setup), after the new venv's own. Then, from a temporary directory and with no PYTHONPATH, the
library imports from the new venv (not from the checkout) and the console script
tff-decorr-train runs one round of the embedded digits task.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

from absl.testing import absltest

from tests import testutil

_PROGRAMS = ('train', 'evaluate', 'analyze', 'partition', 'report', 'study', 'worker')
# What pyproject.toml packages, from where: the checkout's folder -> its place in the wheel.
_FOLDERS = {'tff_decorr': 'tff_decorr', 'tasks': 'tff_decorr/tasks', 'bin': 'tff_decorr/bin'}
_DATA = ('tff_decorr/worker/loopback_bind.c', 'tff_decorr/configs/flag_table.json')


def _run(argv, **kwargs):
  """Runs argv; returns its CompletedProcess, failing the test with its output if it failed."""
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, **kwargs)
  if proc.returncode:
    raise AssertionError(f'{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n'
                         f'{proc.stderr[-3000:]}')
  return proc


def _checkout_files(folder):
  """The .py files under the checkout's `folder`, relative to it."""
  top = os.path.join(testutil.REPO_ROOT, folder)
  return {os.path.relpath(os.path.join(d, f), top) for d, _, files in os.walk(top)
          for f in files if f.endswith('.py') and '__pycache__' not in d}


class WheelTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    src = os.path.join(cls.tmp, 'src')
    os.makedirs(src)
    for name in ('pyproject.toml', 'README.md'):
      shutil.copy(os.path.join(testutil.REPO_ROOT, name), src)
    for folder in _FOLDERS:
      shutil.copytree(os.path.join(testutil.REPO_ROOT, folder), os.path.join(src, folder),
                      ignore=shutil.ignore_patterns('__pycache__', '*.so'))
    dist = os.path.join(cls.tmp, 'dist')
    python = testutil.python()
    _run([python, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', '--no-index',
          '--no-cache-dir', '--disable-pip-version-check', '-w', dist, src])
    _run([python, '-c', 'import sys; from setuptools import build_meta as b; '
          'b.build_sdist(sys.argv[1])', dist], cwd=src)
    cls.wheel = [os.path.join(dist, f) for f in os.listdir(dist) if f.endswith('.whl')]
    cls.sdist = [os.path.join(dist, f) for f in os.listdir(dist) if f.endswith('.tar.gz')]

    # The scratch venv: the wheel installed, the lock taken from the project venv by a .pth.
    cls.venv = os.path.join(cls.tmp, 'venv')
    _run([python, '-m', 'venv', '--without-pip', cls.venv])
    cls.python = os.path.join(cls.venv, 'bin', 'python')
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    cls.project_site = _run([python, '-c', purelib]).stdout.strip()
    cls.site = _run([cls.python, '-c', purelib]).stdout.strip()
    with open(os.path.join(cls.site, 'tff_decorr_lock.pth'), 'w') as f:
      f.write(f'import site; site.addsitedir({cls.project_site!r})\n')
    if len(cls.wheel) == 1:
      _run([python, '-m', 'pip', '--python', cls.python, 'install', '-q', '--no-deps',
            '--no-index', '--no-cache-dir', '--disable-pip-version-check', cls.wheel[0]])
    cls.outside = os.path.join(cls.tmp, 'elsewhere')
    os.makedirs(cls.outside)

  def test_one_wheel_one_sdist(self):
    self.assertLen(self.wheel, 1)
    self.assertLen(self.sdist, 1)
    self.assertRegex(os.path.basename(self.wheel[0]), r'^tff_decorr-\d+\.\d+\.\d+-py3-none-any\.whl$')

  def test_wheel_holds_every_module_and_data_file_under_tff_decorr_only(self):
    with zipfile.ZipFile(self.wheel[0]) as z:
      names = set(z.namelist())
      entry_points = z.read(next(n for n in names if n.endswith('entry_points.txt'))).decode()
    tops = {n.split('/')[0] for n in names if not n.split('/')[0].endswith('.dist-info')}
    self.assertEqual(tops, {'tff_decorr'})  # No tasks/, bin/, tests/ at the top level.
    for folder, place in _FOLDERS.items():
      files = _checkout_files(folder)
      if folder == 'tff_decorr':  # tasks/ and bin/ are checked on their own.
        files = {f for f in files if f.split(os.sep)[0] not in ('tasks', 'bin')}
      missing = {f'{place}/{f}' for f in files} - names
      self.assertFalse(missing, f'pyproject.toml leaves these out of the wheel: {sorted(missing)}')
    for path in _DATA:
      self.assertIn(path, names)
    for program in _PROGRAMS:
      self.assertIn(f'tff-decorr-{program} = tff_decorr.bin.{program}:entry', entry_points)

  def test_sdist_holds_the_sources(self):
    with tarfile.open(self.sdist[0]) as t:
      names = {n.split('/', 1)[1] for n in t.getnames() if '/' in n}
    for path in ('pyproject.toml', 'tasks/registry.py', 'bin/train.py', 'tff_decorr/__init__.py',
                 *_DATA):
      self.assertIn(path, names)

  def test_imports_from_the_venv_not_the_checkout(self):
    self.assertFalse(os.path.exists(os.path.join(self.project_site, 'tff_decorr')),
                     'the project venv holds tff_decorr itself: the check would prove nothing')
    code = ('import json, importlib.util as u, tff_decorr, tff_decorr.tasks.registry as r, '
            'tff_decorr.bin.train; print(json.dumps({"init": tff_decorr.__file__, '
            '"tasks": r.__file__, "tasks_top": bool(u.find_spec("tasks")), '
            '"bin_top": bool(u.find_spec("bin")), "names": list(r.names())}))')
    out = json.loads(_run([self.python, '-c', code], cwd=self.outside).stdout.splitlines()[-1])
    self.assertTrue(out['init'].startswith(self.site), out)
    self.assertEqual(out['tasks'], os.path.join(self.site, 'tff_decorr', 'tasks', 'registry.py'))
    self.assertFalse(out['tasks_top'] or out['bin_top'], out)
    self.assertIn('digits', out['names'])

  def test_console_scripts_answer_help(self):
    for program in _PROGRAMS:
      proc = _run([os.path.join(self.venv, 'bin', f'tff-decorr-{program}'), '--help'],
                  cwd=self.outside)
      self.assertIn('--', proc.stdout)
    # The program's own docstring and flags, not the console script wrapper's.
    proc = _run([os.path.join(self.venv, 'bin', 'tff-decorr-train'), '--help'], cwd=self.outside)
    self.assertIn('Federated training with FedDecorr', proc.stdout)
    self.assertIn('  --rounds: ', proc.stdout)

  def test_console_script_trains_one_round(self):
    out = os.path.join(self.outside, 'run')
    _run([os.path.join(self.venv, 'bin', 'tff-decorr-train'), '--task=digits', '--rounds=1',
          '--regularizer=feddecorr', '--runtime=tf', f'--output_dir={out}',
          f'--cache_dir={os.path.join(self.outside, "cache")}'], cwd=self.outside, timeout=600)
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    self.assertEqual(summary['final_round'], 1)
    self.assertBetween(summary['final_test_accuracy'], 0.0, 1.0)
    self.assertTrue(os.path.isdir(os.path.join(out, 'export', 'saved_model')))


if __name__ == '__main__':
  absltest.main()
