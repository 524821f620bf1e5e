r"""Step-by-step comparison with the PyTorch reference: same weights, same batches.

Reads the fixtures bench/reference/reference_fixtures.py made with the reference's own code
(tests/testdata/reference) and runs the project's client loop (client_update.local_train, what
every algorithm and both runtimes call) from the same initial weights on the same batches, in
float32 (production) and float64. Prints, per model, float type and loss (CE, or CE + FedDecorr
0.1), after 1, 10 and 100 SGD steps: the summed CE and FedDecorr terms of ours and the reference's,
and the largest relative weight difference over all tensors. Then the chaos bound: our float64 loop
from the reference's weights and from those weights times (1 + 1e-11 N(0, 1)), compared after 10,
25 and 100 steps: how far rounding-sized differences grow by themselves.

  .venv/bin/python -m bench.reference.reference_equivalence  # about 10 minutes on 2 cores

Writes bench/results/reference_equivalence.json. tests/reference_equivalence_test.py asserts the
parts that are deterministic enough to test.
"""

from __future__ import annotations

import json
import os
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import _common  # pylint: disable=g-bad-import-order
from bench.reference.reference_fixtures import (  # pylint: disable=g-bad-import-order
    fingerprint, MEAN, STD)
from tff_decorr import models
from tff_decorr import regularizers
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms.workspace import Workspace
from tff_decorr.models import torch_import

FLAGS = flags.FLAGS
_ROOT = _common.ROOT
_DATA = os.path.join(_ROOT, 'tests', 'testdata', 'reference')
_MODELS = {'resnet20': 'resnet20', 'mobilenetv2': 'mobilenet_v2_cifar'}
_CONFIG = client_update.SGDHParams(lr=0.01, momentum=0.9, weight_decay=1e-5)

flags.DEFINE_list('models', ['resnet20', 'mobilenetv2'], 'Fixture models.')
flags.DEFINE_list('mobilenet_steps', ['1', '10'], 'Steps for MobileNetV2 (100 takes minutes).')


def _batches(steps, dtype, pool):
  n = len(pool['labels'])
  idx = np.concatenate([np.arange(t * 32, (t + 1) * 32) % n for t in range(steps)])
  x = ((pool['images'][idx].astype(np.float32) / 255.0 - MEAN) / STD).astype(dtype)
  return tf.data.Dataset.from_tensor_slices((x, pool['labels'][idx].astype(np.int32))).batch(32)


def _workspace(name, dtype, state):
  old = tf.keras.backend.floatx()
  tf.keras.backend.set_floatx('float64' if dtype == np.float64 else 'float32')
  try:
    def model_fn():
      m = models.build(_MODELS[name], num_classes=10, input_shape=(32, 32, 3))
      torch_import.assign_torch_state(m, state)
      return m
    return Workspace(model_fn)
  finally:
    tf.keras.backend.set_floatx(old)


def _max_rel_diff(ws, state, ref, prefix):
  """Largest relative difference over trainable tensors (running statistics are reported apart:
  float64 Keras updates the running variance with the biased batch variance)."""
  worst, where = 0.0, ''
  for key, v in torch_import.to_torch_layout(ws.model, state).items():
    if 'running' in key:
      continue
    r = ref[f'{prefix}/{key}']
    v = v if r.shape == v.shape else fingerprint(key, v)
    d = float(np.max(np.abs(v - r)) / max(np.max(np.abs(r)), 1e-6))
    if d > worst:
      worst, where = d, key
  return worst, where


def _local_train_fn(ws, beta):
  """tf.function (dataset, start weights) -> LocalResult of the project's client loop."""
  reg = regularizers.get('feddecorr', beta=beta) if beta else None
  return tf.function(lambda d, w: client_update.local_train(ws, w, d, _CONFIG, reg))


def main(argv):
  del argv
  pool = dict(np.load(os.path.join(_DATA, 'batches.npz')))
  rows, t0 = [], time.time()
  print('| model | float | loss | steps | CE sum ours / reference | FedDecorr sum ours / '
        'reference | largest relative weight difference |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  for name in FLAGS.models:
    fx = dict(np.load(os.path.join(_DATA, f'{name}.npz')))
    for dtype in (np.float32, np.float64):
      state = {k[5:]: fx[k].astype(dtype) for k in fx if k.startswith('init/')}
      ws = _workspace(name, dtype, state)
      start = [v.numpy() for v in ws.weights]
      for beta in (0.0, 0.1):
        tag = ('f64/' if dtype == np.float64 else '') + ('decorr' if beta else 'plain')
        run = _local_train_fn(ws, beta)
        steps_list = (1, 10, 100) if name == 'resnet20' else tuple(map(int, FLAGS.mobilenet_steps))
        for steps in steps_list:
          res = run(_batches(steps, dtype, pool), start)
          ce = float(res.metrics['ce_sum']) / 32
          dec = float(res.metrics['reg_sum']) / 32 / beta if beta else float('nan')
          ref_ce, ref_dec = fx[f'{tag}/ce'][:steps].sum(), fx[f'{tag}/decorr'][:steps].sum()
          diff, where = _max_rel_diff(ws, state, fx, f'{tag}/step{steps}')
          row = dict(model=name, float=np.dtype(dtype).name, loss='CE + 0.1 FedDecorr' if beta
                     else 'CE', steps=steps, ce=ce, ref_ce=float(ref_ce), decorr=dec,
                     ref_decorr=float(ref_dec), max_rel_weight_diff=diff, tensor=where)
          rows.append(row)
          print(f'| {name} | {row["float"]} | {row["loss"]} | {steps} | {ce:.6f} / {ref_ce:.6f} '
                f'| {dec:.6f} / {ref_dec:.6f} | {diff:.1e} ({where}) |', flush=True)
  # Chaos bound: our own float64 loop against itself from a 1e-11 relative perturbation.
  fx = dict(np.load(os.path.join(_DATA, 'resnet20.npz')))
  state = {k[5:]: fx[k].astype(np.float64) for k in fx if k.startswith('init/')}
  rng = np.random.default_rng(1)
  chaos = []
  print('\n| loss | steps | largest relative weight difference after a 1e-11 perturbation |')
  print('| --- | --- | --- |')
  for beta in (0.0, 0.1):
    ws = _workspace('resnet20', np.float64, state)
    start = [v.numpy() for v in ws.weights]
    moved = [w * (1 + 1e-11 * rng.standard_normal(w.shape)) for w in start]
    run = _local_train_fn(ws, beta)
    for steps in (10, 25, 100):
      a = [t.numpy() for t in run(_batches(steps, np.float64, pool), start).weights]
      b = [t.numpy() for t in run(_batches(steps, np.float64, pool), moved).weights]
      diff = max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-6))
                 for x, y, t in zip(a, b, ws.trainable_mask) if t)
      chaos.append(dict(beta=beta, steps=steps, max_rel_weight_diff=diff))
      print(f'| {"CE + 0.1 FedDecorr" if beta else "CE"} | {steps} | {diff:.1e} |', flush=True)
  os.makedirs(os.path.join(_ROOT, 'bench', 'results'), exist_ok=True)
  path = os.path.join(_ROOT, 'bench', 'results', 'reference_equivalence.json')
  with open(path, 'w') as f:
    json.dump({'rows': rows, 'chaos': chaos, 'wall_time_s': time.time() - t0,
               'load_avg_end': os.getloadavg()}, f, indent=2)
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
