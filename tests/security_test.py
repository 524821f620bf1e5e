"""Files copied between machines (docs/security.md): a client state holding a pickle, a SavedModel
or checkpoint that reads or writes files, and hostile text in a study's report. Workers are
checked in tff_context_test, loopback_test and remote_workers_test; privacy in privacy_test and
aggregation_test."""

import asyncio
import html.parser
import os
import pickle
import shutil
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import testutil
from tff_decorr.algorithms import testing
from tff_decorr.run_files import client_state
from tff_decorr.run_files import export
from tff_decorr.run_files import graph_check
from tff_decorr.run_files import run_directory
from tff_decorr.studies import page

_MARKER = os.path.join(tempfile.gettempdir(), f'security_test_pickle_ran_{os.getpid()}')


class _Payload:
  """Unpickling this creates _MARKER: proof that a pickle was executed."""

  def __reduce__(self):
    return (open, (_MARKER, 'w'))


class FilesTest(absltest.TestCase):

  def test_a_client_state_holding_a_pickle_is_refused_unexecuted(self):
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp)
    store = client_state.ClientStateStore(tmp, initial_fn=lambda: [np.zeros(2, np.float32)])
    store.save('0', [np.ones(2, np.float32)], 1)
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs if f.endswith('.npz')]
    # Replace the saved array by an object array: np.save pickles it into the .npy member.
    os.remove(path)
    with zipfile.ZipFile(path, 'w') as z:
      with z.open('a00000.npy', 'w') as f:
        np.lib.format.write_array(f, np.array([_Payload()], dtype=object), allow_pickle=True)
    with open(path, 'rb') as f:
      self.assertIn(b'security_test_pickle_ran', f.read())  # a real pickle
    with self.assertRaisesRegex(client_state.StateError, 'cannot be read'):
      store.load('0')
    self.assertFalse(os.path.exists(_MARKER))
    # The same file through pickle-enabled loading would have run it: the payload is live.
    with np.load(path, allow_pickle=True) as f:
      f['a00000']
    self.assertTrue(os.path.exists(_MARKER))
    os.remove(_MARKER)


class _Snoop(tf.Module):
  """A SavedModel someone else made: its function reads one file and writes another."""

  def __init__(self, secret, stolen):
    super().__init__()
    self.secret, self.stolen = secret, stolen

  @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32)])
  def __call__(self, images):
    tf.io.write_file(self.stolen, tf.io.read_file(self.secret))
    return {'logits': tf.zeros([tf.shape(images)[0], 10]),
            'representation': tf.zeros([tf.shape(images)[0], 4])}


class SavedModelScanTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.secret = os.path.join(cls.tmp, 'secret.txt')
    with open(cls.secret, 'w') as f:
      f.write('private')
    cls.stolen = os.path.join(cls.tmp, 'stolen.txt')
    module = _Snoop(cls.secret, cls.stolen)
    cls.hostile = os.path.join(cls.tmp, 'hostile')
    tf.saved_model.save(module, cls.hostile,
                        signatures={'serving_default': module.__call__})

  def test_a_savedmodel_that_reads_files_is_refused_before_loading(self):
    refused = dict(graph_check.unsafe_operations(self.hostile))
    self.assertEqual((refused['ReadFile'], refused['WriteFile']), ('reads files', 'writes files'))
    with self.assertRaises(graph_check.UnsafeGraphError) as raised:
      export.load_serving(self.hostile)
    message = str(raised.exception)
    self.assertNotIn('\n', message)
    self.assertIn(f'--saved_model={self.hostile} contains operations tff_decorr never writes: ',
                  message)
    self.assertIn('ReadFile (reads files)', message)
    self.assertIn('WriteFile (writes files)', message)
    self.assertFalse(os.path.exists(self.stolen))
    # As a run's newest checkpoint: refused as such, not reported as damage.
    run = os.path.join(self.tmp, 'run')
    shutil.copytree(self.hostile, os.path.join(run, 'checkpoints', 'round_1'))
    with self.assertRaisesRegex(graph_check.UnsafeGraphError, r'the checkpoint .*round_1 contains '
                                'operations tff_decorr never writes: .*ReadFile'):
      run_directory.newest_checkpoint_round(run)
    self.assertFalse(os.path.exists(self.stolen))
    # Control: loading and calling it does read and write (the scan is not refusing a no-op).
    tf.saved_model.load(self.hostile).signatures['serving_default'](images=tf.zeros([1, 8, 8, 1]))
    with open(self.stolen) as f:
      self.assertEqual(f.read(), 'private')
    os.remove(self.stolen)

  def test_the_projects_own_exports_pass(self):
    weights = [w.numpy() for w in testing.tiny_model().weights]
    path = export.export_saved_model(testing.tiny_model, weights,
                                     os.path.join(self.tmp, 'export'), {'task': 'test'})
    self.assertEqual(graph_check.unsafe_operations(path), [])
    export.load_serving(path, trust_saved_model=True)  # Not a registry model: not rebuilt.
    # A checkpoint as the training program writes it holds arrays only, no graph to run.
    run = os.path.join(self.tmp, 'ckpt_run')
    state = {'round': 1, 'server_state': {'weights': weights}, 'best_accuracy': np.float64(0.5),
             'best_round': 1, 'last_accuracy': np.float64(0.5)}
    asyncio.run(run_directory.checkpoint_manager(run).save(state, 1))
    self.assertEqual(os.listdir(os.path.join(run, 'checkpoints', 'round_1')), ['state.npz'])
    self.assertEqual(run_directory.newest_checkpoint_round(run), 1)


class _Page(html.parser.HTMLParser):
  """Collects the tags and the text of a page as a browser's parser sees them."""

  def __init__(self):
    super().__init__()
    self.tags, self.text = [], []

  def handle_starttag(self, tag, attrs):
    self.tags.append(tag)

  def handle_data(self, data):
    self.text.append(data)


class ReportTest(absltest.TestCase):

  def test_report_html_escapes_run_text_and_has_no_script(self):
    hostile = '<script>alert(1)</script><img src=x onerror=alert(2)>'
    text = page.html_page(f'Study {hostile}', ['regularizer', 'accuracy'],
                          [[hostile, '61.2 ± 0.4']], [f'note {hostile}'], {})
    parser = _Page()
    parser.feed(text)
    self.assertNotIn('script', parser.tags)
    self.assertNotIn('img', parser.tags)  # no figures were given; the hostile one is text
    self.assertIn(hostile, ''.join(parser.text))  # shown as text, intact


if __name__ == '__main__':
  absltest.main()
