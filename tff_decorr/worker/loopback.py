"""Keeping TFF's worker reachable from this machine only, proven before it starts and checked after.

TFF 0.87's `worker_binary` listens on `[::]:<port>` (every interface) and has no flag to change
it; its gRPC service is unauthenticated and runs any TensorFlow graph it is sent. Where the worker
cannot have a network namespace of its own (netns.py, the default), and only when the user accepts
that every local user can then connect to it (bin/train --worker_without_namespace, bin/worker
--port), the project starts the worker with a tiny preloaded library (`loopback_bind.c`, beside
this file) that turns its wildcard bind into a loopback bind. Nothing here needs root: LD_PRELOAD
works for any user on an ordinary (not set-uid) binary. The library is compiled once from its
source with the system C compiler (`make setup` does it, into the virtual environment; otherwise
it is built on first use into the user's cache folder, mode 0700). A file found there is used only
when no other user can replace it or a folder on its path (`untrusted_reason`: owner and mode of
the file and of every folder up to /, wherever the checkout lives). It is named by the source's
hash, so an edited source is rebuilt. Where it cannot be built, the worker is not started
(`unavailable_reason` says why).

Before the worker starts, `canary_problems` proves the library: the worker binary must take bind()
from a shared library (`dynamic_imports`), and a canary process, started by the worker binary's own
program interpreter (its dynamic loader) with the worker's exact environment
(`worker_environment`: the loader's variables of the user's environment removed), binds the
wildcard addresses and reports where the kernel put them; anything off loopback, or the library
not mapped into it, refuses the run before the worker exists. After start-up, `problems(pid, port,
library)` reads from /proc what the worker really listens on and whether the library is mapped
into it: a claim about sockets is verified on the sockets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import stat
import struct
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
  (what `make setup` fills), then the user's cache folder. A file in either is used only if it
  passes `untrusted_reason`, wherever the folder is (a checkout under /tmp included)."""
  return [venv_dir(), cache_dir()]


def _writable_by_others(st: os.stat_result) -> bool:
  return bool(st.st_mode & 0o022)


def _owner(st: os.stat_result) -> Optional[str]:
  """Why a file with `st` is not owned by this user or root (None: it is)."""
  uid = os.getuid()
  if st.st_uid in (uid, 0):
    return None
  return f'is owned by uid {st.st_uid}, not by this user ({uid}) or root'


def _entry_reason(path: str, folder: bool, sticky_ok: bool = False) -> Optional[str]:
  """Why the folder (or, not `folder`, the regular file) at `path` could be replaced by another
  user (None: it cannot): read with lstat, it must be of that kind (a file not a symbolic link),
  owned by this user or root, and not writable by group or others, unless `sticky_ok` and it is a
  sticky folder."""
  try:
    st = os.lstat(path)
  except OSError as e:
    return f'{path}: {e.strerror}'
  if not folder and stat.S_ISLNK(st.st_mode):
    return f'{path} is a symbolic link'
  why = _owner(st)
  if why:
    return f'{path} {why}'
  if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
    return f'{path} is not a {"folder" if folder else "regular file"}'
  if _writable_by_others(st) and not (sticky_ok and stat.S_ISDIR(st.st_mode) and
                                      st.st_mode & stat.S_ISVTX):
    return (f'{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})' +
            (': another user could replace what is below it' if folder else ''))
  return None


_MAX_LINKS = 40  # As the kernel's path walk: more symbolic links than this is a loop.


def folder_untrusted_reason(folder: str) -> Optional[str]:
  """Why a user other than this one (or root) could replace `folder` or a folder on its path,
  and so what is in it (None: nobody can).

  The path is walked from / as the kernel resolves it, symbolic links followed, and every entry
  met is read with lstat. The rule, for each one:
  - it is owned by this user or root (a symbolic link too: its owner may replace it in a sticky
    folder);
  - it is not writable by group or others, unless it is a sticky folder (mode +t, as /tmp) that
    is not `folder` itself: in a sticky folder only an entry's owner, the folder's owner and root
    can rename or remove the entry, and the next entry's owner is checked in turn. So a checkout
    cloned under /tmp is trusted when its own folders are the user's and not writable by others;
    a group-writable folder anywhere on the path is refused (its group could swap what is below
    it), and so is a folder of another user.
  Access control lists are not read: a folder given to others by an ACL alone is not seen.
  """
  # Not os.path.abspath: it removes '..' by the text, and the kernel resolves it after links.
  absolute = folder if folder.startswith('/') else os.path.join(os.getcwd(), folder)
  pending = [p for p in absolute.split('/') if p]
  current, links = '/', 0
  why = _entry_reason(current, folder=True, sticky_ok=True)
  while pending and not why:
    name = pending.pop(0)
    if name in ('.', '..'):  # Back to a folder checked on the way down.
      current = os.path.dirname(current) if name == '..' else current
      continue
    path = os.path.join(current, name)
    try:
      st = os.lstat(path)
    except OSError as e:
      return f'{path}: {e.strerror}'
    if stat.S_ISLNK(st.st_mode):  # Followed as the kernel does; the link's owner is checked.
      why = _owner(st)
      if why:
        return f'{path} {why}'
      links += 1
      if links > _MAX_LINKS:
        return f'{folder}: too many levels of symbolic links'
      target = os.readlink(path)
      current = '/' if target.startswith('/') else current
      pending = [p for p in target.split('/') if p] + pending
      continue
    why = _entry_reason(path, folder=True, sticky_ok=True)
    current = path
  # The folder itself, however it was reached, with no exemption for a sticky folder.
  return why or _entry_reason(current, folder=True)


def untrusted_reason(path: str) -> Optional[str]:
  """Why the library file at `path` cannot be trusted (None: it can): it must be a regular file
  (not a symbolic link), owned by this user or root, writable by its owner only, in a folder that
  passes `folder_untrusted_reason` (owner and mode of every folder up to /). Read with lstat,
  before anything is loaded."""
  return _entry_reason(path, folder=False) or folder_untrusted_reason(os.path.dirname(path))


def _private_dir(directory: str) -> None:
  """Creates `directory` with mode 0700, or checks an existing one: owned by this user, and made
  0700 if it was only readable by others; every folder above it must pass
  `folder_untrusted_reason`. Raises OSError when it cannot be trusted."""
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
  why = folder_untrusted_reason(directory)
  if why:
    raise OSError(why)


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


# The dynamic loader's variables. They decide what is loaded into the worker and how its calls
# bind, so none comes from the user's environment: LD_PRELOAD (a library whose bind() runs before
# ours, or after ours through RTLD_NEXT, and binds the wildcard again), LD_AUDIT (an audit module
# may redirect any symbol binding), LD_LIBRARY_PATH (another libc, whose bind() ours would call),
# and every other LD_* (LD_BIND_NOT, LD_DYNAMIC_WEAK, LD_ORIGIN_PATH, LD_PROFILE, LD_DEBUG, ...)
# and GLIBC_TUNABLES (which tunes the loader too). worker_binary needs none of them: it links only
# system libraries (libc, libm, libstdc++, libgcc_s). /etc/ld.so.preload is root's, trusted as libc.
def _loader_variable(name: str) -> bool:
  return name.startswith('LD_') or name == 'GLIBC_TUNABLES'


def worker_environment(env: dict, library_path: Optional[str]) -> dict:
  """`env` without the dynamic loader's variables, plus LD_PRELOAD=`library_path` when given:
  the environment the worker (and the canary that proves the library) is started with."""
  clean = {k: v for k, v in env.items() if not _loader_variable(k)}
  if library_path is not None:
    clean['LD_PRELOAD'] = library_path
  return clean


def interpreter(binary: str) -> Optional[str]:
  """The program interpreter (dynamic loader) an ELF executable names (PT_INTERP), e.g.
  /lib64/ld-linux-x86-64.so.2; None for a file that is not a dynamically linked ELF program."""
  with open(binary, 'rb') as f:
    head = f.read(64)
    if len(head) < 52 or head[:4] != b'\x7fELF' or head[4] not in (1, 2) or head[5] not in (1, 2):
      return None
    wide, order = head[4] == 2, '<' if head[5] == 1 else '>'
    if wide:
      (phoff,), (phentsize, phnum) = (struct.unpack_from(order + 'Q', head, 32),
                                      struct.unpack_from(order + 'HH', head, 54))
    else:
      (phoff,), (phentsize, phnum) = (struct.unpack_from(order + 'I', head, 28),
                                      struct.unpack_from(order + 'HH', head, 42))
    for i in range(phnum):
      f.seek(phoff + i * phentsize)
      header = f.read(phentsize)
      if struct.unpack_from(order + 'I', header, 0)[0] != 3:  # PT_INTERP
        continue
      offset, size = (struct.unpack_from(order + 'QQQQ', header, 8)[::3] if wide else
                      struct.unpack_from(order + 'IIII', header, 4)[::3])
      f.seek(offset)
      return f.read(size).split(b'\0', 1)[0].decode()
  return None


def dynamic_imports(binary: str) -> Optional[set[str]]:
  """The names of the functions and objects an ELF file takes from shared libraries (undefined
  symbols of its .dynsym section): the calls the dynamic loader binds, and so the ones a preloaded
  library can take over. None when they cannot be read (not ELF, no section headers)."""
  with open(binary, 'rb') as f:
    head = f.read(64)
    if len(head) < 52 or head[:4] != b'\x7fELF' or head[4] not in (1, 2) or head[5] not in (1, 2):
      return None
    wide, order = head[4] == 2, '<' if head[5] == 1 else '>'
    shoff, shentsize, shnum = (
        (struct.unpack_from(order + 'Q', head, 40)[0], *struct.unpack_from(order + 'HH', head, 58))
        if wide else
        (struct.unpack_from(order + 'I', head, 32)[0], *struct.unpack_from(order + 'HH', head, 46)))
    if not shoff or not shnum:
      return None
    sections = []  # (type, offset, size, link) of each section header
    for i in range(shnum):
      f.seek(shoff + i * shentsize)
      header = f.read(shentsize)
      if wide:
        kind, offset, size, link = (struct.unpack_from(order + 'I', header, 4)[0],
                                    *struct.unpack_from(order + 'QQI', header, 24))
      else:
        kind, offset, size, link = (struct.unpack_from(order + 'I', header, 4)[0],
                                    *struct.unpack_from(order + 'III', header, 16))
      sections.append((kind, offset, size, link))
    dynsym = [x for x in sections if x[0] == 11]  # SHT_DYNSYM
    if not dynsym or dynsym[0][3] >= len(sections):
      return None
    _, offset, size, link = dynsym[0]
    f.seek(offset)
    symbols = f.read(size)
    f.seek(sections[link][1])
    names = f.read(sections[link][2])
  entry, layout = (24, order + 'I2xH') if wide else (16, order + 'I10xH')
  imports = set()
  for start in range(entry, len(symbols) - entry + 1, entry):  # Entry 0 is the null symbol.
    name, section = struct.unpack_from(layout, symbols, start)
    if section == 0:  # SHN_UNDEF: defined elsewhere, bound by the loader.
      imports.add(names[name:names.index(b'\0', name)].decode(errors='replace'))
  return imports


# The canary: reports whether the library (argv[1]) is mapped into it and where the kernel put
# its binds of the wildcard addresses, as gRPC makes them (IPv6 dual-stack, and IPv4). Its
# sockets are bound, never listening: nothing can connect to them, wherever they landed.
_CANARY = """
import json, socket, sys
with open('/proc/self/maps') as f:
  mapped = any(line.rstrip().endswith(' ' + sys.argv[1]) for line in f)
bound = []
for family, host in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
  try:
    s = socket.socket(family, socket.SOCK_STREAM)
  except OSError:
    continue  # No IPv6 in this kernel: gRPC then binds IPv4 only.
  with s:
    if family == socket.AF_INET6:
      s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind((host, 0))
    bound.append(s.getsockname()[0])
print(json.dumps({'mapped': mapped, 'bound': bound}))
"""


def canary_problems(binary: str, env: dict, library_path: str) -> list[str]:
  """Why the library would not keep `binary` on loopback (empty: it would), found before the
  binary runs: `binary` must take bind() from a shared library (`dynamic_imports`: its binds go
  through the loader), and a canary process, started by `binary`'s own program interpreter (the
  same loader), with `env` (the worker's environment, LD_PRELOAD included), binds the wildcard
  addresses, and reports where they landed; each must be loopback, and the library must be mapped
  into it (a library the loader skips, corrupt or of another architecture, is not)."""
  loader = interpreter(binary)
  if loader is None:
    return [f'{binary} is not a dynamically linked program: no preloaded library can reach it']
  if 'bind' not in (dynamic_imports(binary) or ()):
    # Its binds would not go through the loader, so neither through the library.
    return [f'{binary} does not take bind() from a shared library: the library cannot reach it']
  python = os.path.realpath(sys.executable)
  library_path = os.path.realpath(library_path)
  try:
    out = subprocess.run([loader, python, '-I', '-S', '-c', _CANARY, library_path], env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
  except (OSError, subprocess.TimeoutExpired) as e:
    return [f'the canary ({loader} {python}) did not run: {e}']
  said = ' | '.join(l.strip() for l in out.stderr.splitlines() if l.strip())[-600:]
  try:
    result = json.loads(out.stdout.strip().splitlines()[-1])
  except (IndexError, ValueError):
    return [f'the canary ({loader} {python}) failed (exit {out.returncode}): {said or "no output"}']
  found = []
  if not result['mapped']:
    found.append(f'the loopback library {library_path} did not load into a canary started as the '
                 f'worker would be{f" ({said})" if said else ""}')
  exposed = [h for h in result['bound'] if not is_loopback(h)]
  if exposed or not result['bound']:
    found.append(f'the canary\'s wildcard binds landed on {", ".join(exposed) or "nothing"}, '
                 'off loopback')
  return found


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
  # `python -m tff_decorr.worker.loopback`: build into the virtual environment (make setup);
  # nothing to do when the current source's library is there.
  venv_dir = _candidate_dirs()[0]
  built = os.path.join(venv_dir, f'{_LIBRARY_NAME}-{_digest()}.so')
  print(built if os.path.exists(built) else build(venv_dir))
