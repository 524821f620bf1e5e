"""graph_check's allow list: operations tff_decorr's SavedModels never use are refused (a table read
from a text file and written out, the reader operations), checkpoint operations only in the saver,
and every model the project exports passes (each model, each precision, the variants that change
the graph). security_test checks the same scan from bin/evaluate's and a resume's side."""

import asyncio
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tests import testutil
from tff_decorr import models
from tff_decorr.run_files import allowed_ops
from tff_decorr.run_files import export
from tff_decorr.run_files import graph_check
from tff_decorr.run_files import run_directory


class _TableThief(tf.Module):
  """Serving a private text file: a lookup table initialised from it at load, exported and written
  to another file with SaveV2 (an operation every SavedModel's saver has) by the serving call."""

  def __init__(self, secret, stolen):
    super().__init__()
    self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
        secret, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
        tf.lookup.TextFileIndex.LINE_NUMBER), -1)
    self.stolen = stolen

  @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32)])
  def __call__(self, images):
    keys, _ = tf.raw_ops.LookupTableExportV2(table_handle=self.table.resource_handle,
                                             Tkeys=tf.string, Tvalues=tf.int64)
    save = tf.raw_ops.SaveV2(prefix=self.stolen, tensor_names=['lines'], shape_and_slices=[''],
                             tensors=[keys])
    with tf.control_dependencies([save]):
      return {'logits': tf.zeros([1, 10]), 'representation': tf.zeros([1, 4])}


class _Reader(tf.Module):
  """Reading a file with the queue-based reader operations."""

  def __init__(self, secret):
    super().__init__()
    self.secret = secret

  @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32)])
  def __call__(self, images):
    queue = tf.raw_ops.FIFOQueueV2(component_types=[tf.string])
    tf.raw_ops.QueueEnqueueV2(handle=queue, components=[tf.constant(self.secret)])
    reader = tf.raw_ops.WholeFileReaderV2()
    _, value = tf.raw_ops.ReaderReadV2(reader_handle=reader, queue_handle=queue)
    return {'logits': tf.zeros([1, 10]), 'representation': tf.zeros([1, 4]), 'file': value}


class RefusedTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.secret = os.path.join(cls.tmp, 'secret.txt')
    with open(cls.secret, 'w') as f:
      f.write('private line\n')

  def _save(self, module, name):
    path = os.path.join(self.tmp, name)
    tf.saved_model.save(module, path, signatures={'serving_default': module.__call__})
    return path

  def test_a_table_read_from_a_text_file_and_written_out_is_refused(self):
    stolen = os.path.join(self.tmp, 'stolen')
    path = self._save(_TableThief(self.secret, stolen), 'table')
    refused = dict(graph_check.unsafe_operations(path))
    self.assertEqual(refused['InitializeTableFromTextFileV2'], 'reads files')
    self.assertEqual(refused['LookupTableExportV2'], 'exports a table')
    # SaveV2 is allowed in the saver's function, not in one the model's call runs.
    self.assertEqual(refused['SaveV2'], 'writes files outside the saver')
    with self.assertRaises(graph_check.UnsafeGraphError) as raised:
      export.load_serving(path)
    message = str(raised.exception)
    self.assertNotIn('\n', message)
    self.assertIn(f'--saved_model={path} contains operations tff_decorr never writes: ', message)
    self.assertIn('InitializeTableFromTextFileV2 (reads files)', message)
    self.assertIn('SaveV2 (writes files outside the saver)', message)
    self.assertEmpty([f for f in os.listdir(self.tmp) if f.startswith('stolen')])
    # Control: loading and calling it does copy the file (the scan is not refusing a no-op).
    tf.saved_model.load(path).signatures['serving_default'](images=tf.zeros([1, 8, 8, 1]))
    self.assertEqual(tf.train.load_checkpoint(stolen).get_tensor('lines').tolist(),
                     [b'private line'])

  def test_a_text_savedmodel_is_scanned_too(self):
    # The loader reads saved_model.pbtxt when saved_model.pb is absent.
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    path = self._save(_Reader(self.secret), 'reader_text')
    proto = graph_check._read(path)  # pylint: disable=protected-access
    os.remove(os.path.join(path, 'saved_model.pb'))
    with open(os.path.join(path, 'saved_model.pbtxt'), 'w') as f:
      f.write(text_format.MessageToString(proto))
    self.assertIn('ReaderReadV2', dict(graph_check.unsafe_operations(path)))
    with self.assertRaisesRegex(graph_check.UnsafeGraphError, r'ReaderReadV2 \(reads files\)'):
      export.load_serving(path)
    tf.saved_model.load(path)  # Control: the loader does read the text form.

  def test_the_reader_operations_are_refused(self):
    path = self._save(_Reader(self.secret), 'reader')
    refused = dict(graph_check.unsafe_operations(path))
    self.assertEqual(refused['WholeFileReaderV2'], 'reads files')
    self.assertEqual(refused['ReaderReadV2'], 'reads files')
    self.assertIn('FIFOQueueV2', refused)  # not described, refused all the same
    self.assertEqual(refused['FIFOQueueV2'], 'not used by tff_decorr')
    run = os.path.join(self.tmp, 'run')
    shutil.copytree(path, os.path.join(run, 'checkpoints', 'round_1'))
    with self.assertRaisesRegex(graph_check.UnsafeGraphError, r'^the checkpoint .*round_1 '
                                r'contains operations tff_decorr never writes: .*ReaderReadV2 '
                                r'\(reads files\).*WholeFileReaderV2 \(reads files\)'):
      run_directory.newest_checkpoint_round(run)


class ProjectExportsTest(testutil.ClassTempDir, absltest.TestCase):
  """Every model, in both precisions, plain and with the variants that add operations
  (decomposed convolutions, a projection head), passes; so do a Keras object's SavedModel and a
  checkpoint in TFF's SavedModel format. `python -m tff_decorr.run_files.allowed_ops --check` runs
  the full product (each variant in each precision, each also as a Keras object)."""

  def test_every_model_in_every_precision_passes(self):
    for name in models.names():
      for precision_name, variant in zip(models.PRECISIONS, allowed_ops.VARIANTS):
        with self.subTest(model=name, precision=precision_name, variant=variant):
          ops = allowed_ops.export_operations(self.tmp, name, precision_name, variant)
          self.assertEmpty(sorted(ops - graph_check.ALLOWED_OPS))
    path = os.path.join(self.tmp, 'small_cnn-mixed_bfloat16-decomposed-projection_dim')
    self.assertEqual(graph_check.unsafe_operations(path), [])
    fn, _ = export.load_serving(path)
    self.assertEqual(fn(images=tf.zeros([2, 8, 8, 3]))['logits'].shape, (2, 3))

  def test_a_keras_object_and_an_old_checkpoint_pass(self):
    ops = allowed_ops.export_operations(self.tmp, 'resnet20', 'float32', {}, keras_object=True)
    self.assertEmpty(sorted(ops - graph_check.ALLOWED_OPS))
    self.assertEqual(graph_check.unsafe_operations(os.path.join(self.tmp,
                                                                'resnet20-float32-keras')), [])
    self.assertEmpty(sorted(allowed_ops.old_checkpoint_operations(self.tmp) -
                            graph_check.ALLOWED_OPS))
    self.assertEqual(graph_check.unsafe_operations(os.path.join(self.tmp, 'old', 'round_1')), [])


if __name__ == '__main__':
  absltest.main()
