"""The public API (docs/api.md) and the deprecated module paths of before the subpackages.

Every name docs/api.md lists between its public-api markers must import. Each flat module path that
the subpackage regroup (commit 1c5fa3b) moved must still import, both as `import tff_decorr.<old>`
and `from tff_decorr import <old>`, give the new module itself and warn with the new path and the
removal release.
"""

import importlib
import os
import re
import subprocess
import sys
import warnings

from absl.testing import absltest

import tff_decorr
from tests import testutil
from tff_decorr.run import deprecated_flags

# Written out here, from `git show --stat 1c5fa3b` (tff_decorr/{ => <package>}/<module>.py), not
# read from tff_decorr.MOVED: the test checks that table, not itself.
_MOVED = {
    'federated': ['tff_context', 'aggregation'],
    'run': ['config', 'training', 'experiment', 'program', 'client_state', 'run_dir', 'export',
            'personalized', 'cli', 'study', 'report', 'deprecated_flags'],
    'collapse': ['analysis', 'plots'],
}
_OLD_TO_NEW = {f'tff_decorr.{m}': f'tff_decorr.{p}.{m}' for p, ms in _MOVED.items() for m in ms}
# Moved after 1c5fa3b: tf_env from run/ to the package root (run/tf_env.py -> tf_env.py).
_OLD_TO_NEW['tff_decorr.run.tf_env'] = 'tff_decorr.tf_env'
# Moved after 1c5fa3b: collapse_tracking from collapse/ to run/ (the run program's round-end hook,
# importing run/export); its flat path follows it.
_OLD_TO_NEW['tff_decorr.collapse_tracking'] = 'tff_decorr.run.collapse_tracking'
_OLD_TO_NEW['tff_decorr.collapse.collapse_tracking'] = 'tff_decorr.run.collapse_tracking'
# Moved after 1c5fa3b: learning from federated/ to runtimes/ (the tff.learning face over
# runtimes/rounds, which imports federated/); its flat path follows it.
_OLD_TO_NEW['tff_decorr.learning'] = 'tff_decorr.runtimes.learning'
_OLD_TO_NEW['tff_decorr.federated.learning'] = 'tff_decorr.runtimes.learning'


def _public_names():
  with open(os.path.join(testutil.REPO_ROOT, 'docs', 'api.md')) as f:
    text = f.read()
  block = re.search(r'<!-- public-api:begin -->(.*?)<!-- public-api:end -->', text, re.S)
  assert block, 'docs/api.md has no public-api block'
  return re.findall(r'`(tff_decorr(?:\.\w+)*)`', block.group(1))


def _resolve(dotted):
  """The object a dotted name names: the longest importable module, then attributes."""
  parts = dotted.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ModuleNotFoundError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ImportError(dotted)


def _forget(old):
  """As if `old` had never been imported (its new module stays imported)."""
  sys.modules.pop(old, None)
  parent, short = old.rsplit('.', 1)
  if parent in sys.modules:
    sys.modules[parent].__dict__.pop(short, None)


class PublicApiTest(absltest.TestCase):

  def test_every_listed_name_imports(self):
    names = _public_names()
    self.assertGreater(len(names), 30)
    self.assertLen(set(names), len(names), 'a name is listed twice')
    for name in names:
      with self.subTest(name=name):
        with warnings.catch_warnings():
          warnings.simplefilter('error', DeprecationWarning)  # Nothing listed is deprecated.
          try:
            _resolve(name)
          except DeprecationWarning as e:  # From a third-party import: not ours to judge.
            if 'tff_decorr' in str(e):
              raise
        self.assertNotIn('.'.join(name.split('.')[:2]), tff_decorr.MOVED)  # Not an old path.

  def test_version_and_removal_release(self):
    self.assertEqual(tff_decorr.__version__, '0.2.0')
    self.assertEqual(deprecated_flags.REMOVED_IN, '0.3.0')


class OldPathsTest(absltest.TestCase):

  def test_table_is_the_regroup(self):
    self.assertEqual(tff_decorr.MOVED, _OLD_TO_NEW)

  def _check_warning(self, caught, old, new):
    ours = [w for w in caught if issubclass(w.category, DeprecationWarning) and
            old in str(w.message)]
    self.assertLen(ours, 1, [str(w.message) for w in caught])
    message = str(ours[0].message)
    self.assertIn(new, message)
    self.assertIn(f'removed in tff_decorr {deprecated_flags.REMOVED_IN}', message)
    # The warning points at the importing line (here), not at importlib.
    self.assertEqual(os.path.realpath(ours[0].filename), os.path.realpath(__file__))

  def test_import_statement(self):
    for old, new in _OLD_TO_NEW.items():
      with self.subTest(old=old):
        _forget(old)
        with warnings.catch_warnings(record=True) as caught:
          warnings.simplefilter('always')
          module = __import__(old, fromlist=['_'])  # `import tff_decorr.<old> as module`
        self.assertIs(module, importlib.import_module(new))
        self.assertIs(sys.modules[old], module)
        self.assertEqual(module.__name__, new)
        self.assertEqual(module.__spec__.name, new)  # importlib.reload still works on it.
        self._check_warning(caught, old, new)

  def test_from_package_import(self):
    for old, new in _OLD_TO_NEW.items():
      parent, short = old.rsplit('.', 1)
      with self.subTest(old=old):
        _forget(old)
        with warnings.catch_warnings(record=True) as caught:
          warnings.simplefilter('always')
          namespace = {}
          exec(compile(f'from {parent} import {short}', __file__, 'exec'), namespace)  # pylint: disable=exec-used
        self.assertIs(namespace[short], importlib.import_module(new))
        self.assertIs(getattr(importlib.import_module(parent), short), namespace[short])
        self._check_warning(caught, old, new)

  def test_unknown_names_still_fail(self):
    with self.assertRaises(ModuleNotFoundError):
      importlib.import_module('tff_decorr.no_such_module')
    with self.assertRaises(AttributeError):
      getattr(tff_decorr, 'no_such_module')

  def test_no_tensorflow_earlier_than_before(self):
    """In fresh interpreters: the package imports no TensorFlow, and an old path imports what its
    new path imports, no more."""
    light = ['deprecated_flags', 'run_dir', 'tf_env', 'study']  # Modules without TensorFlow.
    script = ('import sys, warnings; warnings.simplefilter("ignore"); import tff_decorr; '
              'print("tensorflow" in sys.modules); {imports}; '
              'print(sorted(m for m in ("tensorflow", "tensorflow_federated", "matplotlib") '
              'if m in sys.modules))')
    out = {}
    for form in ('tff_decorr.{}', 'tff_decorr.run.{}'):
      imports = '; '.join(f'import {form.format(m)}' for m in light)
      proc = subprocess.run([sys.executable, '-c', script.format(imports=imports)],
                            cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=300)
      self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
      package_alone, after = proc.stdout.split('\n')[:2]
      self.assertEqual(package_alone, 'False')
      out[form] = after
    self.assertEqual(out['tff_decorr.{}'], out['tff_decorr.run.{}'])
    self.assertEqual(out['tff_decorr.{}'], '[]')


if __name__ == '__main__':
  absltest.main()
