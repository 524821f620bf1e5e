"""TensorBoard HParams of a run and of a study (tff_decorr/run_files/tensorboard_hparams.py), read
back from the event files by tests/testutil.py, which parses the hparams plugin's protobuf itself.

The end-to-end check (bin/study's root config and each bin/train run's values and final metrics in
a real study) is in tests/report_test.py, which has a study at hand.
"""

import glob
import os
import tempfile

from absl.testing import absltest
import tensorflow as tf

from tests import testutil
from tff_decorr.configs import config as config_lib
from tff_decorr.run_files import tensorboard_hparams


def _config(**values):
  return config_lib.make(task='digits', **values).to_dict()


class TensorboardHparamsTest(absltest.TestCase):

  def test_run_hparams_are_the_flags_of_the_resolved_config(self):
    flat = tensorboard_hparams.run_hparams(_config(
        algorithm='fedprox', fedprox_mu=0.01, regularizer='feddecorr', feddecorr_beta=0.05,
        dirichlet_alpha=0.1, seed=3, client_lr=0.05, rounds=7))
    expected = {'algorithm': 'fedprox', 'fedprox_mu': 0.01, 'regularizer': 'feddecorr',
                'feddecorr_beta': 0.05, 'partition': 'dirichlet', 'dirichlet_alpha': 0.1,
                'seed': 3, 'client_lr': 0.05, 'rounds': 7, 'task': 'digits',
                'decomposed': False}
    self.assertEqual({k: flat[k] for k in expected}, expected)
    for key in ('output_dir', 'data_dir', 'cache_dir', 'workers', 'hparams', 'fedprox'):
      self.assertNotIn(key, flat)
    self.assertIsInstance(flat['seed'], int)
    self.assertIsInstance(flat['decomposed'], bool)

  def test_run_writes_its_hparams_and_final_metrics(self):
    logdir = tempfile.mkdtemp()
    config = _config(algorithm='fedprox', fedprox_mu=0.01, dirichlet_alpha=0.1, seed=2)
    writer = tf.summary.create_file_writer(logdir)
    tensorboard_hparams.write_run(writer, config, trial_id='digits-fedprox-feddecorr-abc')
    tensorboard_hparams.write_final(writer, {'final_round': 4, 'final_test_accuracy': 0.25,
                                             'best_test_accuracy': 0.5, 'best_round': 3})
    writer.close()
    events = testutil.hparams_events(logdir)
    self.assertLen(events['session_start'], 1)
    start = events['session_start'][0]
    self.assertEqual(start.group_name, 'digits-fedprox-feddecorr-abc')
    values = {k: testutil.hparam_value(v) for k, v in start.hparams.items()}
    self.assertEqual(values['algorithm'], 'fedprox')
    self.assertAlmostEqual(values['fedprox_mu'], 0.01)
    self.assertAlmostEqual(values['dirichlet_alpha'], 0.1)
    self.assertEqual(values['seed'], 2)
    self.assertNotIn('output_dir', values)
    self.assertEqual(events['scalars']['final_test_accuracy'], [(4, 0.25)])
    self.assertEqual(events['scalars']['best_test_accuracy'], [(4, 0.5)])
    self.assertEqual(events['scalars']['best_round'], [(4, 3.0)])

  def test_metrics_csv_rebuilt_from_tensorboard_holds_only_per_round_metrics(self):
    from tff_decorr.run_files import metrics_log  # pylint: disable=g-import-not-at-top
    run = tempfile.mkdtemp()
    metrics = metrics_log.Metrics(run)
    metrics.hparams(_config(seed=1), trial_id='run')
    for r in (1, 2):
      metrics.release({'test_accuracy': 0.25 * r, 'train_loss': 2.0 / r}, r)
    metrics.final({'final_round': 2, 'final_test_accuracy': 0.5, 'best_test_accuracy': 0.5,
                   'best_round': 2})
    os.remove(os.path.join(run, 'metrics.csv'))
    metrics_log.repair_metrics(run, 2, log=lambda _: None)
    with open(os.path.join(run, 'metrics.csv')) as f:
      header = f.readline().strip().split(',')
    self.assertCountEqual(header, ['round', 'test_accuracy', 'train_loss'])

  def test_study_config_has_the_axes_with_the_runs_values(self):
    study_dir = tempfile.mkdtemp()
    configs = [_config(regularizer=r, feddecorr_beta=b, seed=s) if r == 'feddecorr' else
               _config(regularizer=r, seed=s)
               for r, b in (('none', None), ('feddecorr', 0.05), ('feddecorr', 0.1))
               for s in (0, 1)]
    axes = ['regularizer', 'feddecorr_beta', 'seed']
    for _ in range(2):  # Written again (a resumed or changed study): one config at the root.
      tensorboard_hparams.write_study(study_dir, axes, configs)
    self.assertLen(glob.glob(os.path.join(study_dir, 'events.out.tfevents.*')), 1)
    experiments = testutil.hparams_events(study_dir)['experiment']
    self.assertLen(experiments, 1)
    infos = {h.name: h for h in experiments[0].hparam_infos}
    self.assertEqual(list(infos), axes)
    domain = lambda name: sorted(testutil.hparam_value(v)
                                 for v in infos[name].domain_discrete.values)
    self.assertEqual(domain('regularizer'), ['feddecorr', 'none'])
    self.assertEqual(domain('feddecorr_beta'), [0.05, 0.1])
    self.assertEqual(domain('seed'), [0, 1])
    self.assertEqual([m.name.tag for m in experiments[0].metric_infos],
                     [tag for tag, _ in tensorboard_hparams.METRICS])


if __name__ == '__main__':
  absltest.main()
