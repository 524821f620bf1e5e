"""What the absl binaries in bin/ share: bin/train's flags (define_train_flags, also bin/study's per
grid cell), the component flags generated from the registries, and the path from parsed flags to
Configs (resolve_configs: the one place that calls its four steps in order; step 1, read_flags, is
here); paths as the user typed them, flag parsing, exit codes and the one error handler
(run_guarded) that maps a failure to one line and a code."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
from typing import Any, Dict, List

from absl import flags
from absl import logging



def user_path(path: str) -> str:
  """Relative paths are relative to where the user ran the command (also under `bazel run`,
  whose working directory is the runfiles tree; Bazel passes the user's in BUILD_WORKING_DIRECTORY).
  """
  if not path:
    return path
  path = os.path.expanduser(path)
  if os.path.isabs(path):
    return path
  return os.path.abspath(os.path.join(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()),
                                      path))


def quiet_logging() -> None:
  """WARNING level unless --verbosity was given: TF's SavedModel writer logs every asset at INFO,
  which would drown the progress lines."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')


_HELP_FLAGS = ('-?', '-help', '--help', '-helpshort', '--helpshort', '-helpfull', '--helpfull',
               '-helpxml', '--helpxml')


def parse_flags_or_exit(prog: str):
  """An absl `flags_parser` for app.run: a bad flag value (an unknown --task or --algorithm, a
  number that is not one) is one line and exit code 2, like every other usage error (absl's own
  parser prints "FATAL Flags parsing error" and exits 1); --help and --helpfull exit 0 (absl's
  exit 1). All of them answer before TensorFlow is imported; TensorFlow is imported once the flags
  are parsed, still inside app.run's initialisation (see _import_tensorflow)."""
  import sys  # pylint: disable=g-import-not-at-top

  def parse(argv):
    try:
      args = flags.FLAGS(argv)
    except flags.Error as e:
      print(f'{prog}: error: {e}', file=sys.stderr, flush=True)
      sys.exit(EXIT_USAGE)
    except SystemExit as e:
      # absl's help flags print the help, then exit 1; the help asked for is a success.
      if e.code == 1 and any(a.split('=')[0] in _HELP_FLAGS for a in argv[1:]):
        sys.exit(0)
      raise
    _import_tensorflow()
    return args
  return parse


def _import_tensorflow() -> None:
  """Imports TensorFlow before app.run's initialisation ends. TF's distribute.combinations calls
  absl's app.call_after_init, which, once app.run's initialisation is done, runs the callback at
  once, in the middle of TF's import: it lists the GPUs (initialising the eager context) before
  Keras is loaded, and Keras 2.14 then builds functional models from graph tensors and fails
  ("Attempt to convert a value (None)" in Flatten). Imported earlier, the callback waits for the
  end of the initialisation like any other."""
  import tensorflow  # pylint: disable=g-import-not-at-top,unused-import


def run_program(prog: str, main, module_name: str, doc: str) -> None:
  """Runs a bin/ program's `main` with app.run and parse_flags_or_exit(prog), started as
  `python -m bin.<prog>` or `tff_decorr.bin.<prog>`, by Bazel, or as its console script
  (tff-decorr-<prog>, pyproject.toml). A console script's __main__ is a wrapper: absl's --help
  shows __main__'s docstring and the flags of the module sys.argv[0] names, so those are the
  program's own (`doc`, and the key flags of `module_name`)."""
  import sys  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  main_module = sys.modules['__main__']
  if module_name != '__main__':
    main_module.__doc__ = doc
    for flag in flags.FLAGS.get_key_flags_for_module(module_name):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  app.run(main, flags_parser=parse_flags_or_exit(prog))


def ensure_writable_dir(path: str) -> str:
  """Creates `path` if needed and checks a file can be written there, before any long work, so
  a read-only or full output location fails at once (as an OSError for run_guarded)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  os.makedirs(path, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path, prefix='.write-test-'):
    pass
  return path


# Exit codes of every binary (docs/reliability.md).
EXIT_USAGE = 2        # the command cannot run as given: a flag, the data, the output directory
EXIT_RUN_FAILED = 3   # the run started and stopped: its last completed round is checkpointed
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


# How a run that started can stop, as run_guarded maps it to an exit code. Declared here, in the
# configuration layer, and raised as the round loop's subclasses (tff_decorr.program.round_loop:
# NonFiniteError, DiskFullError, Interrupted), so that run_guarded names them without importing
# the training program, a layer up.
class RunFailedError(RuntimeError):
  """The run started and stopped; its last completed round is checkpointed (EXIT_RUN_FAILED)."""


class RunInterrupted(Exception):  # Not a KeyboardInterrupt subclass: callers print one line for it.
  """The user interrupted the run (Ctrl-C); `completed_round` is the last checkpointed round."""

  def __init__(self, completed_round: int):
    super().__init__(f'interrupted after round {completed_round}')
    self.completed_round = completed_round


def os_error_message(e: OSError) -> str:
  """One line for an OS error: what failed, on which path, and what to do."""
  where = e.filename or ''
  if e.filename2:
    where = f'{where} -> {e.filename2}'
  if e.errno == errno.ENOSPC:
    return (f'no space left on the device holding {where or "the output"}; free some space and '
            're-run the same command: it resumes after the last completed round.')
  if e.errno == errno.EROFS:
    return f'{where} is on a read-only file system; choose a writable --output_dir.'
  if e.errno in (errno.EACCES, errno.EPERM):
    return f'permission denied on {where}; choose a directory you can write (--output_dir).'
  if e.errno in (errno.ENOTDIR, errno.EEXIST):
    return (f'{where}: a file stands where a directory is needed; choose another --output_dir '
            '(or remove that file).')
  return f'{e.strerror or type(e).__name__} on {where or "a file"}.'


def exit_without_finalising(code: int) -> None:
  """Ends a binary that has finished its work at once: runs the exit handlers (worker stop, log
  flushing, the stderr filter's drain) and flushes output, then skips the interpreter's teardown
  of TensorFlow and TFF, C++ and module destructors that cost seconds (docs/benchmarks.md §3) and
  have nothing left to write: every file of a run is written, flushed and closed by then. Only for
  a process's main, never from library code."""
  import atexit  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  os._exit(code if isinstance(code, int) else 1)


def run_guarded(prog: str, fn, interrupted_message=None) -> int:
  """Runs fn() and maps every failure a user can cause or meet to one line on stderr and an exit
  code, instead of a traceback from deep inside TensorFlow. Programming errors still raise."""
  import sys  # pylint: disable=g-import-not-at-top
  from tff_decorr.worker import tff_context  # pylint: disable=g-import-not-at-top

  def fail(message, code):
    print(f'{prog}: error: {message}', file=sys.stderr, flush=True)
    return code

  try:
    return fn()
  except RunInterrupted as e:
    print(f'{prog}: interrupted after round {e.completed_round}; re-run the same command to '
          'resume.', file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
  except KeyboardInterrupt:
    print(f'{prog}: {interrupted_message or "interrupted"}.', file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
  except (RunFailedError, tff_context.WorkerLostError) as e:
    return fail(e, EXIT_RUN_FAILED)
  except (ValueError, tff_context.WorkerUnavailableError, tff_context.WorkerExposedError) as e:
    return fail(e, EXIT_USAGE)
  except FileNotFoundError as e:  # Missing datasets (their messages name the flag) and paths.
    return fail(os_error_message(e) if e.filename else e, EXIT_USAGE)
  except OSError as e:
    return fail(os_error_message(e), EXIT_RUN_FAILED if e.errno == errno.ENOSPC else EXIT_USAGE)
  except Exception as e:  # pylint: disable=broad-except
    # TensorFlow's own file I/O (checkpoints, SavedModels) raises tf.errors.OpError, not OSError,
    # for the same OS failures; its message carries the OS's words and the path.
    os_error = _os_error_from_tf(e)
    if os_error is None:
      raise  # A programming error: the traceback is what its reader needs.
    return fail(os_error_message(os_error),
                EXIT_RUN_FAILED if os_error.errno == errno.ENOSPC else EXIT_USAGE)


_TF_OS_MESSAGES = {'No space left on device': errno.ENOSPC, 'Read-only file system': errno.EROFS,
                   'Permission denied': errno.EACCES}


def _os_error_from_tf(e: Exception):
  """The OSError a tf.errors.OpError stands for ('<path>; No space left on device'), or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not isinstance(e, tf.errors.OpError):
    return None
  message = str(getattr(e, 'message', e))
  for words, code in _TF_OS_MESSAGES.items():
    if words in message:
      # '{{function_node __wrapped__SaveV2...}} /run/x/variables_temp/part-0; No space left on
      # device [Op:SaveV2]': the path is the first absolute path, TF's decorations are dropped.
      path = re.search(r'(?:^|\s)(/[^\s;]+)', message.split(';')[0])
      return OSError(code, words, path.group(1) if path else None)
  return None


_T = 'task default'


def define_train_flags(fv) -> list:
  """Defines every flag of bin/train on `fv`: the generic ones, then one per component setting,
  generated from the registries (a component registered before this call gets its flags too).
  bin/study defines them on a FlagValues of its own per configuration of its grid. Imports no
  TensorFlow unless a registry is imported already (flag_table: a program answers --help and a
  mistyped flag before TensorFlow is loaded). Returns the generic flags' names."""
  from tff_decorr.configs import flag_table  # pylint: disable=g-import-not-at-top
  table = flag_table.current()
  names = table['names']
  d = dict(flag_values=fv)
  before = set(fv)
  flags.DEFINE_enum('task', 'digits', names['task'], 'Task (digits: embedded, no download).', **d)
  flags.DEFINE_string('model', None, f'Model builder name ({_T}).', **d)
  flags.DEFINE_enum('algorithm', 'fedavg', names['algorithm'], 'Federated algorithm.', **d)
  flags.DEFINE_string('regularizer', None, f'{"|".join(names["regularizer"])}, or a '
                      'comma-separated list to run one simulation per regulariser (default: '
                      'feddecorr; the embedded task runs none,feddecorr).', **d)
  flags.DEFINE_enum('partition', None, names['partition'], f'Client partition ({_T}).', **d)
  flags.DEFINE_enum('aggregator', None, names['aggregator'],
                    "Model aggregation: mean (the algorithm's own weighted sum, default) or a "
                    'tff.aggregators factory over client deltas: robust, dp, compression, secure '
                    '(simulated: no cryptography, TFF 0.87 has no secure-aggregation protocol) '
                    '(--runtime=tff; settings --<aggregator>_<setting>).', **d)
  flags.DEFINE_integer('num_clients', None, f'Number of clients ({_T}).', **d)
  flags.DEFINE_integer('clients_per_round', None, 'Clients sampled per round (default: all).', **d)
  flags.DEFINE_integer('rounds', None, f'Communication rounds ({_T}).', **d)
  flags.DEFINE_integer('local_epochs', None, f'Local epochs per round ({_T}).', **d)
  flags.DEFINE_integer('batch_size', None, f'Client batch size ({_T}).', **d)
  # The client optimiser's flags (--client_lr, --momentum, --weight_decay) from its one
  # declaration, algorithms.SGDHParams (the run's 'sgd' component).
  for spec in table['client']:
    flags.DEFINE_float(spec['name'], None, f'{spec["help"].rstrip(".")} ({_T}).', **d)
  flags.DEFINE_integer('seed', 0, 'Seed of partition, initial model, sampling and augmentation.',
                       **d)
  flags.DEFINE_integer('projection_dim', None, 'Projection head width, for algorithms that use '
                       'one (MOON; task default: 256 on CIFAR; 0: none).', **d)
  flags.DEFINE_bool('decomposed', False, 'Use filter-decomposed convolutions (atoms x '
                    'coefficients).', **d)
  flags.DEFINE_integer('num_atoms', 0, 'Atoms per decomposed convolution (0: k*k).', **d)
  flags.DEFINE_enum('init', None, table['inits'], 'Weight initialisation (default: the '
                    'model\'s reference one, as the PyTorch code it ports: kaiming_normal for '
                    'resnet20/32, torch for resnet18, mobilenet_v2_cifar, alexnet_bn; keras for '
                    'small_cnn).', **d)
  flags.DEFINE_enum('precision', 'float32', table['precisions'], 'float32, or '
                    'mixed_bfloat16: every layer computes in bfloat16 and the weights stay float32 '
                    '(faster on a GPU or a CPU with bfloat16 instructions: docs/benchmarks.md; '
                    'results differ from float32 as rounding does).', **d)
  flags.DEFINE_enum('runtime', 'auto', ['auto', 'tff', 'tf'], 'auto: tf, or tff with --workers or '
                    'an --aggregator factory (which only TFF\'s runtime runs); tff: TFF C++ '
                    'runtime (CPU, remote workers); tf: the same TF functions in this process '
                    '(a GPU when present, else one client per CPU core at once). The choice is printed first and recorded in config.json; a run '
                    'resumes under either.', **d)
  flags.DEFINE_string('data_dir', None, 'TFDS data dir (prepared datasets are read offline).', **d)
  flags.DEFINE_string('cache_dir', None, 'Where per-client data shards are cached '
                      '(default ~/.cache/tff_decorr).', **d)
  flags.DEFINE_string('output_dir', None, 'Run directory (default runs/<task>-<algorithm>-'
                      '<regularizer>-<config hash>; the same command resumes the same run).', **d)
  flags.DEFINE_integer('eval_every', None, 'Evaluate every N rounds (and at the end).', **d)
  flags.DEFINE_integer('export_every', 0, 'Also export a SavedModel every N rounds (0: end '
                       'only).', **d)
  flags.DEFINE_string('workers', '', 'Comma-separated TFF workers (bin/worker): unix:/path of a '
                      'Unix socket (e.g. the local end of ssh -L) or host:port.', **d)
  flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                       'Clients trained at once: by TFF\'s worker (-1: as many as it likes) '
                       'and by --runtime=tf (-1: one per CPU core on a CPU, 1 on a GPU).', **d)
  flags.DEFINE_bool('track_collapse', False, 'Log effective rank and significant singular values '
                    'of the global model every --eval_every rounds.', **d)
  flags.DEFINE_list('save_local_models', [], 'Client ids whose local models to export at the '
                    '--save_local_rounds (for local-vs-global analysis with bin/analyze).', **d)
  flags.DEFINE_list('save_local_rounds', [], 'Rounds at which to export the local models of '
                    '--save_local_models (only if the client is sampled that round).', **d)
  flags.DEFINE_bool('overwrite', False, 'Move an existing run with a different configuration '
                    'aside (an identical one is resumed).', **d)
  generic = [name for name in fv if name not in before]
  define_component_flags(fv, table)
  return generic


def define_component_flags(fv, table=None) -> None:
  """One flag per setting of every registered algorithm, regulariser, partition and aggregator,
  `--<component>_<setting>` (tff_decorr.hparams), from `table` (default: flag_table.current())."""
  from tff_decorr.configs import flag_table  # pylint: disable=g-import-not-at-top
  for spec in (table or flag_table.current())['components']:
    kind, name = spec['of']
    text = f'{spec["help"]} [{kind} {name}; default {spec["default"]}]'
    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
              str: flags.DEFINE_string}[flag_table.kind_of(spec)]
    if spec['choices']:
      flags.DEFINE_enum(spec['name'], None, spec['choices'], text, flag_values=fv)
    else:
      define(spec['name'], None, text, flag_values=fv)


@dataclasses.dataclass(frozen=True)
class GivenFlags:
  """Step 1's result: the command line as data, nothing resolved yet."""
  task: Any  # tasks.registry's Task of --task
  # {flag: value} of every flag with a value (not None);
  # --data_dir and --cache_dir absolute ('' when not given); without --regularizer, --output_dir.
  values: Dict[str, Any]
  regularizers: List[str]  # --regularizer's list (default: the task's), each once
  output_dir: str  # --output_dir, absolute; '' for the default run directories
  runs_dir: str  # where default run directories go: runs/ in the user's working directory


def read_flags(fv) -> GivenFlags:
  """Step 1 of resolve_configs: reads the parsed flags `fv` (absl). Which of them are settings, and
  of what, is for the later steps to say; this one only reads values and the user's paths."""
  from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  task = task_registry.get(fv.task)
  values = {name: fv[name].value for name in fv
            if fv[name].name == name and fv[name].value is not None}
  for name in ('data_dir', 'cache_dir'):
    values[name] = user_path(values.get(name) or '')
  values.pop('output_dir', None)
  regs = values.pop('regularizer', None) or task.defaults.get('regularizer', 'feddecorr')
  # Each regulariser once (`none,none` is one run, not the same run twice).
  reg_list = list(dict.fromkeys(r.strip() for r in str(regs).split(',') if r.strip()))
  if not reg_list:
    raise ValueError('--regularizer: empty; give none, feddecorr, feduv or decov.')
  return GivenFlags(task=task, values=values, regularizers=reg_list,
                    output_dir=user_path(fv.output_dir or ''), runs_dir=user_path('runs'))


def resolve_configs(fv) -> list:
  """Configs from parsed flags (bin/train, bin/study per cell): flags > task defaults > component
  defaults; one Config per regulariser, each with its output directory (default:
  runs/<...>-<hash>).

  In four steps, each in one place and called once, here, in this order (docs/DESIGN.md,
  "Configuration and hyper-parameters"); a step calls nothing of an earlier step's module
  (tests/config_test.py traces it):
    1. read the parsed flags (cli.read_flags);
    2. resolve the components and generic settings (config.resolve_components, over the
       registries);
    3. build and validate one Config per regulariser (config.build);
    4. name the output directories (config.set_output_dirs).
  """
  from tff_decorr.configs import config  # pylint: disable=g-import-not-at-top
  given = read_flags(fv)
  resolution = config.resolve_components(given.task, given.values, given.regularizers)
  configs = config.build(resolution)
  config.set_output_dirs(configs, resolution, given.output_dir, given.runs_dir)
  return configs
