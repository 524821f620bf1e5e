r"""Writes the reference's command-line interface as data: tests/testdata/reference/parsers.json.

tests/reference_main_test.py checks that bench/reference/reference_main.py's argv for each algorithm
means, to the reference's main.py and its approach, the fidelity setting and the project's values.
It needs the reference's argument parsers; a checkout of the reference is not part of the project
(nor of a fresh clone), so this script was run ONCE on a checkout of github.com/bytedance/FedDecorr
at commit 973e4af, with the project's venv (argparse alone: neither torch nor the rest of the
reference is imported):

  .venv/bin/python -m bench.reference.reference_parser_specs --reference_dir=/tmp/FedDecorr \
      --out=tests/testdata/reference/parsers.json

and the test rebuilds the parsers from that file. `--check` compares a checkout with the committed
file instead of writing it (exit 1 if they differ).

How it is read. The function `get_args` of main.py and the function `extra_parser` of each
approach/<name>.py are taken from the reference's files by name (Python's ast), compiled alone
with `argparse.ArgumentParser` replaced by a subclass that records each parser built, and called:
get_args with an argv that also holds an unknown option, extra_parser with an empty list and then
with an unknown option. What is recorded (no code, no help texts):
- per parser, each argument's option strings, dest, action (store, store_true, store_false),
  type (int, float, str or none), default, choices, and whether it is required;
- `unknown_options`: 'returned' when the function hands unknown options back (main.py's
  parse_known_args: the approach's arguments), 'error' when the parser exits on one;
- `main_approaches`: the names main.py dispatches on (`args.approach == '<name>'` comparisons);
- `dirichlet_partitions`: the --partition values that dataset_utils.py's partition function
  sends to its Dirichlet (NIID-Bench "noniid-labeldir") branch: the string constants compared
  with `partition` in the test of the branch that names "noniid-labeldir".
"""

import argparse
import ast
import json
import os
import sys
from unittest import mock

FIELDS = ('option_strings', 'dest', 'action', 'type', 'default', 'choices', 'required')
_UNKNOWN = '--reference_parser_specs_unknown=1'


def _function(path, name, parser_class):
  """Function `name` of the reference file `path`, compiled alone (decorators dropped)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
  node.decorator_list = []
  namespace = {'argparse': _ArgparseModule(parser_class),
               'ArgumentParser': parser_class}
  code = compile(ast.Module(body=[node], type_ignores=[]), path, 'exec')
  exec(code, namespace)  # pylint: disable=exec-used
  return namespace[name]


class _ArgparseModule:
  """`argparse` as the reference's code sees it: its ArgumentParser records."""

  def __init__(self, parser_class):
    self.ArgumentParser = parser_class  # pylint: disable=invalid-name

  def __getattr__(self, name):
    return getattr(argparse, name)


def _recording_parser():
  built = []

  class Recording(argparse.ArgumentParser):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      built.append(self)

  return Recording, built


def _action_name(action):
  if isinstance(action, argparse._StoreTrueAction):  # pylint: disable=protected-access
    return 'store_true'
  if isinstance(action, argparse._StoreFalseAction):  # pylint: disable=protected-access
    return 'store_false'
  if isinstance(action, argparse._StoreAction):  # pylint: disable=protected-access
    return 'store'
  raise ValueError(f'{action.option_strings}: an action this script does not record '
                   f'({type(action).__name__})')


def _spec(parser):
  out = []
  for a in parser._actions:  # pylint: disable=protected-access
    if isinstance(a, argparse._HelpAction):  # pylint: disable=protected-access
      continue
    if a.type not in (None, int, float, str):
      raise ValueError(f'{a.option_strings}: type {a.type!r} is not recorded')
    out.append({'option_strings': list(a.option_strings), 'dest': a.dest,
                'action': _action_name(a), 'type': a.type.__name__ if a.type else None,
                'default': a.default, 'choices': list(a.choices) if a.choices else None,
                'required': bool(a.required)})
  return out


def _call(function, parser_class, built, argv_for_sys, *args):
  """(the one parser `function` built, 'returned' or 'error' for an unknown option)."""
  del built[:]
  with mock.patch.object(sys, 'argv', ['main.py', *argv_for_sys]), \
       mock.patch.object(sys, 'stderr'):
    try:
      result = function(*args)
      unknown = 'returned' if _UNKNOWN in str(result) else 'ignored'
    except SystemExit:
      unknown = 'error'
  assert len(built) == 1, f'{function.__name__} built {len(built)} parsers'
  return built[0], unknown


def read(reference_dir):
  parser_class, built = _recording_parser()
  get_args = _function(os.path.join(reference_dir, 'main.py'), 'get_args', parser_class)
  parser, unknown = _call(get_args, parser_class, built, [_UNKNOWN])
  specs = {'main': {'arguments': _spec(parser), 'unknown_options': unknown}}
  with open(os.path.join(reference_dir, 'main.py')) as f:
    main_tree = ast.parse(f.read())
  approaches = []
  for node in ast.walk(main_tree):
    if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
        and node.left.attr == 'approach' and isinstance(node.ops[0], ast.Eq)
        and isinstance(node.comparators[0], ast.Constant)):
      approaches.append(node.comparators[0].value)
  specs['main_approaches'] = approaches
  specs['approaches'] = {}
  for name in approaches:
    path = os.path.join(reference_dir, 'approach', f'{name}.py')
    extra_parser = _function(path, 'extra_parser', parser_class)
    parser, _ = _call(extra_parser, parser_class, built, [], [])
    _, unknown = _call(extra_parser, parser_class, built, [], [_UNKNOWN])
    specs['approaches'][name] = {'arguments': _spec(parser), 'unknown_options': unknown}
  with open(os.path.join(reference_dir, 'dataset_utils.py')) as f:
    tree = ast.parse(f.read())
  dirichlet = None
  for node in ast.walk(tree):
    if isinstance(node, ast.If):
      names = [c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant)
               and isinstance(c.value, str)]
      if 'noniid-labeldir' in names:
        dirichlet = sorted(set(names))
        break
  specs['dirichlet_partitions'] = dirichlet
  return specs


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--reference_dir', default='/tmp/FedDecorr')
  parser.add_argument('--out', default=os.path.join(
      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'tests',
      'testdata', 'reference', 'parsers.json'))
  parser.add_argument('--check', action='store_true',
                      help='compare the checkout with --out instead of writing it')
  args = parser.parse_args(argv)
  specs = {'reference': 'github.com/bytedance/FedDecorr at commit 973e4af',
           'made_by': 'bench/reference/reference_parser_specs.py (its docstring: how)',
           **read(args.reference_dir)}
  text = json.dumps(specs, indent=1, sort_keys=True) + '\n'
  if args.check:
    with open(args.out) as f:
      same = f.read() == text
    print('the checkout matches' if same else f'the checkout differs from {args.out}')
    return 0 if same else 1
  with open(args.out, 'w') as f:
    f.write(text)
  print(f'wrote {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
