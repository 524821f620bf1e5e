"""The TFF execution context this project owns, and the lifecycle of its worker processes.

Why not `tff.backends.native.set_sync_local_cpp_execution_context()`: in TFF 0.87 that context
starts `worker_binary` with the parent's stdout/stderr and stops it only from a `__del__`, which
does not reliably run at interpreter exit (TFF v0.87.0,
`tensorflow_federated/python/core/impl/executor_stacks/executor_factory.py`). The child then
outlives Python (parent PID 1) and holds the parent's stdout, so `python prog.py | tail` never
returns (docs/reference.md §8). Here we start the worker ourselves:
- its output goes to a log file, never to our stdout;
- it is asked to die with its parent (Linux `PR_SET_PDEATHSIG`), so even `kill -9` of the Python
  process cannot orphan it;
- it is stopped at interpreter exit (`atexit`) and on SIGTERM/SIGINT/SIGHUP;
- it has no network of its own (a user+network namespace, reached through a 0600 Unix socket:
  netns.py); where namespaces are not allowed it is not started (WorkerExposedError, one line
  naming the opt-in), unless the user accepts that every local user can connect to it
  (`without_namespace`: bin/train --worker_without_namespace), and then it listens on loopback
  through a library proven on a canary process before the worker starts (loopback.py); either
  way it is checked from the kernel's side before the first computation, and refused otherwise.
The same machinery connects to remote workers (`workers=['unix:/path', 'host:port', ...]`), which
is how simulations are spread over several machines with TFF's own runtime (docs/remote_workers.md).
A remote worker that cannot be reached, or that stops answering during a computation, raises
`WorkerUnavailableError` / `WorkerLostError` (one-line messages naming --workers) instead of TFF's
default of retrying forever.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

from absl import logging
import grpc
import portpicker
# Before TensorFlow (imported by TFF below) when this is the first module to import it.
from tff_decorr import tf_env  # pylint: disable=g-bad-import-order
import tensorflow_federated as tff
# Internals of TFF 0.87's mergeable-computation context, reused with the client order fixed.
from tensorflow_federated.python.common_libs import async_utils
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as _mc  # pylint: disable=line-too-long
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_decorr.worker import loopback
from tff_decorr.worker import netns

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1

# How long a remote worker may be unreachable during a run before the computation fails. TFF's
# contexts retry UNAVAILABLE forever; a worker restarted within this grace lets the round continue.
_LOST_GRACE_SECONDS = 10.0
_REMOTE_START_TIMEOUT = 20.0

_lock = threading.Lock()


class WorkerUnavailableError(RuntimeError):
  """A remote worker given in --workers does not answer when the run starts."""


class WorkerLostError(RuntimeError):
  """A remote worker stopped answering during a computation (the current round is lost)."""


def _lost_message(address: str) -> str:
  return (f'--workers: the TFF worker at {address} stopped answering during a round; restart '
          'it (python -m bin.worker --socket=...) and re-run the same command to resume from the '
          'last checkpoint.')
_processes: list['WorkerProcess'] = []
_handlers_installed = False


def worker_binary_path() -> str:
  """Path of the C++ executor service shipped in the TFF wheel (`data/worker_binary`)."""
  path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise RuntimeError(
        f'TFF worker binary not found at {path}; reinstall the pinned environment (make setup).')
  return path


def _die_with_parent() -> None:
  """Runs in the child between fork and exec: deliver SIGKILL when the parent dies."""
  libc = ctypes.CDLL('libc.so.6', use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  os.setsid()  # Own process group: a Ctrl-C in the terminal is handled by us, not by the worker.


class WorkerExposedError(RuntimeError):
  """The local worker could be reached by someone else; it was stopped before any computation."""


# bin/train --worker_without_namespace: where the local worker cannot have a network namespace of
# its own, it may listen on 127.0.0.1, where every local user can connect to it.
_without_namespace = False


def set_without_namespace(without_namespace: bool) -> None:
  """The default of `install`'s and `install_program`'s `without_namespace` (bin/train
  --worker_without_namespace): whether a local worker that cannot have a network namespace of its
  own may run on 127.0.0.1, reachable by every user of this machine. Off: refused."""
  global _without_namespace
  _without_namespace = bool(without_namespace)


def no_namespace_message(why: str) -> str:
  """The one line that refuses a local worker without a network namespace (`why`: the reason)."""
  return (f'refusing to start the TFF worker: it cannot have a network namespace of its own '
          f'({why}), and without one every user of this machine can connect to its '
          'unauthenticated service, which runs any TensorFlow graph as you. Allow unprivileged '
          'user namespaces (sysctl kernel.unprivileged_userns_clone=1 and '
          'user.max_user_namespaces > 0, or a container that permits unshare); or accept that '
          'exposure to local users with --worker_without_namespace (bin/train) or '
          'without_namespace=True (tff_context.install, install_program, WorkerProcess).')


def check_local_worker_allowed(without_namespace: Optional[bool] = None) -> None:
  """Raises WorkerExposedError (one line, `no_namespace_message`) when a local worker could not
  have a network namespace of its own and `without_namespace` (default: `set_without_namespace`)
  does not accept that. Cheap (one `unshare ... true`, once per process): for a refusal before a
  run writes or builds anything."""
  if without_namespace is None:
    without_namespace = _without_namespace
  ok, why = netns.available()
  if not ok and not without_namespace:
    raise WorkerExposedError(no_namespace_message(why))


def _log_tail(path: str, lines: int = 8) -> str:
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - 16384))
      text = f.read().decode(errors='replace')
  except OSError:
    return ''
  tail = [l.strip() for l in text.splitlines() if l.strip()][-lines:]
  return ' | '.join(tail)


_START_ATTEMPTS = 4
_fallback_said = False  # The loopback opt-in's one warning line, once per process.


def _worker_preexec() -> None:
  _die_with_parent()
  # A shell starts background jobs (`python -m bin.worker ... &`) with SIGINT ignored, and exec
  # keeps it ignored: `stop` would then wait for nothing and kill the worker (the namespace's
  # bridge could not remove its socket).
  signal.signal(signal.SIGINT, signal.SIG_DFL)


class WorkerProcess:
  """One `worker_binary` serving TFF's executor service to this user only.

  TFF's service is unauthenticated and runs whatever graph it is sent, and TFF's binary listens on
  every interface. How it is kept to this user (docs/security.md):
  - `isolation == 'namespace'`: the worker runs in a user+network namespace of its own (netns.py)
    and is reached through a Unix socket, mode 0600 in a 0700 folder (`address` is
    'unix:<path>'); its port is picked inside the namespace, where nothing can take it. Used
    when the machine allows user namespaces and no `port` is asked for, or when `socket_path`
    is given (bin/worker --socket). Where namespaces are not allowed and neither `port` nor
    `without_namespace` is given, nothing is started: WorkerExposedError, one line naming the
    opt-in.
  - `isolation == 'loopback'`: asked for with `port` (bin/worker --port) or, without a
    namespace, with `without_namespace=True`: every local user can connect. The loopback
    library (loopback.py) is proven before the worker starts, on a canary process started by the
    worker binary's loader with the worker's environment (whose loader variables, LD_PRELOAD
    included, are the library's alone: loopback.worker_environment); the worker then listens on
    127.0.0.1:`port`.
  - `isolation == 'none'`: `listen_all=True`, TFF's own behaviour, only when asked for
    (bin/worker --port --listen_all).
  Before the constructor returns, the worker is checked from the kernel's side (`problems`: the
  namespace and socket file, or the library mapped into it and its listening sockets); a worker
  with a problem is stopped and WorkerExposedError raised, with one line saying why and what to
  do. A worker that exits while starting on a port this class picked is started again on another
  port (another process may have taken the port); one that still cannot start raises
  RuntimeError carrying the last lines of its log.
  """

  # Seven parameters: one per bin/worker option, each with a default.
  def __init__(self, port: Optional[int] = None, max_concurrent_computation_calls: int = -1,
               log_path: Optional[str] = None, listen_all: bool = False,
               socket_path: Optional[str] = None, timeout: float = 60.0,
               without_namespace: bool = False):
    self._temporary_log = log_path is None
    if log_path is None:
      fd, log_path = tempfile.mkstemp(prefix='tff_worker_', suffix='.log')
      os.close(fd)
    self.log_path = log_path
    self._log = open(log_path, 'ab')
    self._max_calls = max_concurrent_computation_calls
    self.exposed = listen_all
    self.socket_path: Optional[str] = None
    self._folder: Optional[str] = None  # The private folder we made for the socket.
    self._library: Optional[str] = None
    self.binary_pid: Optional[int] = None
    self.port = port
    self.process: Optional[subprocess.Popen] = None
    namespace_ok, namespace_reason = (False, 'not asked for') if listen_all else netns.available()
    self._announce = False  # Whether to warn, once checked, that local users can connect.
    if listen_all:
      self.isolation = 'none'
    elif socket_path is not None or (port is None and namespace_ok):
      if not namespace_ok:
        self._close_log()
        raise WorkerExposedError(
            f'the TFF worker cannot run in a network namespace of its own ({namespace_reason}); '
            'allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or '
            'serve it on a loopback port instead (bin/worker --port).')
      self.isolation = 'namespace'
    elif port is None and not without_namespace:
      self._close_log()
      raise WorkerExposedError(no_namespace_message(namespace_reason))
    else:
      self._library = loopback.library()
      if self._library is None:
        self._close_log()
        raise WorkerExposedError(
            'refusing to start the TFF worker: it would listen on every interface of this machine, '
            f'unauthenticated. No network namespace ({namespace_reason}) and no loopback library '
            f'({loopback.unavailable_reason()}). Install a C compiler (make setup installs gcc) '
            'or allow user namespaces; or, knowing anyone who can reach the port can run code as '
            'you, pass --listen_all (bin/worker --port).')
      self.isolation = 'loopback'
      self._namespace_reason = namespace_reason
      self._announce = port is None
    with _lock:
      _processes.append(self)
    _install_handlers()
    try:
      self._start(socket_path, timeout)
    except BaseException:
      self.stop()
      raise

  # ---- start-up ----
  def _worker_args(self, port) -> list[str]:
    return [worker_binary_path(), f'--port={port}',
            f'--max_concurrent_computation_calls={self._max_calls}']

  def _popen(self, args, env) -> subprocess.Popen:
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                            stderr=subprocess.STDOUT, preexec_fn=_worker_preexec, close_fds=True,
                            env=env)

  def _start(self, socket_path: Optional[str], timeout: float) -> None:
    # The worker's own TensorFlow reads TF_ENABLE_ONEDNN_OPTS at start-up (tf_env: on unless the
    # user set it; docs/benchmarks.md §1, "oneDNN", measures what it is worth). The dynamic
    # loader's variables are dropped on every path: on loopback, LD_PRELOAD is the library alone.
    env = loopback.worker_environment(tf_env.worker_environment(), self._library)
    if self.isolation == 'namespace':
      if socket_path is None:
        self._folder = netns.private_folder()
        socket_path = os.path.join(self._folder, netns.SOCKET_NAME)
      self.socket_path = socket_path
      self.process = self._popen(netns.command(socket_path, self._worker_args('{port}'),
                                               remove_folder=self._folder is not None), env)
      self._wait_started(timeout)
      self.binary_pid = self._find_binary()
      self.check()
      return
    if self.isolation == 'loopback':
      # Proven before the worker exists: a worker whose library failed would listen on every
      # interface until the check after start-up stopped it.
      found = loopback.canary_problems(worker_binary_path(), env, self._library)
      if found:
        raise WorkerExposedError(
            f'refusing to start the TFF worker on 127.0.0.1: {"; ".join(found)}. Nothing was '
            'started. Rebuild the library (make setup, or remove the file to have it rebuilt) and '
            'run again.')
    picked = self.port is None
    for attempt in range(_START_ATTEMPTS if picked else 1):
      if picked:
        self.port = portpicker.pick_unused_port()
      self.process = self._popen(self._worker_args(self.port), env)
      self.binary_pid = self.process.pid
      try:
        self._wait_started(timeout)
        if not loopback.shared_port(self.process.pid, self.port):
          break
        if not picked:
          raise RuntimeError(f'port {self.port} is in use by another process; choose another.')
        self._stop_process()  # Another worker took the port first: both got it (SO_REUSEPORT).
        raise _StartFailed()
      except _StartFailed:
        if attempt + 1 == (_START_ATTEMPTS if picked else 1):
          raise RuntimeError(self._start_failure('exited during start-up')) from None
        logging.info('TFF worker on port %d did not get the port; trying another port', self.port)
    if self.isolation == 'none':
      logging.warning('The TFF worker on port %d listens on every interface of this machine, '
                      'unauthenticated, as asked (bin/worker --listen_all).', self.port)
    else:
      self.check()
      global _fallback_said
      if self._announce and not _fallback_said:  # Said only now, after the checks have run.
        _fallback_said = True
        logging.warning('The TFF worker listens on 127.0.0.1 (checked: a canary before it started, '
                        'its sockets after), not in a network namespace of its own (%s), as '
                        'accepted (without_namespace): other users of this machine can connect to '
                        'it.', self._namespace_reason)

  def _start_failure(self, what: str) -> str:
    where = self.socket_path or f'port {self.port}'
    tail = _log_tail(self.log_path)
    return (f'TFF worker ({where}) {what}; its log {self.log_path} ends: {tail or "(empty)"}')

  def _wait_started(self, timeout: float) -> None:
    """Until the worker listens: its Unix socket exists, or /proc shows it on its port."""
    deadline = time.monotonic() + timeout
    while True:
      if self.process.poll() is not None:
        if self.isolation == 'namespace':
          raise RuntimeError(self._start_failure('exited during start-up'))
        raise _StartFailed()
      if self.socket_path is not None:
        if os.path.lexists(self.socket_path):
          return
      elif self.port in [p for _, p in loopback.listening_addresses(self.process.pid)]:
        return
      if time.monotonic() > deadline:
        raise RuntimeError(self._start_failure(f'did not start listening within {timeout:.0f}s'))
      time.sleep(0.02)

  def _find_binary(self) -> int:
    """The worker_binary under the namespace's bridge process (its only child)."""
    deadline = time.monotonic() + 10
    while True:
      found = netns.children(self.process.pid)
      if found:
        return found[0]
      if time.monotonic() > deadline:
        raise RuntimeError(self._start_failure('has no worker_binary process'))
      time.sleep(0.02)

  def problems(self) -> list[str]:
    """Why someone other than this user could reach the worker, read from the kernel (empty:
    nobody can, as far as the kernel says)."""
    if self.isolation == 'namespace':
      return netns.problems(self.binary_pid, self.socket_path)
    return loopback.problems(self.binary_pid, self.port, self._library)

  def check(self) -> None:
    """Refuses (stops the worker, raises WorkerExposedError) a worker with `problems()`."""
    if self.isolation == 'none':
      return
    found = self.problems()
    if found:
      self.stop()
      raise WorkerExposedError(
          f'refusing to use the TFF worker: {"; ".join(found)}. Its service is unauthenticated '
          'and runs any TensorFlow graph it is sent. Run where user namespaces are allowed, or '
          'with the loopback library rebuilt (make setup).')

  def listening(self) -> str:
    """Where the worker can be reached, as the kernel reports it (for bin/worker's first line)."""
    if self.isolation == 'namespace':
      st = os.lstat(self.socket_path)
      tcp = loopback.listening_addresses(self.binary_pid)
      return (f'unix socket {self.socket_path} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid '
              f'{st.st_uid}); its TCP port{"s" if len(tcp) != 1 else ""} '
              f'{", ".join(str(p) for _, p in tcp)} only inside its own network namespace '
              f'(interfaces: {", ".join(netns.interfaces(self.binary_pid))})')
    addresses = loopback.listening_addresses(self.binary_pid)
    return ', '.join(f'[{h}]:{p}' if ':' in h else f'{h}:{p}' for h, p in addresses)

  @property
  def address(self) -> str:
    """The gRPC target: 'unix:<path>', or 127.0.0.1:<port> (the loopback library binds IPv4, or
    IPv4-mapped on TFF's dual-stack socket), or localhost:<port> when listening everywhere."""
    if self.socket_path is not None:
      return f'unix:{self.socket_path}'
    return f'{"localhost" if self.exposed else "127.0.0.1"}:{self.port}'

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  def _close_log(self) -> None:
    if not self._log.closed:
      self._log.close()
    if self._temporary_log and os.path.exists(self.log_path):
      os.remove(self.log_path)  # Nobody asked for it; a run's own log lives in its output dir.

  def _stop_process(self, timeout: float = 5.0) -> None:
    if self.process is not None and self.process.poll() is None:
      self.process.send_signal(signal.SIGINT)
      try:
        self.process.wait(timeout)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()

  def stop(self, timeout: float = 5.0) -> None:
    self._stop_process(timeout)
    self._close_log()
    if self._folder is not None:
      shutil.rmtree(self._folder, ignore_errors=True)
    with _lock:
      if self in _processes:
        _processes.remove(self)


class _StartFailed(Exception):
  """The worker exited while starting on a port we picked (another process may hold it)."""


def worker_pids() -> list[int]:
  """PIDs of the worker processes this process started and has not stopped."""
  with _lock:
    return [p.process.pid for p in _processes if p.alive()]


def stop_all() -> None:
  """Stops every worker this process started. Safe to call more than once."""
  with _lock:
    procs = list(_processes)
  for p in procs:
    p.stop()


def _signal_handler(signum, frame):
  del frame
  stop_all()
  # Re-raise with the default disposition so the exit status says which signal ended us.
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def _install_handlers() -> None:
  global _handlers_installed
  if _handlers_installed:
    return
  _handlers_installed = True
  atexit.register(stop_all)
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGHUP):
      if signal.getsignal(sig) in (signal.SIG_DFL, None):
        signal.signal(sig, _signal_handler)


def _wait_ready(stub: tff.framework.RemoteExecutorGrpcStub, address: str, timeout: float,
                process: Optional[WorkerProcess] = None) -> None:
  deadline = time.monotonic() + timeout
  while not stub.is_ready:
    if process is not None and not process.alive():
      raise RuntimeError(process._start_failure(  # pylint: disable=protected-access
          'exited during start-up'))
    if time.monotonic() > deadline:
      if process is not None:
        raise RuntimeError(process._start_failure(  # pylint: disable=protected-access
            f'did not answer within {timeout:.0f}s'))
      raise WorkerUnavailableError(
          f'--workers: no TFF worker answers at {address} (waited {timeout:.0f}s); start one '
          'there (python -m bin.worker --socket=PATH) or fix --workers.')
    time.sleep(0.1)


def parse_address(address: str) -> tuple[str, int]:
  """(host, port) of 'host:port'; ('unix:<path>', 0) of a Unix socket (bin/worker --socket, or
  the local end of `ssh -L /local.sock:/remote.sock`)."""
  if address.startswith('unix:'):
    if not address[len('unix:'):].startswith('/'):
      raise ValueError(f'--workers: {address!r} is not unix:/absolute/path/of/a/socket.')
    return address, 0
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit():
    raise ValueError(f'--workers: {address!r} is not unix:/path or host:port (e.g. '
                     'unix:/run/user/1000/w1.sock, the local end of an SSH tunnel to a worker).')
  return host, int(port)


def _executor_factory(stub_fn) -> tff.framework.ExecutorFactory:
  # TFF's contexts call this for every new executor, including after a failed call (they drop the
  # executor and retry), so a stub check here turns "retry forever" into an error.
  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = 0
    executor = tff.framework.RemoteExecutor(stub_fn())
    executor.set_cardinalities(cardinalities)
    return executor
  return tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)


def _remote_stub(address: str, process: Optional[WorkerProcess], timeout: float):
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  _wait_ready(stub, address, timeout, process)
  return stub


class _RemoteStub:
  """A running remote worker; raises WorkerLostError if it stays unreachable after start-up."""

  def __init__(self, address: str, timeout: float):
    self.address = address
    self._stub = _remote_stub(address, None, timeout)

  def __call__(self):
    deadline = time.monotonic() + _LOST_GRACE_SECONDS
    while not self._stub.is_ready:
      if time.monotonic() > deadline:
        raise WorkerLostError(_lost_message(self.address))
      time.sleep(0.2)
    return self._stub


class _TranslatingContext(tff.framework.SyncContext):
  """Wraps a context on remote workers: gRPC failures become one-line WorkerLostErrors."""

  def __init__(self, inner, addresses: Sequence[str]):
    self._inner = inner
    self._addresses = list(addresses)

  def invoke(self, comp, arg):
    try:
      return self._inner.invoke(comp, arg)
    except WorkerLostError:
      raise
    except grpc.RpcError as e:
      code = e.code() if hasattr(e, 'code') else None
      if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                  grpc.StatusCode.UNKNOWN, grpc.StatusCode.FAILED_PRECONDITION):
        raise WorkerLostError(_lost_message(' or '.join(self._addresses)) +
                              f' (gRPC {code.name if code else e})') from e
      raise


async def _ordered_mergeable_invoke(comp, arg, contexts):
  """Runs a MergeableCompForm over `contexts`, keeping the clients in their original order.

  TFF 0.87's MergeableCompExecutionContext concatenates the groups' clients-placed results in the
  order the workers finish, so `next` can hand back client states in a different client order
  (measured with SCAFFOLD: groups swapped). Here every stage keeps argument order, and partial
  aggregates are merged in group order, so results do not depend on timing.
  """
  arg_list = arg.value() if arg is not None else [None] * len(contexts)

  async def in_order(fn):
    out = []
    for start in range(0, len(arg_list), len(contexts)):
      wave = zip(arg_list[start:start + len(contexts)], contexts)
      out.extend(await asyncio.gather(*[fn(x, ctx) for x, ctx in wave]))
    return out

  partials = await in_order(lambda x, ctx: ctx.invoke(comp.up_to_merge, x))
  merged = partials[0]
  for partial in partials[1:]:
    merged = await contexts[0].invoke(comp.merge, structure.Struct.unnamed(merged, partial))

  def after(x, ctx):
    return _mc._compute_after_merged(comp, x, merged, ctx)  # pylint: disable=protected-access
  result_type = comp.after_merge.type_signature.result
  if type_analysis.contains_only(
      result_type, lambda t: not isinstance(t, tff.FederatedType) or t.all_equal):
    return await after(arg_list[0], contexts[0])  # Nothing clients-placed: any group will do.
  results = await in_order(after)
  repackage = _mc._repackage_partitioned_values  # pylint: disable=protected-access
  return repackage(results, result_type_spec=result_type)


class _MergeableContext(tff.framework.SyncContext):
  """TFF's mergeable-computation context with the client order fixed (see above)."""

  def __init__(self, contexts):
    self._contexts = list(contexts)
    self._runner = async_utils.AsyncThreadRunner()
    self._compiler = compiler_pipeline.CompilerPipeline(_compile_mergeable)

  def invoke(self, comp, arg):
    form = self._compiler.compile(comp)
    if arg is not None:
      arg = _mc.MergeableCompExecutionContextValue(
          arg, form.up_to_merge.type_signature.parameter, len(self._contexts))
    result = self._runner.run_coro_and_return_result(
        _ordered_mergeable_invoke(form, arg, self._contexts))
    return type_conversions.type_to_py_container(result, form.after_merge.type_signature.result)


def _compile(comp):
  """TFF's native compilation, after replacing secure sums by their plain equivalents.

  TFF's C++ runtime implements no secure-aggregation protocol (`tff.federated_secure_sum*`
  fails with "Cannot embed a federated value"); TFF's own simulation context
  (`tff.backends.test`) does this same replacement. The secure aggregator's bounds, clipping and
  quantisation to a bit-width still run, so a simulation computes what the protocol would
  release; only the cryptography is absent. Computations without secure sums are unchanged.
  """
  comp = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
  return tff.backends.native.desugar_and_transform_to_native(comp)


def _compile_mergeable(comp):
  return mergeable_comp_compiler.compile_to_mergeable_comp_form(
      tff.backends.test.replace_secure_intrinsics_with_bodies(comp))


def _make_context(stub_fn, asynchronous: bool = False):
  cls = tff.framework.AsyncExecutionContext if asynchronous else tff.framework.SyncExecutionContext
  return cls(
      executor_fn=_executor_factory(stub_fn),
      compiler_fn=_compile,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)


class _LocalStub:
  """Starts the local worker lazily, and again if it died (TFF's own manager does the same)."""

  def __init__(self, max_concurrent_computation_calls: int, log_path: Optional[str],
               timeout: float, without_namespace: bool = False):
    self._args = (max_concurrent_computation_calls, log_path, without_namespace)
    self._timeout = timeout
    self._process: Optional[WorkerProcess] = None
    self._stub = None

  def __call__(self):
    if self._stub is not None and self._process.alive() and self._stub.is_ready:
      return self._stub
    if self._process is not None:
      self._process.stop()
    # The constructor returns only a worker checked from the kernel's side (WorkerProcess.check):
    # no computation reaches a worker others could reach.
    self._process = WorkerProcess(max_concurrent_computation_calls=self._args[0],
                                  log_path=self._args[1], without_namespace=self._args[2],
                                  timeout=self._timeout)
    self._stub = _remote_stub(self._process.address, self._process, self._timeout)
    return self._stub


def install(max_concurrent_computation_calls: int = -1, log_path: Optional[str] = None,
            workers: Sequence[str] = (), timeout: float = 60.0,
            without_namespace: Optional[bool] = None) -> None:
  """Sets TFF's default execution context.

  Args:
    max_concurrent_computation_calls: passed to the local worker (-1: unlimited).
    log_path: where the local worker's output goes (default: a temporary file).
    workers: addresses of running TFF workers (bin/worker): `unix:/path` of a Unix socket or
      `host:port`. Empty: one local worker process, owned by this process (WorkerProcess: in a
      network namespace of its own; where the machine allows none, refused unless
      `without_namespace`, and then on loopback). One address: that worker runs everything. Several: TFF's mergeable computation form splits the clients of each round
      across them (run by _MergeableContext, which keeps client order; docs/remote_workers.md).
    timeout: seconds to wait for a worker to answer.
    without_namespace: with no `workers`, whether a local worker that cannot have a network
      namespace of its own may listen on 127.0.0.1, where every local user can connect (None: the
      value of `set_without_namespace`, off unless bin/train --worker_without_namespace).

  Raises:
    WorkerExposedError: no `workers`, no network namespace for a local worker, and not
      `without_namespace` (one line naming the opt-in; raised here, before any computation).
    ValueError: a malformed or repeated address in `workers`.
  """
  if not workers:
    if without_namespace is None:
      without_namespace = _without_namespace
    check_local_worker_allowed(without_namespace)
    context = _make_context(_LocalStub(max_concurrent_computation_calls, log_path, timeout,
                                       without_namespace))
  else:
    addresses = list(workers)
    for a in addresses:
      parse_address(a)
    if len(set(addresses)) != len(addresses):
      raise ValueError(f'--workers: {",".join(addresses)} names a worker twice; list each once.')
    timeout = min(timeout, _REMOTE_START_TIMEOUT)
    stubs = [_RemoteStub(a, timeout) for a in addresses]
    if len(stubs) == 1:
      context = _make_context(stubs[0])
    else:
      # Each round's clients are split into len(workers) contiguous groups; each worker computes
      # its group's aggregate ("up to merge"), the partial aggregates are merged, and each worker
      # computes the clients-placed outputs of its group ("after merge"). See
      # docs/remote_workers.md for what this costs.
      contexts = [_make_context(s, asynchronous=True) for s in stubs]
      context = _MergeableContext(contexts)
    context = _TranslatingContext(context, addresses)
  tff.framework.set_default_context(context)


def install_program(max_concurrent_computation_calls: int = -1, log_path: Optional[str] = None,
                    timeout: float = 60.0, without_namespace: Optional[bool] = None) -> None:
  """Sets a `tff.program.NativeFederatedContext` (what `tff.learning.programs.train_model` needs;
  it refuses the synchronous context of `install`) on the same locally owned worker: output to
  a log file, stopped with its parent and by `stop_all()`. `without_namespace` and the refusal
  (WorkerExposedError) are `install`'s."""
  if without_namespace is None:
    without_namespace = _without_namespace
  check_local_worker_allowed(without_namespace)
  stub = _LocalStub(max_concurrent_computation_calls, log_path, timeout, without_namespace)
  context = _make_context(stub, asynchronous=True)
  tff.framework.set_default_context(tff.program.NativeFederatedContext(context))


def port_is_free(port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    return s.connect_ex(('127.0.0.1', port)) != 0


if __name__ == '__main__':  # pragma: no cover - manual smoke check
  install()
  print(tff.federated_computation(lambda: tff.federated_value(1, tff.SERVER))(), file=sys.stderr)
