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
"""

from tff_decorr.lazy import lazy_submodules

__version__ = '0.3.0'


_submodule = lazy_submodules(__name__)


def __getattr__(name):
  if name == 'train':
    from tff_decorr.run import training  # pylint: disable=g-import-not-at-top
    return training.train
  return _submodule(name)
