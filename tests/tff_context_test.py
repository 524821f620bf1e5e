"""The TFF execution context we own leaves no worker process behind, and its worker is reachable
from this machine only."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest

from tests import testutil

_PROGRAM = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    import tensorflow_federated as tff
    from tff_decorr.federated import tff_context
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
    from tff_decorr.federated import tff_context
    from tff_decorr.runtimes import tff_runtime
    tff_context.install()
    alg = algorithms.build('fedavg', testing.tiny_model, algorithms.ClientConfig(lr=0.05))
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


class WorkerListensOnLoopbackTest(absltest.TestCase):

  def test_worker_is_bound_to_loopback_and_runs_a_round(self):
    proc = subprocess.Popen([testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable,
                             '-c', _ROUND_PROGRAM], cwd=testutil.REPO_ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      line = proc.stdout.readline()
      self.assertTrue(line.startswith('WORKERS'), line + proc.stderr.read() if not line else line)
      (pid,) = [int(p) for p in line.split()[1:]]
      sockets = testutil.listening(pid)
      self.assertNotEmpty(sockets)
      for host, port in sockets:
        self.assertTrue(testutil.loopback(host), f'worker listens on {host}:{port}, not loopback')
      proc.stdin.write('\n')
      proc.stdin.flush()
      out, err = proc.communicate(timeout=300)
    finally:
      if proc.poll() is None:
        proc.kill()
    self.assertEqual(proc.returncode, 0, err)
    moved = float(out.split('ROUND')[1].split()[0])
    self.assertGreater(moved, 1e-4)  # the round ran through that worker and trained
    self.assertNotIn('listens on every interface', err)


class TffContextTest(absltest.TestCase):

  def _children_of(self, pid):
    out = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]

  def _run(self, mode):
    proc = subprocess.Popen([testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable,
                             '-c', _PROGRAM, mode], cwd=testutil.REPO_ROOT,
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
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    self._assert_gone(workers)

  def test_sigterm_stops_worker(self):
    proc = self._run('hang')
    self.assertIn('RESULT 9', proc.stdout.readline())
    workers = self._worker_pids(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    self._assert_gone(workers)


if __name__ == '__main__':
  absltest.main()
