"""TensorFlow's process environment, set before TensorFlow is imported (issue 18).

Import this module before `import tensorflow` (the binaries in bin/ do so first):

  from tff_decorr.run import tf_env  # pylint: disable=unused-import

It turns on TensorFlow's oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS=1`) unless the user set the
variable: TF 2.14 enables them by default only on CPUs with AVX512-VNNI, AVX512-BF16 or AMX, and on
an AVX2 CPU its own backward convolutions made a ResNet20 client step 1.4x slower (issue 18). The
variable is read once, when TensorFlow starts, so it must be in the environment before the import;
TFF's `worker_binary` (a separate, statically linked TensorFlow) reads it from its own environment,
which `tff_context.WorkerProcess` builds with `worker_environment()`. oneDNN changes float
rounding (docs/benchmarks.md §7). `TF_ENABLE_ONEDNN_OPTS=0` in the environment keeps it off.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping, Optional

ONEDNN_VARIABLE = 'TF_ENABLE_ONEDNN_OPTS'
_DEFAULTS = {ONEDNN_VARIABLE: '1'}


def configure(environ: Optional[MutableMapping[str, str]] = None) -> None:
  """Adds the project's defaults to `environ` (default: this process's), keeping the user's."""
  environ = os.environ if environ is None else environ
  for name, value in _DEFAULTS.items():
    environ.setdefault(name, value)


def worker_environment(base: Optional[Mapping[str, str]] = None) -> dict:
  """`base` (default: this process's environment) plus the defaults, for a child process."""
  env = dict(os.environ if base is None else base)
  configure(env)
  return env


configure()
