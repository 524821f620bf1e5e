"""bench/accuracy/last_two_iterates.py against the runs themselves, and FedExP's evaluated model.

Two short FedExP runs on digits, alike but for `--fedexp_evaluate`: the run that evaluates the last
iterate reports, as its final accuracy, what the script measures as `last`; the run that evaluates
the paper's average reports what the script measures from its two checkpoints as
`average_last_two_trainable` (the script averages the checkpoints' weights itself in NumPy, the
run's FedExP through its server state: two code paths that must agree). Both runs trained the same
iterates, so their `last` and `previous` agree too.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from bench.accuracy import last_two_iterates
from tff_decorr.configs import config as config_lib
from tff_decorr.program import training


class LastTwoIteratesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    out = tempfile.mkdtemp()
    cls.runs, cls.dirs = {}, {}
    for evaluate in ('last', 'average_last_two'):
      c = config_lib.make(task='digits', algorithm='fedexp', regularizer='none', num_clients=4,
                          clients_per_round=4, local_epochs=2, rounds=3, batch_size=32,
                          runtime='tf', fedexp_evaluate=evaluate, dirichlet_alpha=0.5,
                          cache_dir=os.path.join(out, 'cache'))
      c.output_dir = cls.dirs[evaluate] = os.path.join(out, evaluate)
      training.train(c, log=lambda s: None)
      with open(os.path.join(c.output_dir, 'summary.json')) as f:
        final = json.load(f)['final_test_accuracy']
      cls.runs[evaluate] = (final, last_two_iterates.measure(c.output_dir))

  def test_the_script_measures_what_each_run_evaluated(self):
    final, m = self.runs['last']
    self.assertAlmostEqual(m['last'], final, places=6)
    final, m = self.runs['average_last_two']
    self.assertAlmostEqual(m['average_last_two_trainable'], final, places=6)
    self.assertEqual(m['hparams']['evaluate'], 'average_last_two')
    # Here the four models score apart (25.0, 10.0, 37.8 and 47.8 % when written), so a run
    # that evaluated another of them would not pass.
    scores = [m[k] for k in ('last', 'previous', 'average_last_two', 'average_last_two_trainable')]
    self.assertLen(set(round(x, 6) for x in scores), 4)

  def test_both_runs_trained_the_same_iterates(self):
    a, b = self.runs['last'][1], self.runs['average_last_two'][1]
    self.assertAlmostEqual(a['last'], b['last'], places=6)
    self.assertAlmostEqual(a['previous'], b['previous'], places=6)

  def test_an_unfinished_run_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'not rounds 4 and 5'):
      run_dir = tempfile.mkdtemp()
      with open(os.path.join(self.dirs['last'], 'config.json')) as f:
        config = json.load(f)
      config['rounds'] = 5
      with open(os.path.join(run_dir, 'config.json'), 'w') as f:
        json.dump(config, f)
      os.symlink(os.path.join(self.dirs['last'], 'checkpoints'),
                 os.path.join(run_dir, 'checkpoints'))
      last_two_iterates.global_models(run_dir)


if __name__ == '__main__':
  absltest.main()
