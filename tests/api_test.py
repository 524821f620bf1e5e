"""The public API (docs/api.md), the deprecated module paths of before the subpackages, and the
package's layers.

Every name docs/api.md lists between its public-api markers must import. Each flat module path that
the subpackage regroup (commit 1c5fa3b) moved must still import, both as `import tff_decorr.<old>`
and `from tff_decorr import <old>`, give the new module itself and warn with the new path and the
removal release. No module of tff_decorr imports a module of a layer above its own (docs/DESIGN.md,
"Package map"), read from the sources without importing them.
"""

import ast
import importlib
import os
import re
import subprocess
import sys
import warnings

from absl.testing import absltest

import tff_decorr
from tests import testutil
from tff_decorr.configs import deprecated_flags

# Written out here, from `git show --stat 1c5fa3b` (tff_decorr/{ => <package>}/<module>.py), not
# read from tff_decorr.MOVED: the test checks that table, not itself.
_MOVED = {
    'federated': ['tff_context', 'aggregation'],
    'run': ['config', 'training', 'experiment', 'program', 'client_state', 'run_dir', 'export',
            'personalized', 'cli', 'study', 'report', 'deprecated_flags'],
    'collapse': ['analysis', 'plots'],
}
_OLD_TO_NEW = {f'tff_decorr.{m}': f'tff_decorr.{p}.{m}' for p, ms in _MOVED.items() for m in ms}
# Moved after 0.2.0, when run/ was split by concern: the configuration, a layer below the run
# program (run/{config,deprecated_flags,cli}.py -> configs/). Their flat paths follow them.
for _m in ('config', 'deprecated_flags', 'cli'):
  _OLD_TO_NEW[f'tff_decorr.run.{_m}'] = _OLD_TO_NEW[f'tff_decorr.{_m}'] = f'tff_decorr.configs.{_m}'
# ... and a run directory's files, between the configuration and the run program that writes them
# (run/{run_dir,checkpoint_files,client_state,privacy_ledger,graph_check,export,
# tensorboard_hparams}.py -> run_files/); the flat paths of those that had one follow them.
for _m in ('run_dir', 'checkpoint_files', 'client_state', 'privacy_ledger', 'graph_check', 'export',
           'tensorboard_hparams'):
  _OLD_TO_NEW[f'tff_decorr.run.{_m}'] = f'tff_decorr.run_files.{_m}'
  if f'tff_decorr.{_m}' in _OLD_TO_NEW:
    _OLD_TO_NEW[f'tff_decorr.{_m}'] = f'tff_decorr.run_files.{_m}'
# ... and studies, grids of runs and their reports, above the run program (run/{study,report,
# run_spectra}.py -> studies/); the flat paths of study and report follow them.
for _m in ('study', 'report', 'run_spectra'):
  _OLD_TO_NEW[f'tff_decorr.run.{_m}'] = f'tff_decorr.studies.{_m}'
  if f'tff_decorr.{_m}' in _OLD_TO_NEW:
    _OLD_TO_NEW[f'tff_decorr.{_m}'] = f'tff_decorr.studies.{_m}'
# ... and, in run/, two renamed for what they hold: experiment.py -> composition.py (a run's
# pieces), program.py -> round_loop.py (where a round's metrics are written).
for _m, _new in (('experiment', 'composition'), ('program', 'round_loop')):
  _OLD_TO_NEW[f'tff_decorr.run.{_m}'] = _OLD_TO_NEW[f'tff_decorr.{_m}'] = f'tff_decorr.run.{_new}'
# Moved after 1c5fa3b: tf_env from run/ to the package root (run/tf_env.py -> tf_env.py).
_OLD_TO_NEW['tff_decorr.run.tf_env'] = 'tff_decorr.tf_env'
# Moved after 1c5fa3b: collapse_tracking from collapse/ to run/ (the run program's round-end hook,
# importing run_files/export); its flat path follows it.
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

  def test_each_old_path_names_a_module_of_today(self):
    """No chains: an old path leads straight to a module in the source tree, never to another old
    path (tff_decorr.config -> tff_decorr.configs.config, not -> tff_decorr.run.config)."""
    for old, new in tff_decorr.MOVED.items():
      with self.subTest(old=old):
        self.assertNotIn(new, tff_decorr.MOVED)
        self.assertTrue(_is_module(new), new)
        self.assertFalse(_is_module(old), old)  # A real module would win over the alias.

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
    # Their flat paths, their paths in 0.2.0's run/, and their paths today.
    forms = {'flat': [f'tff_decorr.{m}' for m in light],
             'run': [f'tff_decorr.run.{m}' for m in light]}
    forms['today'] = [_OLD_TO_NEW.get(path, path) for path in forms['run']]
    out = {}
    for form, paths in forms.items():
      imports = '; '.join(f'import {path}' for path in paths)
      proc = subprocess.run([sys.executable, '-c', script.format(imports=imports)],
                            cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=300)
      self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
      package_alone, after = proc.stdout.split('\n')[:2]
      self.assertEqual(package_alone, 'False')
      out[form] = after
    self.assertEqual(out, {form: '[]' for form in forms})


# The layers, lowest first (docs/DESIGN.md, "Package map"). A module may import modules of its own
# layer and of lower ones, never of a higher one: at import time or inside a function alike.
# Written out here, not derived from the imports: the test checks the imports against it.
_LAYERS = (
    ('base', ('tff_decorr.hparams', 'tff_decorr.tf_env', 'tff_decorr.regularizers',
              'tff_decorr.partitions', 'tff_decorr.data_options', 'tff_decorr.lazy')),
    ('models', ('tff_decorr.models',)),
    ('algorithms', ('tff_decorr.algorithms',)),
    ('federated', ('tff_decorr.federated',)),  # aggregation, tff_context, netns, loopback
    ('runtimes', ('tff_decorr.runtimes',)),  # rounds; its faces tff_runtime, tf_runtime, learning.
    ('collapse', ('tff_decorr.collapse',)),
    ('configs', ('tff_decorr.configs',)),  # config, deprecated_flags, cli.
    ('run_files', ('tff_decorr.run_files',)),  # run_dir, checkpoint_files, export, ...
    ('run', ('tff_decorr.run',)),  # training, composition, round_loop, ...
    ('studies', ('tff_decorr.studies',)),  # study, report, run_spectra.
    # tff_decorr/__init__.py alone (no module under it): tff_decorr.train is run.training's, and the
    # MOVED finder reads configs.deprecated_flags.REMOVED_IN.
    ('package', ('tff_decorr',)),
)
# What any layer may take from the package's __init__.py: its own definition, which imports nothing
# (not `train`, not an old path, not `lazy_submodules`, which is the base layer's tff_decorr.lazy).
_PACKAGE_NAMES_ANY_LAYER = ('__version__',)
_PACKAGE_DIR = os.path.join(testutil.REPO_ROOT, 'tff_decorr')


def _is_package(dotted):
  return os.path.isfile(os.path.join(testutil.REPO_ROOT, *dotted.split('.'), '__init__.py'))


def _is_module(dotted):
  """Whether `dotted` (tff_decorr...) is a module or package in the source tree."""
  return (_is_package(dotted) or
          os.path.isfile(os.path.join(testutil.REPO_ROOT, *dotted.split('.')) + '.py'))


def _layer(dotted):
  """The index in _LAYERS of module `dotted`, None when no layer holds it."""
  if dotted == 'tff_decorr':  # The package layer is its __init__.py alone, not every module below.
    return len(_LAYERS) - 1
  for i, (_, prefixes) in enumerate(_LAYERS[:-1]):
    if any(dotted == p or dotted.startswith(p + '.') for p in prefixes):
      return i
  return None


def _module_name(path):
  """tff_decorr/run/training.py -> tff_decorr.run.training; a package's __init__.py -> the
  package."""
  parts = os.path.relpath(path, testutil.REPO_ROOT)[:-len('.py')].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported(module, tree):
  """(line, statement, module of ours imported) for every import in `tree`, functions included:
  `from P import n` names P.n when that is a module (or an old path of MOVED), else P itself, but
  nothing for the package's own _PACKAGE_NAMES_ANY_LAYER."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, f'import {alias.name}', alias.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # Relative: from the importing module's package, `level` packages up.
        package = module.split('.') if _is_package(module) else module.split('.')[:-1]
        base = '.'.join(package[:len(package) - node.level + 1] + ([base] if base else []))
      for alias in node.names:
        statement = f'from {"." * node.level}{node.module or ""} import {alias.name}'
        candidate = f'{base}.{alias.name}'
        if candidate in tff_decorr.MOVED or _is_module(candidate):
          yield node.lineno, statement, candidate
        elif not (base == 'tff_decorr' and alias.name in _PACKAGE_NAMES_ANY_LAYER):
          yield node.lineno, statement, base
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and
          isinstance(node.args[0].value, str) and
          getattr(node.func, 'attr', getattr(node.func, 'id', None)) in ('import_module',
                                                                          '__import__')):
      yield node.lineno, f'import_module({node.args[0].value!r})', node.args[0].value


def _upward_imports(path, source):
  """One line per import in `source` (the file at `path`) that goes above the file's layer, or
  names an old path of MOVED, or is of a module no layer holds."""
  module = _module_name(path)
  layer = _layer(module)
  where = os.path.relpath(path, testutil.REPO_ROOT)
  if layer is None:
    return [f'{where}: module {module} is in no layer of api_test._LAYERS']
  problems = []
  for line, statement, target in _imported(module, ast.parse(source, path)):
    if target != 'tff_decorr' and not target.startswith('tff_decorr.'):
      continue  # Not ours (tasks, tensorflow, ...).
    if target in tff_decorr.MOVED:
      problems.append(f'{where}:{line}: `{statement}` names the deprecated path {target}: '
                      f'import {tff_decorr.MOVED[target]}')
      target = tff_decorr.MOVED[target]
    to = _layer(target)
    if to is None:
      problems.append(f'{where}:{line}: `{statement}`: {target} is in no layer of _LAYERS')
    elif to > layer:
      problems.append(f'{where}:{line}: `{statement}` goes up, from the {_LAYERS[layer][0]} '
                      f'layer ({module}) to the {_LAYERS[to][0]} layer ({target})')
  return problems


class LayersTest(absltest.TestCase):

  def test_no_module_imports_a_higher_layer(self):
    problems, paths = [], []
    for directory, _, files in os.walk(_PACKAGE_DIR):
      paths += [os.path.join(directory, f) for f in files if f.endswith('.py')]
    self.assertGreater(len(paths), 50)
    for path in sorted(paths):
      with open(path) as f:
        problems += _upward_imports(path, f.read())
    if problems:
      self.fail('imports going up a layer (docs/DESIGN.md, "Package map"):\n' +
                '\n'.join(problems))

  def test_every_layer_names_real_modules(self):
    for name, prefixes in _LAYERS:
      for prefix in prefixes:
        self.assertTrue(_is_module(prefix), f'{name}: {prefix}')

  def test_an_upward_import_is_found(self):
    """The check itself: an import inside a function, upward, is named with its file and line."""
    path = os.path.join(_PACKAGE_DIR, 'collapse', 'analysis.py')
    source = ('from tff_decorr.collapse import plots\n'
              'from tff_decorr import __version__, hparams\n'
              'from tff_decorr.lazy import lazy_submodules\n'
              'from tff_decorr import lazy_submodules\n'
              'def f():\n'
              '  from tff_decorr.run import training\n'
              '  from tff_decorr import train\n'
              '  from tff_decorr.federated import learning\n')
    self.assertEqual(_upward_imports(path, source), [
        'tff_decorr/collapse/analysis.py:4: `from tff_decorr import lazy_submodules` goes up, from '
        'the collapse layer (tff_decorr.collapse.analysis) to the package layer (tff_decorr)',
        'tff_decorr/collapse/analysis.py:6: `from tff_decorr.run import training` goes up, from '
        'the collapse layer (tff_decorr.collapse.analysis) to the run layer '
        '(tff_decorr.run.training)',
        'tff_decorr/collapse/analysis.py:7: `from tff_decorr import train` goes up, from the '
        'collapse layer (tff_decorr.collapse.analysis) to the package layer (tff_decorr)',
        'tff_decorr/collapse/analysis.py:8: `from tff_decorr.federated import learning` names the '
        'deprecated path tff_decorr.federated.learning: import tff_decorr.runtimes.learning',
    ])


if __name__ == '__main__':
  absltest.main()
