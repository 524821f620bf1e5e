"""The skeleton of the TFDS builders we write (tiny_imagenet, office_caltech10).

Each dataset's module says what is its own in a `BuilderSpec`: its features, where its sources are
and how they become examples. `LazyBuilder` defines the `tfds.core.GeneratorBasedBuilder` around
it on first use (importing the task registry imports no tensorflow_datasets), registers it with
TFDS once, prepares it, and is the dataset module's command line (`main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

Example = Tuple[str, Dict[str, Any]]  # (key, features) as TFDS's _generate_examples yields them


@dataclasses.dataclass(frozen=True)
class BuilderSpec:
  """What a builder of ours has of its own; the rest is `LazyBuilder`'s."""
  class_name: str  # TFDS names the dataset after it in snake case (TinyImagenet: tiny_imagenet).
  module: str  # The dataset's module (its __name__): TFDS records it in dataset_info.json.
  doc: str  # The builder class's docstring.
  release_notes: str  # Of version 1.0.0, the only one.
  instructions: str  # MANUAL_DOWNLOAD_INSTRUCTIONS: what goes in the manual directory.
  features: Callable[[Any], Mapping[str, Any]]  # tfds -> {name: tfds.features.*}.
  # dl_manager -> {'train': examples, 'test': examples}.
  splits: Callable[[Any], Mapping[str, Iterator[Example]]]
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # More DatasetInfo fields.
  manual_required: bool = True  # Whether `main` requires --manual_dir.
  manual_help: str = 'Folder holding the source files.'  # --manual_dir's help.


class LazyBuilder:
  """A TFDS builder class of `spec`, defined (and registered with TFDS) on first use."""

  def __init__(self, spec: BuilderSpec):
    self.spec = spec
    self._class = None

  def builder_class(self) -> type:
    """The `tfds.core.GeneratorBasedBuilder` subclass (the same one on every call)."""
    if self._class is None:
      self._class = _define(self.spec)
    return self._class

  def prepare(self, data_dir: str, manual_dir: Optional[str] = None) -> None:
    """Builds the dataset into `data_dir`, from `manual_dir` when given.

    Args:
      data_dir: the TFDS data directory to write into.
      manual_dir: the folder holding the sources (None: TFDS's default manual directory).
    """
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    builder = self.builder_class()(data_dir=data_dir)
    config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
    builder.download_and_prepare(download_config=config)

  def main(self, title: str, argv: Optional[Sequence[str]] = None) -> None:
    """`python -m <the dataset's module> --data_dir=DIR --manual_dir=...`: prepares it.

    Args:
      title: the dataset's name as people write it (Tiny ImageNet).
      argv: the arguments (None: sys.argv's).
    """
    parser = argparse.ArgumentParser(description=f'Prepare {title} as a TFDS dataset.')
    parser.add_argument('--data_dir', required=True, help='TFDS data dir to write into.')
    parser.add_argument('--manual_dir', required=self.spec.manual_required, default=None,
                        help=self.spec.manual_help)
    args = parser.parse_args(argv)
    self.prepare(os.path.expanduser(args.data_dir),
                 os.path.expanduser(args.manual_dir) if args.manual_dir else None)
    name = self.builder_class().name
    print(f'{name} prepared in {args.data_dir}')


def _define(spec: BuilderSpec) -> type:
  """The builder class of `spec`, registered with TFDS under its snake-case name."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(dict(spec.features(tfds))),
        supervised_keys=('image', 'label'), **spec.info)

  def _split_generators(self, dl_manager):
    del self  # The spec's, not the builder's.
    return dict(spec.splits(dl_manager))

  def _generate_examples(self, examples):
    del self  # Never called: _split_generators returns the examples themselves.
    return examples

  module_dir = os.path.dirname(os.path.abspath(sys.modules[spec.module].__file__))

  return type(spec.class_name, (tfds.core.GeneratorBasedBuilder,), {
      '__module__': spec.module,
      '__doc__': spec.doc,
      'VERSION': tfds.core.Version('1.0.0'),
      'RELEASE_NOTES': {'1.0.0': spec.release_notes},
      'MANUAL_DOWNLOAD_INSTRUCTIONS': spec.instructions,
      # TFDS finds a builder's metadata folder from its module's package, which in a checkout is
      # mapped onto tasks/ (docs/DESIGN.md, "Packaging") and so has no folder of its own name.
      'pkg_dir_path': epath.Path(module_dir),
      '_info': _info,
      '_split_generators': _split_generators,
      '_generate_examples': _generate_examples,  # Abstract in TFDS: a builder must have it.
  })
