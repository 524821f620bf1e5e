"""The embedded default task: scikit-learn's 8x8 handwritten digits (shipped with the package).

1,797 real images of 10 classes, no download. A fixed, stratified 80/20 split (seed 0) gives 1,437
train and 360 test images. Pixels are 0..16 in the source; they are stored as uint8 0..255
(x * 255 / 16, rounded: distinct values stay distinct), so the task uses the same uint8 pipeline as
the image datasets.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tff_decorr.tasks import base

_TEST_FRACTION = 0.2


@dataclasses.dataclass(frozen=True)
class DigitsTask(base.Task):

  def load_split(self, split, data_dir):
    del data_dir  # Shipped with scikit-learn.
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    from sklearn import model_selection  # pylint: disable=g-import-not-at-top
    if split not in ('train', 'test'):
      raise ValueError(f'unknown split {split!r} for digits; use train or test.')
    d = datasets.load_digits()
    images = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    labels = d.target.astype(np.int64)
    tr, te = model_selection.train_test_split(np.arange(len(labels)), test_size=_TEST_FRACTION,
                                              random_state=0, stratify=labels)
    idx = np.sort(tr if split == 'train' else te)
    return images[idx], labels[idx], None


TASK = DigitsTask(
    name='digits',
    num_classes=10,
    input_shape=(8, 8, 1),
    default_model='small_cnn',
    default_partition='dirichlet',
    defaults=dict(rounds=15, local_epochs=5, client_lr=0.01, momentum=0.9, batch_size=32,
                  weight_decay=1e-5, num_clients=10, eval_every=1,
                  regularizer='none,feddecorr',
                  **{'feddecorr.beta': 0.1, 'dirichlet.alpha': 0.5, 'fedavgm.server_momentum': 0.9}),
    mean=(0.5,), std=(0.5,),
    augmentation='none',
    description='scikit-learn 8x8 digits, embedded (no download)')
