"""tff_decorr: FedDecorr and its baselines on TensorFlow Federated.

`tff_decorr.train(config)` runs a configuration (tff_decorr.run.training), for example
`tff_decorr.train(tff_decorr.run.config.make(task='digits', algorithm='fedprox',
fedprox_mu=1e-3))`.

Layers (docs/DESIGN.md): components (hparams, regularizers, partitions, models/, algorithms/),
the round and its runtimes (runtimes/), the TFF face (federated/), the run program (run/), and
collapse measurement (collapse/). Submodules are imported on first use, so importing the package
itself does not import TensorFlow.
"""

import importlib

__version__ = '0.2.0'


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


_submodule = lazy_submodules(__name__)


def __getattr__(name):
  if name == 'train':
    from tff_decorr.run import training  # pylint: disable=g-import-not-at-top
    return training.train
  return _submodule(name)
