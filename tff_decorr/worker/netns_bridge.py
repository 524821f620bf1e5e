"""Runs TFF's worker in a network namespace of its own and serves it on an owner-only Unix socket.

Started by `netns.command(...)` as `unshare --user --net --map-root-user python -I -S
netns_bridge.py SOCKET PARENT_PID REMOVE_FOLDER -- worker_binary --port={port} ...`, this file runs
*inside* the new namespaces, with the standard library only (it is run as a script, by path, so that
nothing of the project or of site-packages is imported in there). Why each step:

- The namespace has one interface, `lo`, and it starts down: it is brought up here (an ioctl, as
  `ip link set lo up` does), so the worker can listen on it. Nothing else exists in the namespace,
  so a worker listening on TFF's wildcard `[::]` is reachable from nowhere but this namespace, and
  a port picked here cannot collide with anything (no other process has sockets in it).
- The Unix socket is the only way in: it is created with mode 0600 (umask 0177 before bind, then
  checked), owned by the user who started the run (the namespace's root maps to that user), in a
  folder of mode 0700 the caller made. A Unix socket's path is a file, not a network address, so
  the caller outside the namespace can connect to it while nobody else can.
- Each connection to the Unix socket is forwarded to the worker's port, byte for byte, by two
  threads (one per direction) that splice(2) the bytes from socket to socket inside the kernel.
  gRPC opens one connection per channel, so there are few of them.
- The worker dies with this process (PR_SET_PDEATHSIG), and this process is sent SIGTERM when its
  parent dies (set here and checked against PARENT_PID: the parent may be gone already). SIGTERM
  or SIGINT is passed to the worker as SIGINT (how TFF's worker stops cleanly; SIGKILL 5 s later
  if it has not); when the worker exits, the socket is removed, and its folder when
  REMOVE_FOLDER is 1 (the parent made it for this socket), and this process exits with the
  worker's status.
"""

import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = '16sH22x'  # struct ifreq on Linux: the name, then the flags in a 24-byte union.
_BUFFER = 1 << 20
_F_SETPIPE_SZ = 1031
_READY_TIMEOUT = 120.0
_CLOSE_LOCK = threading.Lock()


def _die_with(signum: int) -> None:
  libc = ctypes.CDLL('libc.so.6', use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


def loopback_up() -> None:
  """Sets IFF_UP on `lo` (the namespace's only interface)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack(_IFREQ, b'lo', 0)
    flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b'lo', flags | _IFF_UP))


def free_port() -> int:
  """A port on the namespace's loopback. Nothing else lives in this namespace: it stays free."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _pump(source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
  """Moves bytes from `source` to `sink` until `source` ends. splice(2) through a pipe: the bytes
  go from one socket's buffer to the other's inside the kernel, never copied into Python."""
  pipe_r, pipe_w = os.pipe()
  try:
    fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, _BUFFER)
  except OSError:
    pass  # The default pipe size (64 KiB) works too, in more calls.
  try:
    while True:
      n = os.splice(source.fileno(), pipe_w, _BUFFER)
      if not n:
        break
      while n:
        n -= os.splice(pipe_r, sink.fileno(), n)
  except OSError:
    pass
  finally:
    os.close(pipe_r)
    os.close(pipe_w)
    try:
      sink.shutdown(socket.SHUT_WR)
    except OSError:
      pass
    with _CLOSE_LOCK:
      if done.is_set():  # The other direction has finished too: nothing uses either socket now.
        source.close()
        sink.close()
      done.set()


def _forward(client: socket.socket, port: int) -> None:
  try:
    upstream = socket.create_connection(('127.0.0.1', port))
  except OSError:
    client.close()
    return
  upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  done = threading.Event()
  threading.Thread(target=_pump, args=(client, upstream, done), daemon=True).start()
  threading.Thread(target=_pump, args=(upstream, client, done), daemon=True).start()


def _serve(listener: socket.socket, port: int) -> None:
  while True:
    try:
      client, _ = listener.accept()
    except OSError:
      return  # Closed at exit.
    _forward(client, port)


def _wait_listening(port: int, worker: subprocess.Popen) -> bool:
  deadline = time.monotonic() + _READY_TIMEOUT
  while time.monotonic() < deadline and worker.poll() is None:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1.0).close()
      return True
    except OSError:
      time.sleep(0.02)
  return False


def unix_listener(path: str) -> socket.socket:
  """A listening Unix socket at `path`, mode 0600 from its creation (no window with more)."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  old = os.umask(0o177)
  try:
    listener.bind(path)
  finally:
    os.umask(old)
  os.chmod(path, 0o600)
  listener.listen(64)
  return listener


def main(argv: list) -> int:
  if len(argv) < 6 or argv[4] != '--' or argv[3] not in ('0', '1'):
    print('usage: netns_bridge.py SOCKET PARENT_PID REMOVE_FOLDER(0|1) -- WORKER_BINARY ARGS '
          '({port} is replaced)', file=sys.stderr)
    return 2
  path, parent, remove_folder, command = argv[1], int(argv[2]), argv[3] == '1', argv[5:]
  # SIGTERM, not SIGKILL, when the parent dies: the socket (and the folder the parent made for
  # it) is then removed here, since the parent cannot do it any more.
  _die_with(signal.SIGTERM)
  if os.getppid() != parent:
    return 1  # The run that started us is already gone.
  loopback_up()
  port = free_port()
  command = [a.replace('{port}', str(port)) for a in command]
  worker = None

  def kill(signum, frame):
    del signum, frame
    if worker is not None and worker.poll() is None:
      worker.kill()

  def stop(signum, frame):
    del signum, frame
    if worker is not None and worker.poll() is None:
      worker.send_signal(signal.SIGINT)
      signal.signal(signal.SIGALRM, kill)
      signal.alarm(5)  # A worker that does not stop when asked is killed.
  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)

  def preexec():
    _die_with(signal.SIGKILL)
    # A shell starts background jobs with SIGINT ignored, and exec keeps an ignored signal
    # ignored: the worker must still stop on the SIGINT this process sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
  worker = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=preexec)
  listener = None
  try:
    if _wait_listening(port, worker):
      listener = unix_listener(path)
      print(f'netns_bridge: worker pid {worker.pid} on 127.0.0.1:{port} inside its own network '
            f'namespace, served on {path}', file=sys.stderr, flush=True)
      threading.Thread(target=_serve, args=(listener, port), daemon=True).start()
    while True:
      try:
        code = worker.wait()
        return code if code >= 0 else 128 - code  # As a shell reports a signal.
      except InterruptedError:
        continue
  finally:
    if listener is not None:
      listener.close()
      try:
        os.unlink(path)
      except OSError:
        pass
    if remove_folder:
      try:
        os.rmdir(os.path.dirname(path))  # Only if empty: nothing but our socket was in it.
      except OSError:
        pass


if __name__ == '__main__':
  sys.exit(main(sys.argv))
