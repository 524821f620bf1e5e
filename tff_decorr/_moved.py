"""Old paths and names kept until 0.4.0, each with a DeprecationWarning naming what replaces it:
a module path made an alias of its new module (alias), a name of a module served as its new name
(renamed)."""

import importlib
import sys
from typing import Any, Callable, Mapping, Sequence
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


def renamed(module: str, names: Mapping[str, str], namespace: Mapping[str, Any]
            ) -> Callable[[str], Any]:
  """A module's `__getattr__` that serves each old name as the object of its new name.

  Args:
    module: the module's dotted path (its `__name__`).
    names: {old name: new name}.
    namespace: the module's globals, where the new names are looked up when an old one is used.

  Returns:
    The `__getattr__(name)`: for an old name, the new name's object, with a DeprecationWarning
    naming it; for any other name, AttributeError.
  """
  short = module.rsplit('.', 1)[-1]

  def __getattr__(name: str):  # pylint: disable=invalid-name
    if name not in names:
      raise AttributeError(f'module {module!r} has no attribute {name!r}')
    warnings.warn(f'{short}.{name} is deprecated and will be removed in 0.4.0; it is '
                  f'{short}.{names[name]}.', DeprecationWarning, stacklevel=2)
    return namespace[names[name]]

  return __getattr__


def old_modules(package: str, names: Sequence[str]) -> Callable[[str], Any]:
  """A deprecated package's `__getattr__`: its old modules as attributes, imported on first use
  as before (each warns as it is imported, through `alias`).

  Args:
    package: the package's dotted path (its `__name__`).
    names: its modules' names.

  Returns:
    The `__getattr__(name)`: the module for a name in `names`; AttributeError for any other.
  """

  def __getattr__(name: str):  # pylint: disable=invalid-name
    if name in names:
      return importlib.import_module(f'{package}.{name}')
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  return __getattr__
