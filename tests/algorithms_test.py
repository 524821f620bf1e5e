"""Each algorithm's defining property, run in the in-process TF runtime on a tiny BN model."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_decorr import algorithms
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import tf_runtime

DATA = testing.synthetic_clients()  # sizes 10, 6, 14, 8 -> 3, 2, 4, 2 batches of 4
SIZES = [len(d[1]) for d in DATA]
CFG = algorithms.ClientConfig(local_epochs=2, lr=0.05, momentum=0.9, weight_decay=1e-3)
_RUNTIMES = {}


def runtime(alg, shuffle=False):
  key = (id(alg), shuffle)
  if key not in _RUNTIMES:
    _RUNTIMES[key] = (alg, tf_runtime.TfRuntime(
        alg, testing.make_client_dataset_fn(DATA, shuffle=shuffle)))
  return _RUNTIMES[key][1]


def run(alg, state, clients, client_states=None, seed=0, shuffle=False):
  if client_states is None:
    init = alg.initial_client_state(alg.initial_weights())
    client_states = [init] * len(clients)
  return runtime(alg, shuffle).run_round(state, [(c, seed) for c in clients], client_states)


def assert_lists_close(test, a, b, atol=1e-6, rtol=1e-5):
  test.assertEqual(len(a), len(b))
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)


class AlgorithmsTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.fedavg = algorithms.build('fedavg', testing.tiny_model, CFG)
    cls.x0 = cls.fedavg.initial_weights()
    cls.s0 = cls.fedavg.initial_server_state(cls.x0)
    # Single-client FedAvg rounds: each client's own local result y_i from x0.
    cls.y = {c: run(cls.fedavg, cls.s0, [c])[0]['weights'] for c in '0123'}

  def test_fedavg_one_client_equals_hand_written_torch_style_sgd(self):
    cfg = algorithms.ClientConfig(local_epochs=1, lr=0.1, momentum=0.9, weight_decay=1e-2)
    alg = algorithms.build('fedavg', testing.tiny_model, cfg)
    got = run(alg, alg.initial_server_state(self.x0), ['2'])[0]['weights']
    # Independent loop: Keras gradients, NumPy update rule of torch.optim.SGD.
    model = testing.tiny_model()
    model.set_weights(self.x0)
    trainable = model.trainable_weights
    bufs = [np.zeros(v.shape, np.float32) for v in trainable]
    x, y = DATA[2]
    for start in range(0, len(y), 4):
      xb, yb = x[start:start + 4], y[start:start + 4]
      with tf.GradientTape() as tape:
        logits = model(xb, training=True)['logits']
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))
      grads = tape.gradient(loss, trainable)
      for i, (v, g) in enumerate(zip(trainable, grads)):
        w = v.numpy()
        d = g.numpy() + cfg.weight_decay * w
        bufs[i] = cfg.momentum * bufs[i] + d
        v.assign(w - cfg.lr * bufs[i])
    assert_lists_close(self, got, model.get_weights())
    # The run really trained: weights and BN statistics moved.
    self.assertGreater(np.abs(got[0] - self.x0[0]).max(), 1e-3)
    self.assertGreater(np.abs(got[4] - self.x0[4]).max(), 1e-3)  # bn/moving_mean

  def test_fedavg_averages_everything_including_bn_statistics_by_examples(self):
    spec = self.fedavg.spec
    self.assertEqual(spec.trainable, (True, True, True, True, False, False, True, True))
    self.assertEqual(spec.batchnorm, (False, False, True, True, True, True, False, False))
    got = run(self.fedavg, self.s0, ['0', '1'])[0]['weights']
    n0, n1 = SIZES[0], SIZES[1]
    want = [(n0 * a + n1 * b) / (n0 + n1) for a, b in zip(self.y['0'], self.y['1'])]
    assert_lists_close(self, got, want)
    for i in (4, 5):  # moving mean / variance: averaged, not left at init, not uniform.
      self.assertGreater(np.abs(got[i] - self.x0[i]).max(), 1e-3)
      self.assertGreater(np.abs(got[i] - (self.y['0'][i] + self.y['1'][i]) / 2).max(), 1e-4)

  def test_fedprox_mu_zero_is_fedavg_and_large_mu_stays_close(self):
    got0 = run(algorithms.build('fedprox', testing.tiny_model, CFG, mu=0.0), self.s0, ['2'])
    assert_lists_close(self, got0[0]['weights'], self.y['2'])
    prox = algorithms.build('fedprox', testing.tiny_model, CFG, mu=10.0)
    s, _, m = run(prox, self.s0, ['2'])
    self.assertGreater(m['extra_sum'], 0.0)
    tr = [i for i, t in enumerate(prox.spec.trainable) if t]
    dist = lambda w: np.sqrt(sum(np.sum((w[i] - self.x0[i]) ** 2) for i in tr))
    self.assertLess(dist(s['weights']), 0.3 * dist(self.y['2']))

  def test_fedavgm_reference_form_matches_closed_form_over_three_rounds(self):
    b = 0.5
    alg = algorithms.build('fedavgm', testing.tiny_model, CFG, server_momentum=b)
    state = alg.initial_server_state(self.x0)
    x, m = [w.copy() for w in self.x0], [np.zeros_like(w) for w in self.x0]
    clients = ['0', '3']
    for _ in range(3):
      state = run(alg, state, clients)[0]
      avg = run(self.fedavg, {'weights': x}, clients)[0]['weights']
      m = [b * mi + (1 - b) * (a - xi) for mi, a, xi in zip(m, avg, x)]
      x = [xi + mi for xi, mi in zip(x, m)]
      assert_lists_close(self, state['weights'], x, atol=1e-5)
      assert_lists_close(self, state['momentum'], m, atol=1e-5)
    # The TFF-style form ('tff'): m = b m + delta, x += server_lr m; not the reference form.
    sgdm = algorithms.build('fedavgm', testing.tiny_model, CFG, server_momentum=b, form='tff',
                            server_lr=0.7)
    s1 = run(sgdm, sgdm.initial_server_state(self.x0), clients)[0]
    avg0 = run(self.fedavg, self.s0, clients)[0]['weights']
    assert_lists_close(self, s1['weights'],
                       [x0 + 0.7 * (a - x0) for x0, a in zip(self.x0, avg0)], atol=1e-6)

  def test_fedbn_keeps_bn_local(self):
    alg = algorithms.build('fedbn', testing.tiny_model, CFG)
    s, states, _ = run(alg, alg.initial_server_state(self.x0), ['0', '1'])
    bn = alg.spec.batchnorm
    n0, n1 = SIZES[0], SIZES[1]
    for i, is_bn in enumerate(bn):
      if is_bn:
        np.testing.assert_array_equal(s['weights'][i], self.x0[i])
      else:
        np.testing.assert_allclose(s['weights'][i],
                                   (n0 * self.y['0'][i] + n1 * self.y['1'][i]) / (n0 + n1),
                                   atol=1e-6)
    bn_idx = [i for i, b in enumerate(bn) if b]
    for k, i in enumerate(bn_idx):  # each client keeps its own trained BN variables
      np.testing.assert_allclose(states[0]['bn'][k], self.y['0'][i], atol=1e-6)
      np.testing.assert_allclose(states[1]['bn'][k], self.y['1'][i], atol=1e-6)
    self.assertGreater(np.abs(states[0]['bn'][2] - states[1]['bn'][2]).max(), 1e-2)
    # Next round client 0 starts from ITS BN, not the server's: differs from a fresh start.
    s2, _, _ = run(alg, s, ['0'], [states[0]])
    s2_fresh, _, _ = run(alg, s, ['0'], [alg.initial_client_state(self.x0)])
    self.assertGreater(np.abs(s2['weights'][0] - s2_fresh['weights'][0]).max(), 1e-6)

  def test_moon_temperature_changes_update_and_mu_zero_is_fedavg(self):
    def moon(**kw):
      return algorithms.build('moon', testing.tiny_model, CFG, **kw)
    m0 = moon(mu=0.0)
    s, states, _ = run(m0, self.s0, ['2'])
    assert_lists_close(self, s['weights'], self.y['2'])
    assert_lists_close(self, states[0]['previous'], self.y['2'])
    # A previous model different from the global one makes the contrastive term act.
    prev = {'previous': self.y['3']}
    a = run(moon(temperature=0.5), self.s0, ['2'], [prev])
    b = run(moon(temperature=5.0), self.s0, ['2'], [prev])
    self.assertGreater(a[2]['extra_sum'], 0.0)
    self.assertGreater(np.abs(a[0]['weights'][0] - b[0]['weights'][0]).max(), 1e-5)
    self.assertGreater(np.abs(a[0]['weights'][0] - self.y['2'][0]).max(), 1e-5)

  def test_scaffold_control_variates_follow_option_ii(self):
    n_total = 4
    alg = algorithms.build('scaffold', testing.tiny_model, CFG, num_clients=n_total)
    tr = [i for i, t in enumerate(alg.spec.trainable) if t]
    steps = {'0': 2 * 3, '1': 2 * 2}  # 2 epochs x batches
    s1, st, _ = run(alg, alg.initial_server_state(self.x0), ['0', '1'])
    # Round 1: c = c_i = 0 so local training is FedAvg's.
    for k, c in enumerate('01'):
      want = [(self.x0[i] - self.y[c][i]) / (steps[c] * CFG.lr) for i in tr]
      assert_lists_close(self, st[k]['control'], want, atol=1e-5)
    assert_lists_close(self, s1['weights'],
                       [(a + b) / 2 for a, b in zip(self.y['0'], self.y['1'])])
    assert_lists_close(self, s1['control'],
                       [(a + b) / n_total for a, b in zip(st[0]['control'], st[1]['control'])])
    # Round 2, client 0 alone (server_lr 1 -> new x = y_0): c_i+ = c_i - c + (x - y)/(K lr).
    s2, st2, _ = run(alg, s1, ['0'], [st[0]])
    y2 = s2['weights']
    want = [ci - c + (s1['weights'][i] - y2[i]) / (steps['0'] * CFG.lr)
            for ci, c, i in zip(st[0]['control'], s1['control'], tr)]
    assert_lists_close(self, st2[0]['control'], want, atol=1e-4)
    # The correction acts: not what FedAvg gives from the same start.
    plain = run(self.fedavg, {'weights': s1['weights']}, ['0'])[0]['weights']
    self.assertGreater(np.abs(plain[0] - y2[0]).max(), 1e-5)

  def test_fednova_equal_steps_is_fedavg_and_partial_participation_works(self):
    alg = algorithms.build('fednova', testing.tiny_model, CFG)
    s = run(alg, self.s0, ['1', '3'])[0]  # 2 batches each, different sizes (6, 8)
    assert_lists_close(self, s['weights'], run(self.fedavg, self.s0, ['1', '3'])[0]['weights'])
    s = run(alg, self.s0, ['0', '2'])[0]  # 3 vs 4 batches: normalised, not FedAvg
    fa = run(self.fedavg, self.s0, ['0', '2'])[0]['weights']
    self.assertGreater(np.abs(s['weights'][0] - fa[0]).max(), 1e-5)
    # Closed form for the unequal case: tau_eff * sum p_i (x - y_i)/a_i.
    rho = CFG.momentum
    a = {c: (t - rho * (1 - rho ** t) / (1 - rho)) / (1 - rho) for c, t in (('0', 6), ('2', 8))}
    p = {'0': SIZES[0] / (SIZES[0] + SIZES[2]), '2': SIZES[2] / (SIZES[0] + SIZES[2])}
    tau_eff = sum(p[c] * a[c] for c in '02')
    want = [x - tau_eff * sum(p[c] * (x - self.y[c][i]) / a[c] for c in '02')
            for i, x in enumerate(self.x0)]
    assert_lists_close(self, s['weights'], want, atol=1e-5)
    for clients in (['3'], ['0', '1', '2'], ['2', '3']):  # partial participation, 4 clients
      s = run(alg, s, clients)[0]
      self.assertTrue(all(np.isfinite(w).all() for w in s['weights']))

  def test_decomposed_fast_slow(self):
    build = lambda k: algorithms.build('fedavg_decomposed', testing.tiny_decomposed_model, CFG,
                                       coefficient_period=k)
    plain = algorithms.build('fedavg', testing.tiny_decomposed_model, CFG)
    x0 = plain.initial_weights()
    coef = [i for i, n in enumerate(plain.spec.names) if 'coefficients' in n]
    atoms = [i for i, n in enumerate(plain.spec.names) if 'atoms' in n]
    self.assertLen(coef, 1)
    self.assertLen(atoms, 1)
    want = run(plain, plain.initial_server_state(x0), ['0', '1'])[0]['weights']
    k1 = build(1)
    got, _, m1 = run(k1, k1.initial_server_state(x0), ['0', '1'])
    assert_lists_close(self, got['weights'], want)
    k2 = build(2)
    s, st, m = run(k2, k2.initial_server_state(x0), ['0', '1'])
    np.testing.assert_array_equal(s['weights'][coef[0]], x0[coef[0]])  # not aggregated yet
    np.testing.assert_allclose(s['weights'][atoms[0]], want[atoms[0]], atol=1e-6)
    coef_bytes = 4 * x0[coef[0]].size * 2
    self.assertEqual(m1['bytes_up'] - m['bytes_up'], coef_bytes)
    s, st, m = run(k2, s, ['0', '1'], st)  # round 1: (1+1) % 2 == 0 -> coefficients averaged
    self.assertEqual(m['bytes_up'], m1['bytes_up'])
    n0, n1 = SIZES[0], SIZES[1]
    np.testing.assert_allclose(s['weights'][coef[0]],
                               (n0 * st[0]['coefficients'][0] + n1 * st[1]['coefficients'][0])
                               / (n0 + n1), atol=1e-6)
    with self.assertRaisesRegex(ValueError, 'decomposed'):
      algorithms.build('fedavg_decomposed', testing.tiny_model, CFG)

  @parameterized.product(name=algorithms.NAMES, reg=['none', 'feddecorr'])
  def test_every_algorithm_and_regularizer_runs_a_round(self, name, reg):
    hp = {'scaffold': {'num_clients': 4}}.get(name, {})
    model_fn = testing.tiny_decomposed_model if name == 'fedavg_decomposed' else testing.tiny_model
    alg = algorithms.build(name, model_fn, CFG,
                           regularizer=testing.feddecorr(0.1) if reg == 'feddecorr' else None,
                           **hp)
    s, states, m = run(alg, alg.initial_server_state(alg.initial_weights()), ['0', '2'])
    w = alg.global_weights(s)
    self.assertTrue(all(np.isfinite(x).all() for x in w))
    self.assertGreater(max(np.abs(a - b).max() for a, b in zip(w, alg.initial_weights())), 1e-5)
    self.assertLen(states, 2)
    self.assertEqual(m['examples'], 2 * (SIZES[0] + SIZES[2]))
    self.assertEqual(m['clients'], 2)
    if reg == 'feddecorr':
      self.assertGreater(m['reg_sum'], 0.0)
    else:
      self.assertEqual(m['reg_sum'], 0.0)

  def test_same_seed_same_result(self):
    a = run(self.fedavg, self.s0, ['0', '2'], seed=7, shuffle=True)[0]['weights']
    b = run(self.fedavg, self.s0, ['0', '2'], seed=7, shuffle=True)[0]['weights']
    c = run(self.fedavg, self.s0, ['0', '2'], seed=8, shuffle=True)[0]['weights']
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
    self.assertGreater(max(np.abs(x - y).max() for x, y in zip(a, c)), 1e-6)

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'algorithm'):
      algorithms.build('fedsgd', testing.tiny_model)
    with self.assertRaisesRegex(ValueError, 'num_clients'):
      algorithms.build('scaffold', testing.tiny_model, num_clients=0)
    with self.assertRaisesRegex(ValueError, 'form'):
      algorithms.build('fedavgm', testing.tiny_model, form='nesterov')
    with self.assertRaisesRegex(ValueError, 'momentum'):
      algorithms.ClientConfig(momentum=1.0)
    with self.assertRaisesRegex(ValueError, 'client_states'):
      runtime(self.fedavg).run_round(self.s0, [('0', 0)], [])


if __name__ == '__main__':
  absltest.main()
