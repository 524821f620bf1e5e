"""The paths of before the training program was named tff_decorr.program.

Deprecated; removed in 0.4.0 (CHANGELOG.md). Each module here is the module of the same name in
tff_decorr.program (`tff_decorr.run.composition` is `tff_decorr.program.experiment`); importing
one warns once, naming the new path. "run" now means one thing: one training run and its directory
(docs/DESIGN.md, "Words").
"""

import importlib as _importlib

_MODULES = ('training', 'composition', 'round_loop', 'personalized', 'phases', 'collapse_tracking')


def __getattr__(name: str):
  """`tff_decorr.run.training` and the other old modules as attributes, imported on first use as
  before (each warns as it is imported); any other name, 0.2.0's removed ones among them, is an
  AttributeError."""
  if name in _MODULES:
    return _importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
