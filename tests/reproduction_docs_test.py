"""docs/reproduction.md's and the README's generated blocks equal what the committed archive gives.

bench/accuracy/reproduction.py --figures writes them; a seed archived without re-running it, or a
number edited by hand, fails here.
"""

import os

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from bench.accuracy import reproduction
from tests import testutil
from tff_decorr.studies import aggregate
from tff_decorr.studies import study

_ROOT = testutil.REPO_ROOT  # The source tree, also under Bazel (its runfiles hold no docs).


def _block(path: str, name: str) -> str:
  with open(os.path.join(_ROOT, path)) as f:
    doc = f.read()
  begin = reproduction.BEGIN.format(name=name)
  i, j = doc.find(begin), doc.find(reproduction.END.format(name=name))
  if i < 0 or j < i:
    raise AssertionError(f'{path} has no generated block {name!r}')
  return doc[i + len(begin) + 1:j]


class ReproductionDocsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS(['reproduction_docs_test'])
    archive = reproduction.archive_dir()
    manifest = study.read_manifest(archive)
    cls.runs = [r for r in aggregate.load_runs(archive, manifest) if r.done]

  def test_effects_block_is_current(self):
    self.assertEqual(_block('docs/reproduction.md', 'reproduction-effects'),
                     reproduction.effects_markdown(self.runs))

  def test_readme_table_is_current(self):
    self.assertEqual(_block('README.md', 'reproduction-table'),
                     reproduction.readme_table(self.runs))

  def test_effects_file_is_current(self):
    with open(os.path.join(_ROOT, 'docs', 'reproduction', 'alpha0.05', 'effects.md')) as f:
      self.assertEqual(f.read(), reproduction.effects_markdown(self.runs))

  def test_windows_block_is_current(self):
    self.assertEqual(_block('docs/reproduction.md', 'reproduction-windows-alpha0.05'),
                     reproduction.windows_markdown(self.runs))

  def test_longer_variant_blocks_are_current(self):
    with flagsaver.flagsaver(rounds=50):
      archive = reproduction.archive_dir()
      runs = []
      if (study.read_json(os.path.join(archive, 'study.json')) or {}).get('cells'):
        runs = [r for r in aggregate.load_runs(archive, study.read_manifest(archive)) if r.done]
      variant = reproduction.variant()
      self.assertEqual(_block('docs/reproduction.md', f'reproduction-windows-{variant}'),
                       reproduction.windows_markdown(runs))
      self.assertEqual(_block('docs/reproduction.md', f'reproduction-first-rounds-{variant}'),
                       reproduction.archived_first_rounds(runs))

  def test_each_seed_has_both_methods(self):
    # The archive pairs seeds: a seed with one method finished is reported as in progress only.
    seeds = {}
    for r in self.runs:
      seeds.setdefault(r.flags['seed'], set()).add(r.flags['regularizer'])
    self.assertGreaterEqual(len(seeds), 3)
    self.assertTrue(all(v <= set(reproduction.METHODS) for v in seeds.values()))


if __name__ == '__main__':
  absltest.main()
