"""Subpackages whose submodules are imported on first attribute access.

A base-layer module (docs/DESIGN.md, "Package map"): it imports only `importlib`, so every layer,
and the package's own __init__.py, may take `lazy_submodules` from here without importing anything
above it.
"""

import importlib


def lazy_submodules(package: str):
  """A module `__getattr__` that imports `package`'s submodules on first attribute access."""

  def getattr_(name):
    try:
      return importlib.import_module(f'{package}.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'{package}.{name}':
        raise
      raise AttributeError(f'module {package} has no attribute {name!r}') from None

  return getattr_
