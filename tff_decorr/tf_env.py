"""TensorFlow's process environment, set before TensorFlow is imported.

Import this module before `import tensorflow` (the binaries in bin/ do so first):

  from tff_decorr import tf_env  # pylint: disable=unused-import

It turns on TensorFlow's oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS=1`) unless the user set the
variable: TF 2.14 enables them by default only on CPUs with AVX512-VNNI, AVX512-BF16 or AMX, and
without them a client step costs more CPU time (docs/benchmarks.md §1, "oneDNN"). The variable is
read once, when TensorFlow starts, so it must be in the environment before the import; TFF's
`worker_binary` (a separate, statically linked TensorFlow) reads it from its own environment, which
`tff_context.WorkerProcess` builds with `worker_environment()`. oneDNN changes float rounding
(docs/benchmarks.md §6). `TF_ENABLE_ONEDNN_OPTS=0` in the environment keeps it off.

It also quiets gRPC's informational lines (`GRPC_VERBOSITY=ERROR` unless set), and the binaries
call `quiet_known_noise()`, which drops a few lines TensorFlow's C++ runtime prints on every run
that say nothing to a user (`KNOWN_NOISE`): the CUDA plugin registrations at import on a machine
without a GPU, grappler's "Failed to detect the fetch node(s)", absl's "before
absl::InitializeLog()" preamble. TensorFlow has no switch for these short of
`TF_CPP_MIN_LOG_LEVEL=3`, which would hide real errors too.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from typing import Mapping, MutableMapping, Optional

ONEDNN_VARIABLE = 'TF_ENABLE_ONEDNN_OPTS'
_DEFAULTS = {ONEDNN_VARIABLE: '1', 'GRPC_VERBOSITY': 'ERROR'}

# Substrings of stderr lines that carry no information for a user (each seen on every run here).
KNOWN_NOISE = (
    'Unable to register cuDNN factory', 'Unable to register cuFFT factory',
    'Unable to register cuBLAS factory', 'Could not find cuda drivers on your machine',
    'TF-TRT Warning: Could not find TensorRT', 'Failed to detect the fetch node(s)',
    'All log messages before absl::InitializeLog() is called are written to STDERR',
    'skipping fork() handlers',
)

# Runs in its own process: copies stdin to stdout line by line without the known noise, flushing
# a partial line (a prompt, a progress bar) when nothing more arrives for 0.1 s.
_FILTER = r'''
import os, select, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # it ends when its input does
  signal.signal(sig, signal.SIG_IGN)
noise = [n.encode() for n in sys.argv[1:]]
out = sys.stdout.fileno()
pending = b''
def emit(data):
  while data:
    data = data[os.write(out, data):]
while True:
  ready, _, _ = select.select([0], [], [], 0.1 if pending else None)
  if not ready:
    emit(pending)
    pending = b''
    continue
  chunk = os.read(0, 65536)
  if not chunk:
    emit(pending)
    break
  pending += chunk
  *lines, pending = pending.split(b'\n')
  emit(b''.join(l + b'\n' for l in lines if not any(n in l for n in noise)))
'''
_filter_process = None


def configure(environ: Optional[MutableMapping[str, str]] = None) -> None:
  """Adds the project's defaults to `environ`, keeping every variable the user set.

  Args:
    environ: the environment to complete in place; None: this process's (`os.environ`).
  """
  environ = os.environ if environ is None else environ
  for name, value in _DEFAULTS.items():
    environ.setdefault(name, value)


def worker_environment(base: Optional[Mapping[str, str]] = None) -> dict:
  """The environment for a child process (TFF's worker): `base` plus the project's defaults.

  Args:
    base: the environment to start from (not modified); None: this process's.

  Returns:
    A new dict: `base`'s variables, and each default `base` does not set.
  """
  env = dict(os.environ if base is None else base)
  configure(env)
  return env


def quiet_known_noise() -> None:
  """Routes this process's stderr (file descriptor 2, so the C++ runtime's lines too) through a
  small filter process that drops the KNOWN_NOISE lines and passes everything else on unchanged,
  and sets TensorFlow's C++ log level to errors only (TF_CPP_MIN_LOG_LEVEL=2) unless it is set.
  The filter outlives a crash of this process long enough to pass on what was written before it
  (it ends when the last writer closes the pipe). For binaries only: call it before TensorFlow is
  imported. Does nothing when TFF_DECORR_NOISE=1 is set (to see every line)."""
  global _filter_process
  if _filter_process is not None or os.environ.get('TFF_DECORR_NOISE') == '1':
    return
  # TF's C++ INFO and WARNING lines at start-up (oneDNN is on, the CPU's instructions, ...) go
  # too, in every program alike; errors stay. A level the user set is kept.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.stderr.flush()
  read_end, write_end = os.pipe()
  _filter_process = subprocess.Popen(
      [sys.executable, '-S', '-c', _FILTER, *KNOWN_NOISE], stdin=read_end, stdout=2,
      # Its own session: a Ctrl-C or a signal to our process group must not end it before us
      # (our last words, e.g. "interrupted after round 3", go through it).
      stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
  os.close(read_end)
  os.dup2(write_end, 2)
  os.close(write_end)
  atexit.register(_drain)


def _drain() -> None:
  """At exit: close this process's end of the pipe and wait (briefly) for the filter to pass on
  the last lines, so that they come before the shell's prompt. What the interpreter writes while
  it finalises after this goes nowhere (TFF's ignored __del__ exceptions, for one)."""
  try:
    sys.stderr.flush()
  except (OSError, ValueError):
    pass
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)
  try:
    _filter_process.wait(timeout=2)
  except subprocess.TimeoutExpired:
    pass  # A child process still holds the pipe; the filter ends with it.


configure()
