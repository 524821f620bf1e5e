"""Hyper-parameters declared once, by the component that uses them.

Every algorithm, regulariser, partition and aggregator declares its settings as a frozen dataclass
subclassing `HParams`, each field made with `field(default, help, ...)`. That one declaration
gives:
- defaults and documentation (the field's help);
- validation, in one place per value: `__post_init__` checks every field's type, finiteness,
  bounds and choices, and errors name the command-line flag (`--<component>_<field>`);
- the command-line flags, which bin/train generates from the registries (`flag_specs`);
- the keys a task's paper defaults use (`'<component>.<field>'`).

Why dataclasses and not absl flags directly: the same settings are used from Python
(`algorithms.build`, `tff_decorr.runtimes.learning`, benchmarks, tests) where no flags exist.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Type


# Nine parameters: a setting's declaration, as dataclasses.field's; all but two keyword-only.
def field(default: Any, help: str, *, minimum: Optional[float] = None,  # pylint: disable=redefined-builtin
          maximum: Optional[float] = None, min_exclusive: bool = False,
          max_exclusive: bool = False, choices: Optional[Sequence[str]] = None,
          allow_inf: bool = False, flag: Optional[str] = None) -> Any:
  """A hyper-parameter: default, one-line help, and the constraints `HParams` checks.

  Declares one field of an `HParams` dataclass; its type is the default's (bool, int, float or
  str), and a value given later is converted to it and checked when the HParams is made.

  Args:
    default: the value when none is given; its type is the setting's type.
    help: one line, the flag's help text.
    minimum: lowest value allowed (numbers), None for no bound.
    maximum: highest value allowed (numbers), None for no bound.
    min_exclusive: the minimum itself is not allowed.
    max_exclusive: the maximum itself is not allowed.
    choices: the allowed values (strings), None for any.
    allow_inf: a float may be +-inf (NaN never is).
    flag: the flag's suffix, if not the field's name (FedUV's `lam` is `--feduv_lambda`: `lambda`
      is a Python keyword).

  Returns:
    A `dataclasses.field` carrying the constraints as metadata.

  Raises:
    Nothing itself; the constraints are checked when an HParams is made (ValueError naming the
    flag).
  """
  return dataclasses.field(default=default, metadata={
      'help': help, 'minimum': minimum, 'maximum': maximum, 'min_exclusive': min_exclusive,
      'max_exclusive': max_exclusive, 'choices': tuple(choices) if choices else None,
      'allow_inf': allow_inf, 'flag': flag})


@dataclasses.dataclass(frozen=True)
class HParams:
  """Base of every component's hyper-parameters: a frozen dataclass of `field(...)`s.

  `component` is the registry name (the flag prefix, `--<component>_<field>`); a subclass sets it.
  Every value is converted to its field's type and checked against the field's constraints when
  the object is made.

  Args:
    **fields: a value per field of the subclass (by name); a field left out takes its default.

  Raises:
    ValueError: a value of the wrong type or outside its constraints; the message names the flag
      (`--fedprox_mu: must be >= 0.0, got -1.0.`).
    TypeError: a keyword that is no field (use `from_mapping` for a message naming the settings).
  """

  component: ClassVar[str] = ''
  # The flags' prefix when it is not `component` ('': each flag is named by its field, as the
  # client optimiser's --client_lr, --momentum and --weight_decay are).
  flag_prefix: ClassVar[Optional[str]] = None

  def __post_init__(self):
    for f in dataclasses.fields(self):
      object.__setattr__(self, f.name, _check(self, f, getattr(self, f.name)))

  @classmethod
  def flag_name(cls, name: str) -> str:
    """`<prefix>_<field>` (or the field's `flag` suffix), the prefix being `flag_prefix` or else
    `component`; without a prefix (the client optimiser's settings) the field or its `flag`."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    suffix = f.metadata.get('flag') or f.name
    prefix = cls.component if cls.flag_prefix is None else cls.flag_prefix
    return f'{prefix}_{suffix}' if prefix else suffix

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any]) -> 'HParams':
    """Builds from {field: value}; an unknown key is an error naming the component's settings
    (never silently dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      known = ', '.join(f'--{cls.flag_name(n)}' for n in sorted(names)) or 'none'
      raise ValueError(f'{cls.component or cls.__name__} has no setting(s) {", ".join(unknown)}; '
                       f'its settings are: {known}.')
    return cls(**values)

  def to_dict(self) -> Dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _check(hp: HParams, f: dataclasses.Field, value: Any) -> Any:
  meta = f.metadata
  flag = f'--{type(hp).flag_name(f.name)}'
  kind = type(f.default)
  if kind is bool:
    if not isinstance(value, bool):
      raise ValueError(f'{flag}: must be true or false, got {value!r}.')
    return value
  if kind is int:
    if isinstance(value, bool) or not float(value).is_integer():
      raise ValueError(f'{flag}: must be an integer, got {value!r}.')
    value = int(value)
  elif kind is float:
    try:
      value = float(value)
    except (TypeError, ValueError):
      raise ValueError(f'{flag}: must be a number, got {value!r}.') from None
    if math.isnan(value) or (math.isinf(value) and not meta.get('allow_inf')):
      raise ValueError(f'{flag}: must be a finite number, got {value}.')
  elif kind is str:
    value = str(value)
  if meta.get('choices') and value not in meta['choices']:
    raise ValueError(f'{flag}: choose one of {", ".join(meta["choices"])}, got {value!r}.')
  lo, hi = meta.get('minimum'), meta.get('maximum')
  if lo is not None and (value < lo or (meta.get('min_exclusive') and value == lo)):
    raise ValueError(f'{flag}: must be {">" if meta.get("min_exclusive") else ">="} {lo}, got '
                     f'{value}.')
  if hi is not None and (value > hi or (meta.get('max_exclusive') and value == hi)):
    raise ValueError(f'{flag}: must be {"<" if meta.get("max_exclusive") else "<="} {hi}, got '
                     f'{value}.')
  return value


@dataclasses.dataclass(frozen=True)
class FlagSpec:
  """What bin/train needs to define one flag."""
  name: str  # e.g. 'fedprox_mu'
  component: str
  field: str
  kind: type  # float, int, str or bool
  default: Any
  help: str
  choices: Optional[Tuple[str, ...]]


def flag_specs(cls: Type[HParams]) -> Iterator[FlagSpec]:
  for f in dataclasses.fields(cls):
    yield FlagSpec(name=cls.flag_name(f.name), component=cls.component, field=f.name,
                   kind=type(f.default), default=f.default, help=f.metadata['help'],
                   choices=f.metadata.get('choices'))


@dataclasses.dataclass(frozen=True)
class NoHParams(HParams):
  """A component without hyper-parameters."""


class Registry:
  """Components of one kind by name (regularisers, partitions): `add`, `names`, `get`.

  Each entry has an `HParams` attribute (its settings' dataclass, whose `component` is the name).

  Args:
    kind: what the registry holds, as its flag is named ('regularizer', 'partition').

  Raises:
    ValueError: from `add`, a name registered twice or an HParams whose `component` is not the
      name; from `get`, an unknown name (the message names `--<kind>` and the choices).
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: Dict[str, Any] = {}

  def add(self, name: str, entry: Any) -> None:
    if name in self._entries:
      raise ValueError(f'register: a {self.kind} named {name!r} exists already.')
    hp = entry.HParams
    if dataclasses.fields(hp) and hp.component != name:
      raise ValueError(f'register: {hp.__name__}.component must be {name!r} (its flag prefix).')
    self._entries[name] = entry

  def names(self) -> Tuple[str, ...]:
    return tuple(self._entries)

  def get(self, name: str) -> Any:
    if name not in self._entries:
      raise ValueError(f'--{self.kind}: unknown {self.kind} {name!r}; choose one of '
                       f'{", ".join(self.names())}.')
    return self._entries[name]
