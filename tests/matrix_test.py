"""The combination matrix on its smallest setting.

Every registered algorithm x every registered aggregator x both runtimes is either refused before
anything is written, with a ValueError naming --aggregator or --runtime (by `config.make`, and by
the training program when handed the same combination without validation), or trains on the
embedded default (digits, small_cnn) at client momentum 0.9: finite loss every round and test
accuracy above chance (0.1) after ROUNDS rounds. The refusals must be the ones the algorithms'
declared capabilities imply (base.Algorithm: upload, private_refusal, norm_bound_refusal), and the
check on a built aggregation process must agree with the check on the configuration.

What is trained here: every `--aggregator=mean` cell in both runtimes, and the factory cells of
TRAINED_FACTORY_CELLS. A factory cell costs 40-170 s on this 2-core machine whatever the rounds
(TFF traces and compiles its computation: robust about 60 s, dp 40 s, compression and secure
150-170 s, measured under load 3-4), so all 22 allowed factory cells would take about 40 minutes;
`bench/accuracy/matrix.py` trains every allowed cell (docs/benchmarks.md §7), and
tests/aggregation_test.py checks each factory's arithmetic on a tiny model.
"""

import csv
import dataclasses
import math
import os
import shutil

from absl.testing import absltest
import numpy as np
import tensorflow_federated as tff

from bench.accuracy import matrix
from tff_decorr import algorithms
from tff_decorr import aggregators
from tff_decorr.worker import tff_context
from tff_decorr.configs import config
from tff_decorr.program import training
from tests import testutil

RUNTIMES = ('tff', 'tf')
CHANCE = 0.1  # digits: 10 balanced classes
ROUNDS = 3
# The smallest setting that is reliably above chance after ROUNDS rounds (the task's 5 local
# epochs; fewer clients only save per-client overhead, every round still sees the whole train set).
SMALLEST = dict(task='digits', num_clients=4, clients_per_round=4, rounds=ROUNDS, momentum=0.9,
                seed=0, regularizer='feddecorr', eval_every=ROUNDS)
# DP at a setting that can train with 4 clients in ROUNDS rounds: a fixed clip and little noise.
# What is tested is that the combination computes the right thing, not privacy (docs/benchmarks.md
# §9). Measured for FedAvg on this setting (final test accuracy, TFF's DP noise is not seeded):
# clip 1.0 / noise 0.01 clips the updates so hard that it stays near chance (0.097, 0.144, 0.189),
# and so does a larger clip at that noise (clip 10: 0.100, 0.103, 0.175, 0.181, 0.192); clip 5 /
# noise 0.001 trains (0.319, 0.397, 0.506).
DP_SETTINGS = dict(dp_clip=5.0, dp_noise_multiplier=0.001)
# Literal properties of TFF's factories behind the aggregators (checked against the registry in
# test_refusals_follow_the_declared_capabilities): DP and secure sums are private; at their
# default settings robust and compression clip and zero adaptively, DP clips, and secure sums
# clip every value to their bounds.
PRIVATE = frozenset({'dp', 'secure'})
BOUND_AT_DEFAULTS = frozenset({'robust', 'compression', 'dp', 'secure'})
# The factory cells trained here (the others: bench/accuracy/matrix.py). One per upload form and the
# cheapest factories: a model upload under DP, and SCAFFOLD's delta with its exact control-variate
# sums under robust aggregation (allowed although robust clips: only the model delta is clipped).
TRAINED_FACTORY_CELLS = (('fedavg', 'dp'), ('scaffold', 'robust'))


def settings(algorithm, aggregator, runtime, cache_dir):
  """The config.make keywords of a cell, as bench/accuracy/matrix.py makes them (what a cell needs
  follows from the algorithm's declared attributes and the aggregator)."""
  return matrix.cell_settings(algorithm, aggregator, runtime,
                              dict(SMALLEST, cache_dir=cache_dir), DP_SETTINGS)


class MatrixTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.addClassCleanup(tff_context.stop_all)
    cls.cache = os.path.join(cls.tmp, 'cache')
    # The DP cells' privacy ledger in the test's folder, not the user's data folder.
    testutil.isolated_data_home(os.path.join(cls.tmp, 'data'), cls.addClassCleanup)
    cls.cells = {}  # (algorithm, aggregator, runtime) -> Config, or the ValueError refusing it
    for alg in algorithms.names():
      for agg in aggregators.names():
        for rt in RUNTIMES:
          try:
            cls.cells[alg, agg, rt] = config.make(**settings(alg, agg, rt, cls.cache))
          except ValueError as e:
            cls.cells[alg, agg, rt] = e
    cls.trained = {}  # cell -> (final test accuracy, training losses) or the exception raised
    for (alg, agg, rt), c in cls.cells.items():
      if isinstance(c, ValueError) or (agg != 'mean' and (alg, agg) not in TRAINED_FACTORY_CELLS):
        continue
      out = os.path.join(cls.tmp, f'{alg}-{agg}-{rt}')
      try:
        summary = training.train(dataclasses.replace(c, output_dir=out), log=lambda s: None)
        with open(os.path.join(out, 'metrics.csv')) as f:
          losses = [float(r['train_loss']) for r in csv.DictReader(f)]
        cls.trained[alg, agg, rt] = (summary['final_test_accuracy'], losses)
      except Exception as e:  # pylint: disable=broad-except  (reported by the test, per cell)
        cls.trained[alg, agg, rt] = e
      finally:
        tff_context.stop_all()
        shutil.rmtree(out, ignore_errors=True)

  def refused(self, alg, agg, rt) -> bool:
    return isinstance(self.cells[alg, agg, rt], ValueError)

  def test_every_refusal_names_the_flag_and_writes_nothing(self):
    refused = [k for k in self.cells if self.refused(*k)]
    self.assertNotEmpty(refused)
    for alg, agg, rt in refused:
      with self.subTest(algorithm=alg, aggregator=agg, runtime=rt):
        message = str(self.cells[alg, agg, rt])
        self.assertRegex(message, r'^--(aggregator|runtime)\b')
        self.assertNotIn('\n', message)
        # The training program refuses the same combination when it skipped config.make, with
        # the same message, and leaves no directory behind.
        out = os.path.join(self.tmp, f'refused-{alg}-{agg}-{rt}')
        c = dataclasses.replace(matrix.unvalidated(settings(alg, agg, rt, self.cache)),
                                output_dir=out)
        with self.assertRaises(ValueError) as raised:
          training.train(c, log=lambda s: None)
        tff_context.stop_all()
        self.assertEqual(str(raised.exception), message)
        self.assertFalse(os.path.exists(out))

  def test_refusals_follow_the_declared_capabilities(self):
    for agg in aggregators.names():
      self.assertEqual(aggregators.is_private(agg), agg in PRIVATE, agg)
    self.assertEqual(set(aggregators.names()) - {'mean'}, BOUND_AT_DEFAULTS)
    for alg in algorithms.names():
      cls = algorithms.algorithm_class(alg)
      for agg in aggregators.names():
        for rt in RUNTIMES:
          expected = agg != 'mean' and bool(
              rt == 'tf' or cls.upload is None
              or (agg in PRIVATE and cls.private_refusal)
              or (agg in BOUND_AT_DEFAULTS and cls.norm_bound_refusal))
          self.assertEqual(self.refused(alg, agg, rt), expected, (alg, agg, rt))

  def test_refusals_named_in_the_docs(self):
    factories = [a for a in aggregators.names() if a != 'mean']
    self.assertNotEmpty(factories)
    for alg in algorithms.names():  # The plain sum takes every algorithm, in both runtimes.
      for rt in RUNTIMES:
        self.assertFalse(self.refused(alg, 'mean', rt), (alg, rt))
    for alg in algorithms.names():  # A factory runs only in TFF's runtime.
      for agg in factories:
        self.assertTrue(self.refused(alg, agg, 'tf'), (alg, agg))
        self.assertIn('--runtime=tff', str(self.cells[alg, agg, 'tf']))
    no_upload = [a for a in algorithms.names() if algorithms.algorithm_class(a).upload is None]
    self.assertIn('fedavg_decomposed', no_upload)
    for alg in no_upload:
      for agg in factories:
        self.assertTrue(self.refused(alg, agg, 'tff'), (alg, agg))
        self.assertIn('has no upload that tff.aggregators can aggregate',
                      str(self.cells[alg, agg, 'tff']))
    for agg in ('dp', 'secure', 'robust', 'compression'):
      self.assertTrue(self.refused('fednova', agg, 'tff'), agg)
      self.assertIn('--algorithm=fednova', str(self.cells['fednova', agg, 'tff']))
    for agg in ('dp', 'secure'):
      self.assertTrue(self.refused('scaffold', agg, 'tff'), agg)
      self.assertIn('control-variate', str(self.cells['scaffold', agg, 'tff']))
    for agg in ('robust', 'compression'):
      self.assertFalse(self.refused('scaffold', agg, 'tff'), agg)
    for alg in ('fedbn', 'moon'):  # Client state stays CLIENTS-placed in bin/train's runtime.
      for agg in ('dp', 'secure'):
        self.assertFalse(self.refused(alg, agg, 'tff'), (alg, agg))

  def test_fednova_runs_where_nothing_bounds_its_upload(self):
    base = settings('fednova', 'robust', 'tff', self.cache)
    for agg in ('robust', 'compression'):
      config.make(**{**base, 'aggregator': agg, f'{agg}_zeroing': False,
                     f'{agg}_clipping': False})  # allowed: no error
      with self.assertRaisesRegex(ValueError, f'^--aggregator={agg} cannot be combined with '
                                  '--algorithm=fednova'):
        config.make(**{**base, 'aggregator': agg, f'{agg}_clipping': False})
    # Secure sums clip every value to their bounds, whatever the robust wrappers do.
    with self.assertRaisesRegex(ValueError, '^--aggregator=secure cannot be combined with '
                                '--algorithm=fednova'):
      config.make(**{**base, 'aggregator': 'secure', 'secure_zeroing': False,
                     'secure_clipping': False})

  def test_built_processes_refuse_what_the_configuration_refuses(self):
    # The check on the built AggregationProcess (aggregators.check: private factories found in
    # it, clipping/zeroing norms in its state) against config.make's (declared properties).
    # Neither depends on the value type, so a small one keeps this cheap.
    shape = aggregators.RunShape(num_clients=4, clients_per_round=4, rounds=ROUNDS)
    value_type = tff.TensorType(np.float32, [3])
    for agg in aggregators.names():
      if agg == 'mean':
        continue
      given = {k[len(agg) + 1:]: v for k, v in DP_SETTINGS.items()} if agg == 'dp' else {}
      factory = aggregators.build(agg, aggregators.hparams_class(agg).from_mapping(given), shape)
      process = (factory.create(value_type, tff.TensorType(np.float32))
                 if aggregators.is_weighted(factory) else factory.create(value_type))
      for alg in algorithms.names():
        with self.subTest(algorithm=alg, aggregator=agg):
          try:
            aggregators.check(algorithms.algorithm_class(alg), factory, process,
                              state_on_server=False)
            refused = False
          except ValueError:
            refused = True
          self.assertEqual(refused, self.refused(alg, agg, 'tff'))

  def test_allowed_cells_train_above_chance_with_finite_loss(self):
    self.assertLen(self.trained, 2 * len(algorithms.names()) + len(TRAINED_FACTORY_CELLS))
    for alg, agg, rt in self.trained:
      with self.subTest(algorithm=alg, aggregator=agg, runtime=rt):
        self.assertFalse(self.refused(alg, agg, rt))
        result = self.trained[alg, agg, rt]
        if isinstance(result, Exception):
          self.fail(f'{type(result).__name__}: {result}')
        accuracy, losses = result
        self.assertLen(losses, ROUNDS)
        self.assertTrue(all(math.isfinite(l) for l in losses), losses)
        self.assertGreater(accuracy, CHANCE)

  def test_no_worker_left_running(self):
    self.assertEqual(tff_context.worker_pids(), [])


if __name__ == '__main__':
  absltest.main()
