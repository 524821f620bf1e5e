"""Federated algorithms written once as TF functions (see docs/algorithms.md).

`build(name, model_fn, config=ClientConfig(...), regularizer=None, **hparams)` returns an
`base.Algorithm`; the runtimes (tff_decorr.runtimes) execute it.
"""

from __future__ import annotations

from typing import Callable, Optional

from tff_decorr.algorithms import base
from tff_decorr.algorithms import fedavg
from tff_decorr.algorithms import fedavg_decomposed
from tff_decorr.algorithms import fedavgm
from tff_decorr.algorithms import fedbn
from tff_decorr.algorithms import fednova
from tff_decorr.algorithms import fedprox
from tff_decorr.algorithms import moon
from tff_decorr.algorithms import scaffold
from tff_decorr.algorithms.client_update import ClientConfig

_REGISTRY = {
    'fedavg': fedavg.FedAvg,
    'fedprox': fedprox.FedProx,
    'fedavgm': fedavgm.FedAvgM,
    'fedbn': fedbn.FedBN,
    'moon': moon.Moon,
    'scaffold': scaffold.Scaffold,
    'fednova': fednova.FedNova,
    'fedavg_decomposed': fedavg_decomposed.FedAvgDecomposed,
}
NAMES = tuple(_REGISTRY)


def names() -> tuple:
  return NAMES


def algorithm_class(name: str) -> type:
  """The class of algorithm `name` (its __init__ signature names the hyper-parameters it takes)."""
  if name not in _REGISTRY:
    raise ValueError(f'--algorithm={name!r} is unknown; choose one of {", ".join(NAMES)}.')
  return _REGISTRY[name]


def build(name: str, model_fn: Callable, config: ClientConfig = ClientConfig(),
          regularizer: Optional[Callable] = None, **hparams) -> base.Algorithm:
  """Builds algorithm `name`. hparams: fedprox mu; fedavgm server_momentum, form, server_lr;
  moon mu, temperature; scaffold num_clients, server_lr; fedavg_decomposed coefficient_period."""
  cls = algorithm_class(name)
  try:
    return cls(model_fn, config, regularizer, **hparams)
  except TypeError as e:
    raise ValueError(f'Bad hyper-parameters for --algorithm={name}: {e}') from e
