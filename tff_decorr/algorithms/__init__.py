"""Federated algorithms written once as TF functions (see docs/algorithms.md).

`build(name, model_fn, optimizer=SGDHParams(...), regularizer=None, hparams=None)` returns a
`base.Algorithm`; the runtimes (tff_decorr.runtimes) execute it. Each algorithm declares its
hyper-parameters once, as `<Algorithm>.HParams` (a frozen dataclass, tff_decorr.hparams); a new
algorithm is one module plus one `register(...)` line here (docs/DESIGN.md, "Adding an
algorithm").
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from tff_decorr import _moved
from tff_decorr.algorithms import base
from tff_decorr.algorithms import fedavg
from tff_decorr.algorithms import fedavg_decomposed
from tff_decorr.algorithms import fedavgm
from tff_decorr.algorithms import fedbn
from tff_decorr.algorithms import fedexp
from tff_decorr.algorithms import fedlc
from tff_decorr.algorithms import fednova
from tff_decorr.algorithms import fedopt
from tff_decorr.algorithms import fedprox
from tff_decorr.algorithms import fedrs
from tff_decorr.algorithms import fedsam
from tff_decorr.algorithms import moon
from tff_decorr.algorithms import scaffold
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms.client_update import SGDHParams

_REGISTRY = {}


def register(cls: type) -> type:
  """Adds an algorithm to the registry: its flags, `--algorithm` choice and `build` then work
  without further edits (docs/DESIGN.md, "Adding an algorithm"). Usable as a class decorator.

  Args:
    cls: a `base.Algorithm` subclass with a unique `name` and its `HParams` (whose `component` is
      the name).

  Returns:
    `cls` itself.

  Raises:
    ValueError: `cls` is not a named Algorithm subclass, another class has its name, or its
      HParams' `component` is not its name.
  """
  if not (isinstance(cls, type) and issubclass(cls, base.Algorithm)) or not cls.name:
    raise ValueError(f'register: {cls!r} is not a named tff_decorr Algorithm subclass.')
  if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
    raise ValueError(f'register: an algorithm named {cls.name!r} exists already.')
  hp = cls.HParams
  if dataclasses.fields(hp) and hp.component != cls.name:
    raise ValueError(f'register: {hp.__name__}.component must be {cls.name!r} (its flag prefix).')
  _REGISTRY[cls.name] = cls
  return cls


def names() -> tuple:
  """The registered algorithms' names.

  Returns:
    A tuple of names, the built-in ones (`NAMES`) first, then those registered later.

  Raises:
    Nothing.
  """
  return tuple(_REGISTRY)


def algorithm_class(name: str) -> type:
  """The Algorithm subclass registered as `name`.

  Args:
    name: a name in `names()`.

  Returns:
    The class (not an instance).

  Raises:
    ValueError: an unknown name (the message lists the choices).
  """
  if name not in _REGISTRY:
    raise ValueError(f'--algorithm={name!r} is unknown; choose one of {", ".join(names())}.')
  return _REGISTRY[name]


def hparams_class(name: str) -> type:
  """The frozen dataclass of algorithm `name`'s hyper-parameters (tff_decorr.hparams).

  Args:
    name: a name in `names()`.

  Returns:
    Its `hparams.HParams` subclass (`hparams.NoHParams` for an algorithm without settings).

  Raises:
    ValueError: an unknown name (the message lists the choices).
  """
  return algorithm_class(name).HParams


# Seven parameters: the algorithm, its model and client settings, then run facts some need.
def build(name: str, model_fn: Callable, optimizer: SGDHParams = SGDHParams(),
          regularizer: Optional[Callable] = None, hparams=None, *,
          num_clients: Optional[int] = None, local_epochs: int = 1,
          **values) -> base.Algorithm:
  """Builds algorithm `name`: its client step and server step over a model.

  Args:
    name: a name in `names()`.
    model_fn: no-arg callable returning a Keras model with the project's dict outputs
      ({'representation', 'logits'}; `runtimes.learning.as_dict_model` wraps a plain one).
    optimizer: the client optimiser's settings (`SGDHParams`: lr, momentum, weight_decay; the
      keyword `config`, its name before 0.4.0, still works with a DeprecationWarning).
    regularizer: fn(representation, logits) -> scalar added to the client loss (a
      `regularizers.get(...)`), or None.
    hparams: an instance of the algorithm's HParams, or None.
    num_clients: the total number of clients N; required by algorithms that declare
      `needs_num_clients` (SCAFFOLD), ignored by the others.
    local_epochs: the passes over a client's examples its dataset holds, for algorithms that
      declare `needs_local_epochs` (FedLC counts labels per epoch), ignored by the others.
    **values: the HParams' fields as keywords instead (`build('fedprox', ..., mu=0.01)`).

  Returns:
    The `base.Algorithm` instance.

  Raises:
    ValueError: an unknown name, an unknown keyword (never ignored), a value out of range (naming
      its flag), both `hparams` and keywords, or num_clients missing where it is needed.
  """
  cls = algorithm_class(name)
  optimizer = client_update.optimizer_argument(optimizer, values, 'build')
  if values:
    if hparams is not None:
      raise ValueError('build: give hparams or keyword hyper-parameters, not both.')
    hparams = cls.HParams.from_mapping(values)
  kwargs = {'num_clients': num_clients} if num_clients is not None or cls.needs_num_clients else {}
  if cls.needs_local_epochs:
    kwargs['local_epochs'] = local_epochs
  return cls(model_fn, optimizer, regularizer, hparams, **kwargs)


for _cls in (fedavg.FedAvg, fedprox.FedProx, fedavgm.FedAvgM, fedbn.FedBN, moon.Moon,
             scaffold.Scaffold, fednova.FedNova, fedavg_decomposed.FedAvgDecomposed):
  register(_cls)
for _cls in (fedlc.FedLC, fedrs.FedRS, fedsam.FedSAM,  # the reference's other baselines
             fedopt.FedAdagrad, fedopt.FedAdam, fedopt.FedYogi, fedexp.FedExp):
  register(_cls)
NAMES = names()  # The built-in algorithms (registered ones added later appear in names()).


# ClientConfig, SGDHParams' name before 0.4.0.
__getattr__ = _moved.renamed(__name__, {'ClientConfig': 'SGDHParams'}, globals())
