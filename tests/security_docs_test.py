"""docs/security.md's threat model names, for each row, the tests that check it: each named test
exists (a renamed or deleted test fails here, so the table cannot silently go stale)."""

import ast
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from tests import testutil

_NAME = re.compile(r'`([a-z_]+_test)\.([A-Za-z_]+)\.(test_[a-z0-9_]+)`')


def _methods(module: str) -> dict:
  with open(os.path.join(testutil.REPO_ROOT, 'tests', f'{module}.py')) as f:
    tree = ast.parse(f.read())
  return {node.name: {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
          for node in tree.body if isinstance(node, ast.ClassDef)}


class SecurityDocsTest(absltest.TestCase):

  def test_every_row_names_tests_that_exist(self):
    with open(os.path.join(testutil.REPO_ROOT, 'docs', 'security.md')) as f:
      rows = [line for line in f if line.startswith('| ') and not line.startswith('| What')
              and not line.startswith('| ---')]
    self.assertGreaterEqual(len(rows), 10)
    for row in rows:
      test_cell = row.rstrip().rstrip('|').rsplit('|', 1)[-1]
      names = _NAME.findall(test_cell)
      if not names:
        self.assertIn('none', test_cell, f'a row names no test: {row[:80]}')
        continue
      for module, cls, method in names:
        methods = _methods(module)
        self.assertIn(cls, methods, f'{module}.{cls} (docs/security.md) does not exist')
        self.assertIn(method, methods[cls], f'{module}.{cls}.{method} does not exist')


if __name__ == '__main__':
  absltest.main()
