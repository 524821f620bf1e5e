"""Helpers shared by the tests: where the repository and the shared test data are."""

import os
import subprocess
import sys

# Resolve through Bazel's runfiles symlinks to the source tree.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
PYTHON = os.path.join(REPO_ROOT, '.venv', 'bin', 'python')


def shared_tfds_dir() -> str | None:
  """`../shared/data/tfds` beside the repository, or None when it is absent."""
  path = os.path.join(os.path.dirname(REPO_ROOT), 'shared', 'data', 'tfds')
  return path if os.path.isdir(os.path.join(path, 'cifar10')) else None


def run_module(module: str, *args: str, timeout: float = 600, env=None):
  """Runs `python -m module args...` from the repository root, as a user would."""
  python = PYTHON if os.path.exists(PYTHON) else sys.executable
  full_env = dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([python, '-m', module, *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=timeout, env=full_env)


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
