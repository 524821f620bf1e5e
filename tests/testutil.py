"""Helpers shared by the tests: where the repository and the shared test data are, a class's
temporary folder (ClassTempDir), an isolated privacy ledger (isolated_data_home), worker processes to connect to."""

import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from unittest import mock

import psutil

# Resolve through Bazel's runfiles symlinks to the source tree.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
PYTHON = os.path.join(REPO_ROOT, '.venv', 'bin', 'python')


class ClassTempDir:
  """A TestCase mixin: `cls.tmp`, a folder made before the class's tests and removed after them
  (also when setUpClass fails or skips after it). Listed before the TestCase:
  `class FooTest(testutil.ClassTempDir, absltest.TestCase)`."""

  tmp: str

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix=f'{cls.__name__}_')
    cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)


def isolated_data_home(folder: str, add_cleanup) -> str:
  """Points XDG_DATA_HOME, where the privacy ledger lives (run_files/privacy_ledger), at `folder`
  until the cleanups of `add_cleanup` (a TestCase's addCleanup, or addClassCleanup) run: the DP
  tests' ledgers stay out of the user's data folder and out of each other's. Returns `folder`."""
  patcher = mock.patch.dict(os.environ, {'XDG_DATA_HOME': folder})
  patcher.start()
  add_cleanup(patcher.stop)
  return folder


def shared_tfds_dir() -> str | None:
  """`../shared/data/tfds` beside the repository, or None when it is absent."""
  path = os.path.join(os.path.dirname(REPO_ROOT), 'shared', 'data', 'tfds')
  return path if os.path.isdir(os.path.join(path, 'cifar10')) else None


def python() -> str:
  """The project's venv Python where it exists (as `make test` has it), else this one."""
  return PYTHON if os.path.exists(PYTHON) else sys.executable


# A federated computation small enough to check a worker connection with: `total([1, 2, 3])`
# is 9 (program text, for a subprocess that has installed its TFF context first).
FEDERATED_TOTAL = [
    '@tff.tensorflow.computation(np.int32)',
    'def add_one(x):',
    '  return x + 1',
    '@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))',
    'def total(xs):',
    '  return tff.federated_sum(tff.federated_map(add_one, xs))',
]


def start_socket_worker(socket_path: str, log: str) -> subprocess.Popen:
  """`bin.worker --socket=socket_path` (in its own network namespace, behind a 0600 Unix socket),
  returned once it says it serves; its first line is kept as `.first_line`."""
  proc = subprocess.Popen([python(), '-m', 'bin.worker', f'--socket={socket_path}', f'--log={log}'],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
  line = proc.stdout.readline()  # Printed once the worker listens, as the kernel says.
  if 'serving on' not in line:
    proc.kill()
    raise AssertionError(f'bin.worker did not start: {line!r}; see {log}')
  proc.first_line = line
  return proc


# The line tools/count_skips.py allows a skip by (tests/count_skips_test.py: the same string).
ALLOWED_SKIP_MARK = 'count_skips: allowed skip:'


def skip_without_gpu(test, what: str) -> None:
  """Skips `test` when TensorFlow sees no GPU: the one skip reason no machine of the project can
  meet (they have none). It prints ALLOWED_SKIP_MARK first, for `make test`'s skip count
  (tools/count_skips.py), which fails on any other skip. `what`: what the test needs a GPU for."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.config.list_physical_devices('GPU'):
    return
  reason = f'needs a GPU ({what}); TensorFlow sees none'
  name = test._testMethodName  # pylint: disable=protected-access
  print(f'{ALLOWED_SKIP_MARK} {type(test).__name__}.{name}: {reason}', file=sys.stderr,
        flush=True)
  test.skipTest(reason)


def run_module(module: str, *args: str, timeout: float = 600, env=None):
  """Runs `python -m module args...` from the repository root, as a user would."""
  python = PYTHON if os.path.exists(PYTHON) else sys.executable
  full_env = dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([python, '-m', module, *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=timeout, env=full_env)


def check(proc, what: str):
  """`proc` (a finished subprocess.run), or an AssertionError with its exit code and output."""
  if proc.returncode != 0:
    raise AssertionError(f'{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n'
                         f'{proc.stderr[-3000:]}')
  return proc


def worker_binaries() -> list[str]:
  """Command lines of running TFF worker processes (for leak checks)."""
  out = subprocess.run(['pgrep', '-af', 'worker_binary'], capture_output=True, text=True)
  return [l for l in out.stdout.splitlines() if 'pgrep' not in l]


def processes_holding(path: str) -> list[int]:
  """PIDs of processes that have `path` open (e.g. a TFF worker writing a run's worker log)."""
  target = os.path.realpath(path)
  pids = []
  for pid in os.listdir('/proc'):
    if not pid.isdigit():
      continue
    fd_dir = f'/proc/{pid}/fd'
    try:
      for fd in os.listdir(fd_dir):
        if os.path.realpath(os.path.join(fd_dir, fd)) == target:
          pids.append(int(pid))
          break
    except OSError:
      continue
  return pids


def listening(pid: int, timeout: float = 15.0) -> list[tuple[str, int]]:
  """(address, port) of the TCP sockets process `pid` listens on, read by psutil from /proc (not
  by the project's own reader); waits up to `timeout` s for the first one."""
  deadline = time.monotonic() + timeout
  while True:
    found = [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind='tcp')
             if c.status == psutil.CONN_LISTEN]
    if found or time.monotonic() > deadline:
      return found
    time.sleep(0.1)


def loopback(host: str) -> bool:
  """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1)."""
  address = ipaddress.ip_address(host)
  mapped = getattr(address, 'ipv4_mapped', None)
  return (mapped or address).is_loopback


def dp_epsilon_reference(releases, delta: float) -> float:
  """epsilon of Gaussian releases on uniformly subsampled clients, without replacement, under
  replace-one neighbours, written here from the papers, independently of dp_accounting:

  - RDP of one release at integer order a (Wang, Balle & Kasiviswanathan, "Subsampled Renyi
    Differential Privacy and Analytical Moments Accountant", AISTATS 2019, Theorem 9) with the
    Gaussian's eps(j) = j / (2 s^2) and eps(inf) = inf:
    (1/(a-1)) log(1 + g^2 C(a,2) min(4 (e^eps(2) - 1), 2 e^eps(2))
                  + sum_{j=3..a} g^j C(a,j) 2 e^((j-1) eps(j))),  g = m / N;
    at a fractional order, the linear interpolation of (a-1) RDP(a) between the neighbouring
    integers (their Corollary 10);
  - s = z / 2: the sum of clipped updates has replace-one sensitivity 2C and noise z C;
  - releases compose by adding RDP; (epsilon, delta) by Canonne, Kamath & Steinke 2020
    (Proposition 12 of arXiv 2004.00010): eps = RDP + log(1 - 1/a) - log(delta a) / (a - 1),
    minimised over the orders 1.1..10.9 (step 0.1), 11..63, 128, 256, 512, 1024.

  `releases`: (noise_multiplier z, clients_per_round m, num_clients N, count). Theorem 9 is at
  least the strengthened bound dp_accounting uses for the Gaussian (their Theorem 27), so this is
  an upper bound of a correct implementation's value, and equal to it where that refinement does
  not bind (large epsilon).
  """
  from scipy import special  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  def log_comb(n, k):
    return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)

  def cgf(g, s, a):  # (a - 1) * RDP(a) at an integer order a >= 1, 0 < g < 1
    if a == 1:
      return 0.0
    e2 = 1.0 / (s * s)
    terms = [0.0, 2 * np.log(g) + log_comb(a, 2) + min(np.log(4) + np.log(np.expm1(e2)),
                                                       np.log(2) + e2)]
    for j in range(3, a + 1):
      terms.append(j * np.log(g) + log_comb(a, j) + np.log(2) + (j - 1) * j / (2 * s * s))
    return float(special.logsumexp(terms))

  orders = [1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]
  best = np.inf
  for a in orders:
    rdp = 0.0
    for z, m, n, count in releases:
      g, s = m / n, z / 2.0
      if g == 1.0:  # every client every round: the plain Gaussian mechanism, RDP a / (2 s^2)
        rdp += count * a / (2 * s * s)
        continue
      lo, hi = int(np.floor(a)), int(np.ceil(a))
      t = a - lo
      rdp += count * ((1 - t) * cgf(g, s, lo) + t * cgf(g, s, hi)) / (a - 1)
    if a > 1.01:
      best = min(best, rdp + np.log1p(-1 / a) - np.log(delta * a) / (a - 1))
  return max(0.0, best)


def hparams_events(logdir: str) -> dict:
  """What the event files directly in `logdir` hold for TensorBoard's HParams dashboard, parsed
  from the hparams plugin's protobuf content (not through tff_decorr):
  {'session_start': [SessionStartInfo, ...], 'experiment': [Experiment, ...],
   'scalars': {tag: [(step, value), ...]}}."""
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  out = {'session_start': [], 'experiment': [], 'scalars': {}}
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        plugin = value.metadata.plugin_data
        if plugin.plugin_name == 'hparams':
          data = plugin_data_pb2.HParamsPluginData.FromString(plugin.content)
          if data.HasField('session_start_info'):
            out['session_start'].append(data.session_start_info)
          if data.HasField('experiment'):
            out['experiment'].append(data.experiment)
        elif value.HasField('tensor'):
          out['scalars'].setdefault(value.tag, []).append(
              (event.step, float(tf.make_ndarray(value.tensor))))
  return out


def hparam_value(value) -> object:
  """A google.protobuf.Value of the hparams plugin as Python (bool, number or string)."""
  kind = value.WhichOneof('kind')
  return {'bool_value': value.bool_value, 'number_value': value.number_value,
          'string_value': value.string_value}.get(kind)


# ---- The PyTorch reference's fixtures (tests/testdata/reference, made by bench/) ----
def fingerprint(name: str, array):
  """As bench/reference/reference_fixtures.py: (sum, sum of squares, dot with a name-seeded
  vector)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  a = np.asarray(array, np.float64).ravel()
  seed = int.from_bytes(name.encode()[:8].ljust(8, b'\0'), 'little') ^ a.size
  r = np.random.default_rng(seed).standard_normal(a.size)
  return np.array([a.sum(), (a * a).sum(), (a * r).sum()])


def reference_schedule(fx):
  """(party list: the clients sampled in each round, local epochs) of a fixture of
  bench/reference/reference_fixtures_algorithms.py: its `participation` where it has one (the
  partial runs), else every client in every round."""
  import json  # pylint: disable=g-import-not-at-top
  settings = json.loads(str(fx['settings']))
  if 'participation' in fx:
    participation = json.loads(str(fx['participation']))
  else:
    participation = [list(range(len(settings['client_sizes'])))] * settings['rounds']
  return participation, settings['epochs']


def normalise(images_uint8, dtype):
  """ToTensor + Normalize as the reference computes them (float32: its CIFAR-10 mean and std,
  dataset_utils.get_dataloader, written out here), then cast."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  mean = np.array([125.3, 123.0, 113.9], np.float32) / 255.0
  std = np.array([63.0, 62.1, 66.7], np.float32) / 255.0
  return ((images_uint8.astype(np.float32) / 255.0 - mean) / std).astype(dtype)


def relative_difference(a, b, floor: float = 1e-6) -> float:
  """Largest difference relative to the largest reference value (or `floor` if that is ~0)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor))


class Float64Scope:
  """Builds Keras models in float64 inside the block."""

  def __enter__(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._old = tf.keras.backend.floatx()
    tf.keras.backend.set_floatx('float64')

  def __exit__(self, *exc):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.keras.backend.set_floatx(self._old)


@contextlib.contextmanager
def torch_batch_norm_statistics():
  """Inside the block, Keras' non-fused BatchNormalization (the float64 models' path) updates its
  moving statistics as PyTorch does: the moving variance with the unbiased batch variance
  (x m/(m-1), m values per channel; Keras' non-fused kernel takes the biased one, its float32
  fused kernel the unbiased one), and the decay 1 - momentum formed in the variable's dtype (Keras
  forms it in float32: 0.1 + 1.5e-9). The layer's output, normalised with the biased variance on
  both sides, is unchanged. For tests that compare a float64 model's running statistics with
  PyTorch's closely; the models must be traced inside the block. Patches two private methods of
  Keras 2.14's BatchNormalizationBase (restored on exit)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top,protected-access
  from keras.src.layers.normalization import batch_normalization
  cls = batch_normalization.BatchNormalizationBase
  moments, assign = cls._moments, cls._assign_moving_average

  def counted_moments(layer, inputs, reduction_axes, keep_dims, mask=None):
    layer._values_per_channel = tf.reduce_prod(
        tf.gather(tf.shape(inputs), reduction_axes))
    return moments(layer, inputs, reduction_axes, keep_dims, mask=mask)

  def torch_moving_average(layer, variable, value, momentum, inputs_size):
    if layer.fused:  # The fused kernel's variance is unbiased already.
      return assign(layer, variable, value, momentum, inputs_size)
    dtype = variable.dtype.base_dtype
    value = tf.cast(value, dtype)
    if variable is layer.moving_variance:
      m = tf.cast(layer._values_per_channel, dtype)
      value = value * m / (m - 1)
    # A Python float straight to the variable's dtype (not through float32).
    momentum = tf.cast(momentum, dtype) if tf.is_tensor(momentum) else tf.constant(momentum, dtype)
    delta = (variable - value) * (1 - momentum)
    if inputs_size is not None:
      delta = tf.where(inputs_size > 0, delta, tf.zeros_like(delta))
    return variable.assign_sub(delta)

  cls._moments, cls._assign_moving_average = counted_moments, torch_moving_average
  try:
    yield
  finally:
    cls._moments, cls._assign_moving_average = moments, assign
  # pylint: enable=g-import-not-at-top,protected-access


def resnet20_f64(state):
  """A float64 ResNet20 holding a PyTorch state_dict (the reference tests' starting model)."""
  from tff_decorr import models  # pylint: disable=g-import-not-at-top  (testutil stays light)
  from tff_decorr.models import torch_import  # pylint: disable=g-import-not-at-top
  with Float64Scope():
    m = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3))
  torch_import.assign_torch_state(m, state)
  return m


def namespaces_available() -> bool:
  """Whether this user can make a user+network namespace (`unshare --user --net`)."""
  try:
    return subprocess.run(['unshare', '--user', '--net', '--map-root-user', 'true'],
                          capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def in_own_network(argv: list[str]) -> list[str]:
  """`argv` run in a user+network namespace of its own, its loopback up: for a test that opens a
  socket on every interface, which then exist only inside that namespace."""
  up = ('import importlib.util, os, sys; '
        'spec = importlib.util.spec_from_file_location("netns_bridge", sys.argv[1]); '
        'bridge = importlib.util.module_from_spec(spec); spec.loader.exec_module(bridge); '
        'bridge.loopback_up(); os.execvp(sys.argv[2], sys.argv[2:])')
  python = PYTHON if os.path.exists(PYTHON) else sys.executable
  bridge = os.path.join(REPO_ROOT, 'tff_decorr', 'worker', 'netns_bridge.py')
  return ['unshare', '--user', '--net', '--map-root-user', python, '-c', up, bridge, *argv]


def socket_mode_and_owner(path: str) -> tuple[bool, int, int]:
  """(is a socket, permission bits, owner uid) of `path`, from the kernel (lstat)."""
  import stat  # pylint: disable=g-import-not-at-top
  st = os.lstat(path)
  return stat.S_ISSOCK(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid


def listening_in_its_namespace(pid: int) -> list[tuple[str, int]]:
  """(address, port) of the TCP sockets process `pid` listens on, read from its own network
  namespace's tables (/proc/<pid>/net/tcp{,6}; psutil reads this process's namespace's)."""
  inodes = set()
  for fd in os.listdir(f'/proc/{pid}/fd'):
    try:
      target = os.readlink(f'/proc/{pid}/fd/{fd}')
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(target[8:-1])
  found = []
  for table in ('tcp', 'tcp6'):
    with open(f'/proc/{pid}/net/{table}') as f:
      for row in f.read().splitlines()[1:]:
        fields = row.split()
        if fields[3] != '0A' or fields[9] not in inodes:
          continue
        host_hex, port_hex = fields[1].split(':')
        raw = bytes.fromhex(host_hex)
        host = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        found.append((str(ipaddress.ip_address(host)), int(port_hex, 16)))
  return found
