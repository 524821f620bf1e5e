"""A worker reached through a real OpenSSH tunnel, Unix socket to Unix socket (docs/remote_workers.md).

The recipe of docs/remote_workers.md run on one machine: `bin.worker --socket` (its own network
namespace, a 0600 socket in a 0700 folder) is the far end; an OpenSSH server (Debian's sshd, which
`make test-system-packages` unpacks into the venv without installing the service) listens on
127.0.0.1 only and admits one throwaway key; `ssh -N -L near.sock:worker.sock` with the recipe's
options makes the near end. The test checks what the kernel says of the near end (a socket of mode
0600 owned by the user, in the 0700 folder the user made), that a federated computation sent to
`unix:<near end>` comes back right through SSH, and that sshd listens on loopback only. What one
machine cannot show is the network between two: here ssh and sshd talk over 127.0.0.1.

Run as root (the machines here), sshd needs its privilege-separation user and /run/sshd, which the
Debian package would create; the test creates what is missing and removes what it created.
"""

import glob
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time

from absl.testing import absltest
import psutil

from tests import testutil

_OPENSSH = os.path.join(testutil.REPO_ROOT, '.venv', 'opt', 'openssh')
_SSHD = os.path.join(_OPENSSH, 'usr', 'sbin', 'sshd')

_PROGRAM = '\n'.join([
    'import sys, numpy as np, tensorflow_federated as tff',
    'from tff_decorr.worker import tff_context',
    'tff_context.install(workers=[sys.argv[1]])',
    *testutil.FEDERATED_TOTAL,
    'print("TOTAL", total([1, 2, 3]), flush=True)',
])


def _sbin(tool: str) -> str:
  # Bazel's test PATH is /bin:/usr/bin:/usr/local/bin; the user tools live in /usr/sbin.
  return shutil.which(tool, path=os.pathsep.join([os.environ.get('PATH', ''), '/usr/sbin',
                                                  '/sbin'])) or tool


def _free_loopback_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _wait(predicate, timeout, what):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.1)
  raise AssertionError(f'timed out after {timeout} s waiting for {what}')


def _accepts(port) -> bool:
  try:
    with socket.create_connection(('127.0.0.1', port), timeout=1):
      return True
  except OSError:
    return False


class SshTunnelTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.assertTrue(os.access(_SSHD, os.X_OK),
                    f'{_SSHD} is missing: run `make test-system-packages` (it unpacks Debian\'s '
                    'openssh-server there)')
    self.assertIsNotNone(shutil.which('ssh'), 'ssh is missing: run `make test-system-packages`')
    self.tmp = tempfile.mkdtemp(prefix='ssh_tunnel_')  # mkdtemp: mode 0700.
    self.procs = []
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
    self.addCleanup(self._stop)
    if os.geteuid() == 0:
      self._privilege_separation()

  def _privilege_separation(self):
    """As root, sshd drops to user `sshd` in /run/sshd: made here when missing, removed after."""
    try:
      pwd.getpwnam('sshd')
    except KeyError:
      subprocess.run([_sbin('useradd'), '--system', '--no-create-home', '--home-dir', '/run/sshd',
                      '--shell', '/usr/sbin/nologin', 'sshd'], check=True)
      self.addCleanup(subprocess.run, [_sbin('userdel'), 'sshd'], check=False)
    if not os.path.isdir('/run/sshd'):
      os.makedirs('/run/sshd', mode=0o755)
      self.addCleanup(os.rmdir, '/run/sshd')

  def _stop(self):
    for proc in reversed(self.procs):
      proc.terminate()
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

  def _keygen(self, name):
    path = os.path.join(self.tmp, name)
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', path], check=True)
    return path

  def _start_sshd(self):
    host_key, user_key = self._keygen('host_key'), self._keygen('user_key')
    shutil.copy(user_key + '.pub', os.path.join(self.tmp, 'authorized_keys'))
    libs = sorted({os.path.dirname(p) for p in glob.glob(
        os.path.join(_OPENSSH, '**', 'libwrap.so.0'), recursive=True)})
    env = dict(os.environ, LD_LIBRARY_PATH=':'.join(libs))
    for _ in range(3):  # The port is free when picked; another process may take it first.
      port = _free_loopback_port()
      config = os.path.join(self.tmp, 'sshd_config')
      with open(config, 'w') as f:
        f.write('\n'.join([
            f'ListenAddress 127.0.0.1:{port}', f'HostKey {host_key}',
            f'AuthorizedKeysFile {self.tmp}/authorized_keys', 'PasswordAuthentication no',
            'KbdInteractiveAuthentication no', 'UsePAM no', 'StrictModes no',
            'PermitRootLogin prohibit-password', 'AllowStreamLocalForwarding yes',
            f'PidFile {self.tmp}/sshd.pid', '']))
      log = open(os.path.join(self.tmp, 'sshd.log'), 'w')
      self.addCleanup(log.close)
      sshd = subprocess.Popen([_SSHD, '-D', '-e', '-f', config], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
      self.procs.append(sshd)
      _wait(lambda: sshd.poll() is not None or _accepts(port), 20, 'sshd to listen')
      if sshd.poll() is None:
        return sshd, port, user_key
    with open(os.path.join(self.tmp, 'sshd.log')) as f:
      self.fail(f'sshd did not start: {f.read()[-2000:]}')

  def test_a_computation_through_an_ssh_tunnel_between_unix_sockets(self):
    far_dir = os.path.join(self.tmp, 'far')
    worker = testutil.start_socket_worker(os.path.join(far_dir, 'worker.sock'),
                                          os.path.join(self.tmp, 'worker.log'))
    self.procs.append(worker)
    sshd, port, user_key = self._start_sshd()

    near_dir = os.path.join(self.tmp, 'near')
    os.mkdir(near_dir, 0o700)  # The recipe's `install -d -m 700`.
    near = os.path.join(near_dir, 'a.sock')
    user = pwd.getpwuid(os.geteuid()).pw_name
    tunnel = subprocess.Popen(
        ['ssh', '-N', '-o', 'ExitOnForwardFailure=yes', '-o', 'StreamLocalBindUnlink=yes',
         '-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=no', '-o',
         'UserKnownHostsFile=/dev/null', '-i', user_key, '-p', str(port),
         '-L', f'{near}:{os.path.join(far_dir, "worker.sock")}', f'{user}@127.0.0.1'],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    self.procs.append(tunnel)
    _wait(lambda: tunnel.poll() is not None or os.path.exists(near), 30, 'the near socket')
    if tunnel.poll() is not None:  # (stderr is read only then: it stays open while ssh runs.)
      self.fail(f'ssh exited ({tunnel.returncode}): {tunnel.stderr.read()[-2000:]}')

    # The near end, as the kernel has it: a socket only its owner can use.
    st = os.stat(near)
    self.assertTrue(stat.S_ISSOCK(st.st_mode))
    self.assertEqual(st.st_uid, os.geteuid())
    self.assertEqual(stat.S_IMODE(st.st_mode) & 0o077, 0, oct(st.st_mode))
    self.assertEqual(stat.S_IMODE(os.stat(near_dir).st_mode), 0o700)

    out = subprocess.run([testutil.python(), '-c', _PROGRAM, f'unix:{near}'],
                         cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=300)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('TOTAL 9', out.stdout)

    # sshd on loopback only: nothing of the tunnel is reachable from another machine.
    listening = [c.laddr for c in psutil.Process(sshd.pid).net_connections(kind='inet')
                 if c.status == psutil.CONN_LISTEN]
    self.assertEqual([a.ip for a in listening], ['127.0.0.1'])
    with open(os.path.join(self.tmp, 'sshd.log')) as f:
      self.assertIn('Accepted publickey', f.read())


if __name__ == '__main__':
  absltest.main()
