"""Tiny ImageNet (200 classes, 64x64 RGB): a TFDS builder over the official zip, and its task.

The TFDS catalog has no Tiny ImageNet, so `TinyImagenet` (TFDS name 'tiny_imagenet', 1.0.0) reads
the official `tiny-imagenet-200.zip` (wnids.txt; train/<wnid>/images/*.JPEG;
val/images/*.JPEG labelled by val/val_annotations.txt): 100,000 train images and the 10,000
validation images exposed as the 'test' split (the test images of the zip have no labels).
Labels are the wnid's index in sorted(wnids), which is what torchvision's ImageFolder (used by the
reference) assigns; the wnid is kept as a text feature.
The JPEG bytes are stored as they are (no re-encoding); the few greyscale JPEGs become RGB on
decoding (3 channels). TFDS stores the examples shuffled; the task returns them in ImageFolder's
order (sorted wnid, then sorted file name), the order the reference's partition indexes.

Prepare offline (reads <manual_dir>/tiny-imagenet-200.zip, else downloads the official URL):
  .venv/bin/python -m tasks.tiny_imagenet --data_dir=DIR --manual_dir=DIR_WITH_ZIP
then train with --data_dir=DIR.
"""

from __future__ import annotations

import dataclasses
import io
import os
import posixpath
import zipfile
from typing import Any, ClassVar, Dict, Iterator, Optional, Tuple

import numpy as np

from tff_decorr.tasks import tfds_builder
from tff_decorr.tasks import tfds_image

URL = 'http://cs231n.stanford.edu/tiny-imagenet-200.zip'
ZIP_NAME = 'tiny-imagenet-200.zip'
NUM_CLASSES = 200

MANUAL_DOWNLOAD_INSTRUCTIONS = f"""\
Put the official {ZIP_NAME} ({URL}) in the manual directory (`--manual_dir`, or TFDS's default
<data_dir>/downloads/manual/). Without it the builder downloads that URL itself.
"""


def _features(tfds) -> Dict[str, Any]:
  return {'image': tfds.features.Image(shape=(64, 64, 3), encoding_format='jpeg'),
          'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
          'wnid': tfds.features.Text(),
          'file_name': tfds.features.Text()}


def _splits(dl_manager) -> Dict[str, Iterator[tfds_builder.Example]]:
  path = None
  try:
    manual = dl_manager.manual_dir / ZIP_NAME
    if manual.exists():
      path = manual
  except AssertionError:  # No manual directory: download instead.
    pass
  if path is None:
    path = dl_manager.download(URL)
  return {'train': _examples(path, 'train'), 'test': _examples(path, 'val')}


def _examples(path, split: str) -> Iterator[tfds_builder.Example]:
  with zipfile.ZipFile(os.fspath(path)) as zf:
    names = zf.namelist()
    wnids_file = [n for n in names if posixpath.basename(n) == 'wnids.txt']
    if len(wnids_file) != 1:
      raise ValueError(f'{path}: expected one wnids.txt in the zip, found {len(wnids_file)}.')
    root = posixpath.dirname(wnids_file[0])
    wnids = sorted(zf.read(wnids_file[0]).decode().split())
    if len(wnids) != NUM_CLASSES:
      raise ValueError(f'{path}: wnids.txt lists {len(wnids)} classes, expected 200.')
    index = {w: i for i, w in enumerate(wnids)}
    if split == 'train':
      items = []
      prefix = posixpath.join(root, 'train') + '/'
      for n in names:
        parts = n[len(prefix):].split('/') if n.startswith(prefix) else []
        if len(parts) == 3 and parts[1] == 'images' and n.lower().endswith('.jpeg'):
          items.append((n, parts[0]))
    else:
      ann = zf.read(posixpath.join(root, 'val', 'val_annotations.txt')).decode()
      items = []
      for line in ann.splitlines():
        if line.strip():
          fname, wnid = line.split('\t')[:2]
          items.append((posixpath.join(root, 'val', 'images', fname), wnid))
    for name, wnid in sorted(items):
      if wnid not in index:
        raise ValueError(f'{path}: {name} has wnid {wnid!r}, not in wnids.txt.')
      key = posixpath.basename(name)
      yield key, {'image': io.BytesIO(zf.read(name)), 'label': index[wnid], 'wnid': wnid,
                  'file_name': key}


_BUILDER = tfds_builder.LazyBuilder(tfds_builder.BuilderSpec(
    class_name='TinyImagenet', module=__name__, doc='Tiny ImageNet 200 from the official zip.',
    release_notes='Train (100k) and val as test (10k); labels = sorted-wnid index.',
    instructions=MANUAL_DOWNLOAD_INSTRUCTIONS, features=_features, splits=_splits,
    info={'homepage': 'http://cs231n.stanford.edu/'}, manual_required=False,
    manual_help=f'Directory holding {ZIP_NAME}.'))
builder_class = _BUILDER.builder_class


def prepare(data_dir: str, manual_dir: Optional[str] = None) -> None:
  """Builds the TFDS dataset into `data_dir` (from `manual_dir`/tiny-imagenet-200.zip if given)."""
  _BUILDER.prepare(data_dir, manual_dir)


@dataclasses.dataclass(frozen=True)
class TinyImagenetTask(tfds_image.TfdsImageTask):
  order_features: ClassVar[Tuple[str, ...]] = ('wnid', 'file_name')

  def load_split(self, split: str, data_dir: Optional[str]):
    builder_class()  # Registers 'tiny_imagenet' with TFDS.
    return super().load_split(split, data_dir)

  def original_order(self, split: str, data_dir: Optional[str],
                     features: Dict[str, np.ndarray]) -> np.ndarray:
    """torchvision ImageFolder's order, which the reference indexes: class folders (wnids) sorted,
    then file names sorted as strings (train/<wnid>/images/*, and val/<wnid>/* after the
    reference's val reformatting)."""
    del split, data_dir
    keys = list(zip(features['wnid'].tolist(), features['file_name'].tolist()))
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), np.int64)

  def _missing_message(self, data_dir, err=None):
    where = data_dir or '~/tensorflow_datasets (the TFDS default)'
    return (f'--data_dir: dataset tiny_imagenet is not prepared in {where}. Prepare it with '
            f'`.venv/bin/python -m tasks.tiny_imagenet --data_dir=DIR --manual_dir=ZIPDIR`, '
            f'where ZIPDIR holds the manual zip {ZIP_NAME} ({URL}; without --manual_dir it is '
            f'downloaded), then pass --data_dir=DIR.')


TASK = TinyImagenetTask(
    name='tiny_imagenet', tfds_name='tiny_imagenet', num_classes=NUM_CLASSES,
    input_shape=(64, 64, 3), default_model='mobilenet_v2_cifar', default_partition='dirichlet',
    defaults=dict(rounds=50, local_epochs=10, client_lr=0.01, momentum=0.9, batch_size=64,
                  weight_decay=1e-4, num_clients=10, eval_every=1,
                  partition='dirichlet',
                  **{'feddecorr.beta': 0.1, 'dirichlet.alpha': 0.05, 'fedavgm.server_momentum': 0.5}),
    mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), augmentation='autoaugment',
    description='Tiny ImageNet 200 (TFDS builder over the official zip: tasks/tiny_imagenet.py)')


def main(argv=None):
  _BUILDER.main('Tiny ImageNet', argv)


if __name__ == '__main__':
  main()
