"""Adding an algorithm or a regulariser is one definition plus one registry line (docs/DESIGN.md):
a toy algorithm with its own hyper-parameter and a toy regulariser with its own coefficient,
defined and registered here, train through bin/train's generated flags."""

import csv
import dataclasses
import json
import os
import tempfile
from typing import ClassVar

from absl import flags
from absl.testing import absltest
import numpy as np
import tensorflow as tf

from bin import train
from tff_decorr import algorithms
from tff_decorr import hparams
from tff_decorr import regularizers
from tff_decorr.algorithms import base
from tff_decorr.algorithms import fedavg


@dataclasses.dataclass(frozen=True)
class DampedHParams(hparams.HParams):
  component: ClassVar[str] = 'damped'
  alpha: float = hparams.field(1.0, 'server step toward the clients\' average: x += alpha (avg - '
                               'x). (Its own alpha: --damped_alpha, not the Dirichlet one.)',
                               minimum=0.0, maximum=1.0)


class Damped(fedavg.FedAvg):
  """FedAvg whose server moves only a fraction alpha of the way to the clients' average."""
  name = 'damped'
  HParams = DampedHParams

  def server_step(self, server_state, contribution, weight):
    x = [tf.convert_to_tensor(w) for w in server_state['weights']]
    avg = base.safe_average(contribution, weight, x)
    return {'weights': [w + self.hparams.alpha * (a - w) for w, a in zip(x, avg)]}


@dataclasses.dataclass(frozen=True)
class EnergyHParams(hparams.HParams):
  component: ClassVar[str] = 'energy'
  gamma: float = hparams.field(0.0, 'coefficient of the mean squared representation.',
                               minimum=0.0)


algorithms.register(Damped)  # The one registry line of the toy algorithm ...
regularizers.register(  # ... and of the toy regulariser.
    'energy', EnergyHParams,
    lambda hp: lambda representation, logits: hp.gamma * tf.reduce_mean(tf.square(representation)))


class ExtensionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()

  def flag_values(self, *args):
    fv = flags.FlagValues()
    train.define_flags(fv)
    fv(['train', '--task=digits', '--num_clients=4', '--rounds=2', '--local_epochs=1',
        '--runtime=tf', '--seed=2', f'--cache_dir={self.tmp}/cache', *args])
    return fv

  def run_train(self, name, *args):
    out = os.path.join(self.tmp, name)
    self.assertEqual(train.run(self.flag_values(f'--output_dir={out}', *args)), 0)
    with open(os.path.join(out, 'config.json')) as f:
      config = json.load(f)
    with open(os.path.join(out, 'metrics.csv')) as f:
      metrics = list(csv.DictReader(f))
    weights = tf.saved_model.load(os.path.join(out, 'export', 'saved_model'))
    x = tf.constant(np.random.RandomState(0).normal(size=(8, 8, 8, 1)), tf.float32)
    return config, metrics, weights.signatures['serving_default'](images=x)['logits'].numpy()

  def test_toy_components_train_through_generated_flags(self):
    config, metrics, logits = self.run_train(
        'toy', '--algorithm=damped', '--damped_alpha=0.5', '--regularizer=energy',
        '--energy_gamma=0.01', '--dirichlet_alpha=0.3')
    self.assertEqual(config['hparams']['damped'], {'alpha': 0.5})
    self.assertEqual(config['hparams']['energy'], {'gamma': 0.01})
    self.assertEqual(config['hparams']['dirichlet'], {'alpha': 0.3})  # Two alphas, no clash.
    for row in metrics:
      self.assertGreater(float(row['train_regularizer']), 0.0)  # The toy regulariser acts.
    # alpha = 1 is FedAvg exactly; 0.5 is a different model (the hyper-parameter reached the
    # server step); the default (1.0) comes from the dataclass.
    _, _, fedavg_logits = self.run_train('fedavg', '--algorithm=fedavg', '--regularizer=energy',
                                         '--energy_gamma=0.01', '--dirichlet_alpha=0.3')
    full, _, full_logits = self.run_train('full', '--algorithm=damped', '--regularizer=energy',
                                          '--energy_gamma=0.01', '--dirichlet_alpha=0.3')
    self.assertEqual(full['hparams']['damped'], {'alpha': 1.0})
    np.testing.assert_allclose(full_logits, fedavg_logits, rtol=1e-6, atol=1e-6)
    self.assertGreater(np.abs(logits - fedavg_logits).max(), 1e-3)

  def test_generated_flags_validate_and_document(self):
    fv = self.flag_values('--algorithm=damped', '--damped_alpha=2', '--output_dir=/tmp/unused')
    with self.assertRaisesRegex(ValueError, r'--damped_alpha: must be <= 1.0'):
      train.resolve_configs(fv)
    self.assertIn('server step toward', fv['damped_alpha'].help)
    self.assertIn('[algorithm damped; default 1.0]', fv['damped_alpha'].help)
    fv = self.flag_values('--algorithm=fedavg', '--damped_alpha=0.5', '--output_dir=/tmp/unused')
    with self.assertRaisesRegex(ValueError, r'--damped_alpha: set\(s\) damped, which this run'):
      train.resolve_configs(fv)


if __name__ == '__main__':
  absltest.main()
