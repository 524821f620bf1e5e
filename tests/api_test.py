"""The public API (docs/api.md) and the package's layers.

Every name docs/api.md lists between its public-api markers must import and state its contract
(Args, Returns, Raises). The module paths of before 0.3.0 no longer import. No module of tff_decorr
imports a module of a layer above its own (docs/DESIGN.md, "Package map"), read from the sources
without importing them.
"""

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import warnings

from absl.testing import absltest

import tff_decorr
from tests import testutil

# Module paths that 0.2.0 still served as deprecated aliases and 0.3.0 removed (CHANGELOG.md), one
# of each kind: a flat path of before the subpackages, a path in 0.2.0's run/, and the others.
_REMOVED_PATHS = ('tff_decorr.config', 'tff_decorr.learning', 'tff_decorr.run.config',
                  'tff_decorr.run.experiment', 'tff_decorr.federated.learning',
                  'tff_decorr.collapse.collapse_tracking', 'tff_decorr.run.tf_env',
                  'tff_decorr.configs.deprecated_flags')


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


def _returns_something(fn) -> bool:
  """Whether `fn` returns a value: a `return <value>` or a `yield` in its own body (nested functions
  aside), or a return annotation other than None."""
  annotation = inspect.signature(fn).return_annotation
  if annotation not in (inspect.Signature.empty, None, 'None'):
    return True
  try:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
  except (OSError, TypeError, SyntaxError):
    return False
  body = tree.body[0]
  stack = list(getattr(body, 'body', []))
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
      continue
    if isinstance(node, (ast.Yield, ast.YieldFrom)):
      return True
    if isinstance(node, ast.Return) and node.value is not None and not (
        isinstance(node.value, ast.Constant) and node.value.value is None):
      return True
    stack.extend(ast.iter_child_nodes(node))
  return False


class PublicApiTest(absltest.TestCase):

  def test_every_listed_name_imports(self):
    names = _public_names()
    self.assertGreater(len(names), 30)
    self.assertLen(set(names), len(names), 'a name is listed twice')
    for name in names:
      with self.subTest(name=name):
        with warnings.catch_warnings(record=True) as caught:
          warnings.simplefilter('always')
          _resolve(name)
        # Nothing listed is deprecated (third-party warnings while importing are not ours).
        self.assertEqual([str(w.message) for w in caught if 'tff_decorr' in str(w.message)], [])

  def test_every_listed_name_states_its_contract(self):
    """Each function and class listed has a Google-style docstring with its Args (when it takes
    any), Returns (a function returning something) and Raises sections."""
    problems = []
    for name in _public_names():
      obj = _resolve(name)
      if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        continue  # __version__, NAMES: values, not callables.
      doc = inspect.getdoc(obj) or ''
      sections = set(re.findall(r'^(Args|Returns|Raises):\s*$', doc, re.M))
      needed = {'Raises'}
      if inspect.signature(obj).parameters:
        needed.add('Args')
      if inspect.isfunction(obj) and _returns_something(obj):
        needed.add('Returns')
      if needed - sections:
        problems.append(f'{name}: no {", ".join(sorted(needed - sections))} section')
    self.assertEqual(problems, [])

  def test_the_contract_check_finds_a_missing_section(self):
    def documented(x):
      """Doubles.

      Args:
        x: a number.

      Returns:
        2 x.

      Raises:
        TypeError: x is no number.
      """
      return 2 * x
    def undocumented(x):
      """Doubles x."""
      return 2 * x
    self.assertTrue(_returns_something(documented))
    self.assertFalse(_returns_something(lambda: None))
    doc = inspect.getdoc(documented)
    self.assertEqual(set(re.findall(r'^(Args|Returns|Raises):\s*$', doc, re.M)),
                     {'Args', 'Returns', 'Raises'})
    self.assertEqual(re.findall(r'^(Args|Returns|Raises):\s*$', inspect.getdoc(undocumented),
                                re.M), [])

  def test_version(self):
    self.assertEqual(tff_decorr.__version__, '0.3.0')


def _run_script(test: absltest.TestCase, script: str) -> subprocess.CompletedProcess:
  """`script` run by this Python in a fresh process from the checkout; it must exit 0."""
  proc = subprocess.run([sys.executable, '-c', script], cwd=testutil.REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  test.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
  return proc


class MovedPathsTest(absltest.TestCase):
  """Paths moved since 0.3.0 still import, as the new module, with a warning naming it."""

  def test_old_paths_are_the_new_modules_and_warn(self):
    for old, new in (('tff_decorr.federated.aggregation', 'tff_decorr.aggregators'),
                     ('tff_decorr.federated.tff_context', 'tff_decorr.worker.tff_context'),
                     ('tff_decorr.run.training', 'tff_decorr.program.training'),
                     ('tff_decorr.run.composition', 'tff_decorr.program.experiment'),
                     ('tff_decorr.run.round_loop', 'tff_decorr.program.round_loop')):
      with self.subTest(old=old):
        script = ('import warnings, importlib; warnings.simplefilter("always"); '
                  f'm = importlib.import_module("{old}"); n = importlib.import_module("{new}"); '
                  'print(m is n, any(hasattr(m, a) for a in ("names", "install", "train", '
                  '"Experiment", "LoopConfig")))')
        proc = _run_script(self, script)
        self.assertEqual(proc.stdout.strip(), 'True True')
        self.assertIn(f'{old} is deprecated and will be removed in 0.4.0; import {new} instead.',
                      proc.stderr)

  def test_old_names_are_the_new_ones_and_warn(self):
    script = textwrap.dedent('''
        import warnings
        warnings.simplefilter('always')
        from tff_decorr import algorithms
        from tff_decorr.algorithms import client_update, testing
        from tff_decorr.program import round_loop
        import tff_decorr.run
        from tff_decorr.program import training
        old_train = tff_decorr.run.training.train  # An attribute, imported on first use.
        opt = client_update.SGDHParams(lr=0.05)
        alg = algorithms.build('fedavg', testing.tiny_model, config=opt)
        print(algorithms.ClientConfig is client_update.SGDHParams, alg.optimizer is opt,
              alg.config is opt, round_loop.run is round_loop.train_rounds,
              old_train is training.train)
        ''')
    proc = _run_script(self, script)
    self.assertEqual(proc.stdout.strip(), 'True True True True True')
    for message in ('algorithms.ClientConfig is deprecated and will be removed in 0.4.0; it is '
                    'algorithms.SGDHParams',
                    'build(config=...) is deprecated and will be removed in 0.4.0',
                    'Algorithm.config is deprecated and will be removed in 0.4.0',
                    'round_loop.run is deprecated and will be removed in 0.4.0',
                    'tff_decorr.run.training is deprecated and will be removed in 0.4.0; import '
                    'tff_decorr.program.training instead.'):
      self.assertIn(message, proc.stderr)


class RemovedPathsTest(absltest.TestCase):

  def test_old_paths_no_longer_import(self):
    for old in _REMOVED_PATHS:
      with self.subTest(old=old):
        self.assertFalse(_is_module(old))
        with self.assertRaises(ModuleNotFoundError):
          importlib.import_module(old)
        parent, short = old.rsplit('.', 1)
        if _is_module(parent):
          with self.assertRaises(AttributeError):
            getattr(importlib.import_module(parent), short)
        else:  # A package removed whole.
          with self.assertRaises(ModuleNotFoundError):
            importlib.import_module(parent)

  def test_the_package_imports_no_tensorflow(self):
    script = ('import sys; import tff_decorr; '
              'print(sorted(m for m in ("tensorflow", "tensorflow_federated", "matplotlib") '
              'if m in sys.modules))')
    proc = _run_script(self, script)
    self.assertEqual(proc.stdout.strip(), '[]')


# The layers, lowest first (docs/DESIGN.md, "Package map"). A module may import modules of its own
# layer and of lower ones, never of a higher one: at import time or inside a function alike.
# Written out here, not derived from the imports: the test checks the imports against it.
_LAYERS = (
    # tasks/, imported as tff_decorr.tasks (docs/DESIGN.md, "Packaging"): datasets only, below all.
    ('tasks', ('tff_decorr.tasks',)),
    ('base', ('tff_decorr.hparams', 'tff_decorr.tf_env', 'tff_decorr.regularizers',
              'tff_decorr.partitions', 'tff_decorr.data_options', 'tff_decorr.lazy',
              'tff_decorr._moved')),
    ('models', ('tff_decorr.models',)),
    ('algorithms', ('tff_decorr.algorithms',)),
    ('aggregators', ('tff_decorr.aggregators',)),  # the registry behind --aggregator.
    ('worker', ('tff_decorr.worker',)),  # tff_context, netns, netns_bridge, loopback.
    # Deprecated aliases of aggregators and worker.tff_context, until 0.4.0.
    ('federated', ('tff_decorr.federated',)),
    ('runtimes', ('tff_decorr.runtimes',)),  # federated_round; tff_runtime, tf_runtime, learning.
    ('collapse', ('tff_decorr.collapse',)),
    ('configs', ('tff_decorr.configs',)),  # config, cli.
    ('run_files', ('tff_decorr.run_files',)),  # run_dir, checkpoint_files, export, ...
    ('program', ('tff_decorr.program',)),  # training, experiment, round_loop, ...
    # Deprecated aliases of the program's modules (tff_decorr.run.*), until 0.4.0.
    ('run', ('tff_decorr.run',)),
    ('studies', ('tff_decorr.studies',)),  # study, report, run_spectra.
    # tff_decorr/__init__.py alone (no module under it): tff_decorr.train is run.training's.
    ('package', ('tff_decorr',)),
)
# What any layer may take from the package's __init__.py: its own definition, which imports nothing
# (not `train`, not an old path, not `lazy_submodules`, which is the base layer's tff_decorr.lazy).
_PACKAGE_NAMES_ANY_LAYER = ('__version__',)
_PACKAGE_DIR = os.path.join(testutil.REPO_ROOT, 'tff_decorr')


def _source_parts(dotted):
  """The path parts of module `dotted` in the checkout, where tff_decorr.tasks and tff_decorr.bin
  are tasks/ and bin/, beside the package (docs/DESIGN.md, "Packaging")."""
  for name, folder in (('tff_decorr.tasks', 'tasks'), ('tff_decorr.bin', 'bin')):
    if dotted == name or dotted.startswith(name + '.'):
      return [folder, *dotted.split('.')[2:]]
  return dotted.split('.')


def _is_package(dotted):
  return os.path.isfile(os.path.join(testutil.REPO_ROOT, *_source_parts(dotted), '__init__.py'))


def _is_module(dotted):
  """Whether `dotted` (tff_decorr...) is a module or package in the source tree."""
  return (_is_package(dotted) or
          os.path.isfile(os.path.join(testutil.REPO_ROOT, *_source_parts(dotted)) + '.py'))


def _layer(dotted):
  """The index in _LAYERS of module `dotted`, None when no layer holds it."""
  if dotted == 'tff_decorr':  # The package layer is its __init__.py alone, not every module below.
    return len(_LAYERS) - 1
  for i, (_, prefixes) in enumerate(_LAYERS[:-1]):
    if any(dotted == p or dotted.startswith(p + '.') for p in prefixes):
      return i
  return None


def _module_name(path):
  """tff_decorr/program/training.py -> tff_decorr.program.training; a package's __init__.py -> the
  package."""
  parts = os.path.relpath(path, testutil.REPO_ROOT)[:-len('.py')].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported(module, tree):
  """(line, statement, module of ours imported) for every import in `tree`, functions included:
  `from P import n` names P.n when that is a module, else P itself, but
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
        if _is_module(candidate):
          yield node.lineno, statement, candidate
        elif not (base == 'tff_decorr' and alias.name in _PACKAGE_NAMES_ANY_LAYER):
          yield node.lineno, statement, base
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and
          isinstance(node.args[0].value, str) and
          getattr(node.func, 'attr', getattr(node.func, 'id', None)) in ('import_module',
                                                                          '__import__')):
      yield node.lineno, f'import_module({node.args[0].value!r})', node.args[0].value


def _upward_imports(path, source):
  """One line per import in `source` (the file at `path`) that goes above the file's layer, or is
  of a module no layer holds (an old path of before 0.3.0 among them)."""
  module = _module_name(path)
  layer = _layer(module)
  where = os.path.relpath(path, testutil.REPO_ROOT)
  if layer is None:
    return [f'{where}: module {module} is in no layer of api_test._LAYERS']
  problems = []
  for line, statement, target in _imported(module, ast.parse(source, path)):
    if target != 'tff_decorr' and not target.startswith('tff_decorr.'):
      continue  # Not ours (tasks, tensorflow, ...).
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

  def test_no_two_modules_import_each_other(self):
    imports = {}
    for directory, _, files in os.walk(_PACKAGE_DIR):
      for path in (os.path.join(directory, f) for f in files if f.endswith('.py')):
        with open(path) as f:
          module = _module_name(path)
          imports[module] = {t for _, _, t in _imported(module, ast.parse(f.read(), path))} - {
              module}
    mutual = sorted(f'{a} <-> {b}' for a in imports for b in imports[a]
                    if a < b and a in imports.get(b, ()))
    self.assertEqual(mutual, [], 'modules importing each other (at import time or in a function): '
                     'move what both need into one of them, or into a third')

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
              '  from tff_decorr.program import training\n'
              '  from tff_decorr import train\n')
    self.assertEqual(_upward_imports(path, source), [
        'tff_decorr/collapse/analysis.py:4: `from tff_decorr import lazy_submodules` goes up, from '
        'the collapse layer (tff_decorr.collapse.analysis) to the package layer (tff_decorr)',
        'tff_decorr/collapse/analysis.py:6: `from tff_decorr.program import training` goes up, '
        'from the collapse layer (tff_decorr.collapse.analysis) to the program layer '
        '(tff_decorr.program.training)',
        'tff_decorr/collapse/analysis.py:7: `from tff_decorr import train` goes up, from the '
        'collapse layer (tff_decorr.collapse.analysis) to the package layer (tff_decorr)',
    ])


if __name__ == '__main__':
  absltest.main()
