"""End-to-end tests of bin/train and bin/evaluate on the embedded digits task (subprocesses); one
FedBN test uses a small fake Office-Caltech10 tree (test sets of different sizes per client)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from tff_decorr.tasks import registry
from tests import testutil

_TINY = ['--task=digits', '--num_clients=4', '--local_epochs=1', '--batch_size=64',
         '--client_lr=0.01', '--regularizer=feddecorr', '--seed=3']


def _python():
  return testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable


def _own_accuracies(run_dir, test_sets):
  """Each client's exported SavedModel evaluated here, in NumPy: (accuracies, test examples).
  test_sets[i] = (preprocessed images, labels) client i is tested on."""
  accuracies, sizes = [], []
  for cid, (images, labels) in enumerate(test_sets):
    model = tf.saved_model.load(os.path.join(run_dir, 'export', 'clients', str(cid),
                                             'saved_model'))
    logits = model.signatures['serving_default'](images=tf.constant(images))['logits'].numpy()
    accuracies.append(float(np.mean(np.argmax(logits, axis=1) == labels)))
    sizes.append(len(labels))
  return np.array(accuracies), np.array(sizes)


def _fake_office_caltech10(root):
  """A small Office-Caltech10 tree (noise around a colour per class and domain; 4, 7, 10 and 13
  images per class in the four domains), prepared with the task's TFDS builder. Returns the
  data_dir."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from tff_decorr.tasks import office_caltech10  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  manual = os.path.join(root, 'manual')
  for d, domain in enumerate(office_caltech10.DOMAINS):
    for c, name in enumerate(office_caltech10.CLASSES):
      folder = os.path.join(manual, domain, name)
      os.makedirs(folder)
      for k in range(4 + 3 * d):
        pixels = np.array([25 * c, 60 * d, 100]) + rng.normal(scale=60, size=(64, 64, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            os.path.join(folder, f'{k}.png'))
  data_dir = os.path.join(root, 'tfds')
  office_caltech10.prepare(data_dir, manual)
  return data_dir


def _final_outputs(run_dir):
  """Logits of the exported global model on fixed inputs (a fingerprint of its weights)."""
  loaded = tf.saved_model.load(os.path.join(run_dir, 'export', 'saved_model'))
  x = tf.constant(np.random.RandomState(0).normal(size=(16, 8, 8, 1)), tf.float32)
  return loaded.signatures['serving_default'](images=x)['logits'].numpy()


def _summary_of(run_dir):
  with open(os.path.join(run_dir, 'summary.json')) as f:
    return json.load(f)


class TrainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.cache = os.path.join(cls.tmp, 'cache')
    # The uninterrupted reference run: 3 rounds with the in-process runtime.
    cls.ref_dir = os.path.join(cls.tmp, 'ref')
    cls.ref = cls.train(['--runtime=tf', '--rounds=3', f'--output_dir={cls.ref_dir}'])

  @classmethod
  def train(cls, args, check=True):
    proc = testutil.run_module('bin.train', *_TINY, f'--cache_dir={cls.cache}', *args)
    if check and proc.returncode != 0:
      raise AssertionError(f'train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n'
                           f'{proc.stderr[-3000:]}')
    return proc

  def test_reference_run_writes_all_outputs(self):
    for name in ('config.json', 'metrics.csv', 'summary.json', 'export/saved_model/saved_model.pb',
                 'tensorboard'):
      self.assertTrue(os.path.exists(os.path.join(self.ref_dir, name)), name)
    with open(os.path.join(self.ref_dir, 'summary.json')) as f:
      summary = json.load(f)
    self.assertEqual(summary['final_round'], 3)
    self.assertBetween(summary['final_test_accuracy'], 0.0, 1.0)
    self.assertGreaterEqual(summary['best_test_accuracy'], summary['final_test_accuracy'])
    with open(os.path.join(self.ref_dir, 'metrics.csv')) as f:
      rows = f.read().strip().splitlines()
    self.assertLen(rows, 4)  # Header + 3 rounds.
    self.assertIn('train_regularizer', rows[0])
    self.assertIn('round 3/3', self.ref.stdout)
    self.assertIn('ETA', self.ref.stdout)
    # FedAvg keeps no state on its clients: no client_states/, no client-state manifests.
    self.assertFalse(os.path.exists(os.path.join(self.ref_dir, 'client_states')))
    self.assertEqual([n for n in os.listdir(os.path.join(self.ref_dir, 'checkpoints'))
                      if n.startswith('client_states')], [])

  def test_finished_run_rerun_says_complete_and_writes_nothing(self):
    files = ('summary.json', 'metrics.csv', 'config.json', 'export/saved_model/saved_model.pb')
    before = {f: os.stat(os.path.join(self.ref_dir, f)).st_mtime_ns for f in files}
    with open(os.path.join(self.ref_dir, 'summary.json')) as f:
      summary = json.load(f)
    again = self.train(['--runtime=tf', '--rounds=3', f'--output_dir={self.ref_dir}'])
    self.assertIn(f'{self.ref_dir} is already complete: it finished its 3 rounds', again.stdout)
    self.assertIn(os.path.join(self.ref_dir, 'summary.json'), again.stdout)
    self.assertNotIn('Resuming', again.stdout)
    self.assertIn(f'final {summary["final_test_accuracy"]:.4f} (round 3)', again.stdout)
    self.assertEqual({f: os.stat(os.path.join(self.ref_dir, f)).st_mtime_ns for f in files},
                     before)  # Nothing exported or written again.
    # A finished run whose export is gone exports it again (nothing else to do).
    copy = os.path.join(self.tmp, 'finished_without_export')
    shutil.copytree(self.ref_dir, copy)
    shutil.rmtree(os.path.join(copy, 'export'))
    again = self.train(['--runtime=tf', '--rounds=3', f'--output_dir={copy}'])
    self.assertNotIn('is already complete', again.stdout)
    self.assertTrue(os.path.isdir(os.path.join(copy, 'export', 'saved_model')))
    self.assertEqual(_summary_of(copy)['final_test_accuracy'], summary['final_test_accuracy'])

  def test_killed_run_resumes_to_the_same_result(self):
    out = os.path.join(self.tmp, 'killed')
    cmd = [_python(), '-m', 'bin.train', *_TINY, f'--cache_dir={self.cache}', '--runtime=tf',
           '--rounds=3', f'--output_dir={out}']
    proc = subprocess.Popen(cmd, cwd=testutil.REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
      if line.startswith('round 1/3'):
        proc.send_signal(signal.SIGKILL)  # Somewhere in round 2.
        break
    proc.wait(timeout=60)
    self.assertFalse(os.path.exists(os.path.join(out, 'summary.json')))
    resumed = self.train(['--runtime=tf', '--rounds=3', f'--output_dir={out}'])
    self.assertIn('Resuming', resumed.stdout)
    self.assertNotIn('round 1/3', resumed.stdout)
    self.assertFalse(os.path.exists(os.path.join(out, 'client_states')))  # FedAvg: none to read.
    np.testing.assert_allclose(_final_outputs(out), _final_outputs(self.ref_dir), rtol=1e-5,
                               atol=1e-5)

  def test_tff_run_resumes_under_tf_runtime(self):
    out = os.path.join(self.tmp, 'cross')
    # TFF's worker is a separately built TensorFlow whose kernels round differently in the last
    # bits (one round agrees to ~1e-6; tests/runtimes_test.py checks every algorithm with FedDecorr
    # on a well-conditioned model). FedDecorr divides each feature by sqrt(var + 1e-8), which
    # amplifies round-off ~1e4-fold for a near-constant ReLU feature of this tiny CNN, so this
    # program-level resume test runs without a regulariser and with a small learning rate.
    args = ['--client_lr=0.002', '--regularizer=none']
    first = self.train(args + ['--runtime=tff', '--rounds=2', f'--output_dir={out}'])
    self.assertIn('round 2/2', first.stdout)
    self.train(args + ['--runtime=tf', '--rounds=3', f'--output_dir={out}'])
    ref = os.path.join(self.tmp, 'cross_ref')
    self.train(args + ['--runtime=tf', '--rounds=3', f'--output_dir={ref}'])
    np.testing.assert_allclose(_final_outputs(out), _final_outputs(ref), rtol=1e-3, atol=1e-3)
    # The run's TFF worker wrote its log into the run dir; nothing may still hold it open.
    self.assertEqual(testutil.processes_holding(os.path.join(out, 'tff_worker.log')), [])

  def test_bfloat16_run_trains_as_float32_does_and_exports_what_it_trained(self):
    out = os.path.join(self.tmp, 'bf16')
    proc = self.train(['--runtime=tf', '--rounds=3', f'--output_dir={out}',
                       '--precision=mixed_bfloat16'])
    self.assertIn('Precision: mixed_bfloat16', proc.stdout)
    mixed, plain = _summary_of(out), _summary_of(self.ref_dir)
    # The same seed and data as the float32 reference run: rounding differs, training does not.
    self.assertAlmostEqual(mixed['final_test_accuracy'], plain['final_test_accuracy'], delta=0.1)
    self.assertGreater(np.abs(_final_outputs(out) - _final_outputs(self.ref_dir)).max(), 0)
    with open(os.path.join(out, 'export', 'saved_model', 'tff_decorr.json')) as f:
      self.assertEqual(json.load(f)['precision'], 'mixed_bfloat16')
    proc = testutil.run_module('bin.evaluate', f'--saved_model={out}',
                               f'--output_dir={self.tmp}/bf16_eval')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn(f'top-1 accuracy {mixed["final_test_accuracy"]:.4f}', proc.stdout)

  def test_evaluate_reproduces_final_accuracy(self):
    proc = testutil.run_module('bin.evaluate', f'--saved_model={self.ref_dir}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    with open(os.path.join(self.ref_dir, 'summary.json')) as f:
      summary = json.load(f)
    with open(os.path.join(self.ref_dir, 'evaluation', 'evaluation.json')) as f:
      report = json.load(f)
    self.assertAlmostEqual(report['test_accuracy'], summary['final_test_accuracy'], places=6)
    self.assertLen(report['per_class_accuracy'], 10)
    self.assertGreater(os.path.getsize(report['confusion_matrix_png']), 1000)

  def test_fedbn_reports_each_clients_own_model(self):
    out = os.path.join(self.tmp, 'fedbn')
    proc = self.train(['--runtime=tf', '--rounds=2', '--algorithm=fedbn', f'--output_dir={out}'])
    self.assertIn('per client:', proc.stdout)
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    per_client = summary['per_client_test_accuracy']
    self.assertLen(per_client, 4)
    # The headline is the clients' own models, not the server model, whose BN variables never
    # leave their initial values: recomputed here from each client's exported model on the digits
    # test split (the same 360 images for every client, so the weighted mean is the plain mean;
    # test_fedbn_headline_weights_clients_by_test_examples has test sets of different sizes).
    task = registry.get('digits')
    images, labels, _ = task.load_split('test', None)
    accuracies, _ = _own_accuracies(out, [(task.preprocess(images).numpy(), labels)] * 4)
    np.testing.assert_allclose(per_client, accuracies, atol=1e-9)
    self.assertAlmostEqual(summary['final_test_accuracy'], float(np.mean(accuracies)), places=9)
    with open(os.path.join(out, 'metrics.csv')) as f:
      header = f.readline().strip().split(',')
      last = dict(zip(header, f.read().strip().splitlines()[-1].split(',')))
    self.assertAlmostEqual(float(last['test_accuracy']), float(np.mean(accuracies)), places=6)
    for i in range(4):
      self.assertAlmostEqual(float(last[f'client_{i}_test_accuracy']), accuracies[i], places=6)
    # bin/evaluate recomputes every client from its exported SavedModel (another code path: the
    # serving signature, not the training-time evaluator) and finds the same accuracies.
    proc = testutil.run_module('bin.evaluate', f'--saved_model={out}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    with open(os.path.join(out, 'evaluation', 'evaluation.json')) as f:
      report = json.load(f)
    np.testing.assert_allclose(report['per_client_test_accuracy'], per_client, atol=1e-9)
    # The server model is a different model (initial BN): its logits differ from every client's.
    x = tf.constant(np.random.RandomState(0).normal(size=(16, 8, 8, 1)), tf.float32)
    clients = [tf.saved_model.load(os.path.join(out, 'export', 'clients', str(c), 'saved_model'))
               .signatures['serving_default'](images=x)['logits'].numpy() for c in range(4)]
    for logits in clients:
      self.assertGreater(np.abs(logits - _final_outputs(out)).max(), 1e-3)
    self.assertGreater(np.abs(clients[0] - clients[1]).max(), 1e-3)
    # One client's model is usable on its own by bin/evaluate.
    one = os.path.join(out, 'export', 'clients', '2', 'saved_model')
    proc = testutil.run_module('bin.evaluate', f'--saved_model={one}',
                               f'--output_dir={self.tmp}/fedbn_client2')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn(f'top-1 accuracy {per_client[2]:.4f}', proc.stdout)

  def test_fedbn_headline_weights_clients_by_test_examples(self):
    # A domain task: client i is tested on domain i's test split, and here those differ in size,
    # so the documented headline (mean over clients weighted by test examples,
    # docs/algorithms.md "What is evaluated") differs from the plain mean.
    data_dir = _fake_office_caltech10(os.path.join(self.tmp, 'office'))
    out = os.path.join(self.tmp, 'fedbn_office')
    proc = testutil.run_module(
        'bin.train', '--task=office_caltech10', f'--data_dir={data_dir}', '--model=small_cnn',
        '--num_clients=4', '--local_epochs=1', '--batch_size=16', '--client_lr=0.01',
        '--regularizer=none', '--seed=3', '--rounds=2', '--algorithm=fedbn', '--runtime=tf',
        f'--cache_dir={self.cache}', f'--output_dir={out}')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    with open(os.path.join(out, 'summary.json')) as f:
      summary = json.load(f)
    task = registry.get('office_caltech10')
    images, labels, domains = task.load_split('test', data_dir)
    test_sets = [(task.preprocess(images[domains == i]).numpy(), labels[domains == i])
                 for i in range(4)]
    accuracies, sizes = _own_accuracies(out, test_sets)
    self.assertLen(set(sizes.tolist()), 4)  # Four different test-set sizes.
    want = float(np.sum(sizes * accuracies) / np.sum(sizes))
    self.assertGreater(abs(want - np.mean(accuracies)), 1e-3)  # The weighting matters here.
    np.testing.assert_allclose(summary['per_client_test_accuracy'], accuracies, atol=1e-9)
    self.assertAlmostEqual(summary['final_test_accuracy'], want, places=9)
    with open(os.path.join(out, 'metrics.csv')) as f:
      header = f.readline().strip().split(',')
      last = dict(zip(header, f.read().strip().splitlines()[-1].split(',')))
    self.assertAlmostEqual(float(last['test_accuracy']), want, places=6)

  def test_collapse_tracking_local_models_and_analyze(self):
    out = os.path.join(self.tmp, 'collapse')
    self.train(['--runtime=tf', '--rounds=2', '--track_collapse', '--save_local_models=1',
                '--save_local_rounds=2', f'--output_dir={out}'])
    with open(os.path.join(out, 'metrics.csv')) as f:
      header = f.readline().strip().split(',')
      rows = [dict(zip(header, l.strip().split(','))) for l in f]
    for row in rows:
      self.assertGreater(float(row['effective_rank']), 1.0)
      self.assertGreater(float(row['local_effective_rank']), 1.0)
      self.assertGreaterEqual(float(row['num_significant_sv']), 1.0)
    local = os.path.join(out, 'local_models', 'round_2', 'client_1')
    self.assertTrue(os.path.exists(os.path.join(local, 'saved_model.pb')))
    analysis_dir = os.path.join(self.tmp, 'analysis')
    # No --task: the runs' (their config.json), also for the local model inside its run.
    proc = testutil.run_module('bin.analyze', f'--saved_model={out},{self.ref_dir}',
                               f'--local_saved_model={local}',
                               f'--global_saved_model={out}', f'--output_dir={analysis_dir}',
                               '--probe')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    for name in ('spectra.csv', 'summary.json', 'spectra.png', 'local_vs_global.png'):
      self.assertGreater(os.path.getsize(os.path.join(analysis_dir, name)), 100, name)
    # The probe's head accuracy is the exported model's test accuracy, which the trainer measured
    # on its own (the Keras model in the training program): one example's tie apart.
    with open(os.path.join(analysis_dir, 'summary.json')) as f:
      analysed = json.load(f)
    self.assertEqual(analysed['settings']['task'], 'digits')
    probe = analysed['runs']['collapse']['probe']
    with open(os.path.join(out, 'summary.json')) as f:
      trained = json.load(f)
    self.assertAlmostEqual(probe['head_accuracy'], trained['final_test_accuracy'],
                           delta=1.5 / probe['test_examples'])
    self.assertEqual(sum(probe['head_predictions_per_class']), probe['test_examples'])
    self.assertGreater(probe['nearest_class_mean_accuracy'], 0.1)  # 10 classes; chance is 0.1.

  def test_evaluate_takes_task_and_data_dir_from_the_run(self):
    run = os.path.join(self.tmp, 'edited_run')
    shutil.copytree(self.ref_dir, run)
    with open(os.path.join(run, 'config.json')) as f:
      config = json.load(f)
    # The run's config.json names another task and data directory than the SavedModel's metadata
    # (digits) and the default (none).
    data = os.path.join(self.tmp, 'tfds_of_the_run')
    with open(os.path.join(run, 'config.json'), 'w') as f:
      json.dump(dict(config, task='cifar10', data_dir=data), f)
    model = os.path.join(run, 'export', 'saved_model')
    proc = testutil.run_module('bin.evaluate', f'--saved_model={model}')
    self.assertEqual(proc.returncode, 2)  # cifar10's test split does not fit this digits model.
    self.assertIn('cifar10', proc.stderr.strip().splitlines()[-1])
    for args, want in (([], data), (['--data_dir=/elsewhere/tfds'], '/elsewhere/tfds')):
      out = os.path.join(self.tmp, f'evaluation_{len(args)}')
      proc = testutil.run_module('bin.evaluate', f'--saved_model={model}', '--task=digits',
                                 f'--output_dir={out}', *args)
      self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
      with open(os.path.join(out, 'evaluation.json')) as f:
        evaluation = json.load(f)
      self.assertEqual((evaluation['task'], evaluation['data_dir']), ('digits', want))
      self.assertIn(f'task digits (data {want})', proc.stdout)

  def test_evaluate_refuses_model_of_another_task(self):
    proc = testutil.run_module('bin.evaluate', f'--saved_model={self.ref_dir}', '--task=cifar10')
    self.assertEqual(proc.returncode, 2)
    self.assertIn('--task=cifar10', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)

  def test_different_config_in_same_dir_is_refused_and_nothing_lost(self):
    before = sorted(os.listdir(os.path.join(self.ref_dir, 'checkpoints')))
    proc = self.train(['--runtime=tf', '--rounds=3', '--dirichlet_alpha=0.1',
                       f'--output_dir={self.ref_dir}'], check=False)
    self.assertEqual(proc.returncode, 2)
    self.assertIn('--output_dir', proc.stderr)
    self.assertIn('--overwrite', proc.stderr)
    self.assertEqual(sorted(os.listdir(os.path.join(self.ref_dir, 'checkpoints'))), before)

  def test_bad_flags_exit_2_with_one_line(self):
    cases = {
        '--task=nope': '--task',
        '--dirichlet_alpha=0': '--dirichlet_alpha',
        '--moon_mu=2': '--moon_mu',  # A setting of an algorithm the run does not use.
        '--num_clients=5000': '--num_clients',
        '--algorithm=fedsgd': '--algorithm',
        '--regularizer=l2': '--regularizer',
        '--clients_per_round=9': '--clients_per_round',
        '--model=vgg': '--model',
    }
    for flag, name in cases.items():
      proc = self.train([flag, '--rounds=1', f'--output_dir={self.tmp}/bad'], check=False)
      self.assertEqual(proc.returncode, 2, (flag, proc.stderr[-1500:]))
      self.assertIn(name, proc.stderr, flag)
      self.assertNotIn('Traceback', proc.stderr, flag)

  def test_corrupt_checkpoint_is_reported_not_overwritten(self):
    out = os.path.join(self.tmp, 'corrupt')
    self.train(['--runtime=tf', '--rounds=1', f'--output_dir={out}'])
    ckpt = os.path.join(out, 'checkpoints', 'round_1')
    for name in os.listdir(ckpt):
      path = os.path.join(ckpt, name)
      if os.path.isfile(path):
        with open(path, 'wb') as f:
          f.write(b'garbage')
    proc = self.train(['--runtime=tf', '--rounds=2', f'--output_dir={out}'], check=False)
    self.assertEqual(proc.returncode, 2, proc.stderr[-1500:])
    self.assertIn('checkpoint', proc.stderr)
    self.assertNotIn('Traceback', proc.stderr)
    self.assertTrue(os.path.isdir(ckpt))


if __name__ == '__main__':
  absltest.main()
