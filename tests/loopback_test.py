"""tff_decorr/federated/loopback.py: the preloaded library turns wildcard binds into loopback binds
(checked on real sockets, read back by the kernel and by psutil), the /proc reader agrees with
psutil, the library is looked up only in trusted folders, and a worker that cannot be kept to this
machine is refused (a library that does not load, no compiler). Every test that opens a wildcard
socket does it in a network namespace of its own. The isolated worker itself is checked in
tff_context_test and remote_workers_test."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    # Wildcard binds, with the library or without, happen in a network namespace of their own.
    _needs_namespaces()
    out = subprocess.run(testutil.in_own_network([sys.executable, '-c', _BIND, *args]), env=env,
                         capture_output=True, text=True, check=True)
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


# Run inside a network namespace of its own (testutil.in_own_network): listens on 127.0.0.1 and
# on 0.0.0.0 (which then exists only in that namespace), and prints what the project's /proc
# reader and psutil say.
_LISTENERS = textwrap.dedent('''
    import json, os, socket, sys
    import psutil
    from tff_decorr.federated import loopback
    sockets = []
    for address in ('127.0.0.1', '0.0.0.0'):
      s = socket.socket()
      s.bind((address, 0))
      s.listen(1)
      sockets.append(s)
    ours = sorted(loopback.listening_addresses(os.getpid()))
    theirs = sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections('tcp')
                    if c.status == psutil.CONN_LISTEN)
    exposed = loopback.exposed_addresses(os.getpid())
    wildcard = sockets[1].getsockname()[1]
    for s in sockets:
      s.close()
    print(json.dumps([ours, theirs, exposed, wildcard, loopback.listening_addresses(os.getpid())]))
''')

# Started with TFF_DECORR_WORKER_NAMESPACE=0 inside a namespace of its own: a worker on the
# loopback library's path whose library is the file in argv[1]; prints what happened.
_REFUSAL = textwrap.dedent('''
    import json, os, sys
    from tff_decorr.federated import loopback, tff_context
    loopback.library = lambda: sys.argv[1]
    try:
      worker = tff_context.WorkerProcess()
    except tff_context.WorkerExposedError as e:
      print(json.dumps({'refused': str(e), 'left': tff_context.worker_pids()}))
    else:
      print(json.dumps({'started': worker.listening()}))
      worker.stop()
''')


# In a namespace of its own: no namespace for the worker, no library, and the explicit opt-in
# (bin/train --worker_listen_all): the run goes on with a worker on every interface.
_OPT_IN = textwrap.dedent('''
    import json
    import numpy as np
    import tensorflow_federated as tff
    from tff_decorr.federated import loopback, netns, tff_context
    netns._available = (False, 'not in this test')
    loopback.library = lambda: None
    tff_context.set_listen_all(True)
    tff_context.install()

    @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
    def total(xs):
      return tff.federated_sum(xs)
    result = total([1, 2, 3])
    (pid,) = tff_context.worker_pids()
    print(json.dumps([int(result), loopback.listening_addresses(pid)]))
''')


def _python():
  return testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable


def _needs_namespaces():
  if not testutil.namespaces_available():
    raise absltest.SkipTest('this test opens a wildcard socket, which it does only inside a '
                            'network namespace of its own; unshare --user --net is not allowed '
                            'here')


class ListeningAddressesTest(absltest.TestCase):

  def test_agrees_with_psutil_and_flags_what_is_off_loopback(self):
    _needs_namespaces()
    out = subprocess.run(testutil.in_own_network([_python(), '-c', _LISTENERS]),
                         cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=120)
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    ours, theirs, exposed, wildcard, after = json.loads(out.stdout.splitlines()[-1])
    self.assertEqual(ours, theirs)
    self.assertLen(ours, 2)
    self.assertEqual(exposed, [f'0.0.0.0:{wildcard}'])
    self.assertEqual(after, [])

  def test_is_loopback(self):
    for host in ('127.0.0.1', '127.1.2.3', '::1', '::ffff:127.0.0.1'):
      self.assertTrue(loopback.is_loopback(host), host)
    for host in ('0.0.0.0', '::', '10.0.0.1', '::ffff:10.0.0.1'):
      self.assertFalse(loopback.is_loopback(host), host)


class LibraryFoldersTest(absltest.TestCase):

  def test_only_the_venv_and_the_users_cache_are_searched(self):
    folders = loopback._candidate_dirs()  # pylint: disable=protected-access
    self.assertEqual(folders, [os.path.join(sys.prefix, 'lib', 'tff_decorr'),
                               loopback.cache_dir()])
    self.assertTrue(loopback.cache_dir().startswith(os.path.expanduser('~')) or
                    'XDG_CACHE_HOME' in os.environ)
    for folder in folders:
      self.assertFalse(folder.startswith(tempfile.gettempdir() + os.sep), folder)


class LibraryLookupTest(absltest.TestCase):
  """The library is taken only from the venv or the user's own 0700 folder, checked first."""

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix='loopback_lookup_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
    self.venv = os.path.join(self.tmp, 'venv', 'lib', 'tff_decorr')
    self.cache = os.path.join(self.tmp, 'cache', 'tff_decorr', 'loopback')
    for name, value in (('venv_dir', lambda: self.venv), ('cache_dir', lambda: self.cache),
                        ('_cached', None), ('_reason', None)):
      self.addCleanup(setattr, loopback, name, getattr(loopback, name))
      setattr(loopback, name, value)

  def _plant(self, folder, folder_mode=0o700, file_mode=0o755):
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, folder_mode)
    digest = loopback._digest()  # pylint: disable=protected-access
    path = os.path.join(folder, f'tff_decorr_loopback_bind-{digest}.so')
    with open(path, 'wb') as f:
      f.write(b'planted')
    os.chmod(path, file_mode)
    return path

  def test_a_file_others_can_write_is_not_used(self):
    for folder_mode, file_mode in ((0o700, 0o757), (0o777, 0o755)):
      path = self._plant(self.cache, folder_mode, file_mode)
      self.assertIsNotNone(loopback.untrusted_reason(path), (folder_mode, file_mode))
      loopback._cached = None  # pylint: disable=protected-access
      self.assertNotEqual(loopback.library(), path)
      shutil.rmtree(os.path.dirname(self.cache))

  def test_a_symbolic_link_or_another_users_file_is_not_used(self):
    real = self._plant(os.path.join(self.tmp, 'elsewhere'))
    os.makedirs(self.cache, mode=0o700)
    link = os.path.join(self.cache, os.path.basename(real))
    os.symlink(real, link)
    self.assertIn('symbolic link', loopback.untrusted_reason(link))
    if os.getuid() == 0:  # Only root can give a file away; other users check the owner's rule.
      os.chown(real, 65534, 65534)
      self.assertIn('owned by uid 65534', loopback.untrusted_reason(real))

  def test_the_cache_folder_is_made_0700_and_a_looser_one_refused(self):
    if loopback.compiler() is None:
      self.skipTest('no C compiler: make setup installs gcc')
    os.makedirs(os.path.dirname(self.cache), mode=0o755)
    os.makedirs(self.cache, mode=0o777)
    os.chmod(self.cache, 0o777)
    with self.assertRaisesRegex(OSError, 'writable by it alone'):
      loopback.build(self.cache)
    os.chmod(self.cache, 0o755)  # Ours, readable by others only: tightened, then used.
    built = loopback.build(self.cache)
    self.assertEqual(os.stat(self.cache).st_mode & 0o777, 0o700)
    self.assertIsNone(loopback.untrusted_reason(built))

  def test_a_missing_compiler_leaves_no_library_and_says_why(self):
    self.addCleanup(os.environ.__setitem__, 'PATH', os.environ['PATH'])
    os.environ['PATH'] = self.tmp  # No cc or gcc in it.
    env_cc = os.environ.pop('CC', None)
    if env_cc is not None:
      self.addCleanup(os.environ.__setitem__, 'CC', env_cc)
    self.assertIsNone(loopback.compiler())
    self.assertIsNone(loopback.library())
    self.assertIn('no C compiler', loopback.unavailable_reason())


class RefusalTest(absltest.TestCase):
  """A worker that cannot be isolated is refused: one line, no worker left, no computation."""

  def setUp(self):
    super().setUp()
    from tff_decorr.federated import netns  # pylint: disable=g-import-not-at-top
    from tff_decorr.federated import tff_context  # pylint: disable=g-import-not-at-top
    self.netns, self.tff_context = netns, tff_context
    self.tmp = tempfile.mkdtemp(prefix='loopback_refusal_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def _without_namespace_or_compiler(self):
    for module, name, value in ((self.netns, '_available', (False, 'not allowed in this test')),
                                (loopback, 'library', lambda: None),
                                (loopback, '_reason', 'no C compiler (cc or gcc) on PATH')):
      self.addCleanup(setattr, module, name, getattr(module, name))
      setattr(module, name, value)

  def test_missing_compiler_without_namespace_is_refused_in_one_line(self):
    self._without_namespace_or_compiler()
    with self.assertRaises(self.tff_context.WorkerExposedError) as raised:
      self.tff_context.WorkerProcess()
    message = str(raised.exception)
    self.assertNotIn('\n', message)
    self.assertIn('refusing', message)
    self.assertIn('C compiler', message)  # why, and what to do
    self.assertIn('--worker_listen_all', message)
    self.assertEqual(self.tff_context.worker_pids(), [])  # nothing was started

  def test_missing_compiler_with_a_namespace_needs_no_library(self):
    if not self.netns.available()[0]:
      self.skipTest(f'no user namespaces here: {self.netns.available()[1]}')
    for name, value in (('library', lambda: None), ('_reason', 'no C compiler')):
      self.addCleanup(setattr, loopback, name, getattr(loopback, name))
      setattr(loopback, name, value)
    worker = self.tff_context.WorkerProcess()
    try:
      self.assertEqual(worker.isolation, 'namespace')
      self.assertEqual(worker.problems(), [])
    finally:
      worker.stop()

  def _refusal(self, library_path):
    _needs_namespaces()
    env = dict(os.environ, TFF_DECORR_WORKER_NAMESPACE='0')
    out = subprocess.run(testutil.in_own_network([_python(), '-c', _REFUSAL, library_path]),
                         cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=180,
                         env=env)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    return json.loads(out.stdout.splitlines()[-1])

  def test_a_library_that_exists_but_does_not_load_is_refused(self):
    # A corrupt library: the loader skips it (its complaint goes to the worker's log) and the
    # worker binds the wildcard. In a namespace of this test's own, so nothing is exposed here.
    broken = os.path.join(self.tmp, 'broken.so')
    with open(broken, 'wb') as f:
      f.write(b'\x7fELF not really a shared object')
    result = self._refusal(broken)
    self.assertIn('refused', result, result)  # Fails if the check after start-up is removed.
    self.assertNotIn('\n', result['refused'])
    self.assertIn('did not load', result['refused'])
    self.assertIn('off loopback', result['refused'])
    self.assertEqual(result['left'], [])

  def test_only_the_explicit_opt_in_runs_a_worker_on_every_interface(self):
    _needs_namespaces()
    out = subprocess.run(testutil.in_own_network([_python(), '-c', _OPT_IN]),
                         cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=180)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    result, addresses = json.loads(out.stdout.splitlines()[-1])
    self.assertEqual(result, 6)
    self.assertTrue(any(not loopback.is_loopback(h) for h, _ in addresses), addresses)
    self.assertIn('as asked', out.stderr)  # and it says so

  def test_a_library_that_loads_is_accepted_on_the_same_path(self):
    if loopback.compiler() is None:
      self.skipTest('no C compiler: make setup installs gcc')
    result = self._refusal(loopback.build(os.path.join(self.tmp, 'lib')))
    self.assertIn('started', result, result)
    self.assertIn('127.0.0.1', result['started'].replace('::ffff:7f00:1', '127.0.0.1'))


if __name__ == '__main__':
  absltest.main()
