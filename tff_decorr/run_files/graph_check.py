"""Refusing a SavedModel that names an operation tff_decorr's own files never use, before loading.

tff_decorr reads its own exports as data and runs no graph from a file (run_files/export.py); this
scan guards the one path that does run one, a foreign SavedModel loaded with --trust_saved_model,
as defence in depth: it names what a graph holds, and cannot prove what running it will do.

A SavedModel is a TensorFlow program: `tf.saved_model.load` runs its restore graph and its
resources' initialisers, and calling it runs its functions. Operations may read and write any file
the user can, call back into Python or open connections, and no list of what is dangerous is
complete: a lookup table initialised from a text file (InitializeTableFromTextFileV2) and exported
(LookupTableExportV2) copies a private file into the model's outputs, with operations a deny list
had no reason to name. So the scan is an allow list: `ALLOWED_OPS` holds the operations that
tff_decorr's own SavedModels use, and any other operation refuses the file, one line naming it.

`ALLOWED_OPS` is data derived by exporting, not written by hand: `python -m
tff_decorr.run_files.allowed_ops` exports every model of the registry (`tff_decorr.models.names()`)
in every precision (`models.PRECISIONS`), plain and with the variants that change the graph
(decomposed convolutions, MOON's projection head); the FedBN/personalised per-client exports are the
same export of other weights. It also saves each model as a Keras object (what tests and users save
with `tf.saved_model.save(model)`, which bin/evaluate reads under --trust_saved_model) and a
checkpoint in TFF's SavedModel format (what tff_decorr wrote before checkpoint_files). It prints
the union, which is the list below; `--check` fails when an export names an operation the list
lacks (minutes: it exports every model). Regenerate it after a TensorFlow upgrade.

The checkpoint operations (SaveV2, RestoreV2, MergeV2Checkpoints) read and write files; every
SavedModel has them, in the functions its saver runs to save and restore variables. They are
allowed there only: one in a function that loading or calling the model runs (an object's function,
a signature, a resource's initialiser) is refused too, and so is a write (SaveV2,
MergeV2Checkpoints) in the restore, which the loader runs while it loads a TF1-style SavedModel.
This is a check of the operations a graph names, not a sandbox (docs/security.md): the restore
function reads checkpoint-format files at the path its inputs give.
"""

from __future__ import annotations

import os

# The operations of tff_decorr's SavedModels on TensorFlow 2.14 (derived as the module docstring
# says; `python -m tff_decorr.run_files.allowed_ops` prints this list).
ALLOWED_OPS = frozenset({
    'AddV2', 'AssignSubVariableOp', 'AssignVariableOp', 'BiasAdd', 'Cast', 'Const', 'Conv2D',
    'DepthwiseConv2dNative', 'DisableCopyOnRead', 'Einsum', 'FusedBatchNormV3', 'Identity',
    'MatMul', 'MaxPool', 'Mean', 'MergeV2Checkpoints', 'Mul', 'NoOp', 'Pack', 'Pad',
    'PartitionedCall', 'Placeholder', 'ReadVariableOp', 'Relu', 'Reshape', 'RestoreV2', 'Rsqrt',
    'SaveV2', 'Select', 'ShardedFilename', 'SquaredDifference', 'Squeeze',
    'StatefulPartitionedCall', 'StaticRegexFullMatch', 'StopGradient', 'StridedSlice', 'StringJoin',
    'Sub', 'VarHandleOp',
})

# Allowed only in the functions the saver runs (the module docstring says why).
CHECKPOINT_OPS = {'SaveV2': 'writes files', 'RestoreV2': 'reads files',
                  'MergeV2Checkpoints': 'writes files'}

# What some refused operations do, for the message; any operation not in ALLOWED_OPS is refused
# whether or not it is described here.
DESCRIBED = {
    'ReadFile': 'reads files', 'WriteFile': 'writes files', 'MatchingFiles': 'lists files',
    'ImmutableConst': 'maps a file into memory',
    'InitializeTableFromTextFile': 'reads files', 'InitializeTableFromTextFileV2': 'reads files',
    'LookupTableExport': 'exports a table', 'LookupTableExportV2': 'exports a table',
    'WholeFileReader': 'reads files', 'WholeFileReaderV2': 'reads files',
    'TextLineReader': 'reads files', 'TextLineReaderV2': 'reads files',
    'FixedLengthRecordReader': 'reads files', 'FixedLengthRecordReaderV2': 'reads files',
    'TFRecordReader': 'reads files', 'TFRecordReaderV2': 'reads files',
    'LMDBReader': 'reads files', 'IdentityReader': 'reads files', 'IdentityReaderV2': 'reads files',
    'ReaderRead': 'reads files', 'ReaderReadV2': 'reads files', 'ReaderReadUpTo': 'reads files',
    'ReaderReadUpToV2': 'reads files', 'ReaderRestoreState': 'reads files',
    'ReaderRestoreStateV2': 'reads files',
    'FixedLengthRecordDataset': 'reads files', 'FixedLengthRecordDatasetV2': 'reads files',
    'TFRecordDataset': 'reads files', 'TFRecordDatasetV2': 'reads files',
    'TextLineDataset': 'reads files', 'CSVDataset': 'reads files', 'CSVDatasetV2': 'reads files',
    'SqlDataset': 'opens a database', 'LoadDataset': 'reads files', 'SaveDataset': 'writes files',
    'SaveDatasetV2': 'writes files', 'DatasetToTFRecord': 'writes files',
    'SnapshotDataset': 'writes files', 'SnapshotDatasetV2': 'writes files',
    'CacheDataset': 'may write files', 'CacheDatasetV2': 'may write files',
    'CreateSummaryFileWriter': 'writes files', 'WriteSummary': 'writes files',
    'PrintV2': 'prints, possibly to a file', 'Save': 'writes files', 'SaveSlices': 'writes files',
    'Restore': 'reads files', 'RestoreSlice': 'reads files',
    'PyFunc': 'runs Python', 'PyFuncStateless': 'runs Python', 'EagerPyFunc': 'runs Python',
    'RpcClient': 'opens network connections', 'RpcCall': 'opens network connections',
    'RpcServer': 'listens on the network', 'DataServiceDatasetV4': 'opens network connections',
    **CHECKPOINT_OPS,
}


class UnsafeGraphError(ValueError):
  """A SavedModel names an operation tff_decorr's own SavedModels never use."""


def _called_functions(node) -> set:
  """Names of the functions a node calls (its function-valued attributes: PartitionedCall's f,
  While's cond and body, ...)."""
  out = set()
  for value in node.attr.values():
    if value.func.name:
      out.add(value.func.name)
    out.update(f.name for f in value.list.func)
  return out


def _reachable(roots, functions) -> set:
  seen, todo = set(), list(roots)
  while todo:
    name = todo.pop()
    if name in seen or name not in functions:
      continue
    seen.add(name)
    for node in functions[name].node_def:
      todo.extend(_called_functions(node))
  return seen


def _meta_graph_refusals(meta_graph, found: dict) -> None:
  graph = meta_graph.graph_def
  functions = {f.signature.name: f for f in graph.library.function}
  saver = meta_graph.saver_def
  saver_nodes = {saver.save_tensor_name.split(':')[0], saver.restore_op_name.split(':')[0]} - {''}
  # What loading and calling the model runs: the object graph's functions (methods, signatures,
  # resource initialisers) and whatever the graph's own nodes call, except the saver's two nodes.
  program_roots = set(meta_graph.object_graph_def.concrete_functions)
  for node in graph.node:
    if node.name not in saver_nodes:
      program_roots |= _called_functions(node)
  program = _reachable(program_roots, functions)
  # The restore is run by the loader itself (a TF1-style SavedModel's restore op, while it loads):
  # it reads files, and writes none.
  restore = _reachable(_graph_calls(graph, saver.restore_op_name.split(':')[0]), functions)
  for node in graph.node:
    if node.op not in ALLOWED_OPS or node.op in CHECKPOINT_OPS:
      found.setdefault(node.op, DESCRIBED.get(node.op, 'not used by tff_decorr'))
  for name, function in functions.items():
    for node in function.node_def:
      if node.op not in ALLOWED_OPS:
        found.setdefault(node.op, DESCRIBED.get(node.op, 'not used by tff_decorr'))
      elif node.op in CHECKPOINT_OPS and name in program:
        found.setdefault(node.op, f'{CHECKPOINT_OPS[node.op]} outside the saver')
      elif node.op in CHECKPOINT_OPS and node.op != 'RestoreV2' and name in restore:
        found.setdefault(node.op, f'{CHECKPOINT_OPS[node.op]} in the restore loading runs')


def _graph_calls(graph, node_name: str) -> set:
  """The functions that running graph node `node_name` calls: its own and those of every node it
  depends on (data and control inputs)."""
  nodes = {node.name: node for node in graph.node}
  seen, todo, calls = set(), [node_name], set()
  while todo:
    name = todo.pop().lstrip('^').split(':')[0]
    if name in seen or name not in nodes:
      continue
    seen.add(name)
    calls |= _called_functions(nodes[name])
    todo.extend(nodes[name].input)
  return calls


def _read(path: str):
  """The SavedModel proto of directory `path`, read as TensorFlow's loader reads it:
  saved_model.pb, else saved_model.pbtxt (text)."""
  from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top
  saved_model = saved_model_pb2.SavedModel()
  binary = os.path.join(path, 'saved_model.pb')
  if os.path.exists(binary):
    with open(binary, 'rb') as f:
      saved_model.ParseFromString(f.read())
  else:
    with open(os.path.join(path, 'saved_model.pbtxt'), 'rb') as f:
      text_format.Parse(f.read().decode('utf-8'), saved_model)
  return saved_model


def operations(path: str) -> set:
  """Every operation named in the SavedModel directory `path` (its graphs and functions).

  Args:
    path: a SavedModel directory.

  Returns:
    The set of op type names.

  Raises:
    OSError: neither saved_model.pb nor saved_model.pbtxt can be read.
    google.protobuf.message.DecodeError: the file is not a SavedModel proto.
  """
  out = set()
  for meta_graph in _read(path).meta_graphs:
    out.update(node.op for node in meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
      out.update(node.op for node in function.node_def)
  return out


def unsafe_operations(path: str) -> list[tuple[str, str]]:
  """(operation, why it is refused) for each refused operation in the SavedModel directory `path`
  (sorted, one per kind): any not in ALLOWED_OPS, and a checkpoint operation outside the saver.
  Reads saved_model.pb (or .pbtxt) only; runs nothing.

  Args:
    path: a SavedModel directory.

  Returns:
    [(operation, reason)], sorted; [] for a graph tff_decorr could have written.

  Raises:
    OSError: as `operations`.
    google.protobuf.message.DecodeError: as `operations`.
  """
  found = {}
  for meta_graph in _read(path).meta_graphs:
    _meta_graph_refusals(meta_graph, found)
  return sorted(found.items())


def check(path: str, what: str) -> None:
  """Raises UnsafeGraphError (one line naming `what` and the operations) if the SavedModel at
  `path` names an operation tff_decorr's SavedModels never use; a text SavedModel
  (saved_model.pbtxt, which the loader reads when saved_model.pb is absent) is checked the same
  way. A directory with neither, or one that cannot be parsed (which the loader cannot parse
  either), is left to the loader's own errors.

  Args:
    path: a SavedModel (or TFF checkpoint) directory.
    what: how the message names it ('--saved_model=...').

  Raises:
    UnsafeGraphError: it names a refused operation.
  """
  if not any(os.path.exists(os.path.join(path, name))
             for name in ('saved_model.pb', 'saved_model.pbtxt')):
    return
  try:
    found = unsafe_operations(path)
  except Exception:  # pylint: disable=broad-except  (unparsable: the loader reports the damage)
    return
  if found:
    ops = ', '.join(f'{op} ({reason})' for op, reason in found)
    raise UnsafeGraphError(
        f'{what} contains operations tff_decorr never writes: {ops}. It was made elsewhere or '
        'altered; it was not loaded (docs/security.md).')
