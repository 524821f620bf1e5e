"""Small helpers shared by the absl binaries in bin/."""

from __future__ import annotations

import os

from absl import flags
from absl import logging


def user_path(path: str) -> str:
  """Relative paths are relative to where the user ran the command (also under `bazel run`,
  whose working directory is the runfiles tree; Bazel passes the user's in BUILD_WORKING_DIRECTORY).
  """
  if not path:
    return path
  path = os.path.expanduser(path)
  if os.path.isabs(path):
    return path
  return os.path.abspath(os.path.join(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()),
                                      path))


def quiet_logging() -> None:
  """WARNING level unless --verbosity was given: TF's SavedModel writer logs every asset at INFO,
  which would drown the progress lines."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
