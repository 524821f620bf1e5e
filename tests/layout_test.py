"""The tree's text names things for what they are: no reference to a tracker's issue by number.

A reader of the project has no issue tracker to look a number up in. A setting is named for what it
is (bench/settings.py: `fidelity`, `reproduction`), and a decision's reason is its measurement and
the command behind it (or the commit that made it), never "see issue <number>". This test reads
every text file under tff_decorr/, tasks/, bin/, bench/, docs/, tests/ and README.md and fails with
file:line for each hit of:
- the word followed by a number: "issue" or "issues", a space, hyphen or '#' (or a line break),
  then a digit, in any case (the hits of `grep -rni "issue [0-9]"`, and the spellings it misses:
  hyphenated, with '#', or broken over two lines);
- an identifier that glues the number on (the word, an optional underscore, a digit), outside
  bench/results/, whose JSON files record the commands as they were run.

The patterns below are written so that this file does not match them itself.
"""

import os
import re

from absl.testing import absltest

from tests import testutil

ROOTS = ('tff_decorr', 'tasks', 'bin', 'bench', 'docs', 'tests', 'README.md')
# "issue" + separator + digit (the character class keeps a space-then-digit out of this file); the
# separator may be a line break, with a comment's '#' after it.
_WORDS = re.compile(r'\bissues?(?:[ \t]*\n[ \t#]*|[ \t-]+#?|#)[0-9]', re.IGNORECASE)
_IDENTIFIERS = re.compile(r'\bissue_?[0-9]', re.IGNORECASE)
_RECORDS = os.path.join('bench', 'results') + os.sep
_SKIP_DIRS = {'__pycache__', '.git'}


def _text_files(root):
  """Repository-relative paths of the text files under `root` (a directory or one file)."""
  top = os.path.join(testutil.REPO_ROOT, root)
  if os.path.isfile(top):
    yield root
    return
  for dirpath, dirnames, filenames in os.walk(top):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in sorted(filenames):
      yield os.path.relpath(os.path.join(dirpath, name), testutil.REPO_ROOT)


def _text(path):
  """The file's text, or '' for a binary file (NUL bytes, or not UTF-8)."""
  with open(os.path.join(testutil.REPO_ROOT, path), 'rb') as f:
    data = f.read()
  if b'\0' in data:
    return ''
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError:
    return ''


def find_issue_numbers(roots=ROOTS):
  """['path:line: text', ...] for every reference to an issue by number under `roots`."""
  hits = []
  for root in roots:
    for path in _text_files(root):
      text = _text(path)
      starts = list(_WORDS.finditer(text))
      if not path.startswith(_RECORDS):
        starts += _IDENTIFIERS.finditer(text)
      lines = text.split('\n')
      for number in sorted({text.count('\n', 0, m.start()) + 1 for m in starts}):
        hits.append(f'{path}:{number}: {lines[number - 1].strip()[:120]}')
  return hits


class NoIssueNumbersTest(absltest.TestCase):

  def test_the_tree_names_no_issue_by_number(self):
    hits = find_issue_numbers()
    if hits:
      self.fail(f'{len(hits)} references to an issue by number; name the setting, or give the '
                'measurement and its command instead:\n' + '\n'.join(hits))

  def test_the_patterns_find_each_spelling(self):
    # Each example is built from parts, so that this file holds none of them whole.
    number = '2' + '3'
    for text in (f'issue {number}', f'Issue {number}\'s setting', f'issues {number} and 29',
                 f'issue-{number} runs', f'issue #{number}', f'ISSUE\t{number}',
                 f'at issue\n{number}\'s setting', f'# issue\n  # {number}'):
      self.assertTrue(_WORDS.search(text), text)
    for text in (f'issue{number}_args', f'ISSUE{number}', f'--settings=issue{number}',
                 f'issue_{number}'):
      self.assertTrue(_IDENTIFIERS.search(text), text)
    for text in ('an issue of the reference', 'issues', f'tissue {number}', 'issue: 2 cores',
                 f'reissue{number}'):
      self.assertFalse(_WORDS.search(text) or _IDENTIFIERS.search(text), text)

  def test_every_root_exists(self):
    for root in ROOTS:
      self.assertTrue(os.path.exists(os.path.join(testutil.REPO_ROOT, root)), root)


if __name__ == '__main__':
  absltest.main()
