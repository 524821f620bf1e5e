"""bin/partition: prints the clients x classes matrix, writes the heatmap, rejects bad flags."""

import os
import tempfile

from absl.testing import absltest
import numpy as np

from tests import testutil
from tff_decorr.tasks import registry
from tff_decorr import partitions


class PartitionCliTest(absltest.TestCase):

  def test_matrix_and_png_match_the_library(self):
    png = os.path.join(tempfile.mkdtemp(), 'p.png')
    proc = testutil.run_module('bin.partition', '--dirichlet_alpha=0.3', '--num_clients=5',
                               '--seed=2',
                               f'--output={png}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertGreater(os.path.getsize(png), 1000)
    rows = [l.split() for l in proc.stdout.splitlines() if l.strip() and l.split()[0].isdigit()]
    got = np.array([[int(v) for v in r[1:11]] for r in rows])
    _, labels, _ = registry.get('digits').load_split('train', None)
    parts = partitions.dirichlet_partition(labels, 5, 0.3, seed=2)
    np.testing.assert_array_equal(got, partitions.class_count_matrix(labels, parts, 10))

  def test_task_defaults_as_bin_train_resolves_them(self):
    """cifar10 without a partition flag: its task's Dirichlet alpha 0.05 (not the partition's own
    0.5) and its clients, the partition bin/train's configuration of the same flags trains on."""
    data_dir = testutil.shared_tfds_dir()
    if data_dir is None:
      self.skipTest('no prepared cifar10 in ../shared/data/tfds beside the checkout')
    png = os.path.join(tempfile.mkdtemp(), 'p.png')
    proc = testutil.run_module('bin.partition', '--task=cifar10', f'--data_dir={data_dir}',
                               f'--output={png}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn('cifar10: dirichlet partition, alpha 0.05, 10 clients, seed 0', proc.stdout)
    rows = [l.split() for l in proc.stdout.splitlines() if l.strip() and l.split()[0].isdigit()]
    got = np.array([[int(v) for v in r[1:11]] for r in rows])
    # bin/train's flags resolved by bin/train's own path (bin/study checks its cells with it).
    from tff_decorr.configs import cli  # pylint: disable=g-import-not-at-top
    from tff_decorr.studies import study  # pylint: disable=g-import-not-at-top
    train_flags = study.new_train_flags()
    train_flags(['train', '--task=cifar10', f'--data_dir={data_dir}'])
    config = cli.resolve_configs(train_flags)[0]
    self.assertEqual((config.partition, config.component_hparams('partition').alpha,
                      config.num_clients, config.seed), ('dirichlet', 0.05, 10, 0))
    _, labels, _ = registry.get('cifar10').load_split('train', data_dir)
    parts = partitions.dirichlet_partition(labels, 10, 0.05, seed=0)
    np.testing.assert_array_equal(got, partitions.class_count_matrix(labels, parts, 10))

  def test_bad_flags(self):
    # Errors name the flags; a tiny alpha gives the one-line error without NumPy warnings before
    # it.
    for flag, name in (('--dirichlet_alpha=0', '--dirichlet_alpha'),
                       ('--dirichlet_alpha=1e-300', 'larger --dirichlet_alpha'),
                       ('--num_clients=100000', '--num_clients'),
                       ('--task=imagenet', '--task'), ('--partition=domain', 'domain'),
                       ('--partition=pathological --pathological_classes_per_client=20',
                        '--pathological_classes_per_client')):
      proc = testutil.run_module('bin.partition', *flag.split(),
                                 f'--output={tempfile.mkdtemp()}/x.png')
      self.assertEqual(proc.returncode, 2, (flag, proc.stderr[-1000:]))
      self.assertIn(name, proc.stderr)
      self.assertNotIn('Traceback', proc.stderr)
      self.assertNotIn('RuntimeWarning', proc.stderr)


if __name__ == '__main__':
  absltest.main()
