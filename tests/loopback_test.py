"""tff_decorr/worker/loopback.py and the worker's refusals: the preloaded library turns wildcard
binds into loopback binds (checked on real sockets, read back by the kernel and by psutil), the
/proc reader agrees with psutil, a library is trusted by the owner and mode of its file and of
every folder up to / (wherever the checkout lives), a worker without a network namespace is
refused unless the user accepts the exposure, and on that path the library is proven on a canary
before the worker starts: a poller on the machine's outside address never reaches a worker given a
corrupt library or a hostile LD_PRELOAD. Every test that opens a wildcard socket does it in a
network namespace of its own. The isolated worker itself is checked in tff_context_test and
remote_workers_test."""

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
from tff_decorr.worker import loopback

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


class LoopbackLibraryTest(testutil.ClassTempDir, absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if loopback.compiler() is None:
      raise absltest.SkipTest('no C compiler: make setup installs gcc')
    cls.library = loopback.build(cls.tmp)

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
    self.assertEqual(loopback.build(self.tmp), self.library)
    self.assertTrue(os.path.basename(self.library).startswith('tff_decorr_loopback_bind-'))


# Run inside a network namespace of its own (testutil.in_own_network): listens on 127.0.0.1 and
# on 0.0.0.0 (which then exists only in that namespace), and prints what the project's /proc
# reader and psutil say.
_LISTENERS = textwrap.dedent('''
    import json, os, socket, sys
    import psutil
    from tff_decorr.worker import loopback
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

# Run inside a network namespace of its own (stdlib only): prints where the canary says a
# wildcard bind lands for a good library (argv[1]), a corrupt one (argv[2]), and the good one
# followed by a hostile one (argv[3]) that binds every address to the wildcard.
_CANARIES = textwrap.dedent("""
    import json, os, sys
    from tff_decorr.worker import loopback
    good, corrupt, hostile = sys.argv[1:4]
    binary = sys.argv[4]
    env = dict(os.environ)
    print(json.dumps([loopback.canary_problems(binary, dict(env, LD_PRELOAD=good), good),
                      loopback.canary_problems(binary, dict(env, LD_PRELOAD=corrupt), corrupt),
                      loopback.canary_problems(binary, dict(env, LD_PRELOAD=f'{good} {hostile}'),
                                               good)]))
""")

# A library a user's LD_PRELOAD could hold: every IPv4 or IPv6 bind goes to the wildcard. After
# the loopback library in LD_PRELOAD, it undoes it (the loopback library's RTLD_NEXT is this bind).
_HOSTILE_C = textwrap.dedent("""
    #define _GNU_SOURCE
    #include <dlfcn.h>
    #include <netinet/in.h>
    #include <string.h>
    #include <sys/socket.h>
    int bind(int fd, const struct sockaddr *addr, socklen_t len) {
      int (*real)(int, const struct sockaddr *, socklen_t) = dlsym(RTLD_NEXT, "bind");
      if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        return real(fd, (const struct sockaddr *)&a, sizeof a);
      }
      if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        a.sin6_addr = in6addr_any;
        return real(fd, (const struct sockaddr *)&a, sizeof a);
      }
      return real(fd, addr, len);
    }
""")

# Runs inside a network namespace of its own (stdlib only). Gives the namespace an outside
# address (argv[1]) on a veth interface, as a machine's network card, and polls it throughout: every
# few milliseconds it reads the namespace's listening TCP ports from /proc/net/tcp{,6} and tries
# to connect to each on the outside address. First a control (a socket on the wildcard must be
# reached), then the child argv[3:] (env: argv[2], JSON) runs in phases: each `PHASE name` line it
# prints is answered on its stdin once the poller counts for that phase; a `WAIT` line is answered
# once the poller has connected in the phase, or after 60 s. Prints what the poller tried and
# reached in each phase, and the child's last line.
_ORCHESTRATOR = textwrap.dedent("""
    import fcntl, json, os, shutil, socket, struct, subprocess, sys, threading, time
    outside, env, child = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    if shutil.which('ip'):
      for cmd in (['link', 'add', 'outside0', 'type', 'veth', 'peer', 'name', 'peer0'],
                  ['addr', 'add', outside + '/24', 'dev', 'outside0'],
                  ['link', 'set', 'peer0', 'up'], ['link', 'set', 'outside0', 'up']):
        subprocess.run(['ip', *cmd], check=True)
    else:  # Without iproute2: the address as an alias of lo (SIOCSIFADDR), off loopback all the same.
      request = struct.pack('16sH2s4s8x', b'lo:1', socket.AF_INET, b'', socket.inet_aton(outside))
      with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8916, request)
    phase, tried, reached, scans = ['control'], {}, {}, {}
    def ports():
      found = set()
      for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
          with open(table) as f:
            rows = f.read().splitlines()[1:]
        except FileNotFoundError:
          continue
        found |= {int(r.split()[1].rsplit(':', 1)[1], 16) for r in rows if r.split()[3] == '0A'}
      return found
    def poll():
      while True:
        now = phase[0]
        for port in ports():
          tried.setdefault(now, set()).add(port)
          s = socket.socket()
          s.settimeout(1.0)
          try:
            s.connect((outside, port))
            reached.setdefault(now, set()).add(port)
          except OSError:
            pass
          finally:
            s.close()
        scans[now] = scans.get(now, 0) + 1
        time.sleep(0.003)
    threading.Thread(target=poll, daemon=True).start()
    control = socket.socket()
    control.bind(('0.0.0.0', 0))
    control.listen(1)
    deadline = time.monotonic() + 30
    while not reached.get('control') and time.monotonic() < deadline:
      time.sleep(0.01)
    control.close()
    proc = subprocess.Popen(child, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, **env))
    last = ''
    for line in proc.stdout:
      last = line.strip() or last
      if line.startswith('PHASE '):
        time.sleep(0.05)  # A scan begun in the last phase ends before the next one counts.
        phase[0] = line.split()[1]
        scans[phase[0]] = 0
        while scans[phase[0]] < 2:  # Counts once two scans began in this phase.
          time.sleep(0.005)
        proc.stdin.write('\\n')
        proc.stdin.flush()
      elif line.startswith('WAIT'):
        deadline = time.monotonic() + 60
        while not reached.get(phase[0]) and time.monotonic() < deadline:
          time.sleep(0.01)
        proc.stdin.write('\\n')
        proc.stdin.flush()
    proc.wait()
    print(json.dumps({'tried': {k: sorted(v) for k, v in tried.items()},
                      'reached': {k: sorted(v) for k, v in reached.items()},
                      'scans': scans, 'child_exit': proc.returncode, 'child': last}))
""")

# The child of _ORCHESTRATOR, with TFF_DECORR_WORKER_NAMESPACE=0 and the hostile library in its
# own LD_PRELOAD, as a user's environment would have it. argv[1]: a corrupt library; argv[2]: a
# good one. Phases: the corrupt library (refused), the good one (the hostile LD_PRELOAD must not
# reach the worker), and a worker asked to listen on every interface (the control: reached).
_PHASES = textwrap.dedent("""
    import json, sys
    from tff_decorr.worker import loopback, tff_context
    def phase(name):
      print('PHASE', name, flush=True)
      sys.stdin.readline()
    out = {}
    for name, path in (('corrupt', sys.argv[1]), ('hostile', sys.argv[2])):
      phase(name)
      loopback.library = lambda: path
      try:
        worker = tff_context.WorkerProcess(without_namespace=True)
      except tff_context.WorkerExposedError as e:
        # warned: whether the 'listens on 127.0.0.1 (checked...)' warning was logged.
        out[name] = {'refused': str(e), 'left': tff_context.worker_pids(),
                     'warned': tff_context._fallback_said}
        continue
      with open(f'/proc/{worker.binary_pid}/environ', 'rb') as f:
        loader = [v.decode() for v in f.read().split(b'\\0') if v.startswith(b'LD_')]
      out[name] = {'started': worker.listening(), 'problems': worker.problems(),
                   'loader_environment': loader, 'warned': tff_context._fallback_said}
      print('WAIT', flush=True)  # The poller gets its chance at the running worker too.
      sys.stdin.readline()
      worker.stop()
    phase('everywhere')
    worker = tff_context.WorkerProcess(listen_all=True)
    print('WAIT', flush=True)
    sys.stdin.readline()
    worker.stop()
    phase('done')
    print(json.dumps(out))
""")


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
  """A folder is trusted when no other user can replace it or a folder on its path: each one is
  this user's or root's and not writable by group or others, a sticky folder (as /tmp) excepted
  above the library's own folder. So a checkout under the temp folder is trusted, and a
  group-writable folder anywhere on the path is not. The trees' modes are set here."""

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix='loopback_folders_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def _tree(self, *modes, name='d'):
    """Nested folders `name`0/`name`1/... under self.tmp with these modes, outermost first; the
    innermost's path."""
    path = self.tmp
    for i, mode in enumerate(modes):
      path = os.path.join(path, f'{name}{i}')
      os.mkdir(path)
      os.chmod(path, mode)
    return path

  def test_the_venv_and_the_users_cache_are_searched(self):
    self.assertEqual(loopback._candidate_dirs(),  # pylint: disable=protected-access
                     [os.path.join(sys.prefix, 'lib', 'tff_decorr'), loopback.cache_dir()])
    self.assertTrue(loopback.cache_dir().startswith(os.path.expanduser('~')) or
                    'XDG_CACHE_HOME' in os.environ)

  def test_a_checkout_in_a_sticky_shared_folder_is_trusted_and_its_library_used(self):
    # d0 plays /tmp (1777: anyone may create, only an entry's owner may replace it); below it, a
    # checkout's .venv/lib/tff_decorr, the user's and writable by the user alone.
    venv_lib = self._tree(0o1777, 0o755, 0o755, 0o755, 0o700)
    self.assertIsNone(loopback.folder_untrusted_reason(venv_lib))
    if loopback.compiler() is None:
      return
    for name, value in (('venv_dir', lambda: venv_lib), ('_cached', None), ('_reason', None),
                        ('cache_dir', lambda: os.path.join(self.tmp, 'no-cache'))):
      self.addCleanup(setattr, loopback, name, getattr(loopback, name))
      setattr(loopback, name, value)
    built = loopback.library()
    self.assertEqual(os.path.dirname(built), venv_lib, loopback.unavailable_reason())
    self.assertIsNone(loopback.untrusted_reason(built))
    loopback._cached = None  # pylint: disable=protected-access
    self.assertEqual(loopback.library(), built)  # found again, not rebuilt elsewhere

  def test_a_group_writable_folder_on_the_path_is_refused(self):
    venv_lib = self._tree(0o1777, 0o775, 0o755, 0o700)
    why = loopback.folder_untrusted_reason(venv_lib)
    self.assertIsNotNone(why)
    self.assertIn(f'{self.tmp}/d0/d1 is writable by other users (mode 0775)', why)
    library = os.path.join(venv_lib, 'lib.so')
    with open(library, 'wb') as f:
      f.write(b'x')
    os.chmod(library, 0o755)
    self.assertIn('d0/d1 is writable by other users', loopback.untrusted_reason(library))

  def test_a_shared_folder_without_the_sticky_bit_or_as_the_librarys_own_is_refused(self):
    self.assertIn('d0 is writable by other users (mode 0777)',
                  loopback.folder_untrusted_reason(self._tree(0o777, 0o755, 0o700)))
    # The sticky exception is for folders above: the library's own folder must be the user's.
    self.assertIn('e0/e1 is writable by other users (mode 1777)',
                  loopback.folder_untrusted_reason(self._tree(0o755, 0o1777, name='e')))

  def test_another_users_folder_in_a_sticky_folder_is_refused(self):
    venv_lib = self._tree(0o1777, 0o755, 0o700)
    if os.getuid() != 0:  # Only root can give a folder away; the modes' rules are tested above.
      return
    os.chown(os.path.join(self.tmp, 'd0', 'd1'), 65534, 65534)
    self.assertIn('d0/d1 is owned by uid 65534', loopback.folder_untrusted_reason(venv_lib))

  def test_symbolic_links_on_the_path_are_followed_and_their_targets_checked(self):
    good = self._tree(0o755, 0o700)
    bad = os.path.join(self.tmp, 'shared')
    os.mkdir(bad)
    os.chmod(bad, 0o777)
    os.mkdir(os.path.join(bad, 'lib'), 0o700)
    os.symlink(os.path.join(bad, 'lib'), os.path.join(self.tmp, 'to_bad'))
    os.symlink('d0/d1', os.path.join(self.tmp, 'to_good'))
    self.assertIsNone(loopback.folder_untrusted_reason(os.path.join(self.tmp, 'to_good')))
    self.assertIsNone(loopback.folder_untrusted_reason(good + '/../d1'))
    self.assertIn(f'{bad} is writable by other users',
                  loopback.folder_untrusted_reason(os.path.join(self.tmp, 'to_bad')))


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
  """No namespace, no worker, unless the user accepts the exposure; then no library, no worker."""

  def setUp(self):
    super().setUp()
    from tff_decorr.worker import netns  # pylint: disable=g-import-not-at-top
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    self.netns, self.tff_context = netns, tff_context
    self.tmp = tempfile.mkdtemp(prefix='loopback_refusal_')
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def _set(self, module, name, value):
    self.addCleanup(setattr, module, name, getattr(module, name))
    setattr(module, name, value)

  def _assert_refused_naming_the_opt_in(self, call, why):
    with self.assertRaises(self.tff_context.WorkerExposedError) as raised:
      call()
    message = str(raised.exception)
    self.assertNotIn('\n', message)
    self.assertIn(f'cannot have a network namespace of its own ({why})', message)
    self.assertIn('every user of this machine can connect', message)
    self.assertIn('--worker_without_namespace (bin/train)', message)
    self.assertIn('without_namespace=True (tff_context.install', message)
    self.assertEqual(self.tff_context.worker_pids(), [])  # nothing was started

  def test_without_a_namespace_install_and_the_worker_are_refused_naming_the_opt_in(self):
    self.addCleanup(os.environ.pop, self.netns.DISABLE_ENV, None)
    os.environ[self.netns.DISABLE_ENV] = '0'
    for call in (self.tff_context.install, self.tff_context.install_program,
                 self.tff_context.WorkerProcess):
      self._assert_refused_naming_the_opt_in(call, 'TFF_DECORR_WORKER_NAMESPACE=0 is set')
    os.environ.pop(self.netns.DISABLE_ENV)
    # Without unshare on PATH, the same (tried afresh: the answer is kept per process).
    self._set(self.netns, '_available', None)
    self.addCleanup(os.environ.__setitem__, 'PATH', os.environ['PATH'])
    os.environ['PATH'] = self.tmp
    self._assert_refused_naming_the_opt_in(self.tff_context.install,
                                           'unshare (util-linux) is not on PATH')

  def _train(self, *extra):
    out = os.path.join(self.tmp, 'run')
    return out, subprocess.run(
        [_python(), '-m', 'bin.train', '--task=digits', '--runtime=tff', '--rounds=1',
         '--num_clients=4', '--clients_per_round=2', '--regularizer=none', f'--output_dir={out}',
         f'--cache_dir={os.path.join(self.tmp, "cache")}', *extra],
        cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TFF_DECORR_WORKER_NAMESPACE='0'))

  def test_bin_train_runtime_tff_is_refused_in_one_line_before_writing_anything(self):
    out, proc = self._train()
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    (line,) = [l for l in proc.stderr.splitlines() if l.startswith('train: error:')]
    self.assertIn('refusing to start the TFF worker', line)
    self.assertIn('TFF_DECORR_WORKER_NAMESPACE=0 is set', line)
    self.assertIn('--worker_without_namespace', line)
    self.assertNotIn('Traceback', proc.stderr)
    self.assertFalse(os.path.exists(out))

  def test_bin_train_with_the_opt_in_trains_on_a_checked_loopback_worker(self):
    out, proc = self._train('--worker_without_namespace')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('round 1/1', proc.stdout)
    self.assertIn('listens on 127.0.0.1 (checked', proc.stderr)  # the exposure accepted, said
    self.assertTrue(os.path.exists(os.path.join(out, 'summary.json')))

  def test_missing_compiler_with_the_opt_in_is_refused_in_one_line(self):
    for module, name, value in ((self.netns, '_available', (False, 'not allowed in this test')),
                                (loopback, 'library', lambda: None),
                                (loopback, '_reason', 'no C compiler (cc or gcc) on PATH')):
      self._set(module, name, value)
    with self.assertRaises(self.tff_context.WorkerExposedError) as raised:
      self.tff_context.WorkerProcess(without_namespace=True)
    message = str(raised.exception)
    self.assertNotIn('\n', message)
    self.assertIn('refusing', message)
    self.assertIn('C compiler', message)  # why, and what to do
    self.assertEqual(self.tff_context.worker_pids(), [])  # nothing was started

  def test_missing_compiler_with_a_namespace_needs_no_library(self):
    if not self.netns.available()[0]:
      self.skipTest(f'no user namespaces here: {self.netns.available()[1]}')
    for name, value in (('library', lambda: None), ('_reason', 'no C compiler')):
      self._set(loopback, name, value)
    worker = self.tff_context.WorkerProcess()
    try:
      self.assertEqual(worker.isolation, 'namespace')
      self.assertEqual(worker.problems(), [])
    finally:
      worker.stop()


class WorkerEnvironmentTest(absltest.TestCase):

  def test_the_loaders_variables_are_the_librarys_alone(self):
    env = {'PATH': '/usr/bin', 'HOME': '/root', 'LD_PRELOAD': '/x/hostile.so',
           'LD_AUDIT': '/x/audit.so', 'LD_LIBRARY_PATH': '/x', 'LD_BIND_NOT': '1',
           'GLIBC_TUNABLES': 'glibc.rtld.optional_static_tls=1', 'TF_ENABLE_ONEDNN_OPTS': '1'}
    self.assertEqual(loopback.worker_environment(env, '/lib/ours.so'),
                     {'PATH': '/usr/bin', 'HOME': '/root', 'TF_ENABLE_ONEDNN_OPTS': '1',
                      'LD_PRELOAD': '/lib/ours.so'})
    self.assertEqual(loopback.worker_environment(env, None),
                     {'PATH': '/usr/bin', 'HOME': '/root', 'TF_ENABLE_ONEDNN_OPTS': '1'})

  def test_the_canary_is_started_by_the_worker_binarys_own_loader(self):
    # readelf (binutils) reads the interpreter independently of the project's ELF reader.
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    binary = tff_context.worker_binary_path()
    if shutil.which('readelf') is None:
      self.skipTest('readelf (binutils) is not installed')
    out = subprocess.run(['readelf', '-l', binary], capture_output=True, text=True, check=True)
    (line,) = [l for l in out.stdout.splitlines() if 'program interpreter' in l]
    self.assertEqual(loopback.interpreter(binary), line.split(':', 1)[1].strip(' ]'))
    self.assertIsNone(loopback.interpreter(loopback.SOURCE))  # not a program


# A program whose bind does not go through the loader: the system call itself, as a static
# binary or a hand-made one would make it. No preloaded library can reach it.
_RAW_BIND_C = textwrap.dedent("""
    #include <netinet/in.h>
    #include <sys/socket.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    int main(void) {
      struct sockaddr_in a = {0};
      a.sin_family = AF_INET;
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      return (int)syscall(SYS_bind, fd, (struct sockaddr *)&a, sizeof a);
    }
""")


class WorkerBinaryImportsTest(absltest.TestCase):

  def test_the_worker_binary_takes_bind_from_the_loader_and_a_raw_bind_is_refused(self):
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    if shutil.which('nm') is None or loopback.compiler() is None:
      self.skipTest('nm (binutils) and a C compiler are needed')
    binary = tff_context.worker_binary_path()
    # nm (binutils) lists the undefined dynamic symbols independently of the project's reader.
    out = subprocess.run(['nm', '-D', '--undefined-only', binary], capture_output=True, text=True,
                         check=True)
    expected = {l.split()[-1].split('@')[0] for l in out.stdout.splitlines() if l.strip()}
    self.assertEqual(loopback.dynamic_imports(binary), expected)
    self.assertIn('bind', expected)
    tmp = tempfile.mkdtemp(prefix='loopback_imports_')
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    with open(os.path.join(tmp, 'raw.c'), 'w') as f:
      f.write(_RAW_BIND_C)
    raw = os.path.join(tmp, 'raw')
    subprocess.run([loopback.compiler(), '-o', raw, os.path.join(tmp, 'raw.c')], check=True,
                   capture_output=True)
    self.assertNotIn('bind', loopback.dynamic_imports(raw))
    library = loopback.build(os.path.join(tmp, 'lib'))
    (problem,) = loopback.canary_problems(raw, loopback.worker_environment(os.environ, library),
                                          library)
    self.assertIn('does not take bind() from a shared library', problem)


class CanaryAndPollerTest(testutil.ClassTempDir, absltest.TestCase):
  """Never reachable, not even for an instant: the library is proven before the worker starts."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if loopback.compiler() is None:
      raise absltest.SkipTest('no C compiler: make setup installs gcc')
    cls.library = loopback.build(os.path.join(cls.tmp, 'lib'))
    cls.corrupt = os.path.join(cls.tmp, 'corrupt.so')
    with open(cls.corrupt, 'wb') as f:
      f.write(b'\x7fELF not really a shared object')
    source = os.path.join(cls.tmp, 'hostile.c')
    with open(source, 'w') as f:
      f.write(_HOSTILE_C)
    cls.hostile = os.path.join(cls.tmp, 'hostile.so')
    subprocess.run([loopback.compiler(), '-shared', '-fPIC', '-o', cls.hostile, source, '-ldl'],
                   check=True, capture_output=True)

  def test_the_canary_finds_a_corrupt_library_and_a_hostile_preload(self):
    _needs_namespaces()
    from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top
    out = subprocess.run(testutil.in_own_network(
        [_python(), '-c', _CANARIES, self.library, self.corrupt, self.hostile,
         tff_context.worker_binary_path()]), cwd=testutil.REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    good, corrupt, hostile = json.loads(out.stdout.splitlines()[-1])
    self.assertEqual(good, [])
    self.assertLen(corrupt, 2, corrupt)
    self.assertIn('did not load into a canary', corrupt[0])
    self.assertIn('cannot be preloaded', corrupt[0])  # the loader's own words
    self.assertIn('landed on ::', corrupt[1])
    self.assertEqual(len(hostile), 1, hostile)  # the library loads, and the hostile one undoes it
    self.assertIn('landed on ::', hostile[0])
    self.assertIn('off loopback', hostile[0])

  def test_a_poller_on_the_outside_address_never_reaches_the_worker(self):
    _needs_namespaces()
    env = {'TFF_DECORR_WORKER_NAMESPACE': '0', 'LD_PRELOAD': self.hostile}
    out = subprocess.run(testutil.in_own_network(
        [_python(), '-c', _ORCHESTRATOR, '10.231.0.1', json.dumps(env),
         _python(), '-c', _PHASES, self.corrupt, self.library]),
                         cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=600)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    result = json.loads(out.stdout.splitlines()[-1])
    self.assertEqual(result['child_exit'], 0, out.stderr[-3000:])
    child = json.loads(result['child'])
    tried, reached = result['tried'], result['reached']
    # The poller works: it reaches a socket on the wildcard, and a worker asked to listen there.
    self.assertNotEmpty(reached.get('control', []))
    self.assertNotEmpty(reached.get('everywhere', []), result)
    # (a) A corrupt library: refused before any worker existed; nothing listened, nothing reached.
    self.assertIn('refused', child['corrupt'], child)
    refusal = child['corrupt']['refused']
    self.assertNotIn('\n', refusal)
    self.assertIn('did not load into a canary', refusal)
    self.assertIn('Nothing was started', refusal)
    self.assertEqual(child['corrupt']['left'], [])
    self.assertFalse(child['corrupt']['warned'])  # "checked" is never said before the checks
    self.assertEqual(tried.get('corrupt', []), [])
    # (b) A hostile LD_PRELOAD in the user's environment: the worker runs with the library alone,
    # on loopback; the poller tried its port while it ran and never got in.
    self.assertIn('started', child['hostile'], child)
    self.assertEqual(child['hostile']['problems'], [])
    self.assertTrue(child['hostile']['warned'])  # said once the checks passed
    self.assertEqual(child['hostile']['loader_environment'], [f'LD_PRELOAD={self.library}'])
    self.assertNotEmpty(tried.get('hostile', []), result)
    self.assertEqual(reached.get('corrupt', []) + reached.get('hostile', []), [])
    self.assertGreater(result['scans'].get('hostile', 0), 2)


if __name__ == '__main__':
  absltest.main()
