r"""Round time of the tff.learning path (tff_decorr.runtimes.learning.build_process, a
LearningProcess) and of each tff.aggregators aggregator, relative to today's TFF runtime
(runtimes/tff_runtime.py).

Every variant is FedAvg + FedDecorr on the same task, model, partition, seed and clients, all in
this one process and under the one TFF context (the project's worker_binary), rounds alternating
between the variants:

  runtime              BASELINE: the project's TFF runtime (bench._common.Runner, --runtime=tff)
  process_mean         build_process('fedavg', ...) with its default aggregator, the weighted
                       tff.aggregators.MeanFactory()
  process_robust       model_aggregator=tff.learning.robust_aggregator() (zeroing + clipping)
  process_compression  the composition of tff.learning.compression_aggregator() with its size
                       threshold as a setting (--compression_threshold, default 1000 here: TFF's
                       20,000 would quantise no tensor of small_cnn)
  process_secure       tff.learning.secure_aggregator() (the project's context runs secure sums as
                       plain sums; what is timed is the aggregator's extra work, not a protocol)
  process_dp           tff_decorr.runtimes.learning.dp_aggregator(...) (epsilon accounting
                       included); by default a FIXED clip (--dp_clip=1.0,
                       DifferentiallyPrivateFactory.gaussian_fixed) with
                       --dp_noise_multiplier=1.0, so any --num_clients works:
                       TFF's adaptive clipping (--dp_clip=0) refuses a noise multiplier of
                       0.1 x clients_per_round or more (1.0 with 10 clients). DP averages clients
                       uniformly (an unweighted mean); the cost, not the model, is compared.
  runtime_<aggregator> the same four aggregators as bin/train runs them: --aggregator=robust,
                       compression, secure, dp in the project's TFF runtime (bench._common.Runner
                       over config.make(aggregator=...)), with the settings above

Each round samples clients with tff_decorr.program.round_loop.sample_clients, so every variant
trains the same clients on the same shards in the same round (the LearningProcess keys each client's
shuffle on its own stateless function of (seed, round, client id), so the order of examples inside a
client may differ from the runtime's; the amount of work does not). The first round of each variant
(tracing, compiling, loading into the worker) is reported separately and excluded. Then, per repeat,
each variant's round time is divided by the `runtime` round of the same repeat (measured back to
back), for wall time and for CPU time (this process plus its worker_binary child), and the ratios
are reported as min / median / max over the repeats (bench/_common.py explains why the CPU ratio is
the steadier one on a shared machine).

Bytes sent per round by all sampled clients are recorded too: for the process variants from the
process's metrics, `aggregator/bytes_up` (what the aggregator's wire format sends, from TFF's own
type signatures) and `aggregator/bytes_up_float32` (the same update as plain float32); for
`runtime`, its own `bytes_up` metric (the contribution as float32).

  .venv/bin/python -m bench.speed.learning_overhead             # CPU scale: digits, 10 clients
  .venv/bin/python -m bench.speed.learning_overhead --repeats=15 --variants=process_mean,process_dp
  .venv/bin/python -m bench.speed.learning_overhead --task=cifar10 --data_dir=DIR  # small_cnn

CPU scale (default): the embedded digits task (no download) with its default model (small_cnn) and
settings, 10 clients all sampled every round, 1 local epoch. --task=cifar10 reads CIFAR-10 from
--data_dir (default: the shared TFDS directory beside the repository) and trains small_cnn.
Writes bench/results/learning_overhead_<task>.json (--output_name to change it).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags
import numpy as np

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# TensorFlow at import time, before absl runs main: imported inside main, Keras functional models
# fail to build ("'SymbolicTensor' object has no attribute 'node'", Keras 2.14).
import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import

from bench import _common  # pylint: disable=g-import-not-at-top

BASELINE = 'runtime'
AGGREGATORS = ('robust', 'compression', 'secure', 'dp')
VARIANTS = ((BASELINE, 'process_mean') + tuple(f'process_{a}' for a in AGGREGATORS)
            + tuple(f'runtime_{a}' for a in AGGREGATORS))

FLAGS = flags.FLAGS
flags.DEFINE_enum('task', 'digits', ['digits', 'cifar10'],
                  'digits: embedded, its default model; cifar10: from --data_dir, small_cnn.')
flags.DEFINE_string('data_dir', _common.DEFAULT_DATA_DIR, 'TFDS data dir holding cifar10.')
flags.DEFINE_integer('num_clients', 10, 'Clients (all sampled every round).')
flags.DEFINE_integer('repeats', 5, 'Timed rounds per variant after the untimed first round.')
flags.DEFINE_list('variants', list(VARIANTS),
                  f'Variants to time ({BASELINE}, the baseline, is always included).')
flags.DEFINE_float('dp_noise_multiplier', 1.0, 'Noise multiplier of process_dp.')
flags.DEFINE_float('dp_clip', 1.0, 'Fixed L2 clip of process_dp; 0: TFF\'s adaptive clipping '
                   '(needs --dp_noise_multiplier < 0.1 x --num_clients).')
flags.DEFINE_integer('compression_threshold', 1000, 'Tensors with more values than this are '
                     'quantised to 8 bits by the compression variants (TFF default 20000: no '
                     'tensor of small_cnn is that large).')
flags.DEFINE_string('output_name', '', 'Name of the JSON in bench/results (default '
                    'learning_overhead_<task>).')


def config(aggregator: str = 'mean'):
  """The configuration every variant shares (the process variants reuse the baseline's
  Experiment; runtime_<aggregator> is bin/train's --aggregator=<aggregator>)."""
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  digits = FLAGS.task == 'digits'
  settings = {}
  if aggregator == 'dp':
    settings = dict(dp_noise_multiplier=FLAGS.dp_noise_multiplier, dp_clip=FLAGS.dp_clip)
  elif aggregator == 'compression':
    settings = dict(compression_threshold=FLAGS.compression_threshold)
  return config_lib.make(aggregator=aggregator, **settings,
      task=FLAGS.task, data_dir='' if digits else os.path.abspath(FLAGS.data_dir),
      model='' if digits else 'small_cnn', runtime='tff', algorithm='fedavg',
      regularizer='feddecorr', local_epochs=1, num_clients=FLAGS.num_clients,
      clients_per_round=FLAGS.num_clients, rounds=FLAGS.repeats + 1, seed=0,
      cache_dir=_common.cache_dir())


def aggregator(name: str, num_clients: int):
  """The tff.aggregators factory of process variant `name` (None: build_process's default)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_decorr.runtimes import learning  # pylint: disable=g-import-not-at-top
  if name == 'process_mean':
    return None
  if name == 'process_robust':
    return tff.learning.robust_aggregator()
  if name == 'process_compression':  # compression_aggregator() with the threshold as a setting
    from tff_decorr import aggregators  # pylint: disable=g-import-not-at-top
    return aggregators.build('compression', aggregators.CompressionHParams(
        threshold=FLAGS.compression_threshold), aggregators.RunShape(num_clients, num_clients, 1))
  if name == 'process_secure':
    return tff.learning.secure_aggregator()
  if name == 'process_dp':
    return learning.dp_aggregator(FLAGS.dp_noise_multiplier, clients_per_round=num_clients,
                                  num_clients=num_clients, clip=FLAGS.dp_clip or None)
  raise ValueError(f'no aggregator for variant {name!r}')


def _plain(value):
  """Metrics as JSON values (TFF returns numpy scalars in nested mappings)."""
  if isinstance(value, dict) or hasattr(value, 'items'):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  try:
    return np.asarray(value).tolist()
  except (TypeError, ValueError):
    return str(value)


class RuntimeRunner(_common.Runner):
  """The baseline and the runtime_* variants: _common.Runner, plus the bytes of its last round."""

  def bytes_per_round(self) -> dict:
    up = float(self.metrics['bytes_up'])
    return {'bytes_up': up, 'bytes_up_float32': float(self.metrics.get('bytes_up_float32', up))}


class ProcessRunner:
  """One LearningProcess variant, with _common.Runner's `step()` contract so _common.alternate,
  summarize and report take it unchanged.

  Built from the baseline's Experiment (same model, initial weights, SGDHParams, regulariser,
  client shards, seed) and run in the TFF context the baseline's runtime installed: process.next
  called directly needs the synchronous context, not learning.install_program_context's."""

  def __init__(self, base: RuntimeRunner, model_aggregator):
    from tff_decorr.runtimes import learning  # pylint: disable=g-import-not-at-top
    from tff_decorr.program import round_loop  # pylint: disable=g-import-not-at-top
    exp = base.exp
    c = exp.config
    self.config = c
    self.process = learning.build_process(
        'fedavg', exp.model_fn, exp.client_dataset_fn, optimizer=exp.algorithm.optimizer,
        regularizer=exp.regularizer, client_ids=[str(i) for i in range(c.num_clients)],
        model_aggregator=model_aggregator, seed=c.seed,
        initial_weights=exp.algorithm.initial_weights())
    self.state = self.process.initialize()
    self.metrics = None
    self.round = 0
    self._round_loop = round_loop

  def step(self):
    """Runs one round; returns (wall seconds, CPU seconds) of it."""
    c = self.config
    ids = self._round_loop.sample_clients(c.num_clients, c.clients_per_round, c.seed,
                                          self.round + 1)
    client_ids = [str(i) for i in ids]
    self.round += 1
    c0 = _common.cpu_seconds()
    t0 = time.perf_counter()
    out = self.process.next(self.state, client_ids)
    elapsed = time.perf_counter() - t0
    cpu = _common.cpu_seconds() - c0
    self.state, self.metrics = out.state, out.metrics
    return elapsed, cpu

  def bytes_per_round(self) -> dict:
    agg = self.metrics['aggregator']
    return {'bytes_up': float(agg['bytes_up']),
            'bytes_up_float32': float(agg['bytes_up_float32']),
            'measurements': _plain(agg['measurements'])}


def bytes_table(bytes_up: dict) -> str:
  lines = ['| variant | bytes up per round (all clients) | as float32 | ratio |',
           '| --- | --- | --- | --- |']
  for name, b in bytes_up.items():
    lines.append(f'| {name} | {b["bytes_up"]:,.0f} | {b["bytes_up_float32"]:,.0f} | '
                 f'{b["bytes_up"] / b["bytes_up_float32"]:.3f} |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  _common.check_flags(FLAGS.variants, VARIANTS, FLAGS.repeats)
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  machine = _common.machine()
  names = [BASELINE] + [v for v in VARIANTS if v in FLAGS.variants and v != BASELINE]
  # The baseline first: its Experiment installs the TFF context (and starts the worker) that the
  # process variants then run in, and its data shards are theirs.
  base = RuntimeRunner(config())
  runners = {BASELINE: base}
  for name in names[1:]:
    if name.startswith('runtime_'):
      runners[name] = RuntimeRunner(config(name[len('runtime_'):]))
    else:
      runners[name] = ProcessRunner(base, aggregator(name, base.exp.config.num_clients))
  first, wall, cpu = _common.alternate(runners, FLAGS.repeats)
  summary = _common.summarize(wall, BASELINE)
  cpu_summary = _common.summarize(cpu, BASELINE)
  bytes_up = {n: r.bytes_per_round() for n, r in runners.items()}
  c = base.exp.config
  examples = sum(len(p) for p in base.exp.partition)
  report = {'bench': 'learning_overhead', 'task': c.task, 'model': base.exp.model_name,
            'algorithm': c.algorithm, 'regularizer': c.regularizer,
            'hparams': c.to_dict()['hparams'],
            'num_clients': c.num_clients, 'clients_per_round': c.clients_per_round,
            'local_epochs': c.local_epochs, 'batch_size': c.batch_size,
            'train_examples': examples, 'repeats': FLAGS.repeats, 'variants': names,
            'dp': {'noise_multiplier': FLAGS.dp_noise_multiplier,
                   'clip': FLAGS.dp_clip or 'adaptive'},
            'machine': machine, 'first_round_s': first, 'results': summary,
            'results_cpu': cpu_summary, 'bytes_per_round': bytes_up}
  # Every worker_binary this process started (the other ones on the machine are not ours).
  import psutil  # pylint: disable=g-import-not-at-top
  children = {p.pid for p in psutil.Process().children(recursive=True)}
  ours = set(tff_context.worker_pids()) | (children & _common.worker_pids())
  del runners, base
  _common.report(FLAGS.output_name or f'learning_overhead_{c.task}', report,
                 f'learning_overhead ({c.task}, {report["model"]}, FedAvg + FedDecorr, '
                 f'{c.local_epochs} local epoch(s), {c.num_clients} clients x {examples} examples '
                 f'in all); {FLAGS.repeats} timed rounds each, alternating', BASELINE,
                 extra=bytes_table(bytes_up))
  tff_context.stop_all()
  left = ours & _common.worker_pids()
  print(f'worker_binary processes of this benchmark: {sorted(ours) or "none"}; still running '
        f'after stop_all: {sorted(left) or "none"}')
  if left:
    sys.exit('worker_binary left behind: ' + ', '.join(map(str, sorted(left))))


if __name__ == '__main__':
  app.run(main)
