"""tff_decorr/federated/loopback.py: the preloaded library turns wildcard binds into loopback binds
(checked on real sockets, read back by the kernel and by psutil), and the /proc reader agrees with
psutil. The worker itself is checked in tff_context_test and remote_workers_test."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import logging
from absl.testing import absltest

from tests import testutil
from tff_decorr.federated import loopback

# Binds a listening socket per argument ('4:ADDRESS' or '6:ADDRESS', port 0) and prints where the
# kernel says each is bound.
_BIND = textwrap.dedent('''
    import socket, sys
    for arg in sys.argv[1:]:
      family, address = arg.split(':', 1)
      s = socket.socket(socket.AF_INET if family == '4' else socket.AF_INET6)
      if family == '6':
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual-stack, as gRPC's
      s.bind((address, 0))
      s.listen(1)
      print(s.getsockname()[0])
      s.close()
''')


def _ipv6() -> bool:
  try:
    with socket.socket(socket.AF_INET6) as s:
      s.bind(('::1', 0))
    return True
  except OSError:
    return False


class LoopbackLibraryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if loopback.compiler() is None:
      raise absltest.SkipTest('no C compiler: make setup installs gcc')
    cls.dir = tempfile.mkdtemp(prefix='loopback_test_')
    cls.library = loopback.build(cls.dir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def _bound(self, *args, preload=True):
    env = dict(os.environ)
    if preload:
      env['LD_PRELOAD'] = self.library
    out = subprocess.run([sys.executable, '-c', _BIND, *args], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()

  def test_wildcard_binds_become_loopback(self):
    args = ['4:0.0.0.0'] + (['6:::'] if _ipv6() else [])
    without = self._bound(*args, preload=False)
    self.assertEqual(without[0], '0.0.0.0')  # the kernel, not the library, is being asked
    with_library = self._bound(*args)
    self.assertEqual(with_library[0], '127.0.0.1')
    if _ipv6():
      self.assertEqual(without[1], '::')
      self.assertEqual(with_library[1], '::ffff:127.0.0.1')

  def test_other_binds_are_unchanged(self):
    self.assertEqual(self._bound('4:127.0.0.2'), ['127.0.0.2'])
    if _ipv6():
      self.assertEqual(self._bound('6:::1'), ['::1'])

  def test_build_is_named_by_source_and_reused(self):
    self.assertEqual(loopback.build(self.dir), self.library)
    self.assertTrue(os.path.basename(self.library).startswith('tff_decorr_loopback_bind-'))


class ListeningAddressesTest(absltest.TestCase):

  def test_agrees_with_psutil_and_flags_what_is_off_loopback(self):
    sockets = []
    for family, address in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET, '0.0.0.0')):
      s = socket.socket(family)
      s.bind((address, 0))
      s.listen(1)
      sockets.append(s)
    try:
      ours = sorted(loopback.listening_addresses(os.getpid()))
      theirs = sorted(testutil.listening(os.getpid()))
      self.assertEqual(ours, theirs)
      wildcard_port = sockets[1].getsockname()[1]
      self.assertEqual(loopback.exposed_addresses(os.getpid()), [f'0.0.0.0:{wildcard_port}'])
    finally:
      for s in sockets:
        s.close()
    self.assertEqual(loopback.listening_addresses(os.getpid()), [])

  def test_is_loopback(self):
    for host in ('127.0.0.1', '127.1.2.3', '::1', '::ffff:127.0.0.1'):
      self.assertTrue(loopback.is_loopback(host), host)
    for host in ('0.0.0.0', '::', '10.0.0.1', '::ffff:10.0.0.1'):
      self.assertFalse(loopback.is_loopback(host), host)


class FallbackTest(absltest.TestCase):

  def test_worker_without_the_library_says_so_in_one_line(self):
    from tff_decorr.federated import tff_context  # pylint: disable=g-import-not-at-top
    original = loopback.library
    loopback.library = lambda: None
    try:
      with self.assertLogs(logging.get_absl_logger(), 'WARNING') as logs:
        worker = tff_context.WorkerProcess()
      worker.stop()
    finally:
      loopback.library = original
    self.assertTrue(worker.exposed)
    (line,) = [r.getMessage() for r in logs.records]
    self.assertNotIn('\n', line)
    self.assertIn('listens on every interface', line)
    self.assertIn('C compiler', line)


if __name__ == '__main__':
  absltest.main()
