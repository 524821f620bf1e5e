"""The defaults the docs state are the code's: generated blocks, current and complete.

A page states a setting's default only inside a block that `python -m
tff_decorr.configs.defaults_doc` writes from the settings' declarations (tff_decorr.hparams
fields through the registries, the tasks' defaults). This test fails while a block differs from
what the command writes (a default changed in the code, or a number edited on the page), when a
setting bin/train defines a flag for has no row in any block, and when a row's default, read back
from the page, is not its field's.
"""

import dataclasses
import os
import re
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest

from tests import testutil
from tff_decorr import hparams
from tff_decorr.configs import cli
from tff_decorr.configs import config
from tff_decorr.configs import defaults_doc

_FIX = f'run `.venv/bin/{defaults_doc.COMMAND}`'
_CELL_SPLIT = re.compile(r'(?<!\\)\|')


def _rows(text):
  """The rows of the Markdown table(s) in `text` as {header: cell} (cells unquoted)."""
  rows, header = [], None
  for line in text.splitlines():
    if not line.startswith('|'):
      header = None
      continue
    cells = [c.strip().strip('`') for c in _CELL_SPLIT.split(line)[1:-1]]
    if header is None:
      header = cells
    elif not set(line) <= set('|- '):
      rows.append(dict(zip(header, cells)))
  return rows


def _value(text):
  """A default as the page writes it, as Python: true/false, a number, or a name."""
  if text in ('true', 'false'):
    return text == 'true'
  try:
    return float(text)
  except ValueError:
    return text


def _page_blocks():
  return [b for p in defaults_doc.pages(testutil.REPO_ROOT) for b in defaults_doc.blocks(p)]


def _settings():
  """{flag: the field's default} of every component setting and the client optimiser's, from
  the registries' HParams classes and the Config's client optimiser."""
  out = {spec.name: spec.default for _, _, spec in config.component_flag_specs()}
  client = type(config.Config().client_optimizer)
  out.update({spec.name: spec.default for spec in hparams.flag_specs(client)})
  return out


class DefaultsDocsTest(absltest.TestCase):

  def test_every_block_is_what_the_command_writes(self):
    self.assertEqual(defaults_doc.ROOT, testutil.REPO_ROOT)
    stale = defaults_doc.stale()
    self.assertEmpty(stale, '\n'.join(stale))

  def test_every_flag_of_a_setting_has_a_row_with_its_default(self):
    fv = flags.FlagValues()
    generic = cli.define_train_flags(fv)
    settings = _settings()
    # The flags bin/train defines for settings are the ones this test reads from the classes.
    self.assertEqual(set(settings), set(fv) - set(generic) | {'client_lr', 'momentum',
                                                              'weight_decay'})
    rows = {}
    for block in _page_blocks():
      if block.name in ('defaults/generic', 'defaults/tasks'):
        continue
      for row in _rows(block.text):
        rows.setdefault(row['flag'].lstrip('-'), []).append((block, row))
    self.assertEmpty(sorted(set(settings) - set(rows)), f'settings in no docs table: {_FIX} '
                     'after adding a block (defaults_doc module docstring)')
    for flag, found in rows.items():
      for block, row in found:
        where = f'{os.path.relpath(block.path, testutil.REPO_ROOT)}:{block.line} ({block.name})'
        value = _value(row['default'])
        expected = settings[flag]
        if isinstance(expected, float):
          self.assertAlmostEqual(value, expected, delta=1e-12 * abs(expected), msg=where)
        else:
          self.assertEqual(value, expected, where)

  def test_every_component_and_the_run_settings_have_a_block(self):
    for (kind, name), names in defaults_doc.documented().items():
      has_settings = dataclasses.fields(config.registry(kind).hparams_class(name))
      if has_settings or kind == 'algorithm':  # Every algorithm has its entry, settings or not.
        self.assertNotEmpty(names, f'no block for {kind} {name}: add '
                            f'{defaults_doc.BEGIN.format(name=f"defaults/{kind}/{name}")} and '
                            f'{defaults_doc.END.format(name=f"defaults/{kind}/{name}")} to a '
                            f'page, then {_FIX}')
    names = {b.name for b in _page_blocks()}
    self.assertContainsSubset({'defaults/client', 'defaults/generic', 'defaults/tasks'}, names)

  def test_the_tasks_table_gives_each_tasks_value(self):
    # cifar10's Dirichlet alpha and cifar100's FedAvgM momentum, as tasks_test pins them, read
    # from the page; digits sets no projection head, so its cell is empty.
    (block,) = [b for b in _page_blocks() if b.name == 'defaults/tasks']
    rows = {r['flag']: r for r in _rows(block.text)}
    self.assertEqual(_value(rows['--dirichlet_alpha']['cifar10']), 0.05)
    self.assertEqual(_value(rows['--fedavgm_server_momentum']['cifar100']), 0.5)
    self.assertEqual(_value(rows['--dirichlet_alpha']['without a task']), 0.5)
    self.assertEqual(rows['--projection_dim']['digits'], '—')

  def test_a_changed_default_makes_its_block_stale(self):
    fedprox = config.registry('algorithm').hparams_class('fedprox')

    @dataclasses.dataclass(frozen=True)
    class Changed(fedprox):
      mu: float = hparams.field(0.25, 'proximal coefficient.', minimum=0.0)

    original = config.registry('algorithm').hparams_class
    page = os.path.join(testutil.REPO_ROOT, 'docs', 'algorithms.md')
    with mock.patch.object(config.registry('algorithm'), 'hparams_class',
                           lambda name: Changed if name == 'fedprox' else original(name)):
      stale = defaults_doc.stale([page])
    (block,) = [b for b in defaults_doc.blocks(page) if b.name == 'defaults/algorithm/fedprox']
    self.assertEqual(stale, [f'docs/algorithms.md:{block.line}: defaults/algorithm/fedprox is '
                             f'stale; run {defaults_doc.COMMAND}'])

  def test_an_edited_page_is_found_and_rewritten(self):
    page = os.path.join(testutil.REPO_ROOT, 'docs', 'algorithms.md')
    with open(page, encoding='utf-8') as f:
      original = f.read()
    edited = original.replace('| `--fedprox_mu` | `1e-3` |', '| `--fedprox_mu` | `1e-2` |')
    self.assertNotEqual(edited, original)
    with tempfile.TemporaryDirectory() as tmp:
      copy = os.path.join(tmp, 'algorithms.md')
      with open(copy, 'w', encoding='utf-8') as f:
        f.write(edited)
      self.assertLen(defaults_doc.stale([copy]), 1)
      self.assertEqual(defaults_doc.write([copy]), [copy])
      with open(copy, encoding='utf-8') as f:
        self.assertEqual(f.read(), original)
      self.assertEmpty(defaults_doc.stale([copy]))
      shutil.copy(page, copy)
      self.assertEqual(defaults_doc.write([copy]), [])  # A current page is left as it is.

  def test_a_block_without_its_end_is_refused_with_its_line(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'page.md')
      with open(path, 'w', encoding='utf-8') as f:
        f.write('text\n' + defaults_doc.BEGIN.format(name='defaults/client') + '\n')
      with self.assertRaisesRegex(ValueError, r'page.md:2: block defaults/client has no end'):
        list(defaults_doc.blocks(path))
    with self.assertRaisesRegex(ValueError, 'names no generated block'):
      defaults_doc.render('defaults/nothing')


if __name__ == '__main__':
  absltest.main()
