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
