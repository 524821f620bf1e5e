"""Adding an algorithm or a regulariser is one definition plus one registry line (docs/DESIGN.md):
a toy algorithm with its own hyper-parameter and a toy regulariser with its own coefficient,
defined and registered here, train through bin/train's generated flags; a stateful toy algorithm
with an exact upload runs through bin/train (both runtimes) and build_process from its declared
capabilities alone."""


import csv
import dataclasses
import json
import os
from typing import ClassVar

from absl import flags
from absl.testing import absltest
import numpy as np
import tensorflow as tf

import tensorflow_federated as tff

from tests import testutil
from tff_decorr.bin import train
from tff_decorr import algorithms
from tff_decorr import hparams
from tff_decorr.runtimes import learning
from tff_decorr import regularizers
from tff_decorr.worker import tff_context
from tff_decorr.algorithms import base
from tff_decorr.algorithms import fedavg
from tff_decorr.algorithms import testing


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


class Tally(fedavg.FedAvg):
  """FedAvg whose clients count the rounds they trained in (client state) and whose server tallies
  participations from an upload summed exactly: a stateful algorithm with an exact key, known to
  the runtimes only through its declared capabilities."""
  name = 'tally'
  stateful = True
  exact_keys = ('tally',)

  def initial_server_state(self, weights):
    return {'weights': [np.asarray(w) for w in weights], 'participations': np.float32(0.0)}

  def initial_client_state(self, weights):
    return {'rounds': np.float32(0.0)}

  def update_reference(self, broadcast):
    return {'model': super().update_reference(broadcast)}

  def _client_step(self, ws, broadcast, dataset, client_state):
    out = super()._client_step(ws, broadcast, dataset, client_state)
    return out._replace(contribution={'model': out.contribution, 'tally': tf.constant(1.0)},
                        client_state={'rounds': client_state['rounds'] + 1.0})

  def server_step(self, server_state, contribution, weight):
    new = super().server_step(server_state, contribution['model'], weight)
    return {**new, 'participations': server_state['participations'] + contribution['tally']}


algorithms.register(Damped)  # The one registry line of the toy algorithm ...
algorithms.register(Tally)
regularizers.register(  # ... and of the toy regulariser.
    'energy', EnergyHParams,
    lambda hp: lambda representation, logits: hp.gamma * tf.reduce_mean(tf.square(representation)))


class ExtensionTest(testutil.ClassTempDir, absltest.TestCase):

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

  def test_stateful_toy_algorithm_runs_through_bin_train_on_both_runtimes(self):
    # 4 clients, 2 sampled per round, 3 rounds: 6 participations in all, none counted twice.
    for runtime in ('tf', 'tff'):
      with self.subTest(runtime):
        out = os.path.join(self.tmp, f'tally_{runtime}')
        self.assertEqual(train.run(self.flag_values(
            f'--output_dir={out}', '--algorithm=tally', '--regularizer=none', '--rounds=3',
            '--clients_per_round=2', f'--runtime={runtime}')), 0)
        counts = {}
        states_dir = os.path.join(out, 'client_states')
        # <client>/r<round>.npz (tff_decorr.run_files.client_state)
        for cid in os.listdir(states_dir):
          latest = max(os.listdir(os.path.join(states_dir, cid)),
                       key=lambda name: int(name[1:-4]))
          with np.load(os.path.join(states_dir, cid, latest)) as f:
            counts[cid] = float(f['a00000'])
        self.assertEqual(sum(counts.values()), 6.0)
        self.assertTrue(all(0 < c <= 3 for c in counts.values()), counts)

  def test_stateful_toy_algorithm_runs_as_a_learning_process_with_exact_sums(self):
    # Through tff.learning with a hard clip on the model delta: the exactly summed tally is not
    # clipped (3 clients x 2 rounds = 6), and every client's row of the state table counts 2.
    tff_context.install()
    try:
      ids = ['0', '1', '2']
      fn = testing.make_client_dataset_fn(testing.synthetic_clients(sizes=(6, 4, 5)), batch_size=4)
      process = learning.build_process(
          'tally', testing.tiny_model, fn, regularizer=None, client_ids=ids,
          model_aggregator=tff.aggregators.clipping_factory(1e-3, tff.aggregators.MeanFactory()))
      state = process.initialize()
      for _ in range(2):
        state = process.next(state, ids).state
    finally:
      tff_context.stop_all()
    self.assertEqual(float(state.finalizer['participations']), 6.0)
    np.testing.assert_array_equal(state.client_work['states']['rounds'], [2.0, 2.0, 2.0])

  def test_an_exact_key_is_refused_under_private_aggregators(self):
    # Tally declares an exact key and no private_refusal: the exact key alone refuses it.
    self.assertIsNone(Tally.private_refusal)
    for aggregator in ('dp', 'secure'):
      with self.subTest(aggregator):
        fv = self.flag_values('--algorithm=tally', '--regularizer=none', '--runtime=tff',
                              f'--aggregator={aggregator}', '--dp_clip=1.0' if aggregator == 'dp'
                              else '--secure_zeroing=false', '--output_dir=/tmp/unused')
        with self.assertRaisesRegex(ValueError, rf'--aggregator={aggregator} cannot be combined '
                                    r'with --algorithm=tally: its upload has exact keys \(tally\)'):
          train.resolve_configs(fv)
    train.resolve_configs(self.flag_values(  # not private: allowed
        '--algorithm=tally', '--regularizer=none', '--runtime=tff', '--aggregator=robust',
        '--output_dir=/tmp/unused'))

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
