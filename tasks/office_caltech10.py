"""Office-Caltech10 (4 domains, 10 classes): a TFDS builder over a manual folder tree, and its task.

Layout expected in the manual directory (the usual distribution of the dataset, as FedBN uses it):
  <manual_dir>/{amazon,caltech,dslr,webcam}/<class>/*.(jpg|jpeg|png)
with the 10 classes back_pack, bike, calculator, headphones, keyboard, laptop_computer, monitor,
mouse, mug, projector (label = index in that order; domain = index in the order above).

Deviations from FedBN (docs/tasks.md): images are resized to 64x64 (FedBN: 256x256) so AlexNet-BN
trains on a CPU; the train/test split is our own, deterministic: an image goes to 'test' when the
first 8 bytes of sha256("<domain>/<class>/<file name>") read as an integer are 0 mod 5 (about 20%
per domain), otherwise to 'train'. It does not depend on file order, machine or Python hash seed.

Prepare offline:
  .venv/bin/python -m tasks.office_caltech10 --data_dir=DIR --manual_dir=TREE_ROOT
then train with --data_dir=DIR.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Dict, Iterator, Optional

import numpy as np

from tff_decorr.tasks import base
from tff_decorr.tasks import tfds_builder

DOMAINS = ('amazon', 'caltech', 'dslr', 'webcam')
CLASSES = ('back_pack', 'bike', 'calculator', 'headphones', 'keyboard', 'laptop_computer',
           'monitor', 'mouse', 'mug', 'projector')
IMAGE_SIZE = 64
TEST_MODULUS = 5  # One image in five (by hash) is a test image.
_EXTENSIONS = ('.jpg', '.jpeg', '.png')

MANUAL_DOWNLOAD_INSTRUCTIONS = """\
Put the Office-Caltech10 images in the manual directory as
<manual_dir>/{amazon,caltech,dslr,webcam}/<class>/*.jpg (classes: back_pack, bike, calculator,
headphones, keyboard, laptop_computer, monitor, mouse, mug, projector), e.g. the
office_caltech_10 folder distributed with FedBN's data.
"""


def is_test(domain: str, cls: str, file_name: str) -> bool:
  """The deterministic split: sha256 of '<domain>/<class>/<file name>', first 8 bytes, mod 5."""
  digest = hashlib.sha256(f'{domain}/{cls}/{file_name}'.encode()).digest()
  return int.from_bytes(digest[:8], 'big') % TEST_MODULUS == 0


def _load_image(path: str) -> np.ndarray:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(path) as im:
    im = im.convert('RGB').resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
    return np.asarray(im, np.uint8)


def _features(tfds) -> Dict[str, Any]:
  return {'image': tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3)),
          'label': tfds.features.ClassLabel(names=CLASSES),
          'domain': tfds.features.ClassLabel(names=DOMAINS),
          'file_name': tfds.features.Text()}


def _splits(dl_manager) -> Dict[str, Iterator[tfds_builder.Example]]:
  root = os.fspath(dl_manager.manual_dir)
  missing = [d for d in DOMAINS if not os.path.isdir(os.path.join(root, d))]
  if missing:
    raise FileNotFoundError(f'--manual_dir {root}: missing domain folders {missing}. '
                            + MANUAL_DOWNLOAD_INSTRUCTIONS)
  return {'train': _examples(root, False), 'test': _examples(root, True)}


def _examples(root: str, test: bool) -> Iterator[tfds_builder.Example]:
  for domain in DOMAINS:
    for cls in CLASSES:
      folder = os.path.join(root, domain, cls)
      if not os.path.isdir(folder):
        raise FileNotFoundError(f'{folder} is missing (every domain has all 10 classes).')
      for f in sorted(os.listdir(folder)):
        if f.lower().endswith(_EXTENSIONS) and is_test(domain, cls, f) == test:
          key = f'{domain}/{cls}/{f}'
          yield key, {'image': _load_image(os.path.join(folder, f)), 'label': cls,
                      'domain': domain, 'file_name': key}


_BUILDER = tfds_builder.LazyBuilder(tfds_builder.BuilderSpec(
    class_name='OfficeCaltech10', module=__name__,
    doc='Office-Caltech10 from a manual folder tree, resized to 64x64.',
    release_notes='64x64, 80/20 split per domain by sha256 of the path.',
    instructions=MANUAL_DOWNLOAD_INSTRUCTIONS, features=_features, splits=_splits,
    manual_help='Folder holding {amazon,caltech,dslr,webcam}/<class>/ images.'))
builder_class = _BUILDER.builder_class


def prepare(data_dir: str, manual_dir: str) -> None:
  """Builds the TFDS dataset into `data_dir` from the folder tree `manual_dir`."""
  _BUILDER.prepare(data_dir, manual_dir)


@dataclasses.dataclass(frozen=True)
class OfficeCaltech10Task(base.Task):

  def load_split(self, split: str, data_dir: Optional[str]):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    if split not in ('train', 'test'):
      raise ValueError(f'unknown split {split!r}; use train or test.')
    builder_class()
    try:
      ds = tfds.load('office_caltech10', split=split, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises several types for a missing/unprepared dataset.
      where = data_dir or '~/tensorflow_datasets (the TFDS default)'
      raise base.DatasetNotFoundError(
          f'--data_dir: dataset office_caltech10 is not prepared in {where}. Prepare it with '
          f'`.venv/bin/python -m tasks.office_caltech10 --data_dir=DIR --manual_dir=TREE`, where '
          f'TREE holds {{amazon,caltech,dslr,webcam}}/<class>/*.jpg, then pass --data_dir=DIR.'
      ) from e
    images, labels, domains = [], [], []
    for b in tfds.as_numpy(ds.batch(4096)):
      images.append(b['image'])
      labels.append(b['label'])
      domains.append(b['domain'])
    return (np.concatenate(images).astype(np.uint8), np.concatenate(labels).astype(np.int64),
            np.concatenate(domains).astype(np.int64))


TASK = OfficeCaltech10Task(
    name='office_caltech10', num_classes=len(CLASSES), input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3),
    default_model='alexnet_bn', default_partition='domain',
    defaults=dict(rounds=300, local_epochs=1, client_lr=0.01, momentum=0.9, batch_size=64,
                  weight_decay=1e-5, num_clients=len(DOMAINS), eval_every=1,
                  partition='domain',
                  **{'feddecorr.beta': 0.1}),
    # As FedBN: pixels scaled to [0, 1] without mean/std normalisation (ToTensor only); training
    # augmentation random horizontal flip + rotation in [-30, 30] degrees.
    mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), augmentation='flip_rotate',
    description='Office-Caltech10, 4 domains (TFDS builder over a folder tree: '
                'tasks/office_caltech10.py)',
    domains=DOMAINS)


def main(argv=None):
  _BUILDER.main('Office-Caltech10', argv)


if __name__ == '__main__':
  main()
