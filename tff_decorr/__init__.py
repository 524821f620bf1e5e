"""tff_decorr: FedDecorr and its baselines on TensorFlow Federated.

`tff_decorr.train(config)` runs a configuration (tff_decorr.run.training), for example
`tff_decorr.train(tff_decorr.configs.config.make(task='digits', algorithm='fedprox',
fedprox_mu=1e-3))`.

Layers, lowest first (docs/DESIGN.md): components (hparams, tf_env, regularizers, partitions, lazy,
models/, algorithms/), the TFF machinery (federated/), the round and its runtimes, the tff.learning
face among them (runtimes/), collapse measurement (collapse/), a run's configuration (configs/), a
run directory's files (run_files/), the run program that writes them (run/) and studies of many
runs (studies/).
Submodules are imported on first use, so importing the package itself does not import TensorFlow.

The flat module paths used before the subpackages (`tff_decorr.config`, `from tff_decorr import
learning`, ...) and 0.2.0's paths in run/ (`tff_decorr.run.config`, ...; `MOVED`) still import, as
the very module of the new path, with a DeprecationWarning naming it, until release
`deprecated_flags.REMOVED_IN` (docs/api.md).
"""

import atexit
import importlib
import sys

from tff_decorr import lazy as _lazy
from tff_decorr.lazy import lazy_submodules

__version__ = '0.2.0'

# The modules of 0.2.0's run/ that left it when run/ was split by concern, each -> its module
# today: the configuration a layer below the run program (configs/), a run directory's files
# between the two (run_files/), and studies, grids of runs and their reports, above it (studies/);
# and two that stayed, renamed for what they hold (experiment: the run's composition; program: the
# round loop, where a round's metrics are written).
_RUN_SPLIT = {
    **{m: f'configs.{m}' for m in ('config', 'deprecated_flags', 'cli')},
    **{m: f'run_files.{m}' for m in ('run_dir', 'checkpoint_files', 'client_state',
                                      'privacy_ledger', 'graph_check', 'export',
                                      'tensorboard_hparams')},
    **{m: f'studies.{m}' for m in ('study', 'report', 'run_spectra')},
    'experiment': 'run.composition', 'program': 'run.round_loop',
}

# Old module path (before the subpackage regroup, commit 1c5fa3b, or 0.2.0's path in run/) -> its
# module today, never another old path. Removing these in release REMOVED_IN is deleting this
# table and `_MovedModuleFinder` below.
MOVED = {
    **{f'tff_decorr.{m}': f'tff_decorr.federated.{m}' for m in ('tff_context', 'aggregation')},
    **{f'tff_decorr.{m}': 'tff_decorr.' + _RUN_SPLIT.get(m, f'run.{m}')
       for m in ('config', 'deprecated_flags', 'training', 'experiment', 'program',
                 'client_state', 'run_dir', 'export', 'personalized', 'cli', 'study', 'report')},
    **{f'tff_decorr.{m}': f'tff_decorr.collapse.{m}' for m in ('analysis', 'plots')},
    # Moved down a layer later (commit 05d0c56): the federated layer imports it, and a
    # lower layer must not import from run/. Its flat path of before 1c5fa3b is its path again.
    'tff_decorr.run.tf_env': 'tff_decorr.tf_env',
    # Moved up a layer later (commit 4eaf560): the run program's round-end hook, which
    # imports export; collapse/ keeps the measurements (analysis, plots) and imports nothing
    # above.
    'tff_decorr.collapse_tracking': 'tff_decorr.run.collapse_tracking',
    'tff_decorr.collapse.collapse_tracking': 'tff_decorr.run.collapse_tracking',
    # Moved up a layer later (commit 1b23507): the tff.learning face over runtimes/rounds, a sibling
    # of tff_runtime and tf_runtime; federated/ keeps the TFF machinery that runtimes/ imports.
    'tff_decorr.learning': 'tff_decorr.runtimes.learning',
    'tff_decorr.federated.learning': 'tff_decorr.runtimes.learning',
    # 0.2.0's paths in run/ of the modules that left it or were renamed (_RUN_SPLIT).
    **{f'tff_decorr.run.{m}': f'tff_decorr.{new}' for m, new in _RUN_SPLIT.items()},
}


_submodule = lazy_submodules(__name__)


def __getattr__(name):
  if name == 'train':
    from tff_decorr.run import training  # pylint: disable=g-import-not-at-top
    return training.train
  return _submodule(name)


def _importer_stacklevel() -> int:
  """The stacklevel of the first frame outside the import machinery and the packages' lazy
  attributes (tff_decorr.lazy): the line that imported the old path, which the warning then names.
  (warnings does not count importlib's frozen _bootstrap frames.)"""
  level, frame = 2, sys._getframe(2)  # pylint: disable=protected-access  (the caller's caller)
  machinery = (__file__, importlib.__file__, _lazy.__file__)
  while frame is not None and (frame.f_code.co_filename in machinery or
                               frame.f_code.co_filename.startswith('<frozen importlib.')):
    if not frame.f_code.co_filename.startswith('<frozen importlib.'):
      level += 1
    frame = frame.f_back
  return level


class _AliasLoader:  # An importlib.abc.Loader; importing only `importlib` and `sys` here.
  """Gives the module of the new path itself as the old path's module (one object, one state)."""

  def __init__(self, new: str):
    self.new = new

  def create_module(self, spec):
    # Imported only now, when the old path is: nothing (TensorFlow included) is imported earlier
    # than the old module itself imported it.
    module = importlib.import_module(self.new)
    self.spec = module.__spec__
    return module

  def exec_module(self, module) -> None:
    # Already executed under its new name; importlib set __spec__ to the old path's: put the
    # module's own back (importlib.reload, pickling by reference).
    module.__spec__ = self.spec


class _MovedModuleFinder:  # An importlib.abc.MetaPathFinder.
  """Resolves the old paths of MOVED, after every real finder (a real module always wins)."""

  def find_spec(self, fullname, path=None, target=None):
    """An importlib.machinery.ModuleSpec for an old path of MOVED, None for any other name."""
    del path, target
    new = MOVED.get(fullname)
    if new is None:
      return None
    # Imported here, not with the package: `import tff_decorr` stays as light as it was.
    import importlib.machinery  # pylint: disable=g-import-not-at-top,redefined-outer-name
    import warnings  # pylint: disable=g-import-not-at-top
    from tff_decorr.configs import deprecated_flags  # pylint: disable=g-import-not-at-top
    warnings.warn(f'{fullname} moved to {new}; the old path is deprecated and will be removed in '
                  f'tff_decorr {deprecated_flags.REMOVED_IN} (this is {__version__}): '
                  f'import {new}.', DeprecationWarning, stacklevel=_importer_stacklevel())
    return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def _remove_finder() -> None:
  """Takes the finder off sys.meta_path at exit (atexit: after the exit handlers registered later,
  which may still import an old path). Left there, it keeps this package's globals alive into the
  interpreter's finalisation and changes the order modules are torn down in, enough for TFF
  0.87's default context to print an ignored exception at exit (its __del__ running after
  `subprocess` is gone)."""
  sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _MovedModuleFinder)]


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
  sys.meta_path.append(_MovedModuleFinder())
  atexit.register(_remove_finder)
