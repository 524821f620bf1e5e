"""Facts about the PyTorch reference that its committed fixtures show, printed with their numbers.

The reference-equivalence tests (tests/reference_algorithms_test.py,
tests/reference_optimizers_test.py) compare the project with the fixtures that
bench/reference/reference_fixtures_algorithms.py made once from the reference's own code (commit
973e4af). Some facts in those fixtures are about the reference alone (its FedProx is FedAvg, its
FedExp step stays at 1, ...): a test asserting them runs no project code and cannot fail, so they
are recorded in docs/reference.md §5 instead, and this script recomputes each one from the fixtures
(NumPy only, a second):

  .venv/bin/python -m bench.reference.reference_facts

It prints one line per fact, `ok` or `DIFFERS`, with the number behind it, and exits 1 if a fact
no longer holds (after the fixtures were remade, say).
"""

import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, 'tests', 'testdata', 'reference')
ALG = os.path.join(DATA, 'algorithms')
CLIENT_SIZES = (97, 64, 30)
P = np.array(CLIENT_SIZES, np.float64) / sum(CLIENT_SIZES)


def _load(name, directory=ALG):
  return dict(np.load(os.path.join(directory, f'{name}.npz')))


def _keys(fx, name='keys'):
  return json.loads(str(fx[name]))


def _relative(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _trainable(key):
  return not any(key.endswith(s) for s in ('running_mean', 'running_var', 'num_batches_tracked'))


def _moved(fx, other, entry):
  """Largest relative difference of two fixtures' fingerprints over the trainable keys."""
  return max(_relative(a, b) for key, a, b in zip(_keys(fx), fx[entry], other[entry])
             if _trainable(key))


def facts():
  """[(holds, text)]."""
  out = []
  # FedProx: the unrepaired reference's round is FedAvg's, bit for bit.
  asis, fedavg = _load('fedprox_asis'), _load('resnet20', DATA)
  equal = all(np.array_equal(fp, fedavg[f'f64/fedavg/global/{key}'])
              for key, fp in zip(_keys(asis), asis['global1']))
  out.append((equal, 'fedprox_asis global1 == resnet20.npz f64/fedavg/global, bit for bit '
                     '(its proximal term is zero)'))
  fixed = _load('fedprox_fixed')
  moved = _moved(fixed, asis, 'global1')
  out.append((moved > 1e-4, f'fedprox_fixed vs fedprox_asis, global1: {moved:.1e} (the repaired '
                            'term moves the weights)'))
  # MOON: round 1's contrastive gradient is 0; the temperature acts in round 2; sims are cosines.
  t05, t1 = _load('moon_t0.5'), _load('moon_asis')
  r1, r2 = _moved(t05, t1, 'global1'), _moved(t05, t1, 'global2')
  out.append((r1 < 1e-12, f'moon_t0.5 vs moon_asis, global1: {r1:.1e} (previous = global model)'))
  out.append((r2 > 1e-4, f'moon_t0.5 vs moon_asis, global2: {r2:.1e} (the temperature acts)'))
  z, zg, zp = (t05[f'round2/client0/{k}'] for k in ('z', 'z_global', 'z_prev'))
  cos = lambda a, b: (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
  d = _relative(t05['round2/client0/sims'][:len(z)], np.stack([cos(z, zg), cos(z, zp)], -1))
  out.append((d < 1e-12, f'moon round2/client0/sims are the cosine similarities: {d:.1e}'))
  # FedOptim: the reference's running variances stay >= 0 over its 3 rounds.
  for name in ('gd', 'adam', 'yogi', 'adagrad'):
    low = _variances(_load(f'fedoptim_{name}'))
    out.append((low >= 0, f'fedoptim_{name}: smallest global running variance, rounds 0-3: '
                          f'{low:.3g}'))
  # FedExp: the step is 1 in every round, with and without BN's step counters; the two runs'
  # clients and globals agree; the per-key sums add up to the whole ones; the counters' share.
  full, nocount = _load('fedexp'), _load('fedexp_nocounters')
  sqr_keys = _keys(full, 'sqr_keys')
  counters = np.array([k.endswith('num_batches_tracked') for k in sqr_keys])
  for r in (1, 2, 3):
    etas = float(full[f'round{r}/eta_g']), float(nocount[f'round{r}/eta_g'])
    out.append((etas == (1.0, 1.0), f'fedexp round {r}: eta_g {etas[0]} (whole state_dict), '
                                    f'{etas[1]} (counters removed)'))
    same = max(_relative(nocount[e], full[e]) for e in
               [f'global{r}'] + [f'round{r}/client{i}' for i in range(3)])
    out.append((same < 1e-12, f'fedexp round {r}: the two runs\' clients and globals differ by '
                              f'{same:.1e}'))
    per_client = np.stack([full[f'round{r}/client{i}/sqr_delta'] for i in range(3)])
    mean = P @ per_client
    avg = full[f'round{r}/sqr_avg_delta_per_key']
    sums = (mean.sum() / full[f'round{r}/avg_sqr_delta'],
            avg.sum() / full[f'round{r}/sqr_avg_delta'],
            mean[~counters].sum() / nocount[f'round{r}/avg_sqr_delta'],
            avg[~counters].sum() / nocount[f'round{r}/sqr_avg_delta'])
    text = ', '.join(f'{s:.9f}' for s in sums)
    out.append((max(abs(s - 1) for s in sums) < 1e-6,
                f'fedexp round {r}: per-key sums / whole sums {text}'))
    share = mean[counters].sum() / mean.sum()
    out.append((share > 0.5, f'fedexp round {r}: the counters\' share of sum_i p_i |Delta_i|^2 '
                             f'{share:.2f}'))
  return out


def _variances(fx):
  """The smallest running variance of a fixture's global statistics, rounds 0-3."""
  shapes = {k[len('init/'):]: v.shape for k, v in _load('resnet20', DATA).items()
            if k.startswith('init/')}
  low = np.inf
  for r in range(4):
    flat, at = fx[f'global{r}/stats'], 0
    for key in _keys(fx, 'stat_keys'):
      size = int(np.prod(shapes[key]))
      if key.endswith('running_var'):
        low = min(low, float(flat[at:at + size].min()))
      at += size
  return low


def main():
  ok = True
  for holds, text in facts():
    print(('ok       ' if holds else 'DIFFERS  ') + text)
    ok &= bool(holds)
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
