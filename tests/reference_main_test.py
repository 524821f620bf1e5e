"""bench/reference_main.py's argument mapping: the argv it builds for each algorithm means, to the
reference's own argument parsers, the fidelity setting and the values the project side is given.

The parsers are the reference's own code: `get_args` of its main.py and each approach's
`extra_parser`, read from a checkout (FEDDECORR_DIR, default /tmp/FedDecorr; skipped without one)
and run with argparse alone, so neither torch nor the rest of the reference is imported.
"""

import argparse
import ast
import os
import sys
from unittest import mock

from absl.testing import absltest

from bench import reference_main

REFERENCE_DIR = os.environ.get('FEDDECORR_DIR', reference_main.DEFAULT_REFERENCE_DIR)

# The project's setting (config_lib.make keyword) -> the reference approach's argument holding the
# same number.
SAME_VALUE = {'fedprox_mu': 'mu', 'fedavgm_server_momentum': 'server_momentum',
              'fedadam_server_lr': 'server_learning_rate', 'fedadam_beta1': 'server_momentum',
              'fedadam_beta2': 'server_momentum_second', 'fedadam_tau': 'tau',
              'fedexp_eps': 'eps', 'fedlc_tau': 'calibration_temp',
              'fedrs_alpha': 'restricted_strength', 'fedsam_rho': 'rho'}


def _reference_function(path, name):
  """The function `name` defined in the reference's file `path` (decorators dropped), compiled
  alone with argparse in its namespace."""
  with open(path) as f:
    tree = ast.parse(f.read())
  node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
  node.decorator_list = []
  namespace = {'argparse': argparse, 'ArgumentParser': argparse.ArgumentParser}
  exec(compile(ast.Module(body=[node], type_ignores=[]), path, 'exec'), namespace)  # pylint: disable=exec-used
  return namespace[name]


@absltest.skipUnless(os.path.exists(os.path.join(REFERENCE_DIR, 'main.py')),
                     f'no FedDecorr checkout at {REFERENCE_DIR} (set FEDDECORR_DIR)')
class ReferenceParsersTest(absltest.TestCase):

  def _parse(self, argv):
    """(main.py's args, the approach's args) as the reference parses `argv`."""
    get_args = _reference_function(os.path.join(REFERENCE_DIR, 'main.py'), 'get_args')
    with mock.patch.object(sys, 'argv', ['main.py', *argv]):
      args, rest = get_args()
    extra_parser = _reference_function(
        os.path.join(REFERENCE_DIR, 'approach', f'{args.approach}.py'), 'extra_parser')
    with mock.patch.object(sys, 'argv', ['main.py']):
      return args, extra_parser(rest)

  def test_every_algorithm_is_the_fidelity_setting_with_the_projects_values(self):
    with open(os.path.join(REFERENCE_DIR, 'main.py')) as f:
      main_source = f.read()
    for name, m in reference_main.ALGORITHMS.items():
      for reg in ('none', 'feddecorr') if m.feddecorr else ('none',):
        with self.subTest(algorithm=name, regularizer=reg):
          args, appr = self._parse(reference_main.reference_argv(name, 3, reg, 0.5, 7))
          self.assertEqual(
              (args.model, args.dataset, args.partition, args.alpha, args.n_parties,
               args.sample_fraction, args.n_comm_round, args.epochs, args.lr, args.rho,
               args.weight_decay, args.batch_size, args.init_seed, args.approach),
              ('resnet20', 'cifar10', 'noniid', 0.5, 10, 1.0, 7, 1, 0.01, 0.9, 1e-5, 64, 3,
               m.approach))
          self.assertIn(f"args.approach == '{m.approach}'", main_source)
          for setting, value in m.project.items():
            if setting in SAME_VALUE:
              self.assertEqual(getattr(appr, SAME_VALUE[setting]), value, setting)
          if name in ('fedavgm', 'fedadam'):
            self.assertEqual(appr.server_optimizer, {'fedavgm': 'gd', 'fedadam': 'adam'}[name])
          if m.feddecorr:
            self.assertEqual((appr.feddecorr, appr.feddecorr_coef),
                             (reg == 'feddecorr', reference_main.FEDDECORR_BETA))

  def test_feddecorr_exactly_where_the_reference_has_it(self):
    for name, m in reference_main.ALGORITHMS.items():
      extra_parser = _reference_function(
          os.path.join(REFERENCE_DIR, 'approach', f'{m.approach}.py'), 'extra_parser')
      with self.subTest(algorithm=name):
        if m.feddecorr:
          self.assertTrue(extra_parser(['--feddecorr']).feddecorr)
        else:
          with self.assertRaises(SystemExit), mock.patch.object(sys, 'stderr'):
            extra_parser(['--feddecorr'])
          with self.assertRaisesRegex(ValueError, 'no FedDecorr'):
            reference_main.reference_argv(name, 0, 'feddecorr')

  def test_the_default_partition_branch_is_dirichlet(self):
    with open(os.path.join(REFERENCE_DIR, 'dataset_utils.py')) as f:
      self.assertIn('partition == "noniid-labeldir" or partition == "noniid"', f.read())


class FidelityArgsTest(absltest.TestCase):

  def test_extra_replaces_a_setting_and_appends_the_rest(self):
    argv = reference_main.fidelity_args('fedprox', 2, ['--n_comm_round=1', '--mu=0.01',
                                                        '--feddecorr'])
    self.assertIn('--n_comm_round=1', argv)
    self.assertNotIn('--n_comm_round=10', argv)
    self.assertEqual(argv[-2:], ['--mu=0.01', '--feddecorr'])
    self.assertIn('--approach=fedprox', argv)
    self.assertIn('--init_seed=2', argv)
    self.assertEqual(len({a.split('=')[0] for a in argv}), len(argv))
    with self.assertRaises(ValueError):
      reference_main.fidelity_args('fedavg', 0, ['mu=1'])


class ProjectSettingsTest(absltest.TestCase):

  def test_each_algorithms_project_settings_make_a_config(self):
    from tff_decorr.run import config as config_lib  # pylint: disable=g-import-not-at-top
    for name, m in reference_main.ALGORITHMS.items():
      with self.subTest(algorithm=name):
        c = config_lib.make(task='cifar10', model='resnet20', algorithm=name, **m.project)
        hp = c.component_hparams('algorithm')
        for setting, value in m.project.items():
          self.assertEqual(getattr(hp, setting[len(name) + 1:]), value, setting)


if __name__ == '__main__':
  absltest.main()
