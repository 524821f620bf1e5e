"""TFF's worker with no network of its own: a user+network namespace and an owner-only Unix socket.

TFF 0.87's `worker_binary` listens on `[::]:<port>`, unauthenticated, and runs any TensorFlow
graph it is sent. Rather than narrowing where it listens, the worker is started where there is no
network to listen on: `unshare --user --net --map-root-user` (util-linux; no root needed where the
kernel allows unprivileged user namespaces, as Debian's does) gives it a network namespace whose
only interface is its own loopback. The way in is a Unix socket, mode 0600, owned by the user, in
a folder of mode 0700 (`private_folder`), forwarded to the worker's port by `netns_bridge.py`,
which runs inside the namespace. gRPC clients connect to `unix:<path>`. So:
- no TCP port of the worker is reachable from the machine, let alone the network;
- other users of the machine cannot connect (the kernel checks the socket file's permissions);
- the worker's port is picked inside the namespace, where nothing else can take it.

`available()` says whether this machine allows it (some containers forbid user namespaces); the
caller then refuses to start the worker, unless the user accepts a worker on 127.0.0.1 that every
local user can reach (tff_context's `without_namespace`, through loopback.py).
`problems(pid)` is the check on the running worker, read from the kernel (/proc and the socket
file), never assumed from how it was started.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Optional

BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'netns_bridge.py')
SOCKET_NAME = 'worker.sock'
# Set to 0 to act as if user namespaces were not allowed: the way to test that path (refused
# without the opt-in, the loopback library with it), and for machines where an administrator
# prefers it; the run's checks are the same strict ones.
DISABLE_ENV = 'TFF_DECORR_WORKER_NAMESPACE'

_available: Optional[tuple[bool, str]] = None


def _unshare() -> Optional[str]:
  return shutil.which('unshare')


def available() -> tuple[bool, str]:
  """(True, '') if a user+network namespace can be made here; else (False, why). Tried once per
  process by making one (`unshare ... true`, a few milliseconds)."""
  global _available
  if os.environ.get(DISABLE_ENV, '1') == '0':
    return False, f'{DISABLE_ENV}=0 is set'
  if _available is None:
    tool = _unshare()
    if tool is None:
      _available = (False, 'unshare (util-linux) is not on PATH')
    else:
      try:
        out = subprocess.run([tool, '--user', '--net', '--map-root-user', 'true'],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        _available = (out.returncode == 0,
                      '' if out.returncode == 0 else
                      f'unshare --user --net failed: {(out.stderr or out.stdout).strip()}')
      except (OSError, subprocess.TimeoutExpired) as e:
        _available = (False, f'unshare --user --net failed: {e}')
  return _available


def private_folder() -> str:
  """A new folder of mode 0700, owned by this user, for one worker's socket (mkdtemp: a random
  name, created exclusively)."""
  return tempfile.mkdtemp(prefix='tff_worker_')


def command(socket_path: str, worker_args: list[str], remove_folder: bool = False) -> list[str]:
  """The command that starts `worker_args` (`{port}` replaced by a port picked inside the
  namespace) in its own namespaces, served on `socket_path` (whose folder it removes at the end
  when `remove_folder`: a folder made for this socket alone)."""
  return [_unshare() or 'unshare', '--user', '--net', '--map-root-user', sys.executable, '-I',
          '-S', BRIDGE, socket_path, str(os.getpid()), '1' if remove_folder else '0', '--',
          *worker_args]


def children(pid: int) -> list[int]:
  """PIDs whose parent is `pid`, read from /proc."""
  found = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid:
      found.append(int(entry))
  return found


def interfaces(pid: int) -> list[str]:
  """The network interfaces the process `pid` sees (its namespace's), from /proc/<pid>/net/dev."""
  with open(f'/proc/{pid}/net/dev') as f:
    return [line.split(':', 1)[0].strip() for line in f.read().splitlines()[2:] if ':' in line]


def same_network(pid: int) -> bool:
  """Whether `pid` is in this process's network namespace."""
  return os.stat(f'/proc/{pid}/ns/net').st_ino == os.stat('/proc/self/ns/net').st_ino


def socket_problems(path: str) -> list[str]:
  """What is wrong with a worker's Unix socket for an owner-only service (empty: nothing): it
  must be a socket, mode 0600 or stricter, owned by this user, in a folder of mode 0700 or
  stricter owned by this user. Read with lstat (a symbolic link is refused, not followed)."""
  problems = []
  uid = os.getuid()
  folder = os.path.dirname(os.path.abspath(path))
  st = os.lstat(folder)
  if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
    problems.append(f'its folder {folder} is not a folder of mode 0700 owned by uid {uid} '
                    f'(mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid})')
  st = os.lstat(path)
  if not stat.S_ISSOCK(st.st_mode):
    problems.append(f'{path} is not a socket')
  if st.st_uid != uid or st.st_mode & 0o177:
    problems.append(f'{path} has mode {stat.S_IMODE(st.st_mode):04o} and owner {st.st_uid}, not '
                    f'0600 and uid {uid}')
  return problems


def problems(worker_pid: int, socket_path: str) -> list[str]:
  """Why the worker `worker_pid`, served on `socket_path`, could be reached by anyone but this
  user (empty: it cannot): it must be in a network namespace other than ours, with no interface
  but loopback, and its socket must pass `socket_problems`."""
  found = []
  if same_network(worker_pid):
    found.append(f'the worker (pid {worker_pid}) shares this machine\'s network namespace')
  else:
    others = [i for i in interfaces(worker_pid) if i != 'lo']
    if others:
      found.append(f'the worker\'s network namespace has interfaces {", ".join(others)}')
  return found + socket_problems(socket_path)
