"""No library function is longer than 80 lines, or takes more than 6 parameters without a reason.

Reads every .py file under tff_decorr/, tasks/ and bin/ with `ast`. A function's length is its
`def` line to its last line (decorators excluded, nested functions included in their parent's),
less its docstring: a contract's Args / Returns / Raises is never a reason to split a function;
its parameters are its named ones (positional, keyword-only; `self`/`cls` and *args/**kwargs not
counted). A function may take more parameters when the comment block directly above its `def` (or
above its first decorator) gives the reason, as `# Seven parameters: <why>`. A function may be
longer only by an entry in ALLOWED_LONG, with its reason.
"""

import ast
import os
import re
import textwrap

from absl.testing import absltest

from tests import testutil

ROOTS = ('tff_decorr', 'tasks', 'bin')
MAX_LINES = 80
MAX_PARAMS = 6

# 'path:function' -> why it may be longer than MAX_LINES.
ALLOWED_LONG = {}

# The reason comment: '# <count> parameters: <why>'.
_REASON = re.compile(r'^\s*#\s*\w+ parameters: \S')


def _num_params(node: ast.FunctionDef) -> int:
  a = node.args
  names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
  if names and names[0].arg in ('self', 'cls'):
    names = names[1:]
  return len(names)


def _docstring_lines(node: ast.FunctionDef) -> int:
  first = node.body[0]
  if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
      and isinstance(first.value.value, str)):
    return first.end_lineno - first.lineno + 1
  return 0


def _comments_above(lines: list, node: ast.FunctionDef) -> list:
  """The block of comment lines directly above the function's def (or its first decorator)."""
  i = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 2
  block = []
  while i >= 0 and lines[i].lstrip().startswith('#'):
    block.append(lines[i])
    i -= 1
  return block


def oversized(source: str, path: str = '<source>') -> list:
  """['path:line name: what', ...] for each function of `source` over a limit without a reason."""
  lines = source.splitlines()
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    where = f'{path}:{node.lineno} {node.name}'
    length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
    if length > MAX_LINES and f'{path}:{node.name}' not in ALLOWED_LONG:
      found.append(f'{where}: {length} lines (at most {MAX_LINES})')
    params = _num_params(node)
    if params > MAX_PARAMS and not any(_REASON.match(c) for c in _comments_above(lines, node)):
      found.append(f'{where}: {params} parameters (at most {MAX_PARAMS} without a '
                   "'# <count> parameters: <why>' comment above it)")
  return found


def _library_files():
  for root in ROOTS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(testutil.REPO_ROOT, root)):
      dirnames[:] = sorted(d for d in dirnames if d != '__pycache__')
      for name in sorted(filenames):
        if name.endswith('.py'):
          yield os.path.relpath(os.path.join(dirpath, name), testutil.REPO_ROOT)


class OversizedTest(absltest.TestCase):
  """The checker on sources whose sizes are known by construction."""

  def _function(self, params, body_lines, comment=None):
    head = [comment] if comment else []
    return '\n'.join([*head, f'def f({", ".join(params)}):',
                      *(['  x = 1'] * body_lines), ''])

  def test_lines(self):
    self.assertEqual(oversized(self._function('a', 79)), [])  # 80 lines with the def
    self.assertEqual(oversized(self._function('a', 80)), ['<source>:1 f: 81 lines (at most 80)'])

  def test_docstring_not_counted(self):
    doc = '  """Contract.\n\n  Args:\n    a: one.\n  """'
    with_doc = self._function('a', 79).replace('def f(a):', 'def f(a):\n' + doc)
    self.assertEqual(oversized(with_doc), [])
    self.assertLen(oversized(with_doc.replace('  x = 1', '  x = 1\n  x = 2', 1)), 1)

  def test_parameters(self):
    self.assertEqual(oversized(self._function('abcdef', 1)), [])
    self.assertLen(oversized(self._function('abcdefg', 1)), 1)
    self.assertEqual(oversized(self._function(['self', *'abcdef'], 1)), [])
    self.assertEqual(oversized(self._function(['a', '*b', 'c', '**d'], 1)), [])

  def test_reason_comment(self):
    self.assertEqual(
        oversized(self._function('abcdefg', 1, '# Seven parameters: one per flag.')), [])
    self.assertLen(oversized(self._function('abcdefg', 1, '# Seven parameters:')), 1)
    self.assertLen(oversized(self._function('abcdefg', 1, '# some other remark')), 1)
    two_lines = '# Seven parameters: one per flag,\n# each with a default.'
    self.assertEqual(oversized(self._function('abcdefg', 1, two_lines)), [])
    apart = '# Seven parameters: one per flag.\n\n'
    self.assertLen(oversized(self._function('abcdefg', 1, apart)), 1)
    decorated = textwrap.dedent('''\
        class C:
          # Seven parameters: one per flag.
          @staticmethod
          def g(a, b, c, d, e, f, g):
            pass
        ''')
    self.assertEqual(oversized(decorated), [])

  def test_nested_function_counts_separately(self):
    inner = textwrap.indent(self._function('a', 80), '  ')
    self.assertEqual(oversized('def outer():\n' + inner, 'm.py'),
                     ['m.py:1 outer: 82 lines (at most 80)', 'm.py:2 f: 81 lines (at most 80)'])


class LibraryTest(absltest.TestCase):

  def test_library_functions_are_small(self):
    found = []
    for path in _library_files():
      with open(os.path.join(testutil.REPO_ROOT, path)) as f:
        found += oversized(f.read(), path)
    self.assertEqual(found, [], 'split these functions or group their parameters (a frozen '
                     'dataclass), or give the reason in a comment above the def:\n'
                     + '\n'.join(found))

  def test_allowed_entries_exist(self):
    for path in [k.split(':')[0] for k in ALLOWED_LONG]:
      self.assertTrue(os.path.exists(os.path.join(testutil.REPO_ROOT, path)),
                      f'{path}: no such file; drop it from this test\'s lists.')
    self.assertTrue(all(ALLOWED_LONG.values()), 'every ALLOWED_LONG entry says why')


if __name__ == '__main__':
  absltest.main()
