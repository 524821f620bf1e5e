"""bench/accuracy/server_defaults.py's grid, without training: its sizes, its stages, the smoke
mode, and that every cell's settings reach the algorithm (the digits task's own overrides of the
adaptive optimisers' server_lr and bn never replace a cell's). `--smoke` itself trains (about 2
minutes)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from bench.accuracy import server_defaults as sd


class GridTest(absltest.TestCase):

  def test_grid_sizes_are_the_documented_ones(self):
    counts = {a: sd.count_cells(p) for a, p in sd.PLANS.items()}
    self.assertEqual(counts, {'fedadagrad': 12, 'fedadam': 12, 'fedyogi': 12, 'fedexp': 4,
                              'fedlc': 3, 'fedrs': 3, 'fedsam': 3, 'fedavg': 1})
    self.assertEqual(sum(counts.values()), 50)
    self.assertEqual(sd.count_cells(sd.product_plan(sd.PLANS['fedadam'])), 2 * 4 * 5)
    self.assertEqual(sd.count_cells(sd.product_plan(sd.PLANS['fedexp'])), 2 * 2 * 1)

  def test_stage_two_sweeps_one_axis_from_stage_ones_best(self):
    plan = sd.PLANS['fedadam']
    first = sd.stage1_cells(plan)
    self.assertLen(first, 8)
    self.assertTrue(all(c['tau'] == 1e-3 for c in first))
    best = {'bn': 'average', 'server_lr': 0.1, 'tau': 1e-3}
    second = sd.stage2_cells(plan, best)
    self.assertEqual([c['tau'] for c in second], [1e-5, 1e-4, 1e-2, 1e-1])
    self.assertTrue(all(c['bn'] == 'average' and c['server_lr'] == 0.1 for c in second))
    self.assertLen(second, sd.count_cells(plan) - len(first))
    cells = [{'settings': {'x': 1}, 'mean': 0.2}, {'settings': {'x': 2}, 'mean': 0.3},
             {'settings': {'x': 3}, 'mean': 0.3}]
    self.assertEqual(sd.best_cell(cells)['settings'], {'x': 2})

  def test_smoke_is_one_reference_cell_an_algorithm(self):
    for name, plan in sd.PLANS.items():
      smoke = sd.smoke_plan(plan)
      self.assertEqual(sd.count_cells(smoke), 1, name)
      (cell,) = sd.stage1_cells(smoke)
      self.assertEqual(cell, sd.reference_settings(plan), name)

  def test_every_cell_reaches_the_algorithm_as_set(self):
    for name, plan in sd.PLANS.items():
      cells = sd.stage1_cells(plan)
      cells += [c for s in list(cells) for c in sd.stage2_cells(plan, s)]
      for settings in cells:
        config = sd.make_config(name, settings, seed=1, rounds=12, output_dir='/nonexistent')
        hp = config.hparams[name]
        for field, value in settings.items():
          self.assertEqual(getattr(hp, field), value, (name, settings))
        self.assertEqual((config.task, config.rounds, config.local_epochs, config.regularizer),
                         ('digits', 12, 2, 'none'))
        self.assertIn(sd.cell_key(name, settings), config.output_dir)

  def test_axis_overrides(self):
    plans = sd.apply_overrides(sd.PLANS, ['fedexp.eps=1e-3,1e-2', 'fedexp.step_counters=false',
                                          'fedlc.tau=1'])
    self.assertEqual(plans['fedexp'].stage2[0].values, (1e-3, 1e-2))
    self.assertEqual(plans['fedexp'].stage1[1].values, (False,))
    self.assertEqual(plans['fedlc'].stage1[0].values, (1.0,))
    self.assertEqual(sd.count_cells(plans['fedexp']), 2 + 1)
    self.assertEqual(sd.PLANS['fedlc'].stage1[0].values, (0.01, 0.1, 1.0))  # not changed
    for bad in ('fedexp.nope=1', 'nope.tau=1', 'fedlc'):
      with self.assertRaises(Exception):
        sd.apply_overrides(sd.PLANS, [bad])


if __name__ == '__main__':
  absltest.main()
