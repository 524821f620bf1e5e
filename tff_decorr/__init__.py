"""tff_decorr: FedDecorr and its baselines on TensorFlow Federated.

`tff_decorr.train(config)` runs a configuration (tff_decorr.program.training), for example
`tff_decorr.train(tff_decorr.configs.config.make(task='digits', algorithm='fedprox',
fedprox_mu=1e-3))`.

Layers, lowest first (docs/DESIGN.md): components (hparams, tf_env, regularizers, partitions, lazy,
models/, algorithms/), the registry of aggregators (aggregators), TFF's worker process and its
sandbox (worker/), the round and its runtimes, the tff.learning face among them (runtimes/),
collapse measurement (collapse/), a run's configuration (configs/), a run directory's files
(run_files/), the training program that writes them (program/) and studies of many runs
(studies/). "A run" is one training run and its directory (docs/DESIGN.md, "Words").
Submodules are imported on first use, so importing the package itself does not import TensorFlow.
"""

import os as _os

import atexit as _atexit
import sys as _sys

from tff_decorr.lazy import lazy_submodules

__version__ = '0.3.0'

# tasks/ and bin/ are tff_decorr.tasks and tff_decorr.bin, their one import name: the wheel
# installs them inside this package (pyproject.toml's package-dir); a checkout (and Bazel's
# runfiles) keeps them beside it, so there the parent directory is one more place for this
# package's submodules (docs/DESIGN.md, "Packaging").
_PARENT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], 'tasks')) and
    _os.path.isfile(_os.path.join(_PARENT, 'tasks', '__init__.py'))):
  __path__.append(_PARENT)


def _release_tff_default_context() -> None:
  """At exit, while every module is still intact: drops TensorFlow Federated's own default context
  (set when `tensorflow_federated` is imported, whichever code imported it) and collects it.

  That context holds a `ServiceManager` whose `__del__` reads `subprocess.Popen`; left to the
  interpreter's teardown, it runs after `subprocess` is gone and prints "Exception ignored in
  ServiceManager.__del__ ... 'NoneType' object has no attribute 'Popen'".
  Imports nothing unless TFF was imported.
  """
  if 'tensorflow_federated' not in _sys.modules:
    return
  import gc  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import runtime_error_context  # pylint: disable=g-import-not-at-top
  context_stack_impl.context_stack.set_default_context(runtime_error_context.RuntimeErrorContext())
  gc.collect()


_atexit.register(_release_tff_default_context)

_submodule = lazy_submodules(__name__)


def __getattr__(name):
  if name == 'train':
    from tff_decorr.program import training  # pylint: disable=g-import-not-at-top
    return training.train
  return _submodule(name)
