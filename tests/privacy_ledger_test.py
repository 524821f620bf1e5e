"""The privacy ledger lives outside every cache, kept by the data's identity: a cache rebuilt after
a damaged shard keeps it, another seed on the same data adds to it, a deleted or cut ledger is
reported, and the releases it lacks are found again in the run directories beside the run (each
counted once); a line that is not a release is counted as unreadable, never a traceback; and a
ledger an earlier release kept beside the cache's shards is moved into it."""

import glob
import json
import os
import shutil
import sys
import tempfile
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from tests import testutil
from tff_decorr.worker import tff_context
from tff_decorr.configs import config
from tff_decorr.run_files import privacy_ledger
from tff_decorr.program import training

# Lines that are no release: (what, line). Each was a KeyError or TypeError in 0.2.0's reader.
_MALFORMED = [
    ('an empty object', '{}'),
    ('a JSON list', '[0.8, 2, 4]'),
    ('a line missing a key', json.dumps({'run': '/r', 'noise_multiplier': 0.8,
                                         'clients_per_round': 2})),
    ('a string noise multiplier', json.dumps({'noise_multiplier': '0.8', 'clients_per_round': 2,
                                              'num_clients': 4})),
    ('a fractional client count', json.dumps({'noise_multiplier': 0.8, 'clients_per_round': 2.5,
                                              'num_clients': 4})),
    ('a boolean client count', json.dumps({'noise_multiplier': 0.8, 'clients_per_round': 2,
                                           'num_clients': True})),
    ('a null setting', json.dumps({'noise_multiplier': None, 'clients_per_round': 2,
                                   'num_clients': 4})),
    ('more clients per round than clients', json.dumps({'noise_multiplier': 0.8,
                                                        'clients_per_round': 5,
                                                        'num_clients': 4})),
    ('a run that is not a string', json.dumps({'run': 7, 'noise_multiplier': 0.8,
                                               'clients_per_round': 2, 'num_clients': 4})),
    ('a JSON string', '"release"'),
    ('not JSON', '{"noise_multiplier": 0.8, "clients_per'),
    ('bytes that are not UTF-8', '\udcff\udcfe'),
]
_DELTA = 1 / 4 ** 1.1  # the default delta of --num_clients=4


def _make_releases(ledger, run, count, noise_multiplier=0.8, clients_per_round=2, num_clients=4):
  """`count` releases made by a run in `run`, recorded by the module's own writer as a training
  run records them (the ledger, the run directory's copy and its count)."""
  os.makedirs(run, exist_ok=True)
  hook = privacy_ledger.ReleaseHook(
      ledger, run=run, noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
      num_clients=num_clients, known=len(ledger.entries()[0]))
  for round_num in range(1, count + 1):
    hook.released(round_num)


def _write_lines(path, lines):
  with open(path, 'a', errors='surrogateescape') as f:
    f.writelines(line + '\n' for line in lines)


def _delete_ledger(path):
  """Deletes the ledger's files: the .jsonl, the .seen count beside it and its lock."""
  stem = os.path.splitext(path)[0]
  for name in glob.glob(glob.escape(stem) + '.*'):
    os.remove(name)


def setUpModule():
  tff_context.install()


def tearDownModule():
  tff_context.stop_all()


class _IsolatedDataHome(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
    self.data_home = testutil.isolated_data_home(os.path.join(self.tmp, 'data_home'),
                                                 self.addCleanup)

  def assertClose(self, got, want):  # pylint: disable=invalid-name
    self.assertLessEqual(abs(got - want), 1e-9 * abs(want), f'{got} != {want}')


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


  def test_each_malformed_line_is_unreadable_not_an_error(self):
    ledger = privacy_ledger.Ledger.for_data('digits', 'ef' * 32)
    run = os.path.join(self.tmp, 'runs', 'a')
    good = {'noise_multiplier': 0.8, 'clients_per_round': 2, 'num_clients': 4}
    for what, line in _MALFORMED:
      with self.subTest(what):
        _delete_ledger(ledger.path)
        _write_lines(ledger.path, [json.dumps(good), line, json.dumps(good)])
        self.assertEqual(ledger.entries(), ([good, good], 1))
        account = privacy_ledger.account(ledger, run, 0)
        self.assertEqual((account.releases, account.unreadable_lines), ([good, good], [2]))
        self.assertIn(f'1 lines of the ledger {ledger.path} are not a release (line 2: ',
                      account.unreadable_note())
        self.assertEqual(privacy_ledger.grouped(account.releases), [(0.8, 2, 4, 2)])
        # Moved in from beside a cache, it stays a line, and stays unreadable.
        cache = os.path.join(self.tmp, 'cache', what.replace(' ', '_'))
        os.makedirs(cache)
        _write_lines(os.path.join(cache, privacy_ledger.FILE_NAME), [line, json.dumps(good)])
        self.assertEqual(ledger.migrate_from(cache, log=lambda s: None), 2)
        self.assertEqual(ledger.entries()[1], 2)

  def test_releases_only_in_run_directories_are_counted_once(self):
    ledger = privacy_ledger.Ledger.for_data('digits', 'ef' * 32)
    parent = os.path.join(self.tmp, 'runs')
    _make_releases(ledger, os.path.join(parent, 'a'), 1)
    _make_releases(ledger, os.path.join(parent, 'b'), 2, noise_multiplier=1.6)
    # Another data set's run beside them, and a run of this data under another parent.
    other = privacy_ledger.Ledger.for_data('digits', '01' * 32)
    _make_releases(other, os.path.join(parent, 'other_data'), 4)
    _make_releases(ledger, os.path.join(self.tmp, 'elsewhere', 'c'), 5)
    new = os.path.join(parent, 'new')
    # The ledger whole: its 8 releases, none twice, none missing.
    account = privacy_ledger.account(ledger, new, 0)
    self.assertEqual((len(account.releases), account.missing, account.found_in_runs), (8, 0, {}))
    self.assertEqual(account.note(), '')
    # Cut to its first line (a's release): b's two are found again in b, counted once each.
    with open(ledger.path) as f:
      first = f.readline()
    with open(ledger.path, 'w') as f:
      f.write(first)
    account = privacy_ledger.account(ledger, new, 0)
    self.assertEqual(privacy_ledger.grouped(account.releases), [(0.8, 2, 4, 1), (1.6, 2, 4, 2)])
    self.assertEqual(account.found_in_runs, {os.path.join(parent, 'b'): 2})
    self.assertEqual(account.missing, 7)  # the .seen count: 8 recorded, 1 left
    self.assertIn(f'dp_epsilon_all_releases counts the 2 of them recorded in the run directories '
                  f'{os.path.join(parent, "b")} (2), not the other 5', account.note())
    # Deleted with its .seen count: what a and b made is found again; c's, under another
    # parent, is lost (docs/security.md).
    _delete_ledger(ledger.path)
    account = privacy_ledger.account(ledger, new, 0)
    self.assertEqual(account.found_in_runs, {os.path.join(parent, 'a'): 1,
                                             os.path.join(parent, 'b'): 2})
    self.assertEqual((len(account.releases), account.missing, account.in_ledger), (3, 3, 0))
    # A record another user wrote beside the run is not read.
    with mock.patch.object(os, 'getuid', return_value=os.getuid() + 1):
      self.assertEqual(privacy_ledger.account(ledger, new, 0).missing, 0)
    # The run directories deleted together with the ledger leave nothing to report.
    shutil.rmtree(os.path.join(parent, 'a'))
    shutil.rmtree(os.path.join(parent, 'b'))
    account = privacy_ledger.account(ledger, new, 0)
    self.assertEqual((account.releases, account.missing, account.note()), ([], 0, ''))


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

    # The ledger deleted: the count beside it says 4 releases were recorded, and a and b hold
    # the 4 they made: counted again, with the run directories named.
    os.remove(ledger)
    summary, log = self._train('a', 4)  # resumes after round 3
    self.assertIn(f'Privacy: warning: the ledger {ledger} lacks at least 4 DP releases made on '
                  'this data', log)
    self.assertIn(f'counts the 4 of them recorded in the run directories '
                  f'{os.path.join(self.tmp, "a")} (3), {os.path.join(self.tmp, "b")} (1).', log)
    self.assertEqual(summary['dp_ledger_missing_releases'], 4)
    self.assertEqual(summary['dp_ledger_found_in_run_dirs'],
                     {os.path.join(self.tmp, 'a'): 3, os.path.join(self.tmp, 'b'): 1})
    self.assertIn(f'Privacy: warning: {summary["dp_ledger_note"]}.', log)
    self.assertEqual(summary['dp_releases_on_data'], 5)
    self.assertClose(summary['dp_epsilon_all_releases'], testutil.dp_epsilon_reference(
        [(0.8, 2, 4, 4), (0.8, 2, 3, 1)], summary['dp_delta']))

    # The whole data folder deleted, and the run directories' copies of their releases (as a
    # run directory written before they were kept holds none): its count still says so.
    shutil.rmtree(self.data_home)
    for run in 'ab':
      os.remove(os.path.join(self.tmp, run, privacy_ledger.RUN_RELEASES))
    summary, log = self._train('a', 5)
    self.assertIn('lacks at least 5 DP releases made on this data', log)
    self.assertIn(os.path.join(self.tmp, 'a', privacy_ledger.RUN_RECORD),
                  summary['dp_ledger_note'])
    self.assertIn('dp_epsilon_all_releases does not count them', summary['dp_ledger_note'])
    self.assertEqual(summary['dp_ledger_missing_releases'], 5)
    self.assertEqual(summary['dp_releases_on_data'], 1)

  def test_a_cut_ledger_is_reported(self):
    summary, _ = self._train('a', 3)
    with open(summary['dp_ledger']) as f:
      lines = f.readlines()
    with open(summary['dp_ledger'], 'w') as f:
      f.writelines(lines[:1])
    summary, log = self._train('c', 1, seed=3)
    self.assertIn('lacks at least 2 DP releases made on this data', log)
    self.assertEqual(summary['dp_ledger_missing_releases'], 2)
    # a's 2 cut releases are found in a, its first is in the ledger: 3 + c's 1, none twice.
    self.assertEqual(summary['dp_ledger_found_in_run_dirs'], {os.path.join(self.tmp, 'a'): 2})
    self.assertEqual(summary['dp_releases_on_data'], 4)

  def test_a_deleted_ledger_is_counted_from_the_sibling_run_directories(self):
    # The case: six DP run directories under one parent made 12 releases; the ledger's
    # files are deleted; a new run in a new --output_dir under the same parent. The first run
    # is a real one; the five others are recorded by the module's own writer, two of them at
    # another noise.
    summary, _ = self._train('run_0', 2)
    ledger = privacy_ledger.Ledger(summary['dp_ledger'])
    runs = [os.path.join(self.tmp, f'run_{i}') for i in range(6)]
    for i, run in enumerate(runs[1:], 1):
      _make_releases(ledger, run, 2, noise_multiplier=0.8 if i < 4 else 1.6)
    self.assertEqual((len(ledger.entries()[0]), ledger.seen()), (12, 12))
    _delete_ledger(ledger.path)

    summary, log = self._train('new', 1)
    # At its start and at its end, the run names the six directories and the 12 releases.
    warnings = [l for l in log.splitlines() if l.startswith('Privacy: warning: the ledger')]
    self.assertLen(warnings, 2)
    for warning in warnings:
      self.assertIn(f'the ledger {ledger.path} lacks at least 12 DP releases made on this data',
                    warning)
      self.assertIn('counts the 12 of them recorded in the run directories '
                    + ', '.join(f'{run} (2)' for run in runs), warning)
    with open(os.path.join(self.tmp, 'new', 'summary.json')) as f:
      written = json.load(f)
    for s in summary, written:
      self.assertEqual(s['dp_ledger_missing_releases'], 12)
      self.assertEqual(s['dp_ledger_found_in_run_dirs'], {run: 2 for run in runs})
      self.assertEqual(s['dp_releases_on_data'], 13)
      # Every release composed, against the accountant written in testutil from the papers;
      # the run's own epsilon counts its one round.
      self.assertClose(s['dp_epsilon_all_releases'], testutil.dp_epsilon_reference(
          [(0.8, 2, 4, 9), (1.6, 2, 4, 4)], _DELTA))
      self.assertClose(s['dp_epsilon'],
                       testutil.dp_epsilon_reference([(0.8, 2, 4, 1)], _DELTA))
    self.assertGreater(summary['dp_epsilon_all_releases'], 3 * summary['dp_epsilon'])
    # The new ledger holds the new run's round; the new run directory knows of all 13.
    self.assertLen(ledger.entries()[0], 1)
    with open(os.path.join(self.tmp, 'new', privacy_ledger.RUN_RECORD)) as f:
      self.assertEqual(json.load(f)['releases_seen'], 13)

  def test_malformed_ledger_lines_are_unreadable_and_the_run_completes(self):
    summary, _ = self._train('a', 1)
    _write_lines(summary['dp_ledger'], [line for _, line in _MALFORMED])
    summary, log = self._train('b', 1, seed=5)
    n = len(_MALFORMED)
    self.assertIn(f'Privacy: warning: {n} lines of the ledger {summary["dp_ledger"]} are not a '
                  f'release (line {", ".join(str(i) for i in range(2, 10))} and {n - 8} more: ',
                  log)
    with open(os.path.join(self.tmp, 'b', 'summary.json')) as f:
      written = json.load(f)
    for s in summary, written:
      self.assertEqual(s['final_round'], 1)
      self.assertEqual(s['dp_ledger_unreadable_lines'], n)
      self.assertEqual(s['dp_releases_on_data'], 2)  # a's round and b's, nothing else
      self.assertClose(s['dp_epsilon_all_releases'],
                       testutil.dp_epsilon_reference([(0.8, 2, 4, 2)], _DELTA))
      self.assertIn(f'{n} unreadable ledger lines are not counted', s['dp_note'])
    self.assertNotIn('dp_ledger_missing_releases', summary)


if __name__ == '__main__':
  absltest.main()
