r"""Serves a TFF executor worker (TFF's own C++ `worker_binary`) for remote simulations.

  # on each worker machine: a Unix socket only its owner can use, and no TCP port at all
  python -m bin.worker --socket=$XDG_RUNTIME_DIR/tff/worker.sock
  # on the driver: one SSH tunnel per worker, Unix socket to Unix socket
  ssh -N -L $XDG_RUNTIME_DIR/tff/a.sock:/run/user/1000/tff/worker.sock hostA &
  ssh -N -L $XDG_RUNTIME_DIR/tff/b.sock:/run/user/1000/tff/worker.sock hostB &
  python -m bin.train --workers=unix:$XDG_RUNTIME_DIR/tff/a.sock,unix:$XDG_RUNTIME_DIR/tff/b.sock

With --socket, the worker runs in a user+network namespace of its own (tff_decorr/worker/
netns.py): it has no network, and the socket (mode 0600, in a folder the user owns with mode 0700,
created when missing) is the only way in. TFF's executor service is unauthenticated and runs any
TensorFlow graph it is sent (file reads and writes included), so only its owner may reach it:
other machines reach it through SSH, which authenticates them (docs/remote_workers.md,
docs/security.md). --port serves on 127.0.0.1:<port> instead (the loopback library, for machines
without user namespaces; other local users can connect). --listen_all with --port serves on every
interface, with a warning; use it only on a network where every host that can reach the port is
trusted (or behind a firewall or NetworkPolicy that admits only the driver). In every case the
first line says where the worker listens as the kernel reports it (/proc and the socket file),
and a worker found reachable by others without --listen_all is refused (exit 2).

The worker runs in the foreground until Ctrl-C or SIGTERM; it never outlives this process (it is
killed by the kernel if this process dies). Its output goes to --log (default: a temporary file,
printed at start-up and removed when the worker stops). What crosses the connection: serialized
TFF computations and values (model weights, client ids and seeds, client states); each worker
builds its clients' datasets itself from --cache_dir shards, so the client data directory must be
readable on every worker at the same path. See docs/remote_workers.md.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time

from absl import app
from absl import flags

# The worker_binary inherits this process's environment: oneDNN on unless the user set it.
# Nothing imported here imports TensorFlow: --help and a mistyped flag answer at once;
# cli.parse_flags_or_exit imports TensorFlow once they are parsed.
from tff_decorr import tf_env
from tff_decorr.configs import cli

FLAGS = flags.FLAGS
flags.DEFINE_string('socket', None,
                    'Serve on this Unix socket (mode 0600; its folder is created with mode 0700 '
                    'when missing, and must be owned by you with no access for others), with the '
                    'worker in a network namespace of its own. The way to serve remote drivers '
                    '(over ssh -L, docs/remote_workers.md).')
flags.DEFINE_integer('port', None, 'Serve on this TCP port of 127.0.0.1 instead (the loopback '
                     'library; every local user can connect).')
flags.DEFINE_integer('max_concurrent_computation_calls', -1, 'Concurrent computations (-1: any).')
flags.DEFINE_string('log', None, 'Worker log file (default: a file in the temp dir, printed).')
flags.DEFINE_bool('listen_all', False,
                  'With --port: listen on every network interface instead of 127.0.0.1 only. The '
                  'service is unauthenticated: anyone who can reach the port can run any '
                  'TensorFlow graph as this user. Prefer --socket and an SSH tunnel '
                  '(docs/remote_workers.md).')

LISTEN_ALL_WARNING = (
    'worker: WARNING: --listen_all: port {port} accepts unauthenticated connections on every '
    'interface of this machine; anyone who can reach it can run any TensorFlow graph as this user '
    '(read and write its files). Without --listen_all the worker serves a Unix socket only you can '
    'use, and other machines reach it through an SSH tunnel (docs/remote_workers.md).')


def _error(message: str) -> int:
  print(f'worker: error: {message}', file=sys.stderr, flush=True)
  return 2


def _socket_folder(path: str):
  """Creates the socket's folder (0700) when missing; returns why it cannot be used, or None."""
  folder = os.path.dirname(path)
  try:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.lstat(folder)
  except OSError as e:
    return f'--socket: cannot create its folder {folder}: {e.strerror}'
  if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
    return (f'--socket: its folder {folder} must be a folder you own that others cannot enter '
            f'(mode 0700; it is {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}): '
            f'chmod 700 {folder}, or choose another folder.')
  if os.path.lexists(path):
    return (f'--socket: {path} exists (another worker, or one that was killed): stop that worker '
            'or remove the file.')
  if len(path.encode()) > 107:
    return f'--socket: {path} is longer than a Unix socket path may be (107 bytes).'
  return None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if (FLAGS.socket is None) == (FLAGS.port is None):
    return _error('give one of --socket=PATH (a Unix socket only you can use; the default choice) '
                  'or --port=PORT (127.0.0.1).')
  if FLAGS.listen_all and FLAGS.port is None:
    return _error('--listen_all needs --port: a Unix socket is not on any network interface.')
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
  socket_path = None
  if FLAGS.socket is not None:
    socket_path = os.path.abspath(FLAGS.socket)
    problem = _socket_folder(socket_path)
    if problem:
      return _error(problem)
  else:
    if not 0 < FLAGS.port < 65536:
      return _error(f'--port={FLAGS.port} is not a TCP port (1-65535).')
    if not tff_context.port_is_free(FLAGS.port):
      return _error(f'--port={FLAGS.port} is already in use; choose another port.')
  if FLAGS.listen_all:
    print(LISTEN_ALL_WARNING.format(port=FLAGS.port), file=sys.stderr, flush=True)
  try:
    worker = tff_context.WorkerProcess(
        port=FLAGS.port, socket_path=socket_path,
        max_concurrent_computation_calls=FLAGS.max_concurrent_computation_calls,
        log_path=FLAGS.log, listen_all=FLAGS.listen_all)
  except tff_context.WorkerExposedError as e:
    return _error(str(e))
  except RuntimeError as e:  # Did not start: the message carries its log's last lines.
    print(f'worker: {e}', file=sys.stderr, flush=True)
    return 1
  # Where it listens, read from the kernel now (not inferred from how it was started).
  print(f'TFF worker serving on {worker.listening()} (pid {worker.process.pid}); log: '
        f'{worker.log_path}', flush=True)
  stop = {'now': False}

  def _stop(signum, frame):
    del signum, frame
    stop['now'] = True
  signal.signal(signal.SIGTERM, _stop)
  signal.signal(signal.SIGINT, _stop)
  while not stop['now'] and worker.alive():
    time.sleep(0.2)
  code = worker.process.poll()
  worker.stop()
  if code is not None and not stop['now']:
    print(f'worker: the TFF worker exited with code {code}; see {worker.log_path}',
          file=sys.stderr)
    return 1
  return 0


def entry() -> None:
  """The program, as tff-decorr-worker, `python -m bin.worker` or Bazel runs it."""
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user
  cli.run_program('worker', main, __name__, __doc__)


if __name__ == '__main__':
  entry()
