"""tff_decorr: FedDecorr and its baselines on TensorFlow Federated.

`tff_decorr.train(config)` runs a configuration (tff_decorr.training); the submodules are imported
on use, so importing the package itself does not import TensorFlow.
"""


def __getattr__(name):
  if name == 'train':
    from tff_decorr import training  # pylint: disable=g-import-not-at-top
    return training.train
  raise AttributeError(f'module tff_decorr has no attribute {name!r}')
