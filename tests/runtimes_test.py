"""The TFF runtime and the in-process TF runtime run the same algorithm code to the same result."""

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr import algorithms
from tff_decorr.worker import tff_context
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import tf_runtime
from tff_decorr.runtimes import tff_runtime

DATA = testing.synthetic_clients()
# lr 0.02 and an 8-d representation: FedDecorr divides by sqrt(var + 1e-8), and with a 4-d ReLU
# representation some batches have a nearly constant column; then a 1e-7 change of the initial
# weights moves SCAFFOLD's result by 3e-2 (measured), and no two runtimes could agree.
CFG = algorithms.SGDHParams(lr=0.02, momentum=0.9, weight_decay=1e-3)
HPARAMS = {'scaffold': {'num_clients': 4}, 'fedavgm': {'server_momentum': 0.5},
           'fedavg_decomposed': {'coefficient_period': 2}, 'moon': {'temperature': 0.5}}
ROUNDS = [['0', '1'], ['1', '2', '3']]  # client '1' twice: its client state must carry over


def _build(name):
  model_fn = (testing.tiny_decomposed_model if name == 'fedavg_decomposed'
              else functools.partial(testing.tiny_model, representation_dim=8))
  return algorithms.build(name, model_fn, CFG, regularizer=testing.feddecorr(0.1),
                          **HPARAMS.get(name, {}))


def _flat(structure):
  return [np.asarray(x) for x in tf.nest.flatten(structure)]


class RuntimesTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tff_context.install()

  @classmethod
  def tearDownClass(cls):
    pids = tff_context.worker_pids()
    tff_context.stop_all()
    for pid in pids:  # every worker this test started is gone (or a zombie being reaped)
      if os.path.exists(f'/proc/{pid}'):
        with open(f'/proc/{pid}/stat') as f:
          assert f.read().split()[2] == 'Z', f'worker_binary {pid} still running'
    super().tearDownClass()

  def _run_both(self, alg, rounds, shuffle=False, seed=0):
    fn = testing.make_client_dataset_fn(DATA, shuffle=shuffle, epochs=2)
    tff_rt = tff_runtime.TffRuntime(alg, fn)
    process = tff_rt.process
    runtime = tf_runtime.TfRuntime(alg, fn)
    init_c = alg.initial_client_state(alg.initial_weights())
    results = []
    for run_round, state in ((tff_rt.run_round, tff_rt.initialize()),
                             (runtime.run_round, runtime.initialize())):
      states = {c: init_c for c in '0123'}
      for r, clients in enumerate(rounds):
        state, new_states, metrics = run_round(state, [(c, seed + r) for c in clients],
                                               [states[c] for c in clients])
        states.update(zip(clients, new_states))
      results.append((state, states, metrics))
    return process, results

  @parameterized.parameters(*algorithms.NAMES)
  def test_tff_and_tf_runtimes_agree_with_feddecorr(self, name):
    alg = _build(name)
    _, ((s_tff, c_tff, m_tff), (s_tf, c_tf, m_tf)) = self._run_both(alg, ROUNDS)
    x0 = alg.initial_weights()
    w_tff, w_tf = alg.global_weights(s_tff), alg.global_weights(s_tf)
    self.assertGreater(max(np.abs(a - b).max() for a, b in zip(w_tf, x0)), 1e-4)  # it trained
    for a, b in zip(_flat(s_tff), _flat(s_tf)):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    for c in '0123':
      for a, b in zip(_flat(c_tff[c]), _flat(c_tf[c])):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    self.assertEqual(set(m_tff), set(m_tf))
    for k in m_tf:
      np.testing.assert_allclose(m_tff[k], m_tf[k], rtol=1e-4, err_msg=k)
    self.assertGreater(m_tf['reg_sum'], 0.0)

  def test_datasets_are_built_inside_the_computation_and_seeded(self):
    alg = _build('fedavg')
    process, ((s_a, _, _), (s_b, _, _)) = self._run_both(alg, [['0', '2']], shuffle=True, seed=3)
    # Clients are described by (id, seed), never by serialized datasets.
    param = process.next.type_signature.parameter
    self.assertEqual(param[1], tff.FederatedType(tff_runtime.CLIENT_INPUT_TYPE, tff.CLIENTS))
    self.assertNotIn('*', str(param))  # no sequence (dataset) type anywhere
    for a, b in zip(_flat(s_a), _flat(s_b)):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    # Same seed -> same result in TFF; a different seed reshuffles.
    again = process.next(process.initialize(), [('0', 3), ('2', 3)], [0, 0])[0]
    other = process.next(process.initialize(), [('0', 4), ('2', 4)], [0, 0])[0]
    for a, b in zip(_flat(s_a), _flat(again)):
      np.testing.assert_array_equal(a, b)
    self.assertGreater(max(np.abs(a - b).max() for a, b in zip(_flat(s_a), _flat(other))), 1e-6)

  def test_bad_initial_weights(self):
    alg = _build('fedavg')
    with self.assertRaisesRegex(ValueError, 'initial_weights'):
      tff_runtime.build_process(alg, testing.make_client_dataset_fn(DATA), initial_weights=[])


class ConcurrentClientsTest(tf.test.TestCase, parameterized.TestCase):
  """--runtime=tf with several clients at once gives the bits of one client at a time."""

  @parameterized.parameters('fedavg', 'scaffold', 'moon', 'fedbn')
  def test_concurrent_clients_are_bit_identical_to_sequential(self, name):
    alg = _build(name)
    fn = testing.make_client_dataset_fn(DATA, shuffle=True, epochs=2)
    init_c = alg.initial_client_state(alg.initial_weights())
    rounds = [['0', '1', '2', '3'], ['3', '1', '0']]  # unequal clients, state carried over
    results = []
    for concurrency in (1, 3):
      runtime = tf_runtime.TfRuntime(alg, fn, concurrency=concurrency)
      state, states = runtime.initialize(), {c: init_c for c in '0123'}
      for r, clients in enumerate(rounds):
        state, new_states, metrics = runtime.run_round(
            state, [(c, 7 + r) for c in clients], [states[c] for c in clients])
        states.update(zip(clients, new_states))
      runtime.close()
      self.assertLen(runtime._steps, concurrency)  # pylint: disable=protected-access
      if concurrency > 1:  # Round 2 started its clients longest first, by round 1's times.
        self.assertCountEqual(runtime._seconds, '0123')  # pylint: disable=protected-access
      results.append(_flat((state, [states[c] for c in '0123'], metrics)))
    x0 = _flat(alg.initial_weights())
    self.assertGreater(max(np.abs(a - b).max() for a, b in zip(_flat(alg.global_weights(state)),
                                                                 x0)), 1e-4)
    self.assertEqual(len(results[0]), len(results[1]))
    for a, b in zip(*results):
      np.testing.assert_array_equal(a, b)

  def test_longest_first_starts_untimed_then_the_longest(self):
    seconds = {'a': 1.0, 'b': 5.0, 'c': 3.0, 'd': 5.0}
    ids = ['a', 'x', 'b', 'c', 'y', 'd']
    # Never timed first in the round's order, then by last time (ties in the round's order).
    self.assertEqual(tf_runtime.longest_first(ids, seconds), [1, 4, 2, 5, 3, 0])
    self.assertEqual(tf_runtime.longest_first(ids, {}), list(range(6)))


if __name__ == '__main__':
  absltest.main()
