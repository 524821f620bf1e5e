"""bench/accuracy/server_defaults_fidelity.py without training: each run is what a user gets with the
code's defaults at the fidelity setting (the HParams' own values, independently of the script), a
`--set` form is keyed apart from the defaults, and bad `--set` items are usage errors."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags
from absl.testing import absltest
import numpy as np
import tensorflow as tf

from bench.accuracy import server_defaults_fidelity as sdf
from tff_decorr import algorithms


class _Serving(tf.Module):
  """The export contract: the representation is the input, the logits it plus a bias."""

  def __init__(self, bias):
    super().__init__()
    self.bias = tf.constant(bias, tf.float32)

  @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name='images')])
  def serve(self, images):
    return {'representation': images, 'logits': images + self.bias}


class ConfirmTest(absltest.TestCase):

  def test_runs_take_the_code_defaults_at_the_fidelity_setting(self):
    dirs = set()
    for name in sdf.ALGORITHMS:
      config = sdf.make_config(name, {}, seed=0)
      expected = algorithms.hparams_class(name)()
      got = config.hparams[name]
      for field in vars(expected):
        self.assertEqual(getattr(got, field), getattr(expected, field), (name, field))
      self.assertEqual((config.task, config.model, config.num_clients, config.clients_per_round,
                        config.rounds, config.local_epochs, config.batch_size,
                        config.client_optimizer.lr, config.client_optimizer.momentum,
                        config.regularizer),
                       ('cifar10', 'resnet20', 10, 10, 10, 1, 64, 0.01, 0.9, 'none'))
      self.assertEqual(config.hparams['dirichlet'].alpha, 0.05)
      self.assertTrue(config.output_dir.endswith('s0'))
      dirs.add(os.path.dirname(config.output_dir))
    self.assertLen(dirs, len(sdf.ALGORITHMS))

  def test_a_set_form_is_keyed_apart_from_the_defaults(self):
    default = sdf.make_config('fedexp', {}, seed=1)
    other = sdf.make_config('fedexp', {'fedexp_step_counters': not default.hparams['fedexp']
                                       .step_counters}, seed=1)
    self.assertNotEqual(other.hparams['fedexp'].step_counters,
                        default.hparams['fedexp'].step_counters)
    self.assertNotEqual(os.path.dirname(other.output_dir), os.path.dirname(default.output_dir))

  def test_feddecorr_cells_are_the_defaults_with_feddecorr_keyed_apart(self):
    for name in ('fedavgm', 'moon'):
      plain = sdf.make_config(name, {}, seed=2)
      decorr = sdf.make_config(name, {}, seed=2, regularizer='feddecorr')
      self.assertEqual((plain.regularizer, decorr.regularizer), ('none', 'feddecorr'))
      self.assertEqual(decorr.hparams['feddecorr'].beta, 0.1)  # The paper's CIFAR-10 beta.
      self.assertEqual(decorr.hparams[name], plain.hparams[name])
      self.assertNotEqual(os.path.dirname(decorr.output_dir), os.path.dirname(plain.output_dir))
    # The regulariser-free cells keep the names of the runs made before --regularizer existed.
    self.assertEqual(sdf.cell_key('fedexp', {'a': 1}), sdf.cell_key('fedexp', {'a': 1}, 'none'))
    self.assertTrue(sdf.cell_key('fedexp', {'a': 1}, 'feddecorr').startswith('fedexp+feddecorr-'))

  def test_moon_has_its_projection_head(self):
    self.assertEqual(sdf.make_config('moon', {}, seed=0).projection_dim, 256)
    self.assertEqual(sdf.make_config('fedavgm', {}, seed=0).projection_dim, 0)

  def test_an_unknown_regularizer_is_refused_naming_the_choices(self):
    with self.assertRaisesRegex(flags.IllegalFlagValueError, 'none.*feddecorr|feddecorr.*none'):
      flags.FLAGS['regularizer'].parse('decorr')

  def test_probe_reads_each_runs_exported_model(self):
    # Two "runs" whose exported models' representation is the input itself and whose logits
    # favour class 0 by a margin; the probe and the effective rank checked against NumPy.
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0, 0], [4, 0, 0], [0, 4, 0]])
    train_y, test_y = rng.choice(3, 40), rng.choice(3, 30)
    train_x = (centres[train_y] + rng.normal(size=(40, 3))).astype(np.float32)
    test_x = (centres[test_y] + rng.normal(size=(30, 3))).astype(np.float32)
    root = tempfile.mkdtemp()
    runs = []
    for i, bias in enumerate(([9.0, 0, 0], [0.0, 0, 0])):
      module = _Serving(bias)
      run = os.path.join(root, f's{i}')
      tf.saved_model.save(module, os.path.join(run, 'export', 'saved_model'),
                          signatures={'serving_default': module.serve})
      runs.append(run)

    class Task:
      num_classes = 3

      def test_dataset(self, data_dir):
        return tf.data.Dataset.from_tensor_slices((test_x, test_y)).batch(8)

      def split_dataset(self, split, data_dir):
        assert split == 'train'
        return tf.data.Dataset.from_tensor_slices((train_x, train_y)).batch(8)

    got = sdf.probe_runs(runs, Task(), root, trust_saved_model=True)  # Foreign SavedModels.
    means = np.stack([train_x[train_y == c].astype(np.float64).mean(0) for c in range(3)])
    nearest = np.linalg.norm(test_x[:, None] - means[None], axis=2).argmin(1)
    self.assertEqual(got['nearest_class_mean_accuracy'], [np.mean(nearest == test_y)] * 2)
    head = [(test_x + np.array(b)).argmax(1) for b in ([9.0, 0, 0], [0.0, 0, 0])]
    self.assertEqual(got['head_accuracy'], [np.mean(h == test_y) for h in head])
    self.assertEqual(got['largest_predicted_class_share'][0], 1.0)  # The biased head: class 0.
    eig = np.clip(np.linalg.eigvalsh(np.cov(test_x.astype(np.float64).T, bias=True)), 0, None)
    p = eig / eig.sum()
    np.testing.assert_allclose(got['effective_rank'], [np.exp(-np.sum(p * np.log(p)))] * 2,
                               rtol=1e-6)

  def test_set_values(self):
    self.assertEqual(sdf._parse_set(['fedexp_step_counters=false', 'fedadam_bn=average']),
                     {'fedexp_step_counters': 'false', 'fedadam_bn': 'average'})
    self.assertEqual([sdf._typed(v) for v in ('true', 'False', '3', '1e-3', 'average')],
                     [True, False, 3, 1e-3, 'average'])
    for bad in ('fedexp_step_counters', '=1'):
      with self.assertRaises(app.UsageError):
        sdf._parse_set([bad])


if __name__ == '__main__':
  absltest.main()
