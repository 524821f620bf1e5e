"""Keeping TFF's worker reachable from this machine only, and checking that it is.

TFF 0.87's `worker_binary` listens on `[::]:<port>` (every interface) and has no flag to change
it; its gRPC service is unauthenticated and runs any TensorFlow graph it is sent. The project
therefore starts the worker with a tiny preloaded library (`loopback_bind.c`, beside this file)
that turns its wildcard bind into a loopback bind. Nothing here needs root: LD_PRELOAD works for any
user on an ordinary (not set-uid) binary. The library is compiled once from its source with the
system C compiler (`make setup` does it, into the virtual environment; otherwise it is built on
first use into the user's cache folder, mode 0700). A file found there is used only when it and
its folder belong to the user (or root) and nobody else can write them; no shared folder such as
/tmp is ever searched, where another user could plant the file first. It is named by the
source's hash, so an edited source is rebuilt. Where it cannot be built, the worker is not started
(`unavailable_reason` says why), unless the user asked for an exposed worker.

This is the fallback for machines without user namespaces (netns.py is the first choice: there
the worker has no network at all). `problems(pid, port, library)` reads from /proc what the
worker really listens on and whether the library is mapped into it; the run refuses to send a
computation to a worker with any problem: a claim about sockets is verified on the sockets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Optional

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'loopback_bind.c')
_LIBRARY_NAME = 'tff_decorr_loopback_bind'

_cached: Optional[str] = None
_reason: Optional[str] = None


def _digest() -> str:
  with open(SOURCE, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def venv_dir() -> str:
  """Where `make setup` builds the library: inside the virtual environment that runs us."""
  return os.path.join(sys.prefix, 'lib', 'tff_decorr')


def cache_dir() -> str:
  """The user's own folder for a library built on first use (mode 0700, checked before use)."""
  cache = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(cache, 'tff_decorr', 'loopback')


def _candidate_dirs() -> list[str]:
  """Where a built library is looked for, and built when missing: the virtual environment first
  (what `make setup` fills), then the user's cache folder. Never a shared folder such as /tmp,
  where another user could create the file first."""
  return [venv_dir(), cache_dir()]


def _writable_by_others(st: os.stat_result) -> bool:
  return bool(st.st_mode & 0o022)


def untrusted_reason(path: str) -> Optional[str]:
  """Why the library file or folder at `path` cannot be trusted (None: it can): it must be a
  regular file or a folder (not a symbolic link), owned by this user or root, writable by its
  owner only; so must the folder holding it. Read with lstat, before anything is loaded."""
  uid = os.getuid()
  for p in (path, os.path.dirname(path)):
    try:
      st = os.lstat(p)
    except OSError as e:
      return f'{p}: {e.strerror}'
    if stat.S_ISLNK(st.st_mode):
      return f'{p} is a symbolic link'
    if st.st_uid not in (uid, 0):
      return f'{p} is owned by uid {st.st_uid}, not by this user ({uid}) or root'
    if _writable_by_others(st):
      return f'{p} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})'
  return None


def _private_dir(directory: str) -> None:
  """Creates `directory` with mode 0700, or checks an existing one: owned by this user, and made
  0700 if it was only readable by others. Raises OSError when it cannot be trusted."""
  os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
  try:
    os.mkdir(directory, 0o700)
  except FileExistsError:
    pass
  st = os.lstat(directory)
  if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or _writable_by_others(st):
    raise OSError(f'{directory} is not a folder owned by this user and writable by it alone '
                  f'(mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid})')
  if st.st_mode & 0o077:
    os.chmod(directory, 0o700)
  parent = os.lstat(os.path.dirname(directory))
  if parent.st_uid not in (os.getuid(), 0) or (_writable_by_others(parent) and
                                               not parent.st_mode & stat.S_ISVTX):
    # A sticky folder (/tmp) lets nobody else rename or remove what we made in it.
    raise OSError(f'{os.path.dirname(directory)} can be written by other users')


def compiler() -> Optional[str]:
  return shutil.which(os.environ.get('CC', 'cc')) or shutil.which('gcc')


def build(directory: str) -> str:
  """Compiles the library into `directory` (mode 0700, checked; atomically: concurrent runs may
  build it at once) and returns its path. Raises OSError or subprocess.CalledProcessError when
  that is impossible."""
  cc = compiler()
  if cc is None:
    raise OSError('no C compiler (cc or gcc) on PATH')
  _private_dir(directory)
  target = os.path.join(directory, f'{_LIBRARY_NAME}-{_digest()}.so')
  fd, partial = tempfile.mkstemp(dir=directory, prefix=f'.{_LIBRARY_NAME}-', suffix='.so')
  os.close(fd)
  try:
    subprocess.run([cc, '-shared', '-fPIC', '-O2', '-o', partial, SOURCE, '-ldl'], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.chmod(partial, 0o755)
    os.replace(partial, target)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return target


def library() -> Optional[str]:
  """The path of the built preload library, building it if needed; None if it cannot be had
  (then `unavailable_reason()` says why). A file found where it should be is used only if it and
  its folder pass `untrusted_reason`."""
  global _cached, _reason
  if _cached is not None and os.path.exists(_cached) and untrusted_reason(_cached) is None:
    return _cached
  name = f'{_LIBRARY_NAME}-{_digest()}.so'
  dirs = _candidate_dirs()
  errors = []
  for d in dirs:
    path = os.path.join(d, name)
    if os.path.lexists(path):
      why = untrusted_reason(path)
      if why is None:
        _cached = path
        return _cached
      errors.append(f'not using {path}: {why}')
  for d in dirs:
    try:
      _cached = build(d)
      return _cached
    except (OSError, subprocess.CalledProcessError) as e:
      detail = getattr(e, 'output', b'') or b''
      errors.append(f'{d}: {e}{(" " + detail.decode(errors="replace").strip()) if detail else ""}')
      if compiler() is None:
        break
  _reason = '; '.join(errors) or 'unknown'
  return None


def unavailable_reason() -> str:
  return _reason or ''


def _socket_inodes(pid: int) -> set[str]:
  inodes = set()
  fd_dir = f'/proc/{pid}/fd'
  for fd in os.listdir(fd_dir):
    try:
      target = os.readlink(os.path.join(fd_dir, fd))
    except OSError:
      continue  # Closed between listdir and readlink.
    if target.startswith('socket:['):
      inodes.add(target[len('socket:['):-1])
  return inodes


def _decode(hex_address: str) -> tuple[str, int]:
  """/proc/net/tcp{,6} local addresses: host bytes in 32-bit little-endian words, then the port."""
  host_hex, port_hex = hex_address.split(':')
  raw = bytes.fromhex(host_hex)
  host = b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
  return str(ipaddress.ip_address(host)), int(port_hex, 16)


def _listening_rows(pid: int):
  """(host, port, inode) of every TCP socket in the LISTEN state in `pid`'s network namespace."""
  for table in ('tcp', 'tcp6'):
    try:
      with open(f'/proc/{pid}/net/{table}') as f:
        rows = f.read().splitlines()[1:]
    except FileNotFoundError:
      continue  # No IPv6 in this kernel.
    for row in rows:
      fields = row.split()
      if fields[3] == '0A':  # 0A: TCP_LISTEN
        yield (*_decode(fields[1]), fields[9])


def shared_port(pid: int, port: int) -> bool:
  """Whether a socket that is not `pid`'s listens on `port` too. gRPC sets SO_REUSEPORT, so two
  workers of one user started on the same port both start, and the kernel splits connections
  between them: the port is taken, although our worker did not fail."""
  inodes = _socket_inodes(pid)
  return any(p == port and inode not in inodes for _, p, inode in _listening_rows(pid))


def listening_addresses(pid: int) -> list[tuple[str, int]]:
  """(host, port) of every TCP socket the process `pid` holds in the LISTEN state."""
  inodes = _socket_inodes(pid)
  return [(host, port) for host, port, inode in _listening_rows(pid) if inode in inodes]


def is_loopback(host: str) -> bool:
  address = ipaddress.ip_address(host)
  if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
    address = address.ipv4_mapped
  return address.is_loopback


def exposed_addresses(pid: int) -> list[str]:
  """The process's listening addresses that are not on loopback ('host:port'; empty: none)."""
  return [f'{h}:{p}' for h, p in listening_addresses(pid) if not is_loopback(h)]


def mapped(pid: int, path: str) -> bool:
  """Whether the file at `path` is mapped into the process `pid` (/proc/<pid>/maps): a preloaded
  library the loader skipped (it did not load: corrupt, wrong architecture, a noexec folder)
  is not, and the loader's complaint went only to the process's own output."""
  real = os.path.realpath(path)
  with open(f'/proc/{pid}/maps') as f:
    return any(line.rstrip().endswith(' ' + real) for line in f)


def problems(pid: int, port: int, library_path: Optional[str]) -> list[str]:
  """Why the worker `pid` started for `port` is not a worker reachable from this machine only
  (empty: it is), read from the kernel: the preload library must be mapped into it, it must
  listen on `port` (or another process holds the port and answers in its place), and nothing it
  listens on may be off loopback."""
  found = []
  if library_path is not None and not mapped(pid, library_path):
    found.append(f'the loopback library {library_path} did not load into the worker (see its log)')
  addresses = listening_addresses(pid)
  if port not in [p for _, p in addresses]:
    found.append(f'the worker (pid {pid}) does not listen on port {port}')
  exposed = [f'{h}:{p}' for h, p in addresses if not is_loopback(h)]
  if exposed:
    found.append(f'the worker listens on {", ".join(exposed)}, off loopback')
  if shared_port(pid, port):
    found.append(f'another process listens on port {port} too')
  return found


if __name__ == '__main__':
  # `python -m tff_decorr.federated.loopback`: build into the virtual environment (make setup);
  # nothing to do when the current source's library is there.
  venv_dir = _candidate_dirs()[0]
  built = os.path.join(venv_dir, f'{_LIBRARY_NAME}-{_digest()}.so')
  print(built if os.path.exists(built) else build(venv_dir))
