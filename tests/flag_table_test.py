"""flag_table.json, bin/train's flags as data read without TensorFlow, says what the registries say.

The table is generated (`python -m tff_decorr.configs.flag_table`); a component added, renamed or
given a new setting without regenerating it fails here, naming the command.
"""

import json

from absl import flags
from absl.testing import absltest

from tff_decorr.configs import cli
from tff_decorr.configs import flag_table

_FIX = 'flag_table.json is stale: run `.venv/bin/python -m tff_decorr.configs.flag_table`'


def _flags_as_data(fv):
  """{name: (type, default, help, enum values)} of every flag defined on `fv`."""
  return {name: (type(f).__name__, f.default, f.help, getattr(f.parser, 'enum_values', None))
          for name, f in fv._flags().items()}  # pylint: disable=protected-access


class FlagTableTest(absltest.TestCase):

  def test_the_file_is_what_the_registries_give(self):
    live = json.loads(json.dumps(flag_table.build()))  # As JSON holds it (lists, not tuples).
    stored = flag_table.load()
    self.assertEqual(stored.keys(), live.keys(), _FIX)
    for key in live:
      self.assertEqual(stored[key], live[key], f'{_FIX} (it differs in {key!r})')

  def test_the_flags_from_the_file_are_the_flags_from_the_registries(self):
    from_file, from_registries = flags.FlagValues(), flags.FlagValues()
    cli.define_component_flags(from_file, flag_table.load())
    cli.define_component_flags(from_registries, flag_table.build())
    self.assertEqual(_flags_as_data(from_file), _flags_as_data(from_registries), _FIX)
    # A few by hand, from the components' declarations (tff_decorr.hparams).
    self.assertEqual(from_file['fedprox_mu'].help.split(' [')[1], 'algorithm fedprox; default 0.001]')
    self.assertIsInstance(from_file['dirichlet_alpha'], flags.Flag)
    self.assertEqual(type(from_file['moon_temperature'].parser).__name__, 'FloatParser')


if __name__ == '__main__':
  absltest.main()
