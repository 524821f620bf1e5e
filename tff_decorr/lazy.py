"""Subpackages whose submodules are imported on first attribute access.

A base-layer module (docs/DESIGN.md, "Package map"): it imports only `importlib`, so every layer,
and the package's own __init__.py, may take `lazy_submodules` from here without importing anything
above it.
"""

import importlib


def lazy_module(name: str):
  """Module `name`, executed on its first attribute access (importlib.util.LazyLoader), or the
  module itself if it is imported already. A bin/ program names the modules it runs with at the
  top, and still answers --help before they import TensorFlow.

  Args:
    name: a module's dotted name.

  Returns:
    The module object (registered in sys.modules), executed on first use.

  Raises:
    ModuleNotFoundError: no module of that name exists.
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  if spec is None:
    raise ModuleNotFoundError(f'No module named {name!r}', name=name)
  spec.loader = importlib.util.LazyLoader(spec.loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def lazy_submodules(package: str):
  """A module `__getattr__` that imports `package`'s submodules on first attribute access.

  Args:
    package: the package's dotted name (its `__name__`).

  Returns:
    getattr_(name): the submodule `package.name`, imported; AttributeError when there is none
    (an import error inside an existing submodule propagates).
  """

  def getattr_(name):
    try:
      return importlib.import_module(f'{package}.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'{package}.{name}':
        raise
      raise AttributeError(f'module {package} has no attribute {name!r}') from None

  return getattr_
