"""A run's output directory: its resolved configuration, and refusing to mix two runs in one dir.

Layout of a run directory:
  config.json          the resolved configuration (flags + task defaults), written before round 1
  checkpoints/         program state, one version per round (tff.program.FileProgramStateManager)
  client_states/       per-client state (FedBN BN, SCAFFOLD c_i, MOON previous model)
  metrics.csv          one row per round (tff.program.CSVFileReleaseManager)
  tensorboard/         the same metrics for TensorBoard
  export/saved_model   the global model with a serving signature (logits + representation)
  summary.json         final and best test accuracy, configuration, versions
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Mapping

# Keys that may differ when a run is resumed: where things are, how they are executed or shown,
# and how long to go on. Everything else changes the result, so a mismatch is refused.
RESUMABLE_KEYS = frozenset({
    'output_dir', 'data_dir', 'runtime', 'rounds', 'eval_every', 'workers',
    'max_concurrent_computation_calls', 'overwrite', 'export_every', 'track_collapse',
    'save_local_models', 'save_local_rounds', 'cache_dir',
})


class RunDirError(ValueError):
  """The output directory cannot be used as asked; the message names the flag and the fix."""


def config_path(output_dir: str) -> str:
  return os.path.join(output_dir, 'config.json')


def write_json_atomic(path: str, value: Any) -> None:
  """Writes JSON via a temporary file and an atomic rename: never a half-written file."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=True, default=_json_default)
    f.write('\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _json_default(value):
  if hasattr(value, 'item'):
    return value.item()
  if hasattr(value, 'tolist'):
    return value.tolist()
  return str(value)


def prepare(output_dir: str, config: Mapping[str, Any], overwrite: bool = False) -> bool:
  """Makes `output_dir` ready for a run with `config`.

  Returns True when the directory already holds this run (so the caller resumes it). A directory
  holding a run with a different configuration is refused unless `overwrite`, in which case the old
  run is moved aside (`<dir>.replaced-<time>`), never deleted.
  """
  if not output_dir:
    raise RunDirError('--output_dir is empty: give a directory for the run outputs.')
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise RunDirError(f'--output_dir={output_dir} is a file; give a directory.')
  path = config_path(output_dir)
  if os.path.isdir(output_dir) and os.listdir(output_dir):
    old = None
    if os.path.exists(path):
      try:
        with open(path) as f:
          old = json.load(f)
      except (OSError, json.JSONDecodeError) as e:
        raise RunDirError(f'--output_dir={output_dir} has an unreadable config.json ({e}); '
                          'use another --output_dir, or pass --overwrite to move it aside.') from e
    same = old is not None and not differences(old, config)
    if same and not overwrite:
      write_json_atomic(path, dict(config))
      return True
    if not overwrite:
      if old is None:
        raise RunDirError(f'--output_dir={output_dir} is not empty and holds no tff_decorr run; '
                          'use an empty or new directory, or pass --overwrite to move it aside.')
      diff = ', '.join(f'--{k}: {old.get(k)!r} -> {config.get(k)!r}'
                       for k in differences(old, config))
      raise RunDirError(f'--output_dir={output_dir} holds a run with a different configuration '
                        f'({diff}); use another --output_dir, or pass --overwrite to move the old '
                        'run aside.')
    aside = f'{output_dir.rstrip(os.sep)}.replaced-{time.strftime("%Y%m%d-%H%M%S")}'
    shutil.move(output_dir, aside)
    print(f'--overwrite: moved the previous run to {aside}', flush=True)
  os.makedirs(output_dir, exist_ok=True)
  write_json_atomic(path, dict(config))
  return False


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  keys = (set(old) | set(new)) - RESUMABLE_KEYS
  return sorted(k for k in keys if _norm(old.get(k)) != _norm(new.get(k)))


def _norm(v):
  # JSON turns tuples into lists and may write ints for integral floats.
  if isinstance(v, (list, tuple)):
    return [_norm(x) for x in v]
  if isinstance(v, bool) or v is None or isinstance(v, str):
    return v
  if isinstance(v, (int, float)):
    return float(v)
  return v
