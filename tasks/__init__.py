"""The tasks: datasets, their client partitions and paper defaults (registry.get(name)).

Imported as tff_decorr.tasks, its one name: the wheel installs this folder there (pyproject.toml)
and a checkout maps it there (tff_decorr/__init__.py). Imported as a top-level `tasks` too, each
module would run twice, with two registries whose Task classes differ.
"""

if __name__ != 'tff_decorr.tasks':
  raise ImportError(f'import tff_decorr.tasks, not {__name__} (docs/DESIGN.md, "Packaging").')
