"""The privacy ledger lives outside every cache, kept by the data's identity: a cache rebuilt after
a damaged shard keeps it, another seed on the same data adds to it, a deleted or cut ledger is
reported, and a ledger an earlier release kept beside the cache's shards is moved into it."""

import json
import os
import shutil
import sys
import tempfile
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from tff_decorr.federated import tff_context
from tff_decorr.configs import config
from tff_decorr.run_files import privacy_ledger
from tff_decorr.run import training


def setUpModule():
  tff_context.install()


def tearDownModule():
  tff_context.stop_all()


class _IsolatedDataHome(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
    self.data_home = os.path.join(self.tmp, 'data_home')
    patcher = mock.patch.dict(os.environ, {'XDG_DATA_HOME': self.data_home})
    patcher.start()
    self.addCleanup(patcher.stop)


class LedgerFileTest(_IsolatedDataHome):

  def test_kept_in_the_users_data_folder_by_task_and_examples(self):
    ledger = privacy_ledger.Ledger.for_data('digits', 'ab' * 32)
    self.assertEqual(ledger.path, os.path.join(self.data_home, 'tff_decorr', 'privacy_ledgers',
                                               'digits-' + 'ab' * 12 + '.jsonl'))
    self.assertEqual(os.stat(os.path.dirname(ledger.path)).st_mode & 0o777, 0o700)
    with mock.patch.dict(os.environ, {'XDG_DATA_HOME': 'relative'}):  # ignored, as XDG says
      self.assertEqual(privacy_ledger.data_root(),
                       os.path.join(os.path.expanduser('~'), '.local', 'share', 'tff_decorr'))

  def test_a_ledger_beside_the_cache_is_moved_in_once(self):
    cache = os.path.join(self.tmp, 'cache', 'digits', 'dirichlet-0123')
    os.makedirs(cache)
    entry = {'time': 't', 'run': '/r', 'noise_multiplier': 0.8, 'clients_per_round': 2,
             'num_clients': 4}
    with open(os.path.join(cache, privacy_ledger.FILE_NAME), 'w') as f:
      f.write(json.dumps(entry) + '\n' + json.dumps(entry) + '\n')
    lines = []
    ledger = privacy_ledger.open_for_run('digits', 'cd' * 32, [cache], log=lines.append)
    entries, unreadable = ledger.entries()
    self.assertEqual((len(entries), unreadable), (2, 0))
    self.assertEqual(entries[0]['migrated_from'], os.path.join(cache, privacy_ledger.FILE_NAME))
    self.assertEqual(ledger.seen(), 2)
    self.assertIn('Privacy: moved 2 DP releases recorded in', lines[0])
    self.assertFalse(os.path.exists(os.path.join(cache, privacy_ledger.FILE_NAME)))
    privacy_ledger.open_for_run('digits', 'cd' * 32, [cache], log=lines.append)  # once only
    self.assertLen(ledger.entries()[0], 2)
    self.assertLen(lines, 1)


class LedgerThroughTrainingTest(_IsolatedDataHome):
  """Runs of bin/train's program on the digits data under --aggregator=dp."""

  def _train(self, name, rounds, **settings):
    c = config.make(**{**dict(task='digits', num_clients=4, clients_per_round=2, local_epochs=1,
                              batch_size=64, regularizer='none', aggregator='dp',
                              dp_noise_multiplier=0.8, dp_clip=1.0,
                              cache_dir=os.path.join(self.tmp, 'cache')),
                       **settings, 'rounds': rounds})
    c.output_dir = os.path.join(self.tmp, name)
    lines = []
    summary = training.train(c, log=lines.append)
    return summary, '\n'.join(lines)

  def test_cache_rebuilds_other_seeds_and_a_deleted_ledger(self):
    summary, _ = self._train('a', 2)
    ledger = summary['dp_ledger']
    self.assertTrue(ledger.startswith(os.path.join(self.data_home, 'tff_decorr',
                                                   'privacy_ledgers', 'digits-')))
    self.assertEqual(summary['dp_releases_on_data'], 2)
    # The ledger is nowhere in the cache.
    cache_files = [f for _, _, fs in os.walk(os.path.join(self.tmp, 'cache')) for f in fs]
    self.assertNotIn(privacy_ledger.FILE_NAME, cache_files)

    # A damaged shard: the cache folder is replaced whole when the run resumes; the ledger stays.
    (shard_dir,) = [d for d, _, fs in os.walk(os.path.join(self.tmp, 'cache'))
                    if '0.tfrecord' in fs]
    os.remove(os.path.join(shard_dir, '0.tfrecord'))
    summary, log = self._train('a', 3)
    self.assertIn('shard(s) missing or changed; rewriting it', log)
    self.assertTrue(os.path.exists(os.path.join(shard_dir, '0.tfrecord')))
    self.assertEqual((summary['dp_ledger'], summary['dp_releases_on_data']), (ledger, 3))
    self.assertNotIn('dp_ledger_missing_releases', summary)

    # Another seed (another partition of the same examples): the same ledger, counted together.
    summary, log = self._train('b', 1, seed=7, num_clients=3)
    self.assertEqual((summary['dp_ledger'], summary['dp_releases_on_data']), (ledger, 4))
    self.assertIn('Privacy: 3 DP rounds were released on this data before this start', log)
    self.assertIn('4 DP rounds were released on this data, 1 of them in this run',
                  summary['dp_note'])

    # The ledger deleted: the count beside it says 4 releases were recorded.
    os.remove(ledger)
    summary, log = self._train('a', 4)  # resumes after round 3
    self.assertIn(f'Privacy: warning: the ledger {ledger} lacks at least 4 DP releases made on '
                  'this data', log)
    self.assertEqual(summary['dp_ledger_missing_releases'], 4)
    self.assertIn('dp_epsilon_all_releases does not count them', summary['dp_ledger_note'])
    self.assertIn(f'Privacy: warning: {summary["dp_ledger_note"]}.', log)
    self.assertEqual(summary['dp_releases_on_data'], 1)

    # The whole data folder deleted: the run directory's own count still says so.
    shutil.rmtree(self.data_home)
    summary, log = self._train('a', 5)
    self.assertIn('lacks at least 5 DP releases made on this data', log)
    self.assertIn(os.path.join(self.tmp, 'a', privacy_ledger.RUN_RECORD),
                  summary['dp_ledger_note'])
    self.assertEqual(summary['dp_ledger_missing_releases'], 5)

  def test_a_cut_ledger_is_reported(self):
    summary, _ = self._train('a', 3)
    with open(summary['dp_ledger']) as f:
      lines = f.readlines()
    with open(summary['dp_ledger'], 'w') as f:
      f.writelines(lines[:1])
    summary, log = self._train('c', 1, seed=3)
    self.assertIn('lacks at least 2 DP releases made on this data', log)
    self.assertEqual(summary['dp_ledger_missing_releases'], 2)
    self.assertEqual(summary['dp_releases_on_data'], 2)


if __name__ == '__main__':
  absltest.main()
