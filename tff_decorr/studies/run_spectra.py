"""A run's collapse measures over rounds: the global model's spectrum at several rounds, and the gap
between one client's local model and the global model, as one small file (spectra.json).

Where they come from, in a run directory of bin/train:
- `export/round_<r>/` (`--export_every`) and `export/saved_model` (the final round): the global
  model's representations over the task's test split, as bin/analyze computes them;
- `collapse/round_<r>.npy` (`--track_collapse`): the same spectrum, saved during training;
- `local_models/round_<r>/client_<c>/` (`--save_local_models=c --save_local_rounds=r`): client c's
  local model of round r, compared with the global model of round r (analysis.local_global_gap).

`spectra.json` holds the singular values themselves (a model's representation size: 64 for
ResNet20), so a study archived without its SavedModels (bin/report --archive_dir) still draws its
spectra and tables; `read` prefers it to recomputing.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Callable, Dict, Optional

import numpy as np

from tff_decorr.collapse import analysis
from tff_decorr.run_files import run_dir as run_dir_lib
from tff_decorr.studies import study

FILE = 'spectra.json'
VERSION = 1


def _rounds_of(pattern: str, path: str) -> Dict[int, str]:
  out = {}
  for p in glob.glob(os.path.join(path, pattern)):
    m = re.search(r'round_(\d+)', p)
    if m:
      out[int(m.group(1))] = p
  return out


def compute(path: str, final_round: int, dataset_fn: Callable[[], Any], load_fn: Callable,
            max_examples: Optional[int] = None) -> dict:
  """The measures of the run in `path` (finished at `final_round`) from what it saved.

  Args:
    path: the run directory.
    final_round: its last round (its final export is measured at it).
    dataset_fn: gives the task's test dataset (called once, only if a model must be loaded).
    load_fn: model_dir -> representation function; loads and checks one SavedModel.
    max_examples: caps the test examples a spectrum is taken over; None for all.

  Returns:
    {'version', 'global': {round: [sv...]}, 'local': [{'client', 'round', 'sv', 'gap'}]},
    JSON-ready.
  """
  dataset = []

  def spectrum(model_dir: str) -> np.ndarray:
    if not dataset:
      dataset.append(dataset_fn())
    cov = analysis.representation_covariance(load_fn(model_dir), dataset[0], max_examples)
    return analysis.singular_values(cov)

  global_sv: Dict[int, np.ndarray] = {}
  for r, p in _rounds_of('collapse/round_*.npy', path).items():
    global_sv[r] = np.load(p, allow_pickle=False)
  for r, p in _rounds_of('export/round_*', path).items():
    if r not in global_sv and os.path.isdir(p):
      global_sv[r] = spectrum(p)
  final = os.path.join(path, 'export', 'saved_model')
  if final_round not in global_sv and os.path.isdir(final):
    global_sv[final_round] = spectrum(final)
  local = []
  for r, round_dir in sorted(_rounds_of('local_models/round_*', path).items()):
    for client_dir in sorted(glob.glob(os.path.join(round_dir, 'client_*'))):
      if r not in global_sv:
        continue  # No global model of that round to compare with.
      sv = spectrum(client_dir)
      local.append({'client': os.path.basename(client_dir)[len('client_'):], 'round': r,
                    'sv': sv.tolist(), 'gap': analysis.local_global_gap(sv, global_sv[r])})
  return {'version': VERSION, 'global': {str(r): global_sv[r].tolist() for r in sorted(global_sv)},
          'local': local}


def write(path: str, measures: dict) -> str:
  """Writes `compute`'s measures as the run's spectra.json (atomically).

  Args:
    path: the run directory.
    measures: `compute`'s result.

  Returns:
    The file written.
  """
  out = os.path.join(path, FILE)
  run_dir_lib.write_json_atomic(out, measures)
  return out


def read(path: str) -> Optional[dict]:
  """The run's spectra.json, read back without models.

  Args:
    path: the run directory.

  Returns:
    {'global': {int round: ndarray}, 'local': [...]}; None if absent or not this format.
  """
  return read_measures(study.read_json(os.path.join(path, FILE)))


def read_measures(data: Any) -> Optional[dict]:
  """`compute`'s JSON form as arrays keyed by int rounds.

  Args:
    data: the parsed JSON (any value).

  Returns:
    As `read`'s; None when `data` is not this version's format.
  """
  if not isinstance(data, dict) or data.get('version') != VERSION:
    return None
  return {'global': {int(r): np.asarray(v, dtype=np.float64)
                     for r, v in data.get('global', {}).items()},
          'local': [dict(item, sv=np.asarray(item['sv'], dtype=np.float64))
                    for item in data.get('local', [])]}
