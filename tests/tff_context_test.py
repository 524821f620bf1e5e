"""The TFF execution context we own leaves no worker process behind, and its worker is reachable
by this user only: in a network namespace of its own behind a 0600 Unix socket, or, without
namespaces, on loopback; a worker others could reach is refused. Workers started at once never
collide."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from absl.testing import absltest
import psutil

from tests import testutil

_PROGRAM = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    import tensorflow_federated as tff
    from tff_decorr.worker import tff_context
    tff_context.install()

    @tff.tensorflow.computation(np.int32)
    def add_one(x):
      return x + 1

    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def total(xs):
      return tff.federated_sum(tff.federated_map(add_one, xs))

    print('RESULT', total([1, 2, 3]), flush=True)
    print('WORKERS', *tff_context.worker_pids(), flush=True)
    mode = sys.argv[1]
    if mode == 'error':
      raise RuntimeError('deliberate failure after a computation ran')
    if mode == 'hang':
      time.sleep(600)
''')


# One FedAvg round of the project's own TFF runtime; the worker's sockets are read in between.
_ROUND_PROGRAM = textwrap.dedent('''
    import sys
    import numpy as np
    from tff_decorr import algorithms
    from tff_decorr.algorithms import testing
    from tff_decorr.worker import tff_context
    from tff_decorr.runtimes import tff_runtime
    tff_context.install(without_namespace='--without_namespace' in sys.argv)
    alg = algorithms.build('fedavg', testing.tiny_model, algorithms.SGDHParams(lr=0.05))
    runtime = tff_runtime.TffRuntime(alg, testing.make_client_dataset_fn(
        testing.synthetic_clients()))
    state = runtime.initialize()
    print('WORKERS', *tff_context.worker_pids(), flush=True)
    sys.stdin.readline()  # the test reads the sockets now
    before = alg.global_weights(state)
    state, _, metrics = runtime.run_round(state, [('0', 0), ('1', 0)],
                                          [alg.initial_client_state(before)] * 2)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(alg.global_weights(state), before))
    print('ROUND', moved, flush=True)
''')


# Run as a user that is not the socket's owner: tries to connect to the socket argv[1].
_OTHER_USER = textwrap.dedent('''
    import os, socket, sys
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    s = socket.socket(socket.AF_UNIX)
    try:
      s.connect(sys.argv[1])
      print('CONNECTED')
    except PermissionError:
      print('REFUSED')
''')

# Started 4 at once by each of 2 processes: every worker serves one computation.
_MANY_PROGRAM = textwrap.dedent('''
    import sys, threading
    import numpy as np
    import tensorflow_federated as tff
    from tff_decorr.worker import tff_context
    workers, errors = [], []
    started, done = threading.Semaphore(0), threading.Event()
    def start():
      try:
        workers.append(tff_context.WorkerProcess(without_namespace=True))
      except Exception as e:  # pylint: disable=broad-except
        errors.append(repr(e))
      started.release()
      done.wait()  # A worker dies with the thread that started it (PR_SET_PDEATHSIG).
    threads = [threading.Thread(target=start) for _ in range(int(sys.argv[1]))]
    for t in threads:
      t.start()
    for t in threads:
      started.acquire()
    assert not errors, errors

    @tff.tensorflow.computation(np.int32)
    def add_one(x):
      return x + 1

    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def total(xs):
      return tff.federated_sum(tff.federated_map(add_one, xs))

    for w in workers:
      tff_context.install(workers=[w.address])
      print('SERVED', w.isolation, w.address, total([1, 2, 3]), flush=True)
    tff_context.stop_all()
    done.set()
''')


def _python():
  return testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable


def _child_binary(pid, timeout=15.0):
  """The worker_binary under `pid` (the namespace's bridge; or `pid` itself on loopback)."""
  deadline = time.monotonic() + timeout
  while True:
    process = psutil.Process(pid)
    if 'worker_binary' in process.exe():
      return pid
    found = [c.pid for c in process.children() if 'worker_binary' in c.exe()]
    if found or time.monotonic() > deadline:
      return found[0]
    time.sleep(0.1)


class WorkerIsolationTest(absltest.TestCase):

  def _round(self, env=None, *args):
    """Starts one FedAvg round's program; returns (process, pid it reports as its worker)."""
    proc = subprocess.Popen([_python(), '-c', _ROUND_PROGRAM, *args], cwd=testutil.REPO_ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **(env or {})))
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    line = proc.stdout.readline()
    self.assertTrue(line.startswith('WORKERS'), line + proc.stderr.read() if not line else line)
    (pid,) = [int(p) for p in line.split()[1:]]
    return proc, pid

  def _finish(self, proc):
    proc.stdin.write('\n')
    proc.stdin.flush()
    out, err = proc.communicate(timeout=300)
    self.assertEqual(proc.returncode, 0, err)
    moved = float(out.split('ROUND')[1].split()[0])
    self.assertGreater(moved, 1e-4)  # the round ran through that worker and trained
    return err

  def test_worker_has_no_network_and_an_owner_only_socket_and_runs_a_round(self):
    if not testutil.namespaces_available():
      self.skipTest('unshare --user --net is not allowed here (the loopback path is tested below)')
    proc, pid = self._round()
    binary = _child_binary(pid)
    # Read from the kernel, not from the project's code: the worker's network namespace is not
    # ours, and its only interface is its own loopback.
    self.assertNotEqual(os.stat(f'/proc/{binary}/ns/net').st_ino,
                        os.stat('/proc/self/ns/net').st_ino)
    with open(f'/proc/{binary}/net/dev') as f:
      interfaces = [l.split(':')[0].strip() for l in f.read().splitlines()[2:]]
    self.assertEqual(interfaces, ['lo'])
    # The way in: a Unix socket, 0600, owned by this user, in a 0700 folder of this user.
    sockets = [a for a in psutil.Process(pid).cmdline() if a.endswith('.sock')]
    (path,) = sockets
    is_socket, mode, owner = testutil.socket_mode_and_owner(path)
    self.assertTrue(is_socket)
    self.assertEqual((mode, owner), (0o600, os.getuid()))
    folder = os.lstat(os.path.dirname(path))
    self.assertEqual((folder.st_mode & 0o777, folder.st_uid), (0o700, os.getuid()))
    if os.getuid() == 0:  # Another user is turned away by the kernel (only root can become one).
      other = subprocess.run([sys.executable, '-S', '-c', _OTHER_USER, path], capture_output=True,
                             text=True, timeout=30)
      self.assertEqual(other.stdout.strip(), 'REFUSED', other.stderr)
    self._finish(proc)
    self.assertFalse(os.path.exists(os.path.dirname(path)))  # its folder goes with the worker

  def test_without_namespaces_the_worker_is_on_loopback_and_runs_a_round(self):
    proc, pid = self._round({'TFF_DECORR_WORKER_NAMESPACE': '0'}, '--without_namespace')
    sockets = testutil.listening(pid)
    self.assertNotEmpty(sockets)
    for host, port in sockets:
      self.assertTrue(testutil.loopback(host), f'worker listens on {host}:{port}, not loopback')
    err = self._finish(proc)
    self.assertNotIn('every interface', err)
    self.assertIn('other users of this machine can connect', err)  # the accepted exposure, said

  def test_a_socket_others_could_reach_is_refused(self):
    if not testutil.namespaces_available():
      self.skipTest('unshare --user --net is not allowed here')
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    folder = tempfile.mkdtemp(prefix='tff_context_test_')
    self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
    os.chmod(folder, 0o755)  # others may enter it: the check after start-up must refuse it
    with self.assertRaises(tff_context.WorkerExposedError) as raised:
      tff_context.WorkerProcess(socket_path=os.path.join(folder, 'w.sock'))
    self.assertIn('mode 0700', str(raised.exception))
    self.assertNotIn('\n', str(raised.exception))
    self.assertEqual(tff_context.worker_pids(), [])


class StartFailureTest(absltest.TestCase):
  """A worker that cannot start: its error carries the last lines of its log, on both paths."""

  def setUp(self):
    super().setUp()
    from tff_decorr.worker import netns  # pylint: disable=g-import-not-at-top
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    self.netns, self.tff_context = netns, tff_context
    self.tmp = tempfile.mkdtemp(prefix='tff_context_start_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
    self.attempts = os.path.join(self.tmp, 'attempts')
    fake = os.path.join(self.tmp, 'worker_binary')
    with open(fake, 'w') as f:
      f.write(f'#!/bin/sh\necho attempt >> {self.attempts}\necho "E0000 Failed to bind: '
              f'something else holds $1"\nexit 3\n')
    os.chmod(fake, 0o755)
    self.addCleanup(setattr, tff_context, 'worker_binary_path', tff_context.worker_binary_path)
    tff_context.worker_binary_path = lambda: fake

  def _failure(self):
    with self.assertRaises(RuntimeError) as raised:
      self.tff_context.WorkerProcess(without_namespace=True)
    message = str(raised.exception)
    self.assertIn('exited during start-up', message)
    self.assertIn('Failed to bind: something else holds --port=', message)  # the log's last line
    self.assertNotIn('\n', message)
    self.assertEqual(self.tff_context.worker_pids(), [])
    with open(self.attempts) as f:
      return len(f.readlines())

  def test_on_loopback_another_port_is_tried_then_the_log_is_quoted(self):
    # pylint: disable=protected-access
    self.addCleanup(setattr, self.netns, '_available', self.netns._available)
    self.netns._available = (False, 'not in this test')
    # The canary (loopback_test) runs the worker binary's loader; this fake is a shell script.
    from tff_decorr.worker import loopback  # pylint: disable=g-import-not-at-top
    self.addCleanup(setattr, loopback, 'canary_problems', loopback.canary_problems)
    loopback.canary_problems = lambda *args: []
    self.assertEqual(self._failure(), self.tff_context._START_ATTEMPTS)

  def test_in_a_namespace_the_log_is_quoted(self):
    if not self.netns.available()[0]:
      self.skipTest('unshare --user --net is not allowed here')
    self.assertEqual(self._failure(), 1)  # Its port cannot be taken: no reason to try again.


class ConcurrentStartTest(absltest.TestCase):
  """Workers started at once never collide, on either path: 8 from 2 processes, each serving."""

  def _many(self, env):
    procs = [subprocess.Popen([_python(), '-c', _MANY_PROGRAM, '4'], cwd=testutil.REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, **env)) for _ in range(2)]
    served = []
    for proc in procs:
      out, err = proc.communicate(timeout=400)
      self.assertEqual(proc.returncode, 0, err[-3000:])
      served += [l.split() for l in out.splitlines() if l.startswith('SERVED')]
    self.assertLen(served, 8)
    self.assertEqual({s[-1] for s in served}, {'9'})
    self.assertLen({s[2] for s in served}, 8)  # 8 different sockets or ports
    return {s[1] for s in served}

  def test_eight_workers_from_two_processes_all_serve(self):
    expected = {'namespace'} if testutil.namespaces_available() else {'loopback'}
    self.assertEqual(self._many({}), expected)

  def test_eight_loopback_workers_from_two_processes_all_serve(self):
    self.assertEqual(self._many({'TFF_DECORR_WORKER_NAMESPACE': '0'}), {'loopback'})


class TffContextTest(absltest.TestCase):

  def _children_of(self, pid):
    out = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]

  def _run(self, mode):
    proc = subprocess.Popen([_python(), '-c', _PROGRAM, mode], cwd=testutil.REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc

  def _worker_pids(self, out):
    line = [l for l in out.splitlines() if l.startswith('WORKERS')][0]
    pids = [int(p) for p in line.split()[1:]]
    self.assertLen(pids, 1)
    return pids

  def _assert_gone(self, pids):
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
      alive = [p for p in pids if os.path.exists(f'/proc/{p}') and
               'Z' not in open(f'/proc/{p}/stat').read().split()[2]]
      time.sleep(0.2)
    self.assertEqual(alive, [], 'TFF worker process outlived its parent')

  def test_computation_runs_and_normal_exit_leaves_nothing(self):
    proc = self._run('normal')
    out, _ = proc.communicate(timeout=120)  # Returns only once every holder of stdout is gone.
    self.assertIn('RESULT 9', out)
    self.assertEqual(proc.returncode, 0)
    self._assert_gone(self._worker_pids(out))

  def test_exit_on_error_leaves_nothing(self):
    proc = self._run('error')
    out, _ = proc.communicate(timeout=120)
    self.assertIn('RESULT 9', out)
    self.assertNotEqual(proc.returncode, 0)
    self._assert_gone(self._worker_pids(out))

  def test_sigkill_of_parent_kills_worker(self):
    proc = self._run('hang')
    self.assertIn('RESULT 9', proc.stdout.readline())
    workers = self._worker_pids(proc.stdout.readline())
    self.assertEqual(workers, self._children_of(proc.pid))
    sockets = [a for a in psutil.Process(workers[0]).cmdline() if a.endswith('.sock')]
    binaries = self._children_of(workers[0])  # under the namespace's bridge
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    self._assert_gone(workers + binaries)
    for path in sockets:  # The namespace's bridge removes the socket and its folder itself.
      self.assertFalse(os.path.exists(os.path.dirname(path)), path)

  def test_sigterm_stops_worker(self):
    proc = self._run('hang')
    self.assertIn('RESULT 9', proc.stdout.readline())
    workers = self._worker_pids(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    self._assert_gone(workers)


if __name__ == '__main__':
  absltest.main()
