"""Simulations across TFF remote workers (bin/worker): same results, clear errors, no leftovers.

Two `bin.worker --socket` processes (each worker in a network namespace of its own, behind a 0600
Unix socket, as the far end of an `ssh -L` tunnel would be); `bin.train --workers=unix:A,unix:B`
runs two rounds across them (TFF's mergeable-computation context) and its exported model must
equal a plain single-process `--runtime=tff` run of the same config. A dead worker gives a
one-line error naming --workers, and killing the workers (SIGTERM and SIGKILL) leaves none of
their worker_binary children behind. `bin.worker --port` serves 127.0.0.1 and `--listen_all`
every interface, said as the kernel reports it (the latter only inside a namespace of the test's
own).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time

from absl.testing import absltest
import numpy as np
import portpicker
import psutil

from tests import testutil

# SCAFFOLD: its client states (control variates) must come back to the right clients.
# Small client lr: training amplifies last-bit differences of the summation order (each worker
# sums its own clients, then the partial sums are merged), so the comparison stays meaningful.
_CONFIG = ('--task=digits', '--algorithm=scaffold', '--num_clients=4', '--clients_per_round=4',
           '--rounds=2', '--local_epochs=1', '--regularizer=none', '--client_lr=0.002', '--seed=3',
           '--runtime=tff', '--eval_every=2')
_TOLERANCE = 1e-3


def _binaries_of(proc):
  # The binary itself, not the namespace's bridge (whose arguments name it).
  return [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
          if os.path.basename(c.cmdline()[0]) == 'worker_binary']


def _running(pid) -> bool:
  # A process may exit between two looks at it: that is the answer, not an error.
  try:
    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _gone(pids, timeout=15.0):
  deadline = time.monotonic() + timeout
  alive = list(pids)
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if _running(p)]
    time.sleep(0.2)
  return alive


def _logits(saved_model_dir):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fn = tf.saved_model.load(saved_model_dir).signatures['serving_default']
  spec = fn.structured_input_signature[1]['images']
  images = tf.random.stateless_uniform([32] + spec.shape[1:].as_list(), seed=[7, 9])
  return fn(images=images)['logits'].numpy()


class RemoteWorkersTest(absltest.TestCase):

  def test_workers_have_no_network_and_owner_only_sockets(self):
    for proc, path in zip(self.workers, self.sockets):
      (binary,) = _binaries_of(proc)
      self.assertNotEqual(os.stat(f'/proc/{binary}/ns/net').st_ino,
                          os.stat('/proc/self/ns/net').st_ino)
      is_socket, mode, owner = testutil.socket_mode_and_owner(path)
      self.assertTrue(is_socket)
      self.assertEqual((mode, owner), (0o600, os.getuid()))
      self.assertIn(f'unix socket {path} (mode 0600, owner uid {os.getuid()})', proc.first_line)
      self.assertIn('interfaces: lo)', proc.first_line)

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix='remote_workers_test_')
    self.cache = os.path.join(self.tmp, 'cache')
    # Each worker's socket in a folder of its own, as on two machines (bin.worker makes it 0700).
    self.sockets = [os.path.join(self.tmp, f'host{i}', 'worker.sock') for i in range(2)]
    self.workers = [testutil.start_socket_worker(p, os.path.join(self.tmp, f'worker{i}.log'))
                    for i, p in enumerate(self.sockets)]
    self.addCleanup(self._stop_workers)

  def _stop_workers(self):
    for w in self.workers:
      if w.poll() is None:
        w.kill()
        w.wait()
      w.stdout.close()

  def _train(self, out, *extra):
    cache = () if any(a.startswith('--cache_dir=') for a in extra) else (
        f'--cache_dir={self.cache}',)
    return [testutil.python(), '-m', 'bin.train', *_CONFIG, *cache,
            f'--output_dir={os.path.join(self.tmp, out)}', *extra]

  def test_two_workers_equal_single_process_then_errors_and_no_leftovers(self):
    workers_flag = '--workers=' + ','.join(f'unix:{p}' for p in self.sockets)
    binaries = [_binaries_of(w) for w in self.workers]
    for b in binaries:
      self.assertLen(b, 1)
    cpu_before = [psutil.Process(b[0]).cpu_times().user for b in binaries]
    # The single-process run uses the other core while the --workers run compiles. Separate shard
    # caches, so the two runs never write the same cache directory at the same time.
    single = subprocess.Popen(self._train('single', f'--cache_dir={self.cache}-single'),
                              cwd=testutil.REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    remote = subprocess.run(self._train('remote', workers_flag), cwd=testutil.REPO_ROOT,
                            capture_output=True, text=True, timeout=400)
    s_out, s_err = single.communicate(timeout=400)
    self.assertEqual(remote.returncode, 0, remote.stderr[-3000:])
    self.assertEqual(single.returncode, 0, s_err[-3000:])
    self.assertIn('round 2/2', remote.stdout)
    self.assertIn('round 2/2', s_out)
    # Both workers trained clients (TFF splits the 4 clients 2 + 2). An idle worker uses no CPU
    # (measured: 0.00 s in 30 s); the run costs each about 0.7 s here.
    cpu_used = [psutil.Process(b[0]).cpu_times().user - t for b, t in zip(binaries, cpu_before)]
    for used in cpu_used:
      self.assertGreater(used, 0.25, f'worker CPU seconds during the run: {cpu_used}')

    remote_logits = _logits(os.path.join(self.tmp, 'remote', 'export', 'saved_model'))
    single_logits = _logits(os.path.join(self.tmp, 'single', 'export', 'saved_model'))
    self.assertGreater(np.abs(single_logits).max(), 0.0)
    np.testing.assert_allclose(remote_logits, single_logits, rtol=0, atol=_TOLERANCE)

    # Kill the workers: one politely, one with SIGKILL (its worker_binary dies with it).
    self.workers[0].send_signal(signal.SIGTERM)
    self.assertEqual(self.workers[0].wait(timeout=30), 0)
    self.workers[1].send_signal(signal.SIGKILL)
    self.workers[1].wait(timeout=30)
    self.assertEqual(_gone(binaries[0] + binaries[1]), [])
    ours = [l for l in testutil.worker_binaries() if any(p in l for p in self.sockets)]
    self.assertEqual(ours, [])
    self.assertFalse(os.path.exists(self.sockets[0]))  # removed by the worker that was stopped

    # A worker that is not running: one line naming --workers, exit 2, no traceback.
    dead = subprocess.run(self._train('remote', workers_flag, '--rounds=3'),
                          cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=300)
    self.assertEqual(dead.returncode, 2, dead.stderr[-3000:])
    self.assertNotIn('Traceback', dead.stderr)
    errors = [l for l in dead.stderr.splitlines() if l.startswith('train: error:')]
    self.assertLen(errors, 1)
    self.assertIn('--workers', errors[0])
    self.assertIn(f'unix:{self.sockets[0]}', errors[0])


class WorkerFlagsTest(absltest.TestCase):
  """bin.worker's other ways to serve, and its refusals, said from the kernel's side."""

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix='remote_workers_flags_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_port_serves_loopback_said_from_the_sockets(self):
    port = portpicker.pick_unused_port()
    proc = subprocess.Popen([testutil.python(), '-m', 'bin.worker', f'--port={port}',
                             f'--log={os.path.join(self.tmp, "port.log")}'],
                            cwd=testutil.REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
      line = proc.stdout.readline()
      (binary,) = _binaries_of(proc)
      sockets = testutil.listening(binary)
      self.assertNotEmpty(sockets)
      for host, p in sockets:
        self.assertTrue(testutil.loopback(host), f'bin.worker listens on {host}:{p}')
      self.assertIn(f':{port}', line)
      self.assertNotIn('[::]', line)
    finally:
      proc.kill()
      proc.wait()
      proc.stdout.close()

  def test_a_socket_folder_others_can_enter_is_refused(self):
    folder = os.path.join(self.tmp, 'open')
    os.mkdir(folder)
    os.chmod(folder, 0o755)
    proc = testutil.run_module('bin.worker', f'--socket={folder}/w.sock', timeout=120)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    errors = [l for l in proc.stderr.splitlines() if l.startswith('worker: error:')]
    self.assertLen(errors, 1)
    self.assertIn('mode 0700', errors[0])
    self.assertFalse(os.path.exists(os.path.join(folder, 'w.sock')))

  def test_listen_all_is_explicit_and_warns(self):
    if not testutil.namespaces_available():
      self.skipTest('a worker on every interface is started only inside a network namespace of '
                    'the test\'s own; unshare --user --net is not allowed here')
    port = portpicker.pick_unused_port()
    proc = subprocess.Popen(testutil.in_own_network(
        [testutil.python(), '-m', 'bin.worker', f'--port={port}', '--listen_all',
         f'--log={os.path.join(self.tmp, "all.log")}']),
                            cwd=testutil.REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
      warning = ''
      for _ in range(50):  # TensorFlow's start-up lines come first
        warning = proc.stderr.readline()
        if 'WARNING: --listen_all' in warning or not warning:
          break
      self.assertIn('WARNING: --listen_all', warning)
      self.assertIn('unauthenticated', warning)
      line = proc.stdout.readline()
      self.assertIn(f'[::]:{port}', line)  # as /proc says: every interface (of that namespace)
      (binary,) = _binaries_of(proc)
      self.assertNotEqual(os.stat(f'/proc/{binary}/ns/net').st_ino,
                          os.stat('/proc/self/ns/net').st_ino)
      hosts = [h for h, _ in testutil.listening_in_its_namespace(binary)]
      self.assertNotEmpty(hosts)
      self.assertFalse(any(testutil.loopback(h) for h in hosts), hosts)
    finally:
      proc.kill()  # at once: nothing connects to it
      proc.wait()
      proc.stdout.close()
      proc.stderr.close()


class WorkerLostTest(absltest.TestCase):
  """A worker that stops answering between/inside calls: WorkerLostError, not TFF's endless retry."""

  def test_lost_worker_raises_one_line_error(self):
    program = '\n'.join([
        'import sys, time, numpy as np, tensorflow_federated as tff',
        'from tff_decorr.worker import tff_context',
        'w = tff_context.WorkerProcess()',
        'tff_context.install(workers=[w.address])',
        *testutil.FEDERATED_TOTAL,
        'print("FIRST", total([1, 2, 3]), flush=True)',
        'w.process.kill(); w.process.wait()',
        't = time.monotonic()',
        'try:',
        '  total([1, 2, 3])',
        'except tff_context.WorkerLostError as e:',
        '  print("LOST", round(time.monotonic() - t), e, flush=True)',
    ])
    proc = subprocess.run([testutil.python(), '-c', program], cwd=testutil.REPO_ROOT,
                          capture_output=True, text=True, timeout=180)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('FIRST 9', proc.stdout)
    lost = [l for l in proc.stdout.splitlines() if l.startswith('LOST')]
    self.assertLen(lost, 1, proc.stdout)
    self.assertIn('--workers', lost[0])
    self.assertIn('re-run the same command', lost[0])
    self.assertLess(int(lost[0].split()[1]), 60)


if __name__ == '__main__':
  absltest.main()
