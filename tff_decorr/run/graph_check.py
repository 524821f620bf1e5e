"""Refusing a SavedModel that would touch files, processes or the network, before it is loaded.

A SavedModel is a TensorFlow program: `tf.saved_model.load` runs its restore graph, and calling it
runs its functions, whose operations may read and write any file the user can (ReadFile,
WriteFile, PrintV2 to a file, dataset readers and writers, summary writers), call back into Python
(PyFunc) or open connections (RPC, the tf.data service). The project's exports (and the
checkpoints older releases wrote as SavedModels) never contain such operations, so a run directory copied from elsewhere whose SavedModel does was
not written by tff_decorr, or was altered. `check(path)` reads `saved_model.pb` as a protocol
buffer (nothing is executed) and lists every operation of every graph and function in it.

This is a check of the operations a graph names, not a sandbox (docs/security.md): the checkpoint
operations every SavedModel carries (SaveV2, RestoreV2, MergeV2Checkpoints) are allowed, and they
read and write checkpoint-format files at the paths their inputs give.
"""

from __future__ import annotations

import os

# Operations that reach outside the computation: files, Python, processes, the network.
DENIED = {
    # Files.
    'ReadFile': 'reads files', 'WriteFile': 'writes files', 'MatchingFiles': 'lists files',
    'ImmutableConst': 'maps a file into memory',
    'FixedLengthRecordDataset': 'reads files', 'FixedLengthRecordDatasetV2': 'reads files',
    'TFRecordDataset': 'reads files', 'TFRecordDatasetV2': 'reads files',
    'TextLineDataset': 'reads files', 'CSVDataset': 'reads files', 'CSVDatasetV2': 'reads files',
    'ExperimentalCSVDataset': 'reads files', 'LMDBDataset': 'reads files',
    'ExperimentalLMDBDataset': 'reads files', 'SqlDataset': 'opens a database',
    'ExperimentalSqlDataset': 'opens a database', 'MatchingFilesDataset': 'lists files',
    'ExperimentalMatchingFilesDataset': 'lists files', 'LoadDataset': 'reads files',
    'SaveDataset': 'writes files', 'SaveDatasetV2': 'writes files',
    'DatasetToTFRecord': 'writes files', 'ExperimentalDatasetToTFRecord': 'writes files',
    'SnapshotDataset': 'writes files', 'SnapshotDatasetV2': 'writes files',
    'SnapshotDatasetReader': 'reads files', 'DistributedSave': 'writes files',
    'CacheDataset': 'may write files', 'CacheDatasetV2': 'may write files',
    'CreateSummaryFileWriter': 'writes files', 'CreateSummaryDbWriter': 'writes files',
    'WriteSummary': 'writes files', 'WriteScalarSummary': 'writes files',
    'WriteHistogramSummary': 'writes files', 'WriteImageSummary': 'writes files',
    'WriteAudioSummary': 'writes files', 'WriteGraphSummary': 'writes files',
    'WriteRawProtoSummary': 'writes files', 'ImportEvent': 'writes files',
    'DebugIdentity': 'may write files', 'DebugIdentityV2': 'may write files',
    'DebugIdentityV3': 'may write files', 'DebugNanCount': 'may write files',
    'DebugNumericSummary': 'may write files', 'DebugNumericSummaryV2': 'may write files',
    'Save': 'writes files', 'SaveSlices': 'writes files', 'Restore': 'reads files',
    'RestoreSlice': 'reads files', 'FileSystemSetConfiguration': 'configures file systems',
    # Python and processes.
    'PyFunc': 'runs Python', 'PyFuncStateless': 'runs Python', 'EagerPyFunc': 'runs Python',
    # The network.
    'RpcClient': 'opens network connections', 'RpcCall': 'opens network connections',
    'RpcServer': 'listens on the network', 'RpcServerStart': 'listens on the network',
    'RpcServerRegister': 'listens on the network', 'Rpc': 'opens network connections',
    'TryRpc': 'opens network connections', 'DataServiceDataset': 'opens network connections',
    'DataServiceDatasetV2': 'opens network connections',
    'DataServiceDatasetV3': 'opens network connections',
    'DataServiceDatasetV4': 'opens network connections',
    'RegisterDataset': 'opens network connections',
    'RegisterDatasetV2': 'opens network connections',
}


class UnsafeGraphError(ValueError):
  """A SavedModel names an operation that reaches outside the computation."""


def _nodes(saved_model):
  for meta_graph in saved_model.meta_graphs:
    graph = meta_graph.graph_def
    yield from graph.node
    for function in graph.library.function:
      yield from function.node_def


def _reason(node) -> str | None:
  if node.op in DENIED:
    return DENIED[node.op]
  if node.op == 'PrintV2':  # Printing is harmless; printing to a file is writing one.
    stream = node.attr['output_stream'].s.decode(errors='replace')
    if stream not in ('', 'stderr', 'stdout', 'log(info)', 'log(warning)', 'log(error)'):
      return f'writes to {stream}'
  return None


def unsafe_operations(path: str) -> list[tuple[str, str]]:
  """(operation, what it does) for each denied operation in the SavedModel directory `path`
  (sorted, one per kind). Reads saved_model.pb only; runs nothing."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top
  saved_model = saved_model_pb2.SavedModel()
  with open(os.path.join(path, 'saved_model.pb'), 'rb') as f:
    saved_model.ParseFromString(f.read())
  found = {}
  for node in _nodes(saved_model):
    reason = _reason(node)
    if reason:
      found.setdefault(node.op, reason)
  return sorted(found.items())


def check(path: str, what: str) -> None:
  """Raises UnsafeGraphError (one line naming `what` and the operations) if the SavedModel at
  `path` names an operation that reaches outside the computation. A SavedModel without
  saved_model.pb (a text one, or a damaged one) is left to the loader's own errors."""
  if not os.path.exists(os.path.join(path, 'saved_model.pb')):
    return
  try:
    found = unsafe_operations(path)
  except Exception:  # pylint: disable=broad-except  (unparsable: the loader reports the damage)
    return
  if found:
    ops = ', '.join(f'{op} ({reason})' for op, reason in found)
    raise UnsafeGraphError(
        f'{what} contains operations that reach outside the model: {ops}. tff_decorr never '
        'writes these, so it was made elsewhere or altered; it was not loaded '
        '(docs/security.md).')
