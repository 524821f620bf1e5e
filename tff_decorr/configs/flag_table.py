"""What bin/train's flags are made of, readable without importing TensorFlow.

The flags are generated from the registries (tasks, models, algorithms, regularisers, partitions,
aggregators) and the settings each component declares (tff_decorr.hparams), and those registries
import TensorFlow, seconds before a program could answer `--help` or a mistyped flag
(docs/benchmarks.md §3).
flag_table.json, beside this file, is that information as data, generated from the registries and
never edited by hand (`python -m tff_decorr.configs.flag_table` rewrites it); the declarations
stay where they are. tests/flag_table_test.py fails while the file differs from the registries.

`current()` is what cli.define_train_flags reads: the live registries when a registry module is
already imported (TensorFlow's cost is paid, and a component the caller registered gets its
flags), the file otherwise (a bin/ program starting).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'flag_table.json')

# The modules whose registries the table stands for. partitions imports no TensorFlow, but a
# partition registered by the caller must get its flag too.
REGISTRY_MODULES = ('tff_decorr.tasks.registry', 'tff_decorr.models', 'tff_decorr.algorithms',
                    'tff_decorr.regularizers', 'tff_decorr.partitions', 'tff_decorr.aggregators')
_KINDS = {'float': float, 'int': int, 'str': str, 'bool': bool}


def _spec(spec) -> Dict[str, Any]:
  """A hparams.FlagSpec as JSON data (its kind by name)."""
  return {'name': spec.name, 'component': spec.component, 'field': spec.field,
          'kind': spec.kind.__name__, 'default': spec.default, 'help': spec.help,
          'choices': list(spec.choices) if spec.choices else None}


def build() -> Dict[str, Any]:
  """The table from the live registries (imports them, and with them TensorFlow)."""
  from tff_decorr import models  # pylint: disable=g-import-not-at-top
  from tff_decorr.configs import config  # pylint: disable=g-import-not-at-top
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  return {
      'names': {'task': list(task_registry.names()),
                **{kind: list(config.registry(kind).names()) for kind in config.KINDS}},
      'inits': list(models.INITS),
      'precisions': list(models.PRECISIONS),
      # The client optimiser's flags sit among the generic ones (cli.define_train_flags).
      'client': [_spec(spec) for kind, _, spec in config.component_flag_specs()
                 if kind == 'client_optimizer'],
      'components': [dict(_spec(spec), of=[kind, name])
                     for kind, name, spec in config.component_flag_specs() if kind in config.KINDS],
  }


def load() -> Dict[str, Any]:
  """The table as flag_table.json holds it."""
  with open(PATH, encoding='utf-8') as f:
    return json.load(f)


def current() -> Dict[str, Any]:
  """The live registries' table once any of them is imported, else flag_table.json's."""
  if any(name in sys.modules for name in REGISTRY_MODULES):
    return build()
  return load()


def kind_of(spec: Dict[str, Any]) -> type:
  """The Python type of a table entry's values (float, int, str or bool)."""
  return _KINDS[spec['kind']]


def write() -> str:
  """Rewrites flag_table.json from the registries; returns its path."""
  with open(PATH, 'w', encoding='utf-8') as f:
    json.dump(build(), f, indent=1, sort_keys=True)
    f.write('\n')
  return PATH


if __name__ == '__main__':
  print(f'wrote {write()}')
