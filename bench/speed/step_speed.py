r"""Speed of one client training step, against plain Keras and against the compute limit.

  .venv/bin/python -m bench.speed.step_speed                 # every model, mode=step
  .venv/bin/python -m bench.speed.step_speed --models=resnet20,mobilenet_v2_cifar
  .venv/bin/python -m bench.speed.step_speed --mode=round --models=resnet20  # a round, tf and tff

mode=step, per model (batch 64, FedAvg + FedDecorr beta 0.1, SGD lr 0.01 momentum 0.9, weight
decay 1e-5; 32x32x3 images, 64x64x3 for resnet18 and alexnet_bn):
- client step: the project's own client step (`algorithms.build('fedavg', ...)
  .make_client_step(Workspace)`), called on a dataset of --steps batches; per-step time = call time
  / --steps, so a fixed per-call cost is included, spread over the steps;
- TF floor: Keras `train_on_batch` of the same model with the same optimizer (Keras SGD, momentum
  0.9), cross-entropy only, in the same process;
- compute limit: the model's forward FLOPs (TF's profiler, batch 64) x 3 / the rate of a large
  float32 matmul measured in the same process (per CPU-second and per wall second).
The two variants alternate in blocks (--steps steps each, order rotated every repeat); each block's
client-step time is divided by the floor's of the same repeat, and the median of those ratios is
printed as `floor ratio X.XX` (CPU time; wall next to it). CPU time is this process's user + system.

mode=round: a whole round of --clients clients (FedAvg + FedDecorr) under --runtime=tf and
--runtime=tff alternately, each client holding --round_steps batches of synthetic data in one
setting and 1 batch in the other. The per-client fixed cost (dataset construction, call, state
transfer, the function's instantiation; TFF's serialisation) is the intercept of round time
against steps per client: (T(1) S - T(S)) / (S - 1) / clients, with T the round's CPU time (this
process and TFF's worker_binary) and S = --round_steps. `--round_data=shards` gives each client
its data as a training run does (random uint8 images in one shard file per client, read,
normalised and augmented by the cifar10 task's client dataset, tasks/client_data.py), so the
intercept includes reading the shard and building the batches:

  .venv/bin/python -m bench.speed.step_speed --mode=round --models=small_cnn --batch_size=10 \
      --clients=50 --round_steps=5 --round_data=shards --repeats=5 --suffix=cross_device

mode=reference: the project's client step against the reference's (bytedance/FedDecorr: its own
network and the body of its local-training loop, bench/reference/reference_step_worker.py) in a
persistent PyTorch process, both alive at once, blocks of --steps steps alternating (order rotated
every repeat), batch 64 of 32x32 in memory, lr 0.01, momentum 0.9, weight decay 1e-5, FedDecorr
coefficient --beta on both sides (0: the fidelity setting's FedAvg). Ours twice: one client alone,
and two clients at once in two threads, each in its own workspace, as `--runtime=tf` trains a round
on a 2-core CPU (per-step time = the block's time / (2 x steps)). Printed: per-step CPU and wall
time of each and the median over repeats of ours / reference per repeat. resnet20 and
mobilenet_v2_cifar (the reference's resnet20 and mobilenetv2).

  .venv/bin/python -m bench.speed.step_speed --mode=reference --models=resnet20,mobilenet_v2_cifar \
      --beta=0 --steps=6 --repeats=6

--precision=mixed_bfloat16 times the project's step as `bin/train --precision=mixed_bfloat16`
trains (bfloat16 layers, float32 weights); the reference stays float32, as its main.py is.

mode=perturbation (not a timing): how fast SGD amplifies a small change, i.e. which differences
between runtimes or kernels to expect. The embedded default setting (digits, small_cnn, batch 32,
lr 0.01, momentum 0.9, weight decay 1e-5, one client holding the 1,437 training images) trains
from w0 and from w0 + --perturbation x (random signs) for k steps, with and without FedDecorr
(beta 0.1); printed: the largest difference of the test logits (360 images) and of the weights
after k steps.

Writes bench/results/step_speed[_<mode>][_<suffix>].json, with the load average at the start and
the end of the run.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

from tff_decorr import tf_env  # pylint: disable=g-bad-import-order,unused-import  (before TF)
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import _common
from tff_decorr import algorithms
from tff_decorr import models
from tff_decorr.models import precision
from tff_decorr import regularizers
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms import workspace

FLAGS = flags.FLAGS
flags.DEFINE_enum('mode', 'step', ['step', 'round', 'perturbation', 'reference'],
                  'What to measure (see the module docstring).')
flags.DEFINE_list('models', ['small_cnn', 'resnet20', 'mobilenet_v2_cifar', 'resnet18',
                             'alexnet_bn'], 'Models (tff_decorr.models names).')
flags.DEFINE_integer('batch_size', 64, 'Batch size.')
flags.DEFINE_integer('steps', 4, 'Steps per timed block (mode=step).')
flags.DEFINE_integer('repeats', 5, 'Alternating repeats; medians over repeats are reported.')
flags.DEFINE_float('beta', 0.1, 'FedDecorr coefficient of the client step (0: no regulariser).')
flags.DEFINE_bool('jit', False, 'Compile the client step with XLA (jit_compile=True).')
flags.DEFINE_integer('clients', 10, 'Clients per round (mode=round).')
flags.DEFINE_integer('round_steps', 5, 'Batches per client in the long round (mode=round).')
flags.DEFINE_list('runtimes', ['tf', 'tff'], 'Runtimes to time (mode=round).')
flags.DEFINE_enum('round_data', 'synthetic', ['synthetic', 'shards'],
                  'mode=round: clients of float tensors made in the dataset function (synthetic), '
                  'or the product\'s own path (shards): uint8 images in one shard file per client, '
                  'read, preprocessed and augmented by the cifar10 task\'s client dataset.')
flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                     "TFF worker's concurrent computations (mode=round; -1: unlimited).")
flags.DEFINE_float('perturbation', 1e-7, 'Size of the initial-weight change (mode=perturbation).')
flags.DEFINE_string('reference_dir', '/tmp/FedDecorr',
                    'Checkout of bytedance/FedDecorr (mode=reference).')
flags.DEFINE_string('torch_python', '/tmp/torchenv/bin/python',
                    'Python of the PyTorch environment (mode=reference; '
                    'bench/reference/reference_main.py says how to install it).')
flags.DEFINE_enum('precision', 'float32', list(models.PRECISIONS),
                  "The project's model precision, as bin/train --precision.")
flags.DEFINE_string('suffix', '', 'Appended to the output name: step_speed[_round]_<suffix>.json.')

_IMAGE_SIZE = {'resnet18': 64, 'alexnet_bn': 64}
_NUM_CLASSES = {'resnet18': 200}


def _shape(name):
  s = _IMAGE_SIZE.get(name, 32)
  return (s, s, 3), _NUM_CLASSES.get(name, 10)


def _model_fn(name):
  shape, classes = _shape(name)
  # As bin/train builds it (program/experiment.py): float32, or bfloat16 layers with float32
  # weights.
  return lambda: precision.build(
      lambda: models.build(name, num_classes=classes, input_shape=shape), FLAGS.precision)


def _algorithm(name):
  reg = regularizers.get('feddecorr', beta=FLAGS.beta) if FLAGS.beta > 0 else None
  tf.keras.utils.set_random_seed(0)
  return algorithms.build('fedavg', _model_fn(name),
                          algorithms.SGDHParams(lr=0.01, momentum=0.9,
                                                  weight_decay=1e-5), regularizer=reg)


def _cpu() -> float:
  return sum(os.times()[:2])


def forward_flops(model, batch: int) -> float:
  """FLOPs of one forward pass at `batch` (TF's profiler counts a multiply-add as 2)."""
  fn = tf.function(lambda x: model(x, training=False))
  graph = fn.get_concrete_function(
      tf.TensorSpec((batch,) + tuple(model.input_shape[1:]), tf.float32)).graph
  opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  opts['output'] = 'none'
  return float(tf.compat.v1.profiler.profile(graph, options=opts).total_float_ops)


def matmul_rate(n: int = 1024, calls: int = 20):
  """float32 matmul FLOP/s per CPU-second and per wall second (the compute limit's yardstick)."""
  a = tf.random.stateless_normal([n, n], seed=[1, 2])
  b = tf.random.stateless_normal([n, n], seed=[3, 4])
  mm = tf.function(lambda a, b: tf.matmul(a, b))
  mm(a, b).numpy()
  best_cpu = best_wall = 0.0
  for _ in range(3):
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(calls):
      out = mm(a, b)
    out.numpy()
    flops = 2.0 * n ** 3 * calls
    best_cpu = max(best_cpu, flops / max(_cpu() - c0, 1e-9))
    best_wall = max(best_wall, flops / (time.perf_counter() - t0))
  return best_cpu, best_wall


def _batches(name, n_batches, seed=0):
  shape, classes = _shape(name)
  rng = np.random.RandomState(seed)
  x = rng.randn(n_batches * FLAGS.batch_size, *shape).astype(np.float32)
  y = rng.randint(0, classes, n_batches * FLAGS.batch_size).astype(np.int32)
  return x, y


class _ClientStep:
  """The project's client step on a dataset of `steps` batches held in memory."""

  def __init__(self, name, steps):
    self.alg = _algorithm(name)
    self.ws = workspace.Workspace(self.alg.model_fn, self.alg.num_models)
    step = self.alg.make_client_step(self.ws)
    if FLAGS.jit:
      step = tf.function(step.python_function, jit_compile=True)
    self.step = step
    x, y = _batches(name, steps)
    self.dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch_size)
    self.broadcast = tf.nest.map_structure(
        tf.constant, self.alg.broadcast(self.alg.initial_server_state(self.alg.initial_weights())))
    self.state = tf.constant(self.alg.initial_client_state(None))

  def __call__(self):
    out = self.step(self.broadcast, self.dataset, self.state)
    return float(out.metrics['loss_sum'].numpy())


class _KerasFloor:
  """Keras train_on_batch of the same model and optimizer: what plain TF does per step."""

  def __init__(self, name, steps):
    tf.keras.utils.set_random_seed(0)
    self.model = _model_fn(name)()
    self.model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                       loss={'logits': tf.keras.losses.SparseCategoricalCrossentropy(
                           from_logits=True)})
    x, y = _batches(name, steps)
    b = FLAGS.batch_size
    self.batches = [(x[i * b:(i + 1) * b], {'logits': y[i * b:(i + 1) * b]}) for i in range(steps)]

  def __call__(self):
    out = None
    for x, y in self.batches:
      out = self.model.train_on_batch(x, y)
    return out


def _timed(fn):
  c0, t0 = _cpu(), time.perf_counter()
  fn()
  return _cpu() - c0, time.perf_counter() - t0


def _machine(load_start):
  flags_cpu = set()
  try:
    with open('/proc/cpuinfo') as f:
      flags_cpu = {w for line in f if line.startswith('flags') for w in line.split()}
  except OSError:
    pass
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  return {'cpus': os.cpu_count(), 'platform': platform.platform(),
          'python': sys.version.split()[0], 'tensorflow': tf.__version__,
          'onednn_enabled': bool(_pywrap_util_port.IsMklEnabled()),
          'TF_ENABLE_ONEDNN_OPTS': os.environ.get('TF_ENABLE_ONEDNN_OPTS'),
          'avx512_vnni': 'avx512_vnni' in flags_cpu, 'avx512_bf16': 'avx512_bf16' in flags_cpu,
          'loadavg_start': list(load_start), 'loadavg_end': list(os.getloadavg())}


def run_step_mode():
  rate_cpu, rate_wall = matmul_rate()
  print(f'matmul rate: {rate_cpu / 1e9:.1f} GFLOP per CPU-s, {rate_wall / 1e9:.1f} GFLOP/s wall '
        f'(load {os.getloadavg()[0]:.2f})', flush=True)
  results = {'matmul_gflop_per_cpu_s': rate_cpu / 1e9, 'matmul_gflop_per_wall_s': rate_wall / 1e9,
             'models': {}}
  lines = []
  for name in FLAGS.models:
    load0 = os.getloadavg()
    variants = {'client_step': _ClientStep(name, FLAGS.steps),
                'tf_floor': _KerasFloor(name, FLAGS.steps)}
    for fn in variants.values():  # tracing
      fn()
    times = {k: [] for k in variants}
    order = list(variants)
    for r in range(FLAGS.repeats):
      for k in order[r % 2:] + order[:r % 2]:
        cpu, wall = _timed(variants[k])
        times[k].append((cpu / FLAGS.steps, wall / FLAGS.steps))
    flops = forward_flops(variants['tf_floor'].model, FLAGS.batch_size)
    limit_cpu, limit_wall = 3 * flops / rate_cpu, 3 * flops / rate_wall
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in times.items()}
    ratio_cpu = statistics.median(a[0] / b[0] for a, b in zip(times['client_step'],
                                                                times['tf_floor']))
    ratio_wall = statistics.median(a[1] / b[1] for a, b in zip(times['client_step'],
                                                                 times['tf_floor']))
    results['models'][name] = {
        'input_shape': list(_shape(name)[0]), 'num_classes': _shape(name)[1],
        'forward_gflop_per_batch': flops / 1e9,
        'compute_limit_cpu_s': limit_cpu, 'compute_limit_wall_s': limit_wall,
        'median_cpu_s_per_step': {k: v[0] for k, v in med.items()},
        'median_wall_s_per_step': {k: v[1] for k, v in med.items()},
        'per_repeat_cpu_wall_s_per_step': times,
        'floor_ratio_cpu': ratio_cpu, 'floor_ratio_wall': ratio_wall,
        'limit_ratio_cpu': med['client_step'][0] / limit_cpu,
        'loadavg_start_end': [load0[0], os.getloadavg()[0]]}
    client, floor = med['client_step'], med['tf_floor']
    line = (f'{name}: client step {client[0]:.3f} CPU-s {client[1]:.3f} wall-s/step; '
            f'TF floor {floor[0]:.3f} CPU-s {floor[1]:.3f} wall-s; '
            f'compute limit {limit_cpu:.3f} CPU-s (x{med["client_step"][0] / limit_cpu:.2f}); '
            f'load {load0[0]:.2f}; wall ratio {ratio_wall:.2f}; floor ratio {ratio_cpu:.2f}')
    lines.append(line)
    print(line, flush=True)
  return results, lines


_REFERENCE_MODEL = {'resnet20': 'resnet20', 'mobilenet_v2_cifar': 'mobilenetv2'}


class _ReferenceStep:
  """The reference's step in a persistent PyTorch process
  (bench/reference/reference_step_worker.py)."""

  def __init__(self, name):
    worker = os.path.join(_common.ROOT, 'bench', 'reference', 'reference_step_worker.py')
    self.proc = subprocess.Popen(
        [FLAGS.torch_python, worker, f'--reference_dir={FLAGS.reference_dir}',
         f'--model={_REFERENCE_MODEL[name]}', f'--batch_size={FLAGS.batch_size}',
         f'--batches={FLAGS.steps}', f'--coef={FLAGS.beta}'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = json.loads(self.proc.stdout.readline())

  def __call__(self, steps):
    self.proc.stdin.write(f'{steps}\n')
    self.proc.stdin.flush()
    out = json.loads(self.proc.stdout.readline())
    return out['cpu_s'], out['wall_s']

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def run_reference_mode():
  missing = [p for p in (FLAGS.torch_python, os.path.join(FLAGS.reference_dir, 'networks'))
             if not os.path.exists(p)]
  if missing:
    raise app.UsageError(f'--mode=reference needs {", ".join(missing)}: see '
                         'bench/reference/reference_main.py for the PyTorch environment and the '
                         'checkout (--torch_python, --reference_dir).')
  unsupported = [m for m in FLAGS.models if m not in _REFERENCE_MODEL]
  if unsupported:
    raise app.UsageError(f'--models: the reference has no {", ".join(unsupported)}; choose from '
                         f'{", ".join(_REFERENCE_MODEL)}.')
  results, lines = {'models': {}}, []
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
  for name in FLAGS.models:
    load0 = os.getloadavg()
    ref = _ReferenceStep(name)
    one, pair = _ClientStep(name, FLAGS.steps), [_ClientStep(name, FLAGS.steps) for _ in range(2)]
    for fn in [one] + pair:  # tracing, in this thread
      fn()
    ref(FLAGS.steps)

    def two_clients():
      for f in [pool.submit(fn) for fn in pair]:
        f.result()

    variants = {'ours_one_client': (lambda: _timed(one), 1),
                'ours_two_clients': (lambda: _timed(two_clients), 2),
                'reference': (lambda: ref(FLAGS.steps), 1)}
    times = {k: [] for k in variants}
    order = list(variants)
    for r in range(FLAGS.repeats):
      for k in order[r % 3:] + order[:r % 3]:
        time.sleep(0.5)  # The other side's threads stop spinning before a block starts.
        fn, clients = variants[k]
        cpu, wall = fn()
        times[k].append((cpu / (clients * FLAGS.steps), wall / (clients * FLAGS.steps)))
    ref.close()
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in times.items()}
    ratios = {k: {'cpu': statistics.median(a[0] / b[0] for a, b in zip(times[k],
                                                                       times['reference'])),
                  'wall': statistics.median(a[1] / b[1] for a, b in zip(times[k],
                                                                        times['reference']))}
              for k in ('ours_one_client', 'ours_two_clients')}
    results['models'][name] = {
        'reference_worker': ref.info, 'median_cpu_s_per_step': {k: v[0] for k, v in med.items()},
        'median_wall_s_per_step': {k: v[1] for k, v in med.items()},
        'per_repeat_cpu_wall_s_per_step': times, 'ratio_to_reference': ratios,
        'loadavg_start_end': [load0[0], os.getloadavg()[0]]}
    line = (f'{name}: reference {med["reference"][0]:.3f} CPU-s {med["reference"][1]:.3f} wall-s '
            f'per step ({ref.info["threads"]} torch threads); ours, one client '
            f'{med["ours_one_client"][0]:.3f} CPU-s {med["ours_one_client"][1]:.3f} wall-s '
            f'(ratio CPU {ratios["ours_one_client"]["cpu"]:.2f}, wall '
            f'{ratios["ours_one_client"]["wall"]:.2f}); two clients at once '
            f'{med["ours_two_clients"][0]:.3f} CPU-s {med["ours_two_clients"][1]:.3f} wall-s a '
            f'step (ratio CPU {ratios["ours_two_clients"]["cpu"]:.2f}, wall '
            f'{ratios["ours_two_clients"]["wall"]:.2f}); load {load0[0]:.2f} -> '
            f'{os.getloadavg()[0]:.2f}')
    lines.append(line)
    print(line, flush=True)
  pool.shutdown()
  return results, lines


def _round_dataset_fn(name, steps):
  shape, classes = _shape(name)
  n = steps * FLAGS.batch_size

  def fn(client_id, seed):
    i = tf.strings.to_number(client_id, tf.int64)
    key = tf.stack([seed, i])
    x = tf.random.stateless_normal([n, *shape], seed=key)
    y = tf.random.stateless_uniform([n], seed=key + 1, maxval=classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch_size)

  return fn


def _shard_dataset_fn(name, steps, root):
  """Clients of `steps` batches of random uint8 images in shard files, through the cifar10 task's
  client dataset (what a training run reads)."""
  from tff_decorr.tasks import client_data  # pylint: disable=g-import-not-at-top
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  task = registry.get('cifar10')
  shape, classes = _shape(name)
  if tuple(shape) != tuple(task.input_shape) or classes != task.num_classes:
    raise app.UsageError(f'--round_data=shards uses the cifar10 task: {name} takes {shape} with '
                         f'{classes} classes; choose a 32x32 model with 10 classes.')
  n = steps * FLAGS.batch_size
  rng = np.random.RandomState(steps)
  images = rng.randint(0, 256, (FLAGS.clients * n, *shape)).astype(np.uint8)
  labels = rng.randint(0, classes, FLAGS.clients * n).astype(np.int64)
  parts = [np.arange(c * n, (c + 1) * n) for c in range(FLAGS.clients)]
  shard_dir = os.path.join(root, f'{name}_{steps}')
  client_data.write_client_shards(images, labels, parts, shard_dir, log=lambda s: None)
  return task.client_dataset_fn(shard_dir, batch_size=FLAGS.batch_size, epochs=1)


def run_round_mode():
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  from tff_decorr.runtimes import tf_runtime  # pylint: disable=g-import-not-at-top
  from tff_decorr.runtimes import tff_runtime  # pylint: disable=g-import-not-at-top
  if 'tff' in FLAGS.runtimes:
    tff_context.install(max_concurrent_computation_calls=FLAGS.max_concurrent_computation_calls)
  results, lines = {'models': {}}, []
  s_long = FLAGS.round_steps
  for name in FLAGS.models:
    load0 = os.getloadavg()
    alg = _algorithm(name)
    runners = {}
    # TFF's computations first: tracing them after the in-process runtime built its Keras models
    # fails in Keras ("invalid state"), as in tests/runtimes_test.py's order.
    shard_root = tempfile.mkdtemp(prefix='step_speed_shards_')
    for rt_name in sorted(FLAGS.runtimes, key=lambda r: r != 'tff'):
      for steps in (1, s_long):
        fn = (_shard_dataset_fn(name, steps, shard_root) if FLAGS.round_data == 'shards'
              else _round_dataset_fn(name, steps))
        rt = (tf_runtime.TfRuntime(alg, fn) if rt_name == 'tf'
              else tff_runtime.TffRuntime(alg, fn))
        runners[(rt_name, steps)] = [rt, rt.initialize(), 0]
    init_state = alg.initial_client_state(alg.initial_weights())

    def one_round(key):
      rt, state, r = runners[key]
      inputs = [(str(c), r * 100 + c) for c in range(FLAGS.clients)]
      c0, t0 = _common.cpu_seconds(), time.perf_counter()
      state, _, _ = rt.run_round(state, inputs, [init_state] * FLAGS.clients)
      runners[key][1:] = [state, r + 1]
      return _common.cpu_seconds() - c0, time.perf_counter() - t0

    first = {f'{k[0]}_{k[1]}': one_round(k) for k in runners}  # tracing round
    times = {k: [] for k in runners}
    keys = list(runners)
    for r in range(FLAGS.repeats):
      for k in keys[r % len(keys):] + keys[:r % len(keys)]:
        times[k].append(one_round(k))
    entry = {'first_round_cpu_wall_s': first, 'loadavg_start_end': [load0[0], 0.0]}
    for rt_name in FLAGS.runtimes:
      fixed, step = [], []
      for (c1, _), (cs, _) in zip(times[(rt_name, 1)], times[(rt_name, s_long)]):
        fixed.append((c1 * s_long - cs) / (s_long - 1) / FLAGS.clients)
        step.append((cs - c1) / (s_long - 1) / FLAGS.clients)
      med = lambda v: statistics.median(v)
      entry[rt_name] = {
          'round_cpu_s_median': {str(s): med(c for c, _ in times[(rt_name, s)])
                                 for s in (1, s_long)},
          'round_wall_s_median': {str(s): med(w for _, w in times[(rt_name, s)])
                                  for s in (1, s_long)},
          'per_round_cpu_wall_s': {str(s): times[(rt_name, s)] for s in (1, s_long)},
          'fixed_cpu_s_per_client_median': med(fixed),
          'step_cpu_s_median': med(step),
          # One epoch of a CIFAR-10 client among 10: 5,000 images, 79 steps of 64.
          'fixed_fraction_of_cifar10_epoch': med(fixed) / (79 * med(step))}
      line = (f'{name} --runtime={rt_name}: round of {FLAGS.clients} clients x {s_long} steps '
              f'{entry[rt_name]["round_cpu_s_median"][str(s_long)]:.2f} CPU-s '
              f'{entry[rt_name]["round_wall_s_median"][str(s_long)]:.2f} wall-s; x 1 step '
              f'{entry[rt_name]["round_cpu_s_median"]["1"]:.2f} CPU-s; per-client fixed cost '
              f'{med(fixed):.3f} CPU-s (step {med(step):.3f} CPU-s; '
              f'{100 * entry[rt_name]["fixed_fraction_of_cifar10_epoch"]:.1f}% of a CIFAR-10 '
              f'client epoch); load {load0[0]:.2f}')
      lines.append(line)
      print(line, flush=True)
    entry['loadavg_start_end'][1] = os.getloadavg()[0]
    results['models'][name] = entry
    shutil.rmtree(shard_root, ignore_errors=True)
  if 'tff' in FLAGS.runtimes:
    tff_context.stop_all()
  return results, lines


def _perturbation_trainer(ws, dataset, config, reg, x_test):
  @tf.function
  def train(start, k):
    client_update.local_train(ws, start, dataset.take(k), config, reg)
    return list(ws.weights), ws.model(x_test, training=False)['logits']
  return train

def run_perturbation_mode():
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  task = registry.get('digits')
  x_tr, y_tr, _ = task.load_split('train', None)
  x_te, _, _ = task.load_split('test', None)
  norm = lambda x: tf.constant((x.astype(np.float32) / 255.0 - 0.5) / 0.5)
  x_tr, x_te, y_tr = norm(x_tr), norm(x_te), tf.constant(y_tr, tf.int32)
  batch, checkpoints = 32, (1, 2, 5, 10, 20, 45, 90, 225)  # 45 steps = one epoch
  dataset = tf.data.Dataset.from_tensor_slices((x_tr, y_tr)).repeat().batch(batch)
  config = algorithms.SGDHParams(lr=0.01, momentum=0.9, weight_decay=1e-5)
  model_fn = lambda: models.build('small_cnn', num_classes=10, input_shape=task.input_shape)
  tf.keras.utils.set_random_seed(3)
  w0 = [v.numpy() for v in model_fn().weights]
  rng = np.random.RandomState(0)
  w1 = [w + FLAGS.perturbation * np.sign(rng.randn(*w.shape)).astype(np.float32) for w in w0]
  results, lines = {'perturbation': FLAGS.perturbation, 'steps': list(checkpoints)}, []
  for reg_name in ('none', 'feddecorr'):
    reg = regularizers.get('feddecorr', beta=0.1) if reg_name == 'feddecorr' else None
    train = _perturbation_trainer(workspace.Workspace(model_fn), dataset, config, reg, x_te)

    rows = []
    for k in checkpoints:
      (wa, la), (wb, lb) = train(w0, tf.constant(k, tf.int64)), train(w1, tf.constant(k, tf.int64))
      dw = max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in zip(wa, wb))
      dl = float(np.max(np.abs(la.numpy() - lb.numpy())))
      rows.append({'steps': k, 'max_abs_logit_diff': dl, 'max_abs_weight_diff': dw})
    results[reg_name] = rows
    line = f'{reg_name}: max |logit diff| after ' + ', '.join(
        f'{r["steps"]} steps {r["max_abs_logit_diff"]:.1e}' for r in rows)
    lines.append(line)
    print(line, flush=True)
  return results, lines


def main(argv):
  del argv
  load_start = os.getloadavg()
  unknown = sorted(set(FLAGS.models) - set(models.names()))
  if unknown:
    raise app.UsageError(f'--models: unknown {", ".join(unknown)}; choose from '
                         f'{", ".join(models.names())}.')
  modes = {'step': run_step_mode, 'round': run_round_mode, 'perturbation': run_perturbation_mode,
           'reference': run_reference_mode}
  results, lines = modes[FLAGS.mode]()
  results.update(
      command=' '.join(['.venv/bin/python -m bench.speed.step_speed'] + sys.argv[1:]),
      settings={k: FLAGS[k].value for k in ('mode', 'models', 'batch_size', 'steps', 'repeats',
                                            'beta', 'jit', 'clients', 'round_steps',
                                            'runtimes', 'max_concurrent_computation_calls',
                                            'reference_dir', 'torch_python', 'round_data',
                                            'precision')},
      summary=lines, machine=_machine(load_start))
  name = 'step_speed' + (f'_{FLAGS.mode}' if FLAGS.mode != 'step' else '')
  name += f'_{FLAGS.suffix}' if FLAGS.suffix else ''
  path = os.path.join(_common.ROOT, 'bench', 'results', name + '.json')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(results, f, indent=2, default=float)
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
