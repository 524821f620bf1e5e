"""Models read as data (run_files/export.py, checkpoint_files.py; docs/security.md): loading a model
runs no code from the file.

The attack: a TF1-style SavedModel (a MetaGraphDef with a saver_def and no object
graph) whose restore op calls a function holding SaveV2 and MergeV2Checkpoints. Every operation it
names is on graph_check's allow list, and TensorFlow's loader runs the restore while it loads: it
writes an attacker-named file and moves another run's export/saved_model/variables into a folder
of the attacker's choosing. Here it is built, shown to do that damage through TensorFlow's loader,
and shown to do none through bin/evaluate, bin/analyze and a resume, with and without graph_check.
The project's own exports and checkpoints are read back as data, equal to what TensorFlow's loader
gives them.
"""

import asyncio
import hashlib
import json
import os
import shutil
import sys
import tempfile
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.core.protobuf import saved_model_pb2

from tests import testutil
from tff_decorr import models
from tff_decorr.models import precision
from tff_decorr.run_files import checkpoint_files
from tff_decorr.run_files import export
from tff_decorr.run_files import graph_check
from tff_decorr.run_files import run_directory

_ATTACKER_NAME = 'pwned_by_savedmodel'


def build_tf1_attack(path: str, attacker_prefix: str, victim_prefix: str, loot_prefix: str) -> str:
  """Writes, at `path`, a TF1-style SavedModel whose restore op writes the checkpoint
  `attacker_prefix` (SaveV2) and moves the checkpoint `victim_prefix` to `loot_prefix`
  (MergeV2Checkpoints, deleting the victim's folder); its serving signature looks like an export's
  (images -> logits, representation). Its operations are all on graph_check.ALLOWED_OPS."""
  graph = tf.Graph()
  with graph.as_default():
    filename = tf.compat.v1.placeholder(tf.string, [], name='filename')
    images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1], name='images')
    flat = tf.reshape(images, [-1, 64])
    logits = tf.identity(flat[:, :10], name='logits')
    representation = tf.identity(flat[:, :4], name='representation')

    @tf.function
    def restore():
      save = tf.raw_ops.SaveV2(prefix=attacker_prefix, tensor_names=['x'], shape_and_slices=[''],
                               tensors=[tf.constant(1.0)])
      with tf.control_dependencies([save]):
        merge = tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[victim_prefix],
                                              destination_prefix=loot_prefix,
                                              delete_old_dirs=True)
      with tf.control_dependencies([merge]):
        return tf.constant(0)

    restored = restore()
    info = {name: tf.compat.v1.saved_model.utils.build_tensor_info(t) for name, t in
            (('images', images), ('logits', logits), ('representation', representation))}
  saved_model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
  meta_graph = saved_model.meta_graphs.add()
  meta_graph.meta_info_def.tags.append('serve')
  meta_graph.graph_def.CopyFrom(graph.as_graph_def())
  meta_graph.saver_def.filename_tensor_name = filename.name
  meta_graph.saver_def.save_tensor_name = filename.name
  meta_graph.saver_def.restore_op_name = restored.op.name
  meta_graph.saver_def.version = 2
  signature = meta_graph.signature_def['serving_default']
  signature.method_name = 'tensorflow/serving/predict'
  signature.inputs['images'].CopyFrom(info['images'])
  for name in ('logits', 'representation'):
    signature.outputs[name].CopyFrom(info[name])
  os.makedirs(os.path.join(path, 'variables'))
  with open(os.path.join(path, 'saved_model.pb'), 'wb') as f:
    f.write(saved_model.SerializeToString())
  return path


def _export(path: str, model_name: str = 'small_cnn', precision_name: str = 'float32',
            variant=None, seed: int = 0, metadata=None) -> str:
  """An export as bin/train writes it (experiment.Experiment.export), of a freshly built model."""
  kwargs = dict(variant or {})
  model_fn = lambda: precision.build(
      lambda: models.build(model_name, num_classes=3, input_shape=(8, 8, 3), **kwargs),
      precision_name)
  tf.keras.utils.set_random_seed(seed)
  weights = [v.numpy() for v in model_fn().weights]
  meta = {'task': 'test', 'model': model_name, 'precision': precision_name,
          'model_kwargs': kwargs} if metadata is None else metadata
  return export.export_saved_model(model_fn, weights, path, meta)


def _files(root: str) -> dict:
  """Every file under `root`: relative path -> the SHA-256 of its bytes (a run's .lock: that it
  exists; each start of bin/train writes its own process id there)."""
  out = {}
  for directory, _, names in os.walk(root):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, root)] = (
            'lock' if name == '.lock' else hashlib.sha256(f.read()).hexdigest())
  return out


class AttackTest(absltest.TestCase):
  """Each test builds the attack aimed at a fresh victim run, and checks the whole temp tree."""

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.victim = os.path.join(self.root, 'victim_run')
    _export(os.path.join(self.victim, 'export', 'saved_model'))
    self.victim_variables = os.path.join(self.victim, 'export', 'saved_model', 'variables')
    self.attacker_file = os.path.join(self.root, _ATTACKER_NAME)
    self.loot = os.path.join(self.root, 'loot', 'stolen')
    self.attack = self.place(os.path.join(self.root, 'attack'))
    self.before = _files(self.root)
    self.assertLen([p for p in self.before if p.startswith('victim_run/export/saved_model/'
                                                           'variables/')], 2)

  def place(self, path: str) -> str:
    return build_tf1_attack(path, self.attacker_file,
                            os.path.join(self.victim_variables, 'variables'), self.loot)

  def assert_harmless(self):
    """Nothing written, nothing moved: the tree is as before, the victim's files in place."""
    self.assertEqual(sorted(_files(self.root)), sorted(self.before))
    self.assertEqual(_files(self.root), self.before)
    self.assertEqual(sorted(os.listdir(self.victim_variables)),
                     ['variables.data-00000-of-00001', 'variables.index'])
    self.assertEmpty([os.path.join(d, n) for d, ds, ns in os.walk(self.root) for n in ds + ns
                      if n.startswith(_ATTACKER_NAME) or n == 'loot'])

  def assert_one_line(self, proc, *needles):
    self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    self.assertLen(lines, 1, proc.stderr)
    for needle in needles:
      self.assertIn(needle, lines[0])

  def test_tensorflows_loader_runs_the_restore_and_does_the_damage(self):
    # Why the allow list let it through: every operation it names is one the project's exports
    # use, and the writes sit in the saver's restore, which the scan took for the saver's own.
    self.assertEmpty(graph_check.operations(self.attack) - graph_check.ALLOWED_OPS)
    tf.saved_model.load(self.attack)  # What export.load_serving called after the scan.
    self.assertTrue(os.path.exists(self.attacker_file + '.index'))
    self.assertFalse(os.path.exists(self.victim_variables))  # Moved, folder deleted.
    self.assertEqual(sorted(os.listdir(os.path.dirname(self.loot))),
                     ['stolen.data-00000-of-00001', 'stolen.index'])
    # The victim's weights are now the attacker's.
    self.assertIn('_CHECKPOINTABLE_OBJECT_GRAPH', tf.train.load_checkpoint(self.loot)
                  .get_variable_to_dtype_map())

  def test_the_scan_names_the_writes_in_the_restore(self):
    refused = dict(graph_check.unsafe_operations(self.attack))
    self.assertEqual(refused, {'SaveV2': 'writes files in the restore loading runs',
                               'MergeV2Checkpoints': 'writes files in the restore loading runs'})

  def test_bin_evaluate_refuses_it_with_and_without_trust(self):
    for trust in ([], ['--trust_saved_model']):
      proc = testutil.run_module('bin.evaluate', f'--saved_model={self.attack}', '--task=digits',
                                 f'--output_dir={self.root}/evaluation', *trust)
      self.assert_one_line(proc, f'--saved_model={self.attack}', 'SaveV2 (writes files in the '
                           'restore loading runs)')
      self.assert_harmless()

  def test_bin_analyze_refuses_it_with_and_without_trust(self):
    for trust in ([], ['--trust_saved_model']):
      proc = testutil.run_module('bin.analyze', f'--saved_model={self.attack}', '--task=digits',
                                 f'--output_dir={self.root}/analysis', *trust)
      self.assert_one_line(proc, f'--saved_model={self.attack}', 'MergeV2Checkpoints')
      self.assert_harmless()
    proc = testutil.run_module('bin.analyze', f'--local_saved_model={self.attack}',
                               f'--global_saved_model={self.attack}', '--task=digits',
                               f'--output_dir={self.root}/analysis')
    self.assert_one_line(proc, f'--local_saved_model={self.attack}')
    self.assert_harmless()

  def test_a_resume_refuses_it_as_a_checkpoint(self):
    run = os.path.join(self.root, 'run')
    self.place(os.path.join(run, 'checkpoints', 'round_1'))
    self.before = _files(self.root)
    with self.assertRaisesRegex(graph_check.UnsafeGraphError, r'^the checkpoint .*round_1 '
                                'contains .*SaveV2 \\(writes files in the restore loading runs\\)'):
      run_directory.newest_checkpoint_round(run)
    with self.assertRaises(graph_check.UnsafeGraphError):
      run_directory.load_checkpoint(run, {'weights': [np.zeros(3, np.float32)]})
    self.assert_harmless()

  def test_without_the_scan_it_is_read_as_data_or_refused_and_runs_nothing(self):
    """The scan is defence in depth: with it switched off, nothing of the file runs either."""
    # Alone: a foreign SavedModel, refused naming the flag.
    with mock.patch.object(graph_check, 'check'):
      with self.assertRaisesRegex(export.SavedModelError, r'^--saved_model=.*attack was not '
                                  r'written by tff_decorr .*give --trust_saved_model'):
        export.load_serving(self.attack)
    self.assert_harmless()
    # In place of a run's export, with metadata that names a model: read as data, refused.
    run = os.path.join(self.root, 'run')
    fake = self.place(os.path.join(run, 'export', 'saved_model'))
    with open(os.path.join(fake, export.METADATA_FILE), 'w') as f:
      json.dump({'model': 'small_cnn', 'model_kwargs': {}, 'num_classes': 10,
                 'input_shape': [8, 8, 1]}, f)
    with open(os.path.join(run, 'config.json'), 'w') as f:
      json.dump({'task': 'digits', 'model': 'small_cnn'}, f)
    # ... and as that run's newest checkpoint, in TFF's older SavedModel format.
    self.place(os.path.join(run, 'checkpoints', 'round_1'))
    self.before = _files(self.root)
    with mock.patch.object(graph_check, 'check'):
      with self.assertRaisesRegex(export.SavedModelError, 'variables/variables.index'):
        export.load_serving(run)
      with self.assertRaisesRegex(run_directory.CheckpointError, 'nothing was changed'):
        run_directory.newest_checkpoint_round(run)
      with self.assertRaises(run_directory.CheckpointError):
        run_directory.load_checkpoint(run, {'weights': [np.zeros(3, np.float32)]})
    self.assert_harmless()

  def test_a_resume_of_bin_train_refuses_it_and_nothing_is_changed(self):
    run = os.path.join(self.root, 'run')
    args = ['--task=digits', '--regularizer=none', '--num_clients=2', '--clients_per_round=2',
            '--local_epochs=1', '--rounds=1', '--runtime=tf', f'--output_dir={run}']
    testutil.check(testutil.run_module('bin.train', *args), 'bin.train')
    shutil.rmtree(os.path.join(run, 'checkpoints'), ignore_errors=True)
    self.place(os.path.join(run, 'checkpoints', 'round_1'))  # Its newest checkpoint.
    self.before = _files(self.root)
    proc = testutil.run_module('bin.train', *args[:-2], '--rounds=2', args[-1])
    self.assert_one_line(proc, 'round_1', 'SaveV2 (writes files in the restore loading runs)')
    self.assert_harmless()


class ExportsAsDataTest(absltest.TestCase):
  """The project's exports and checkpoints, read as data, equal what TensorFlow's loader gives."""

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path
    self.images = np.random.default_rng(0).normal(size=(6, 8, 8, 3)).astype(np.float32)

  def assert_equal_to_tensorflows_loader(self, path, **load_args):
    with mock.patch.object(tf.saved_model, 'load', side_effect=AssertionError('graph loaded')):
      fn, meta = export.load_serving(path, **load_args)
    self.assertIsInstance(fn, export.ServingFunction)
    loaded = tf.saved_model.load(path).signatures['serving_default']
    ours, theirs = fn(images=tf.constant(self.images)), loaded(images=tf.constant(self.images))
    for name in ('logits', 'representation'):
      np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), rtol=0, atol=1e-6)
    self.assertNotEqual(float(np.abs(theirs['logits'].numpy()).max()), 0.0)  # Not a zero model.
    export.check_compatible(fn, meta, 3, (8, 8, 3), 'test')
    return fn, meta

  def test_every_precision_and_variant_equals_tensorflows_loader(self):
    for precision_name in models.PRECISIONS:
      for variant in ({}, {'decomposed': True, 'projection_dim': 8}):
        with self.subTest(precision=precision_name, variant=variant):
          path = _export(os.path.join(self.tmp, f'{precision_name}-{len(variant)}'),
                         precision_name=precision_name, variant=variant, seed=len(variant))
          self.assert_equal_to_tensorflows_loader(path)

  def test_an_older_export_is_rebuilt_from_its_runs_config(self):
    # Metadata without model_kwargs (exports before them): the run's config.json says the rest.
    run = os.path.join(self.tmp, 'run')
    variant = {'decomposed': True, 'projection_dim': 8}
    path = _export(os.path.join(run, 'export', 'saved_model'), variant=variant, metadata={
        'task': 'test', 'model': 'small_cnn', 'precision': 'float32'})
    with open(os.path.join(run, 'config.json'), 'w') as f:
      json.dump({'task': 'test', 'model': 'small_cnn', 'projection_dim': 8, 'decomposed': True,
                 'num_atoms': 0, 'init': None, 'precision': 'float32'}, f)
    with mock.patch.object(tf.saved_model, 'load', side_effect=AssertionError('graph loaded')):
      export.load_serving(run)  # A run directory reads its export.
    self.assert_equal_to_tensorflows_loader(path)
    os.remove(os.path.join(run, 'config.json'))  # Then nothing says what the model is.
    with self.assertRaisesRegex(export.SavedModelError, 'give --trust_saved_model'):
      export.load_serving(run)

  def test_weights_of_another_model_are_refused_by_name(self):
    path = _export(os.path.join(self.tmp, 'export'))
    with open(os.path.join(path, export.METADATA_FILE)) as f:
      meta = json.load(f)
    meta['model_kwargs'] = {'decomposed': True}
    with open(os.path.join(path, export.METADATA_FILE), 'w') as f:
      json.dump(meta, f)
    with self.assertRaisesRegex(export.SavedModelError, r'^--saved_model=.*: its variables are '
                                'not the weights of the model its metadata names'):
      export.load_serving(path)
    meta['model'] = 'no_such_model'
    with open(os.path.join(path, export.METADATA_FILE), 'w') as f:
      json.dump(meta, f)
    with self.assertRaisesRegex(export.SavedModelError, 'cannot be built .*unknown model'):
      export.load_serving(path)

  def test_a_foreign_savedmodel_needs_the_flag_which_runs_it(self):
    module = tf.Module()
    module.w = tf.Variable(tf.ones([192, 3]))
    module.serve = tf.function(
        lambda images: {'logits': tf.reshape(images, [-1, 192]) @ module.w,
                        'representation': tf.reshape(images, [-1, 192])},
        input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32, name='images')])
    path = os.path.join(self.tmp, 'foreign')
    tf.saved_model.save(module, path, signatures={'serving_default': module.serve})
    with self.assertRaisesRegex(export.SavedModelError, r'^--x=.*foreign was not written by '
                                r'tff_decorr .*give --trust_saved_model \(trust_saved_model=True'):
      export.load_serving(path, '--x')
    fn, _ = export.load_serving(path, trust_saved_model=True)
    np.testing.assert_allclose(fn(images=tf.constant(self.images))['logits'].numpy(),
                               self.images.reshape(6, 192).sum(1, keepdims=True).repeat(3, 1),
                               rtol=1e-5)

  def test_a_checkpoint_in_tffs_older_format_is_read_as_data(self):
    state = {'round': 3, 'server_state': {'weights': [np.arange(6, dtype=np.float32).reshape(2, 3),
                                                      np.ones(2, np.float32)],
                                          'aggregator': b'\x00st\x00ate\x00'},
             'best_accuracy': np.float64(0.25), 'best_round': 2, 'last_accuracy': np.float64(0.125)}
    structure = {'round': 0, 'server_state': {'weights': [np.zeros((2, 3), np.float32),
                                                          np.zeros(2, np.float32)],
                                              'aggregator': b''},
                 'best_accuracy': np.float64(0), 'best_round': 0, 'last_accuracy': np.float64(0)}
    tffs = tff.program.FileProgramStateManager(os.path.join(self.tmp, 'checkpoints'),
                                               prefix='round_')
    asyncio.run(tffs.save(state, 3))
    expected = asyncio.run(tffs.load(3, structure))  # TFF's reader: tf.saved_model.load.
    manager = run_directory.checkpoint_manager(self.tmp)
    self.assertTrue(manager.is_saved_model(3))
    with mock.patch.object(tf.saved_model, 'load', side_effect=AssertionError('graph loaded')):
      self.assertEqual(run_directory.newest_checkpoint_round(self.tmp), 3)
      got = asyncio.run(manager.load(3, structure))
    tf.nest.map_structure(np.testing.assert_array_equal, got, expected)
    tf.nest.map_structure(lambda a, b: self.assertIs(type(a), type(b)), got, expected)
    self.assertEqual(got['server_state']['aggregator'], b'\x00st\x00ate\x00')
    with self.assertRaisesRegex(checkpoint_files.IncompleteCheckpointError, 'no value'):
      asyncio.run(manager.load(3, dict(structure, extra=np.zeros(1))))


if __name__ == '__main__':
  absltest.main()
