"""Per-client state store on disk (FedBN's BN variables, SCAFFOLD's c_i, MOON's previous model;
nothing for an algorithm without per-client state: NoClientStates).

One `.npz` file per client and version: `<dir>/<quoted client id>/r<round>.npz`, written atomically
(temporary file in the same directory, fsync, `os.replace`), so a crash never leaves a half-written
state. Only sampled clients are loaded, so memory does not grow with the number of clients (the
store keeps just a {client id: round} index). A client without a saved state gets
`initial_fn()` (the algorithm's `initial_client_state`).

Checkpoints: `save_manifest(path)` records which version of every client belongs to the checkpoint;
`load_manifest(path)` restores that consistent set (versions written after it, e.g. by a round that
crashed, are ignored and later overwritten). After a manifest is written, versions older than the
ones it references are deleted, except those an older manifest still in use references (`keep`):
the program keeps two checkpoints, so the previous one stays resumable.
"""

from __future__ import annotations

import io
import json
import os
import urllib.parse
from typing import Any, Callable, Dict, Optional

import numpy as np
import tensorflow as tf

from tff_decorr.run_files import run_dir

MANIFEST_VERSION = 1


class StateError(ValueError):
  """A saved client state cannot be used; the message says how to proceed."""


class ClientStateStore:
  """Client states keyed by client id, persisted under `directory`."""

  def __init__(self, directory: str, initial_fn: Callable[[], Any]):
    if not directory:
      raise ValueError('directory must be a non-empty path for the client-state store.')
    if not callable(initial_fn):
      raise ValueError('initial_fn must be a callable returning the initial client state.')
    self.directory = directory
    self._initial_fn = initial_fn
    self._template = initial_fn()
    self._latest: Dict[str, int] = {}
    os.makedirs(directory, exist_ok=True)

  def _client_dir(self, client_id: str) -> str:
    return os.path.join(self.directory, urllib.parse.quote(str(client_id), safe=''))

  def _path(self, client_id: str, round_num: int) -> str:
    return os.path.join(self._client_dir(client_id), f'r{int(round_num)}.npz')

  def __contains__(self, client_id: str) -> bool:
    return str(client_id) in self._latest

  def __len__(self) -> int:
    return len(self._latest)

  def load(self, client_id: str) -> Any:
    """The client's latest saved state, or the initial state if it has none.

    Args:
      client_id: the client (any value; its str is the key).

    Returns:
      A nest of NumPy arrays of the initial state's structure.

    Raises:
      StateError: the file cannot be read, or holds another structure (the message says how to
        resume).
    """
    client_id = str(client_id)
    if client_id not in self._latest:
      return self._initial_fn()
    path = self._path(client_id, self._latest[client_id])
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = [f[f'a{i:05d}'] for i in range(len(f.files))]
    except Exception as e:  # BadZipFile, OSError, KeyError, ValueError: one message for all.
      raise StateError(f'the state of client {client_id} ({path}) cannot be read '
                       f'({type(e).__name__}: {str(e)[:120]}); the run directory is damaged. '
                       'Resume from the previous checkpoint by removing the newest '
                       'checkpoints/round_* directory, or use another --output_dir.') from e
    flat_template = tf.nest.flatten(self._template)
    if len(arrays) != len(flat_template):
      raise StateError(f'{path} holds {len(arrays)} arrays but the algorithm\'s client state has '
                       f'{len(flat_template)}; the store belongs to another algorithm or model '
                       '(use a fresh --output directory).')
    return tf.nest.pack_sequence_as(self._template, arrays)

  def save(self, client_id: str, state: Any, round_num: int) -> None:
    """Writes `state` as the client's version for `round_num` (atomically) and makes it the
    latest.

    Args:
      client_id: the client.
      state: a nest of arrays or tensors of the initial state's structure.
      round_num: the round that produced it.

    Raises:
      ValueError: `state` has another structure.
      OSError: the file cannot be written (the previous version stays).
    """
    client_id = str(client_id)
    flat = [np.asarray(a) for a in tf.nest.flatten(state)]
    tf.nest.assert_same_structure(self._template, tf.nest.pack_sequence_as(self._template, flat))
    arrays = {f'a{i:05d}': a for i, a in enumerate(flat)}
    # Serialised in memory, then written: a failing write (full disk) then never leaves a
    # half-closed ZipFile behind, whose finaliser would print a traceback.
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    run_dir.atomic_write(self._path(client_id, round_num), lambda f: f.write(buffer.getvalue()),
                         'wb')
    self._latest[client_id] = int(round_num)

  def manifest(self) -> dict:
    """The current versions as a manifest.

    Returns:
      {'version': MANIFEST_VERSION, 'clients': {client id: round}}.
    """
    return {'version': MANIFEST_VERSION, 'clients': dict(self._latest)}

  def save_manifest(self, path: str, prune: bool = True,
                    keep: Optional[Dict[str, int]] = None) -> None:
    """Records the current version of every client (atomically), then prunes older versions,
    keeping every version at or after the one `keep` (an older manifest's clients) names.

    Args:
      path: the manifest file (checkpoints/client_states_<r>.json).
      prune: delete the older versions.
      keep: {client id: round} of a manifest still in use; None: none.

    Raises:
      OSError: the manifest cannot be written.
    """
    data = json.dumps(self.manifest(), sort_keys=True).encode()
    run_dir.atomic_write(path, lambda f: f.write(data), 'wb')
    if prune:
      self._prune(keep or {})

  @staticmethod
  def read_manifest(path: str) -> Dict[str, int]:
    """The versions a manifest file records.

    Args:
      path: the manifest file.

    Returns:
      {client id: round}; {} when the file does not exist.

    Raises:
      ValueError: the file is not JSON.
      KeyError: it has no 'clients'.
    """
    if not os.path.exists(path):
      return {}
    with open(path, 'rb') as f:
      return {str(k): int(v) for k, v in json.loads(f.read().decode())['clients'].items()}

  def load_manifest(self, path: str) -> None:
    """Makes the versions a manifest records the latest (a checkpoint's consistent set).

    Args:
      path: the manifest file.

    Raises:
      ValueError: not a manifest of this version, or it names a state file that is missing.
      OSError: the file cannot be read.
    """
    with open(path, 'rb') as f:
      manifest = json.loads(f.read().decode())
    if manifest.get('version') != MANIFEST_VERSION or 'clients' not in manifest:
      raise ValueError(f'{path} is not a client-state manifest (version {MANIFEST_VERSION}).')
    latest = {str(k): int(v) for k, v in manifest['clients'].items()}
    for client_id, r in latest.items():
      if not os.path.exists(self._path(client_id, r)):
        raise ValueError(f'{path} refers to a missing client state {self._path(client_id, r)}; '
                         'the checkpoint directory is incomplete.')
    self._latest = latest

  def _prune(self, keep: Dict[str, int]) -> None:
    for client_id, r in self._latest.items():
      r = min(r, keep.get(client_id, r))
      client_dir = self._client_dir(client_id)
      for name in os.listdir(client_dir):
        if name.startswith('r') and name.endswith('.npz'):
          try:
            version = int(name[1:-4])
          except ValueError:
            continue
          if version < r:
            os.remove(os.path.join(client_dir, name))

  def load_many(self, client_ids) -> list:
    """`load` of each client, in order.

    Args:
      client_ids: the clients.

    Returns:
      Their states, a list.

    Raises:
      StateError: as `load`.
    """
    return [self.load(c) for c in client_ids]

  def save_many(self, client_ids, states, round_num: int) -> None:
    """`save` of each client's state.

    Args:
      client_ids: the clients.
      states: their states, in the same order.
      round_num: the round that produced them.

    Raises:
      ValueError: not one state per client, or a state of another structure.
    """
    if len(client_ids) != len(states):
      raise ValueError(f'{len(client_ids)} client ids but {len(states)} states.')
    for c, s in zip(client_ids, states):
      self.save(c, s, round_num)


class NoClientStates:
  """The store of an algorithm without per-client state (its capability `stateful` is False:
  FedAvg, FedProx, ...): every client's state is the algorithm's initial one whatever a round
  returns, so nothing is written (no client_states/, no checkpoints/client_states_<r>.json) and a
  resumed run reads nothing; the files a run of an earlier release wrote are ignored. The
  interface of ClientStateStore, as the round loop uses it."""

  def __init__(self, initial_fn: Callable[[], Any]):
    if not callable(initial_fn):
      raise ValueError('initial_fn must be a callable returning the initial client state.')
    self._initial_fn = initial_fn

  def __contains__(self, client_id: str) -> bool:
    return False

  def __len__(self) -> int:
    return 0

  def load(self, client_id: str) -> Any:
    """The initial state, whatever the client (ClientStateStore.load's contract)."""
    del client_id
    return self._initial_fn()

  def load_many(self, client_ids) -> list:
    """One initial state per client."""
    return [self._initial_fn() for _ in client_ids]

  def save(self, client_id: str, state: Any, round_num: int) -> None:
    """Writes nothing."""
    del client_id, state, round_num

  def save_many(self, client_ids, states, round_num: int) -> None:
    """Writes nothing; raises ValueError when there is not one state per client."""
    if len(client_ids) != len(states):
      raise ValueError(f'{len(client_ids)} client ids but {len(states)} states.')

  def manifest(self) -> dict:
    """A manifest without clients."""
    return {'version': MANIFEST_VERSION, 'clients': {}}

  def save_manifest(self, path: str, prune: bool = True,
                    keep: Optional[Dict[str, int]] = None) -> None:
    """Writes nothing."""
    del path, prune, keep

  read_manifest = staticmethod(ClientStateStore.read_manifest)

  def load_manifest(self, path: str) -> None:
    """Reads nothing (a manifest an earlier release wrote is ignored)."""
    del path
