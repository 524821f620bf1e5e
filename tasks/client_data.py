"""Client data as files: one TFRecord shard per client, and the per-client dataset built from them.

Why files: inside TFF's C++ runtime a client's dataset must be built from its client id, reading
files (docs/reference.md §8: in-memory datasets are serialized into the computation, limit 100 MB
and re-sent every round). The train split is decoded once, partitioned, and each client's examples
are written once to `<dir>/<client id>.tfrecord` (raw uint8 pixels + label). Memory therefore does
not grow with the number of clients, and 1,000 clients cost 1,000 small files.

Why not tf.data's `shuffle`: its seed is combined with the *global* seed, which is the process's
seed in the eager (tf) runtime but TF's default graph seed inside TFF's traced computations, so the
two runtimes would shuffle differently. Here every epoch's order and every augmentation draw are
stateless functions of (round seed, epoch, position), identical wherever the graph runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

MANIFEST = 'manifest.json'
_FEATURES = {
    'image': tf.io.FixedLenFeature([], tf.string),
    'label': tf.io.FixedLenFeature([], tf.int64),
}


def content_hash(images: np.ndarray, labels: np.ndarray, parts: Sequence[np.ndarray]) -> str:
  h = hashlib.sha256()
  h.update(str((images.shape, str(images.dtype))).encode())
  h.update(np.ascontiguousarray(images).data)
  h.update(np.ascontiguousarray(labels, np.int64).data)
  for p in parts:
    h.update(np.asarray(p, np.int64).tobytes())
    h.update(b'|')
  return h.hexdigest()


def examples_hash(images: np.ndarray, labels: np.ndarray) -> str:
  """The identity of a data set's examples (pixels and labels, in their order), whatever the
  partition, seed or number of clients: what the privacy ledger is kept by."""
  h = hashlib.sha256()
  h.update(str((images.shape, str(images.dtype))).encode())
  h.update(np.ascontiguousarray(images).data)
  h.update(np.ascontiguousarray(labels, np.int64).data)
  return h.hexdigest()


class ShardError(ValueError):
  """A client's cached shard is missing or differs from what was written; says how to recover."""


def _shard_path(directory: str, client_id) -> str:
  return os.path.join(directory, f'{client_id}.tfrecord')


def _damaged_shards(directory: str, manifest: dict, client_ids) -> list:
  """Ids whose shard file is missing or whose byte size differs from the manifest's record.

  A stat per file: cheap enough to run on every start and for every round's sampled clients, and
  a shard truncated even at a record boundary changes its size (it would otherwise train on fewer
  examples, silently)."""
  sizes = manifest.get('bytes')
  if sizes is None:  # A cache written before sizes were recorded: cannot be verified.
    return list(client_ids)
  bad = []
  for cid in client_ids:
    path = _shard_path(directory, cid)
    if not os.path.exists(path) or os.path.getsize(path) != sizes[int(cid)]:
      bad.append(cid)
  return bad


def check_shards(directory: str, client_ids) -> None:
  """Raises ShardError when a sampled client's shard was deleted or changed during a run."""
  with open(os.path.join(directory, MANIFEST)) as f:
    manifest = json.load(f)
  bad = _damaged_shards(directory, manifest, client_ids)
  if bad:
    raise ShardError(f'the cached data of client(s) {", ".join(map(str, bad))} in {directory} is '
                     'missing or changed since it was written; re-run the same command: the cache '
                     'is rebuilt and the run resumes after its last completed round.')


def write_client_shards(images: np.ndarray, labels: np.ndarray, parts: Sequence[np.ndarray],
                        directory: str, log=print) -> str:
  """Writes one shard per client (ids '0'..'n-1'); skipped when `directory` already holds them,
  unharmed (every shard's size checked against the manifest; a damaged cache is rebuilt).

  Atomic: shards go to a temporary sibling directory, the manifest is written last, and the
  directory is renamed into place, so an interrupted write never leaves a partial shard set.
  """
  if images.dtype != np.uint8:
    raise ValueError(f'images must be uint8 (decoded pixels), got {images.dtype}.')
  if len(images) != len(labels):
    raise ValueError(f'{len(images)} images but {len(labels)} labels.')
  digest = content_hash(images, labels, parts)
  bad = _bad_cache(directory, digest, len(parts))
  if not bad:
    return directory
  if bad != ['all']:
    log(f'client data cache {directory}: {len(bad)} shard(s) missing or changed; rewriting it.')
  elif os.path.exists(os.path.join(directory, MANIFEST)):
    log(f'client data cache {directory}: written from other data (its content hash differs); '
        'rewriting it.')
  tmp = f'{directory.rstrip(os.sep)}.tmp-{os.getpid()}'
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  sizes = []
  for cid, idx in enumerate(parts):
    idx = np.asarray(idx, np.int64)
    with tf.io.TFRecordWriter(_shard_path(tmp, cid)) as w:
      for i in idx:
        ex = tf.train.Example(features=tf.train.Features(feature={
            'image': tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[i].tobytes()])),
            'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
        }))
        w.write(ex.SerializeToString())
    sizes.append(int(len(idx)))
  with open(os.path.join(tmp, MANIFEST), 'w') as f:
    json.dump({'content_hash': digest, 'num_clients': len(parts), 'sizes': sizes,
               'bytes': [os.path.getsize(_shard_path(tmp, c)) for c in range(len(parts))],
               'image_shape': list(images.shape[1:])}, f)
  # Runs of one partition started together (bin/study --jobs, a Slurm array) write the same
  # shards: the first to finish wins and the others use its directory, never swap it under a run
  # that already reads it.
  if not _bad_cache(directory, digest, len(parts)):
    shutil.rmtree(tmp, ignore_errors=True)
    return directory
  if os.path.exists(directory):
    old = f'{directory.rstrip(os.sep)}.old-{os.getpid()}'
    os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.makedirs(os.path.dirname(directory.rstrip(os.sep)) or '.', exist_ok=True)
    try:
      os.replace(tmp, directory)
    except OSError:  # Another process renamed its (same) shards into place in between.
      if _bad_cache(directory, digest, len(parts)):
        raise
      shutil.rmtree(tmp, ignore_errors=True)
  return directory


def _bad_cache(directory: str, digest: str, num_clients: int) -> list:
  """[] when `directory` holds these shards unharmed; ['all'] when it holds none (or others);
  else the ids of missing or changed shards."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return ['all']
  if manifest.get('content_hash') != digest:
    return ['all']
  return _damaged_shards(directory, manifest, range(num_clients))


# A client whose whole local training (examples x epochs, as float32 model inputs) fits in this
# many bytes gets its batches computed up front, without tf.data map functions (below).
MATERIALIZE_BYTES = 64 << 20


# Eight parameters: the task's data settings (shape, batch, preprocessing, augmentation, epochs)
# are each the caller's own choice; tasks.base.Task passes them by name.
def make_client_dataset_fn(shard_dir: str, image_shape: Sequence[int], batch_size: int,
                           preprocess: Callable[[tf.Tensor], tf.Tensor],
                           augment: Optional[Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = None,
                           epochs: int = 1, drop_remainder: bool = False,
                           materialize_bytes: int = MATERIALIZE_BYTES):
  """Returns `fn(client_id: tf.string, seed: tf.int64) -> tf.data.Dataset` of batched
  (float32 images, int32 labels), built from TF ops only (it is traced into TFF computations).

  The dataset holds `epochs` passes over the client's examples, each in its own stateless random
  order and batched separately (the last batch of an epoch may be smaller, like a PyTorch
  DataLoader without drop_last), so iterating it once is the client's whole local training.
  `augment(image_uint8, seed[2]) -> image_uint8` is applied with a per-example stateless seed.

  Two ways to the same bits, chosen per client by its size (tf.cond):
  - small (epochs x examples x input bytes <= `materialize_bytes`): every epoch's augmented,
    preprocessed examples are computed when the dataset is made (tf.map_fn over the examples) and
    sliced into batches. No tf.data function: a new iterator over a dataset with `map` or
    `flat_map` instantiates and optimises their functions again, a CPU cost that many small
    clients would pay every round;
  - large: a stream (one epoch after another, examples mapped in parallel), so memory stays a few
    batches whatever the client's size, and augmentation overlaps training.
  `preprocess` must give the same bits in a tf.data function and in a graph (tasks.base.Task's
  does: one multiply-add, which graph optimisation leaves alone).

  Raises:
    ValueError: batch_size or epochs below 1.
  """
  if batch_size < 1:
    raise ValueError(f'--batch_size must be >= 1, got {batch_size}.')
  if epochs < 1:
    raise ValueError(f'--local_epochs must be >= 1, got {epochs}.')
  return _ClientDatasets(os.path.abspath(shard_dir), [int(d) for d in image_shape], batch_size,
                         preprocess, augment, epochs, drop_remainder, materialize_bytes)


@dataclasses.dataclass(frozen=True, eq=False)  # Hashed by identity, as the closure it replaced.
class _ClientDatasets:
  """make_client_dataset_fn's function: (client_id, seed) -> the client's batched dataset."""
  shard_dir: str
  image_shape: list[int]
  batch_size: int
  preprocess: Callable[[tf.Tensor], tf.Tensor]
  augment: Optional[Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]
  epochs: int
  drop_remainder: bool
  materialize_bytes: int

  def _parse(self, record):
    ex = tf.io.parse_single_example(record, _FEATURES)
    image = tf.reshape(tf.io.decode_raw(ex['image'], tf.uint8), self.image_shape)
    return image, tf.cast(ex['label'], tf.int32)

  @staticmethod
  def _order(n, seed, epoch):
    return tf.argsort(tf.random.stateless_uniform([n], seed=tf.stack([seed, epoch])))

  def _prep(self, image, label, seed, epoch, position):
    if self.augment is not None:
      image = self.augment(image, tf.stack([seed, (epoch + 1) * (1 << 32) + position]))
    return self.preprocess(image), label

  def _batch(self, ds):
    return ds.batch(self.batch_size, drop_remainder=self.drop_remainder)

  def _streamed(self, images, labels, n, seed):
    def one_epoch(epoch):
      o = self._order(n, seed, epoch)
      ds = tf.data.Dataset.from_tensor_slices(
          (tf.gather(images, o), tf.gather(labels, o), tf.range(tf.cast(n, tf.int64))))
      # Parallel but order-preserving: every op is stateless, so the result is the same as serial.
      return self._batch(
          ds.map(lambda image, label, position: self._prep(image, label, seed, epoch, position),
                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))
    return tf.data.Dataset.range(self.epochs).flat_map(one_epoch)

  def _materialized(self, images, labels, n, seed):
    ds = None
    for e in range(self.epochs):
      epoch = tf.constant(e, tf.int64)
      o = self._order(n, seed, epoch)
      positions = tf.range(tf.cast(n, tf.int64))
      x = tf.map_fn(lambda a: self._prep(a[0], a[1], seed, epoch, a[2])[0],
                    (tf.gather(images, o), tf.gather(labels, o), positions),
                    fn_output_signature=tf.float32)
      x = tf.ensure_shape(x, [None, *self.image_shape])
      epoch_ds = self._batch(tf.data.Dataset.from_tensor_slices((x, tf.gather(labels, o))))
      ds = epoch_ds if ds is None else ds.concatenate(epoch_ds)
    return ds

  def __call__(self, client_id, seed):
    path = tf.strings.join([self.shard_dir, '/', client_id, '.tfrecord'])
    images, labels = tf.data.TFRecordDataset(path).map(self._parse).batch(
        1 << 30).get_single_element()
    n = tf.shape(labels)[0]
    seed = tf.cast(seed, tf.int64)
    example_bytes = 4 * int(np.prod(self.image_shape))
    small = tf.cast(n, tf.int64) * (self.epochs * example_bytes) <= self.materialize_bytes
    return tf.cond(small, lambda: self._materialized(images, labels, n, seed),
                   lambda: self._streamed(images, labels, n, seed))
