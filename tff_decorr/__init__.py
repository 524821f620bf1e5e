"""tff_decorr: FedDecorr and its baselines on TensorFlow Federated.

`tff_decorr.train(config)` runs a configuration (tff_decorr.training), for example
`tff_decorr.train(tff_decorr.config.make(task='digits', algorithm='fedprox', fedprox_mu=1e-3))`.
Submodules are imported on first use, so importing the package itself does not import TensorFlow.
"""

import importlib

__version__ = '0.2.0'


def __getattr__(name):
  if name == 'train':
    from tff_decorr import training  # pylint: disable=g-import-not-at-top
    return training.train
  try:
    return importlib.import_module(f'{__name__}.{name}')
  except ModuleNotFoundError as e:
    if e.name != f'{__name__}.{name}':
      raise
    raise AttributeError(f'module {__name__} has no attribute {name!r}') from None
