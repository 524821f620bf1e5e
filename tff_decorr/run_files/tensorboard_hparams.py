"""TensorBoard's HParams dashboard: what a run and a study write for it.

A run (metrics_log.py, in its tensorboard/ directory) writes its hyper-parameters once per start, as
the hparams plugin's session-start record (`hp.hparams`), and its final and best test accuracy when
it finishes, as scalars named by `METRICS`. A study (bin/study, study.py) writes at its root the
experiment configuration (`hp.hparams_config`): its axes, the grid's flags that differ between runs,
each with the values its runs have, and `METRICS`. `tensorboard --logdir=<study_dir>` then shows
the grid in the HParams dashboard, one row per run.

Hyper-parameters are named as bin/train's flags (`algorithm`, `client_lr`, `feddecorr_beta`,
`dirichlet_alpha`, ...), the names a study's axes have, with the types of the resolved
configuration (config.json), so a run's values and the study's domains match.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Dict, Mapping, Sequence, Tuple, Union

Value = Union[bool, int, float, str]

# (scalar tag, what the dashboard calls it). final_/best_ are written by the run when it finishes;
# train_loss is the per-round scalar metrics_log.Metrics writes (the dashboard shows its last
# value).
METRICS: Tuple[Tuple[str, str], ...] = (
    ('final_test_accuracy', 'final test accuracy'),
    ('best_test_accuracy', 'best test accuracy'),
    ('best_round', 'round of the best test accuracy'),
    ('train_loss', 'last training loss'),
)
# The scalars a run writes once, at its end (not per round: metrics_log.repair_metrics skips them).
FINAL_TAGS = ('final_test_accuracy', 'best_test_accuracy', 'best_round')
# Where a run reads and writes, and how it reaches its workers: not hyper-parameters.
NOT_HPARAMS = ('output_dir', 'data_dir', 'cache_dir', 'workers',
               'max_concurrent_computation_calls')
_EVENTS = 'events.out.tfevents.*'


def _flag_names() -> Dict[Tuple[str, str], str]:
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  return {(component, spec.field): spec.name
          for _, component, spec in config_lib.component_flag_specs()}


def _scalar(value: Any) -> Any:
  """A value the hparams plugin holds (bool, number, string), or None (not shown)."""
  if isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str)) for v in value):
    return ','.join(map(str, value))
  return None


def run_hparams(config: Mapping[str, Any]) -> Dict[str, Value]:
  """{bin/train flag name: value} of a resolved configuration (`Config.to_dict()`, config.json):
  its generic settings and each of its components' settings (`{'fedprox': {'mu': 0.01}}` ->
  `fedprox_mu`), without locations (NOT_HPARAMS).

  Args:
    config: the configuration's plain form.

  Returns:
    {flag name: bool, number or string}; values the plugin cannot hold (lists, None) are left out.
  """
  out: Dict[str, Value] = {}
  for key, value in config.items():
    if key == 'hparams' or key in NOT_HPARAMS:
      continue
    value = _scalar(value)
    if value is not None:
      out[key] = value
  names = None
  for component, fields in (config.get('hparams') or {}).items():
    for field, value in dict(fields).items():
      if names is None:
        names = _flag_names()
      value = _scalar(value)
      if value is not None:
        out[names.get((component, field), f'{component}_{field}')] = value
  return out


def write_run(writer, config: Mapping[str, Any], trial_id: str) -> None:
  """A run's hyper-parameters (the hparams plugin's session start) through tf.summary `writer`.

  Args:
    writer: the run's tf.summary file writer.
    config: the configuration's plain form.
    trial_id: the run's name on the dashboard.
  """
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  with writer.as_default():
    hp.hparams(run_hparams(config), trial_id=trial_id)
  writer.flush()


def write_final(writer, summary: Mapping[str, Any]) -> None:
  """The finished run's metrics (METRICS written at its end) as scalars at its last round.

  Args:
    writer: the run's tf.summary file writer.
    summary: summary.json's content ('final_round' and the FINAL_TAGS it has).

  Raises:
    KeyError: `summary` has no 'final_round'.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  step = int(summary['final_round'])
  with writer.as_default():
    for tag in FINAL_TAGS:
      if tag in summary:
        tf.summary.scalar(tag, float(summary[tag]), step=step)
  writer.flush()


def study_axes(axes: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> Dict[str, list]:
  """{axis: its distinct values over the runs' resolved configurations, typed as the runs write
  them}, in the axes' order; an axis no configuration holds (a flag that is not a setting) has
  no values.

  Args:
    axes: the study's axes, as flag names.
    configs: the runs' configurations, plain form.

  Returns:
    {axis: [distinct values, in first-seen order]}.
  """
  values: Dict[str, list] = {a: [] for a in axes}
  for config in configs:
    flat = run_hparams(config)
    for axis in axes:
      if axis in flat and flat[axis] not in values[axis]:
        values[axis].append(flat[axis])
  return values


def write_study(study_dir: str, axes: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> str:
  """The study's experiment configuration at `study_dir` (its own event file, replacing the one
  an earlier invocation wrote, so the dashboard shows the current grid).

  Args:
    study_dir: the study's directory.
    axes: its axes, as flag names.
    configs: its runs' configurations, plain form.

  Returns:
    The event file written ('' if none appeared).

  Raises:
    OSError: the directory cannot be written.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  params = []
  for axis, values in study_axes(axes, configs).items():
    types = {type(v) for v in values}
    domain = hp.Discrete(sorted(values)) if values and len(types) == 1 else None
    params.append(hp.HParam(axis, domain, display_name=axis,
                            description=f'bin/train --{axis}'))
  metrics = [hp.Metric(tag, display_name=name) for tag, name in METRICS]
  before = set(glob.glob(os.path.join(study_dir, _EVENTS)))
  writer = tf.summary.create_file_writer(study_dir)
  with writer.as_default():
    hp.hparams_config(hparams=params, metrics=metrics, time_created_secs=time.time())
  writer.close()
  for path in before:  # Only the study writes event files at its root.
    os.remove(path)
  written = sorted(set(glob.glob(os.path.join(study_dir, _EVENTS))) - before)
  return written[-1] if written else ''
