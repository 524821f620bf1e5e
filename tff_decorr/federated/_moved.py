"""One old module path made an alias of its new module, with a DeprecationWarning naming it."""

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
  """Makes module `old` the module `new` (the same object: isinstance and identity hold).

  Args:
    old: the deprecated dotted path, whose module calls this while it is being imported.
    new: the dotted path of today.
  """
  warnings.warn(f'{old} is deprecated and will be removed in 0.4.0; import {new} instead.',
                DeprecationWarning, stacklevel=3)
  sys.modules[old] = importlib.import_module(new)
