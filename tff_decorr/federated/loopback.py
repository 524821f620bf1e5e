"""Keeping TFF's worker reachable from this machine only, and checking that it is.

TFF 0.87's `worker_binary` listens on `[::]:<port>` (every interface) and has no flag to change
it; its gRPC service is unauthenticated and runs any TensorFlow graph it is sent. The project
therefore starts the worker with a tiny preloaded library (`loopback_bind.c`, beside this file)
that turns its wildcard bind into a loopback bind. Nothing here needs root: LD_PRELOAD works for any
user on an ordinary (not set-uid) binary. The library is compiled once from its source with the
system C compiler (`make setup` does it, into the virtual environment; otherwise it is built on
first use into the user's cache directory) and named by the source's hash, so an edited source is
rebuilt. Where it cannot be built, the caller falls back to TFF's own behaviour and says so in one
line (`unavailable_reason`).

`listening_addresses(pid)` reads what a process really listens on from /proc, which is how the
run checks its worker after start-up and how the tests check it: a claim about sockets is verified
on the sockets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
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


def _candidate_dirs() -> list[str]:
  """Where a built library is looked for, and built when missing: the virtual environment first
  (what `make setup` fills), then the user's cache directory, then the temporary directory."""
  cache = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return [os.path.join(sys.prefix, 'lib', 'tff_decorr'), os.path.join(cache, 'tff_decorr'),
          os.path.join(tempfile.gettempdir(), f'tff_decorr-{os.getuid()}')]


def compiler() -> Optional[str]:
  return shutil.which(os.environ.get('CC', 'cc')) or shutil.which('gcc')


def build(directory: str) -> str:
  """Compiles the library into `directory` (atomically: concurrent runs may build it at once) and
  returns its path. Raises OSError or subprocess.CalledProcessError when that is impossible."""
  cc = compiler()
  if cc is None:
    raise OSError('no C compiler (cc or gcc) on PATH')
  os.makedirs(directory, mode=0o700, exist_ok=True)
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
  (then `unavailable_reason()` says why)."""
  global _cached, _reason
  if _cached is not None and os.path.exists(_cached):
    return _cached
  name = f'{_LIBRARY_NAME}-{_digest()}.so'
  dirs = _candidate_dirs()
  for d in dirs:
    if os.path.exists(os.path.join(d, name)):
      _cached = os.path.join(d, name)
      return _cached
  errors = []
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


def preload_environment(env: dict) -> bool:
  """Adds the library to `env['LD_PRELOAD']`. Returns False (env unchanged) if it is unavailable."""
  path = library()
  if path is None:
    return False
  existing = env.get('LD_PRELOAD', '')
  env['LD_PRELOAD'] = f'{path} {existing}'.strip()
  return True


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


def listening_addresses(pid: int) -> list[tuple[str, int]]:
  """(host, port) of every TCP socket the process `pid` holds in the LISTEN state."""
  inodes = _socket_inodes(pid)
  found = []
  for table in ('tcp', 'tcp6'):
    try:
      with open(f'/proc/{pid}/net/{table}') as f:
        rows = f.read().splitlines()[1:]
    except FileNotFoundError:
      continue  # No IPv6 in this kernel.
    for row in rows:
      fields = row.split()
      if fields[3] == '0A' and fields[9] in inodes:  # 0A: TCP_LISTEN
        found.append(_decode(fields[1]))
  return found


def is_loopback(host: str) -> bool:
  address = ipaddress.ip_address(host)
  if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
    address = address.ipv4_mapped
  return address.is_loopback


def exposed_addresses(pid: int) -> list[str]:
  """The process's listening addresses that are not on loopback ('host:port'; empty: none)."""
  return [f'{h}:{p}' for h, p in listening_addresses(pid) if not is_loopback(h)]


if __name__ == '__main__':
  # `python -m tff_decorr.federated.loopback`: build into the virtual environment (make setup);
  # nothing to do when the current source's library is there.
  venv_dir = _candidate_dirs()[0]
  built = os.path.join(venv_dir, f'{_LIBRARY_NAME}-{_digest()}.so')
  print(built if os.path.exists(built) else build(venv_dir))
