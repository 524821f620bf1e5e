"""Tasks by name: `get('cifar10')`, `names()`."""

from __future__ import annotations

from typing import Tuple

from tff_decorr.tasks import base
from tff_decorr.tasks import digits
from tff_decorr.tasks import domainnet
from tff_decorr.tasks import office_caltech10
from tff_decorr.tasks import tfds_image
from tff_decorr.tasks import tiny_imagenet

_TASKS = {t.name: t for t in (digits.TASK, tfds_image.CIFAR10, tfds_image.CIFAR100,
                              tiny_imagenet.TASK, office_caltech10.TASK,
                              domainnet.TASK)}


def names() -> Tuple[str, ...]:
  """The tasks' names.

  Returns:
    A tuple of names ('digits', 'cifar10', ...), the `--task` choices.
  """
  return tuple(_TASKS)


def get(name: str) -> base.Task:
  """The task `name`: its data, model defaults and the paper's settings.

  Args:
    name: a name in `names()`.

  Returns:
    Its `base.Task`.

  Raises:
    ValueError: an unknown name (naming --task and the choices).
  """
  if name not in _TASKS:
    raise ValueError(f'--task: unknown task {name!r}; choose one of {", ".join(_TASKS)}.')
  return _TASKS[name]
