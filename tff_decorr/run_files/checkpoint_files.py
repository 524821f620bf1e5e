"""A round's checkpoint as one file of arrays: TFF's program state manager with a cheaper format.

`tff.program.FileProgramStateManager` writes every version as a SavedModel: it wraps each value in a
tf.Variable, traces a tf.function over them and writes its graph, a cost a study of short runs pays
every round of every run, where one `.npz` of the same values costs little (docs/benchmarks.md,
"Fixed costs"). We keep TFF's manager for what it does well (versions, their names, keeping the
newest `keep_total`) and change only the file: `round_<n>/state.npz`, the state's leaves in
`tff.program`'s flattening order, written as TFF writes (into `round_<n>_temp<pid>`, renamed when
complete) and also synced to disk before the rename, so a kill or a power cut leaves the previous
version or the new one.

Reading runs nothing: `np.load(allow_pickle=False)` reads arrays only, and the zip's CRC-32 of
each array turns damaged bytes into an error instead of wrong weights. Checkpoints written as
SavedModels (tff_decorr before this module) are still read, so an older run resumes, and as data
too: not by TFF's reader, which loads the SavedModel and so runs its program (a TF1-style one's
restore op included, docs/security.md), but with the checkpoint reader, which parses the tensors of
its variables/ and runs no graph; each value is found by its place in the state, which TFF's writer
keeps as the variable's path in the checkpoint's object graph.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
import tensorflow_federated as tff
# TFF's flattening of a program state, so that every structure its manager accepts is accepted.
from tensorflow_federated.python.program import structure_utils

FILE_NAME = 'state.npz'
SAVED_MODEL_FILE = 'saved_model.pb'  # a version written by TFF's own format
# Where TFF's writer (file_utils.write_saved_model) keeps the state: the attribute of its module
# that holds it, and the key of the object graph in a TF2 checkpoint.
_TFF_STATE_ATTRIBUTE = '_value'
_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'


class IncompleteCheckpointError(ValueError):
  """A version's directory exists but its state cannot be read as the run's state."""


def _entry(value: Any, index: int) -> tuple[str, np.ndarray]:
  """(name, array) of state value `index`. A bytes value (an aggregator's serialised state, e.g.
  --aggregator=dp's) is stored as its uint8 bytes under '<index>b': NumPy's bytes dtype would
  drop trailing zero bytes, and object arrays need pickle to read."""
  if isinstance(value, (bytes, np.bytes_)):
    return f'{index}b', np.frombuffer(bytes(value), np.uint8)
  array = np.asarray(value)
  if array.dtype == object or array.dtype.kind in 'SV':
    raise TypeError(f'program state value {index} ({type(value).__name__}) is not bytes or an '
                    'array of numbers or text; the checkpoint format stores only those')
  return str(index), array


def _sync_directory(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


class ArrayFileProgramStateManager(tff.program.FileProgramStateManager):
  """`tff.program.FileProgramStateManager` whose versions are `<prefix><n>/state.npz`."""

  def state_file(self, version: int) -> str:
    return os.path.join(self._get_path_for_version(version), FILE_NAME)

  def is_saved_model(self, version: int) -> bool:
    """Whether `version` was written in TFF's SavedModel format (by an older tff_decorr)."""
    return (not os.path.exists(self.state_file(version)) and
            os.path.exists(os.path.join(self._get_path_for_version(version), SAVED_MODEL_FILE)))

  async def save(self, program_state: Any, version: int) -> None:
    path = self._get_path_for_version(version)
    if os.path.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self._root_dir)
    leaves = structure_utils.flatten(await tff.program.materialize_value(program_state))
    arrays = dict(_entry(v, i) for i, v in enumerate(leaves))
    temp = f'{path}_temp{os.getpid()}'  # run_dir.prepare removes leftovers named '*_temp*'
    shutil.rmtree(temp, ignore_errors=True)
    try:
      os.makedirs(temp)
      with open(os.path.join(temp, FILE_NAME), 'wb') as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
      os.rename(temp, path)
    except BaseException:  # A full disk or an interrupt: leave no half-written version behind.
      shutil.rmtree(temp, ignore_errors=True)
      raise
    _sync_directory(self._root_dir)
    await self._remove_old_program_state()

  def read_leaves(self, version: int) -> list[Any]:
    """Every value of `version` (arrays; bytes where bytes were saved), in flattening order, read
    in full (each array's CRC checked). IncompleteCheckpointError when its directory holds no
    state file or one of another kind."""
    state_file = self.state_file(version)
    if not os.path.exists(state_file):
      raise IncompleteCheckpointError(f'{state_file} is missing')
    with np.load(state_file, allow_pickle=False) as z:
      names = {name.rstrip('b'): name for name in z.files}
      if sorted(names) != sorted(str(i) for i in range(len(z.files))):
        raise IncompleteCheckpointError(f'{state_file} is not a tff_decorr checkpoint')
      values = [z[names[str(i)]] for i in range(len(z.files))]
      return [v.tobytes() if names[str(i)].endswith('b') else v for i, v in enumerate(values)]

  def _saved_model_reader(self, version: int):
    """The checkpoint reader of version `version`'s variables/ (TFF's SavedModel format) and its
    object graph's variables by path ('server_state/weights/0' -> checkpoint key)."""
    prefix = os.path.join(self._get_path_for_version(version), 'variables', 'variables')
    if not os.path.exists(f'{prefix}.index'):
      raise IncompleteCheckpointError(f'{prefix}.index is missing')
    reader = tf.train.load_checkpoint(prefix)  # Parses the tensors' files; runs no graph.
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    keys, todo = {}, [(c.node_id, c.local_name) for c in graph.nodes[0].children
                      if c.local_name == _TFF_STATE_ATTRIBUTE]
    while todo:
      node_id, path = todo.pop()
      node = graph.nodes[node_id]
      for attribute in node.attributes:
        if attribute.name == 'VARIABLE_VALUE':
          keys[path[len(_TFF_STATE_ATTRIBUTE) + 1:]] = attribute.checkpoint_key
      todo.extend((c.node_id, f'{path}/{c.local_name}') for c in node.children)
    if not keys:
      raise IncompleteCheckpointError(f'{prefix} holds no program state of TFF\'s format')
    return reader, keys

  def read_saved_model_leaves(self, version: int, structure: Any = None) -> list[Any]:
    """The values of version `version`, written in TFF's SavedModel format, read as data: those
    of `structure`'s leaves in flattening order (bytes where TFF stored strings), or, without a
    structure, every variable (to check that all can be read). IncompleteCheckpointError when
    a leaf has no variable in the checkpoint."""
    reader, keys = self._saved_model_reader(version)
    if structure is None:
      return [reader.get_tensor(keys[path]) for path in sorted(keys)]
    out = []
    for path, expected in structure_utils.flatten_with_name(structure):
      if path not in keys:
        if expected is None:  # TFF stores no variable for a None leaf.
          out.append(None)
          continue
        raise IncompleteCheckpointError(f'{self._get_path_for_version(version)} has no value '
                                        f'{path} of this run\'s state')
      value = reader.get_tensor(keys[path])
      # A string comes back as a 0-d object array of bytes: the bytes, as TFF's reader gives.
      out.append(value.item() if isinstance(value, np.ndarray) and value.dtype == object and
                 value.ndim == 0 else value)
    return out

  async def load(self, version: int, structure: Any) -> Any:
    if not os.path.isdir(self._get_path_for_version(version)):
      raise tff.program.ProgramStateNotFoundError(version)
    if self.is_saved_model(version):
      leaves = self.read_saved_model_leaves(version, structure)
    else:
      leaves = self.read_leaves(version)
    expected: Sequence[Any] = structure_utils.flatten(structure)
    kind = lambda v: 'bytes' if isinstance(v, (bytes, np.bytes_)) else np.shape(v)
    shapes = [kind(v) for v in expected]
    if [kind(a) for a in leaves] != shapes:
      raise IncompleteCheckpointError(
          f'{self.state_file(version)} holds {len(leaves)} values that are not shaped as this '
          f"run's state ({len(shapes)} values): it was written by another model or task")
    # 0-d arrays come back as NumPy scalars, as TFF's own reader returns them.
    return structure_utils.unflatten_as(
        structure, [a[()] if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in leaves])
