"""A run cut short is packed with its newest checkpoint and put back into a study elsewhere."""

import json
import os
import shutil
import tarfile

from absl.testing import absltest

from bench.accuracy import reproduction
from tests import testutil
from tff_decorr.studies import archive
from tff_decorr.studies import study


def _write(path, text='x'):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


class ResumePackTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path
    self.run = os.path.join(self.tmp, 'study', 'runs', 'cifar10-fedavg-none-abc')
    for f in ('config.json', 'metrics.csv', 'tensorboard/events', 'client_states/3/state.npz',
              'export/round_10/saved_model.pb', 'checkpoints/round_9/state.npz',
              'checkpoints/client_states_9.json', 'checkpoints/round_12/state.npz',
              'checkpoints/client_states_12.json'):
      _write(os.path.join(self.run, f), f)
    self.archive = os.path.join(self.tmp, 'archive')
    self.pack = os.path.join(self.archive, 'in_progress', 'cifar10-fedavg-none-abc',
                             reproduction.RESUME_PACK)
    os.makedirs(os.path.dirname(self.pack))
    reproduction.pack(self.run, self.pack)

  def test_keeps_only_the_newest_checkpoint(self):
    with tarfile.open(self.pack) as tar:
      names = {m.name for m in tar.getmembers() if m.isfile()}
    prefix = 'cifar10-fedavg-none-abc/'
    self.assertIn(prefix + 'checkpoints/round_12/state.npz', names)
    self.assertIn(prefix + 'checkpoints/client_states_12.json', names)
    self.assertNotIn(prefix + 'checkpoints/round_9/state.npz', names)
    self.assertNotIn(prefix + 'checkpoints/client_states_9.json', names)
    self.assertIn(prefix + 'export/round_10/saved_model.pb', names)
    self.assertIn(prefix + 'client_states/3/state.npz', names)

  def test_unpacked_into_a_new_study_once(self):
    runs = os.path.join(self.tmp, 'elsewhere', 'runs')
    reproduction.unpack_resume_packs(self.archive, runs)
    with open(os.path.join(runs, 'cifar10-fedavg-none-abc', 'metrics.csv')) as f:
      self.assertEqual(f.read(), 'metrics.csv')
    # A study that already has the run keeps its own files.
    _write(os.path.join(runs, 'cifar10-fedavg-none-abc', 'metrics.csv'), 'newer')
    reproduction.unpack_resume_packs(self.archive, runs)
    with open(os.path.join(runs, 'cifar10-fedavg-none-abc', 'metrics.csv')) as f:
      self.assertEqual(f.read(), 'newer')

  def test_not_unpacked_once_archived_finished(self):
    os.makedirs(os.path.join(self.archive, 'runs', 'cifar10-fedavg-none-abc'))
    runs = os.path.join(self.tmp, 'elsewhere', 'runs')
    reproduction.unpack_resume_packs(self.archive, runs)
    self.assertFalse(os.path.exists(os.path.join(runs, 'cifar10-fedavg-none-abc')))

  def test_pack_with_a_foreign_path_is_refused(self):
    evil = os.path.join(self.archive, 'in_progress', 'other-run', reproduction.RESUME_PACK)
    os.makedirs(os.path.dirname(evil))
    with tarfile.open(evil, 'w:gz') as tar:
      tar.add(self.run, arcname='somewhere-else')
    with self.assertRaisesRegex(SystemExit, 'outside'):
      reproduction.unpack_resume_packs(self.archive, os.path.join(self.tmp, 'x', 'runs'))
    self.assertFalse(os.path.exists(os.path.join(self.tmp, 'x', 'runs', 'somewhere-else')))


class RestoreArchivedTest(absltest.TestCase):
  """The committed 30-round archive, put back into a study on a machine that never held it."""

  def setUp(self):
    super().setUp()
    tmp = self.create_tempdir().full_path
    self.archive = os.path.join(tmp, 'archive')
    shutil.copytree(os.path.join(testutil.REPO_ROOT, 'bench', 'results', 'reproduction',
                                 'alpha0.05'), self.archive)
    self.study = os.path.join(tmp, 'study')
    self.runs = os.path.join(self.study, 'runs')

  def _files(self):
    """{path: contents} of the archive; study.json's time of writing left out."""
    out = {}
    for root, _, names in os.walk(self.archive):
      for name in names:
        path = os.path.join(root, name)
        with open(path, 'rb') as f:
          out[os.path.relpath(path, self.archive)] = f.read()
    manifest = json.loads(out['study.json'])
    del manifest['updated']
    out['study.json'] = manifest
    return out

  def test_bin_study_counts_them_done_and_archiving_again_changes_nothing(self):
    manifest = study.read_manifest(self.archive)
    before = self._files()
    reproduction.restore_archived(self.archive, self.runs)
    for cell in manifest['cells']:
      self.assertTrue(study.is_done(os.path.join(self.study, cell['run_dir']), cell['rounds']),
                      cell['name'])
    shutil.copyfile(os.path.join(self.archive, 'study.json'),
                    os.path.join(self.study, 'study.json'))
    archive.archive(self.study, self.archive, log=lambda s: None)
    after = self._files()
    self.assertEqual(sorted(after), sorted(before))
    self.assertEqual([name for name in before if after[name] != before[name]], [])

  def test_a_run_the_study_has_is_left_as_it_is(self):
    name = sorted(os.listdir(os.path.join(self.archive, 'runs')))[0]
    _write(os.path.join(self.runs, name, 'metrics.csv'), 'training')
    reproduction.restore_archived(self.archive, self.runs)
    self.assertEqual(os.listdir(os.path.join(self.runs, name)), ['metrics.csv'])
    self.assertEqual(len(os.listdir(self.runs)), len(os.listdir(os.path.join(self.archive,
                                                                                'runs'))))


if __name__ == '__main__':
  absltest.main()
