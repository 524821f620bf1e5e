r"""Serves a TFF executor worker (TFF's own C++ `worker_binary`) on a port, for remote simulations.

  bazel run //bin:worker -- --port=8000          # on each worker machine: 127.0.0.1:8000 only
  ssh -N -L 8001:127.0.0.1:8000 hostA &          # on the driver: one SSH tunnel per worker
  ssh -N -L 8002:127.0.0.1:8000 hostB &
  bazel run //bin:train -- --workers=127.0.0.1:8001,127.0.0.1:8002 ...

The worker listens on loopback only: TFF's executor service is unauthenticated and runs any
TensorFlow graph it is sent (file reads and writes included), so other machines reach it through
an authenticated channel such as the SSH tunnels above (docs/remote_workers.md, docs/security.md).
--listen_all serves on every interface instead, with a warning; use it only on a network where
every host that can reach the port is trusted (or behind a firewall or NetworkPolicy that admits
only the driver).

The worker runs in the foreground until Ctrl-C or SIGTERM; it never outlives this process (it is
killed by the kernel if this process dies). Its output goes to --log (default: a temporary file,
printed at start-up and removed when the worker stops). What crosses the network: serialized TFF
computations and values (model weights, client ids and seeds, client states); each worker builds
its clients' datasets itself from --cache_dir shards, so the client data directory must be readable
on every worker at the same path. See docs/remote_workers.md.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from absl import app
from absl import flags

# The worker_binary inherits this process's environment: oneDNN on unless the user set it.
from tff_decorr import tf_env  # pylint: disable=g-import-not-at-top  (before TF)
if __name__ == '__main__':
  tf_env.quiet_known_noise()  # TF's C++ lines that say nothing to a user (issue 31)

FLAGS = flags.FLAGS
flags.DEFINE_integer('port', 8000, 'Port to serve on.')
flags.DEFINE_integer('max_concurrent_computation_calls', -1, 'Concurrent computations (-1: any).')
flags.DEFINE_string('log', None, 'Worker log file (default: a file in the temp dir, printed).')
flags.DEFINE_bool('listen_all', False,
                  'Listen on every network interface instead of 127.0.0.1 only. The service is '
                  'unauthenticated: anyone who can reach the port can run any TensorFlow graph as '
                  'this user. Prefer the default and an SSH tunnel (docs/remote_workers.md).')

LISTEN_ALL_WARNING = (
    'worker: WARNING: --listen_all: port {port} accepts unauthenticated connections on every '
    'interface of this machine; anyone who can reach it can run any TensorFlow graph as this user '
    '(read and write its files). Without --listen_all the worker stays on 127.0.0.1 and other '
    'machines reach it through an SSH tunnel (docs/remote_workers.md).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if not 0 < FLAGS.port < 65536:
    print(f'worker: error: --port={FLAGS.port} is not a TCP port (1-65535).', file=sys.stderr)
    return 2
  from tff_decorr.federated import tff_context  # pylint: disable=g-import-not-at-top
  if not tff_context.port_is_free(FLAGS.port):
    print(f'worker: error: --port={FLAGS.port} is already in use; choose another port.',
          file=sys.stderr)
    return 2
  if FLAGS.listen_all:
    print(LISTEN_ALL_WARNING.format(port=FLAGS.port), file=sys.stderr, flush=True)
  worker = tff_context.WorkerProcess(port=FLAGS.port,
                                     max_concurrent_computation_calls=
                                     FLAGS.max_concurrent_computation_calls,
                                     log_path=FLAGS.log, listen_all=FLAGS.listen_all)
  where = 'every interface' if worker.exposed else '127.0.0.1 only'
  print(f'TFF worker serving on port {FLAGS.port}, {where} (pid {worker.process.pid}); log: '
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


if __name__ == '__main__':
  app.run(main)
