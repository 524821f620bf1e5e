"""bench/reference/reference_main.py's argument mapping: the argv it builds for each algorithm
means, to the reference's own argument parsers, the fidelity setting and the values the project side
is given.

The parsers are the reference's `get_args` of its main.py and each approach's `extra_parser`, as
data: tests/testdata/reference/parsers.json, made once from a checkout of the reference (commit
973e4af) by bench/reference/reference_parser_specs.py (its docstring says how and what it records).
The test rebuilds each parser with argparse from that file, so it runs without the checkout.
"""

import argparse
import json
import os

from absl.testing import absltest

from bench.reference import reference_main

SPECS = os.path.join(os.path.dirname(os.path.realpath(__file__)), 'testdata', 'reference',
                     'parsers.json')

# The project's setting (config_lib.make keyword) -> the reference approach's argument holding the
# same number.
SAME_VALUE = {'fedprox_mu': 'mu', 'fedavgm_server_momentum': 'server_momentum',
              'fedadam_server_lr': 'server_learning_rate', 'fedadam_beta1': 'server_momentum',
              'fedadam_beta2': 'server_momentum_second', 'fedadam_tau': 'tau',
              'fedexp_eps': 'eps', 'fedlc_tau': 'calibration_temp',
              'fedrs_alpha': 'restricted_strength', 'fedsam_rho': 'rho',
              'moon_mu': 'mu'}
_TYPES = {None: None, 'int': int, 'float': float, 'str': str}


class _Refused(Exception):
  """The reference's parser would exit on this argv."""


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    raise _Refused(message)


def build_parser(spec):
  """An argparse parser with the recorded arguments of one of the reference's parsers."""
  parser = _Parser(add_help=False)
  for a in spec['arguments']:
    kwargs = {'dest': a['dest'], 'action': a['action'], 'default': a['default'],
              'required': a['required']}
    if a['action'] == 'store':
      kwargs.update(type=_TYPES[a['type']], choices=a['choices'])
    parser.add_argument(*a['option_strings'], **kwargs)
  return parser


def parse(specs, argv):
  """(main.py's args, the approach's args) as the reference parses `argv`: main.py hands the
  options it does not know to its approach's parser, which refuses any it does not know."""
  assert specs['main']['unknown_options'] == 'returned', specs['main']['unknown_options']
  args, rest = build_parser(specs['main']).parse_known_args(argv)
  approach = specs['approaches'][args.approach]
  assert approach['unknown_options'] == 'error', approach['unknown_options']
  return args, build_parser(approach).parse_args(rest)


class ReferenceParsersTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    with open(SPECS) as f:
      cls.specs = json.load(f)

  def test_every_algorithm_is_the_fidelity_setting_with_the_projects_values(self):
    for name, m in reference_main.ALGORITHMS.items():
      for reg in ('none', 'feddecorr') if m.feddecorr else ('none',):
        with self.subTest(algorithm=name, regularizer=reg):
          args, appr = parse(self.specs, reference_main.reference_argv(name, 3, reg, 0.5, 7))
          self.assertEqual(
              (args.model, args.dataset, args.partition, args.alpha, args.n_parties,
               args.sample_fraction, args.n_comm_round, args.epochs, args.lr, args.rho,
               args.weight_decay, args.batch_size, args.init_seed, args.approach),
              ('resnet20', 'cifar10', 'noniid', 0.5, 10, 1.0, 7, 1, 0.01, 0.9, 1e-5, 64, 3,
               m.approach))
          self.assertIn(m.approach, self.specs['main_approaches'])
          for setting, value in m.project.items():
            if setting in SAME_VALUE:
              self.assertEqual(getattr(appr, SAME_VALUE[setting]), value, setting)
          if name == 'moon':  # The projection head the project's CIFAR-10 MOON has (256).
            self.assertEqual((appr.use_proj_head, appr.proj_dim), (True, 256))
          if name in ('fedavgm', 'fedadam'):
            self.assertEqual(appr.server_optimizer, {'fedavgm': 'gd', 'fedadam': 'adam'}[name])
          if m.feddecorr:
            self.assertEqual((appr.feddecorr, appr.feddecorr_coef),
                             (reg == 'feddecorr', reference_main.FEDDECORR_BETA))

  def test_feddecorr_exactly_where_the_reference_has_it(self):
    for name, m in reference_main.ALGORITHMS.items():
      approach = build_parser(self.specs['approaches'][m.approach])
      with self.subTest(algorithm=name):
        if m.feddecorr:
          self.assertTrue(approach.parse_args(['--feddecorr']).feddecorr)
        else:
          with self.assertRaises(_Refused):
            approach.parse_args(['--feddecorr'])
          with self.assertRaisesRegex(ValueError, 'no FedDecorr'):
            reference_main.reference_argv(name, 0, 'feddecorr')

  def test_the_fidelity_partition_is_the_dirichlet_branch(self):
    partition = dict(reference_main.FIDELITY)['--partition']
    self.assertIn(partition, self.specs['dirichlet_partitions'])


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
    from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
    for name, m in reference_main.ALGORITHMS.items():
      with self.subTest(algorithm=name):
        c = config_lib.make(task='cifar10', model='resnet20', algorithm=name, **m.project)
        hp = c.component_hparams('algorithm')
        for setting, value in m.project.items():
          self.assertEqual(getattr(hp, setting[len(name) + 1:]), value, setting)


if __name__ == '__main__':
  absltest.main()
