"""A run's per-round metrics: metrics.csv (TFF's CSV release manager) and tensorboard/, written
together each round (`Metrics`), and the repair of metrics.csv from tensorboard/ before a run
resumes after a crash (`repair_metrics`).
"""

from __future__ import annotations

import asyncio
import csv
import glob
import io
import os
from typing import Any, Mapping, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_decorr.run_files import run_dir
from tff_decorr.run_files import tensorboard_hparams


class Metrics:
  """Per-round metrics to CSV (TFF's release manager) and TensorBoard, and a progress line.

  TensorBoard's events are flushed every round, before the round's checkpoint: they are the copy
  `repair_metrics` rebuilds a cut or deleted metrics.csv from (a writer left to flush on its own
  would lose the newest rounds to a kill). The run's hyper-parameters and final metrics go to the
  same directory for TensorBoard's HParams dashboard (tensorboard_hparams).
  """

  def __init__(self, output_dir: str):
    self._csv = tff.program.CSVFileReleaseManager(
        os.path.join(output_dir, 'metrics.csv'), key_fieldname='round')
    self._tb = tf.summary.create_file_writer(os.path.join(output_dir, 'tensorboard'))

  def release(self, values: dict, round_num: int) -> None:
    clean = {k: float(v) for k, v in values.items() if v is not None}
    asyncio.run(self._csv.release(clean, key=round_num))
    with self._tb.as_default():
      for name, value in clean.items():
        tf.summary.scalar(name, value, step=round_num)
    self._tb.flush()

  def hparams(self, config: Mapping[str, Any], trial_id: str) -> None:
    tensorboard_hparams.write_run(self._tb, config, trial_id)

  def final(self, summary: Mapping[str, Any]) -> None:
    tensorboard_hparams.write_final(self._tb, summary)


def _round_list(rounds: Sequence[int]) -> str:
  """'1-3, 5': rounds as ranges, for messages."""
  parts, rounds = [], sorted(rounds)
  i = 0
  while i < len(rounds):
    j = i
    while j + 1 < len(rounds) and rounds[j + 1] == rounds[j] + 1:
      j += 1
    parts.append(str(rounds[i]) if i == j else f'{rounds[i]}-{rounds[j]}')
    i = j + 1
  return ', '.join(parts)


def _read_metrics_csv(path: str):
  """(fieldnames, {round: row of strings}, damaged) of metrics.csv as written. A row is damaged
  when it has another number of fields than the header, a value that is not a number, or is the
  last line of a file that does not end with a newline (cut mid-line: its last number may be
  cut short too)."""
  if not os.path.exists(path):
    return [], {}, False
  with open(path, newline='') as f:
    text = f.read()
  records = list(csv.reader(io.StringIO(text)))
  if not records:
    return [], {}, bool(text)
  header, records = records[0], records[1:]
  cut_last = not text.endswith('\n')
  if not records and cut_last:  # The header itself is cut.
    return [], {}, True
  rows, damaged = {}, False
  for i, record in enumerate(records):
    try:
      if len(record) != len(header) or (cut_last and i == len(records) - 1):
        raise ValueError('cut row')
      for v in record[1:]:
        if v:
          float(v)
      rows[int(record[0])] = dict(zip(header, record))
    except ValueError:
      damaged = True
  return header, rows, damaged


def _tensorboard_rows(tb_dir: str, rounds: Sequence[int]) -> dict:
  """{round: {tag: value}} from the event files under `tb_dir`: the newest value of each round's
  scalar (a round run again after a crash was written twice). A truncated event file gives what
  it holds before the cut. The run's HParams records (its hyper-parameters, its final metrics) are
  not per-round metrics and are left out."""
  wanted, newest = set(rounds), {}
  for path in sorted(glob.glob(os.path.join(tb_dir, 'events.out.tfevents.*'))):
    try:
      for record in tf.data.TFRecordDataset(path):
        event = tf.compat.v1.Event.FromString(record.numpy())
        if event.step not in wanted:
          continue
        for v in event.summary.value:
          if (v.tag in tensorboard_hparams.FINAL_TAGS or
              v.metadata.plugin_data.plugin_name == 'hparams'):
            continue
          value = (float(tf.make_ndarray(v.tensor)) if v.HasField('tensor')
                   else float(v.simple_value))
          key = (int(event.step), v.tag)
          if key not in newest or event.wall_time >= newest[key][0]:
            newest[key] = (event.wall_time, value)
    except (tf.errors.DataLossError, tf.errors.OpError, ValueError):
      continue  # What was read before the damage is kept.
  out: dict = {}
  for (step, tag), (_, value) in newest.items():
    out.setdefault(step, {})[tag] = value
  return out


def repair_metrics(output_dir: str, completed_round: int, log=print) -> None:
  """Before resuming after `completed_round`: metrics.csv must hold a whole row for each of rounds
  1..completed_round. Rows that are missing (the file deleted) or damaged (cut mid-line) are rebuilt
  from tensorboard/, which holds the same per-round scalars (as float32); rounds neither holds are
  named as lost, in one warning line. Rows after `completed_round` belong to a round that is run
  again: they are dropped, as TFF's CSV manager would drop them.
  """
  if completed_round < 1:
    return
  path = os.path.join(output_dir, 'metrics.csv')
  existed = os.path.exists(path)
  header, rows, damaged = _read_metrics_csv(path)
  missing = [r for r in range(1, completed_round + 1) if r not in rows]
  if not missing and not damaged:
    return
  rebuilt = _tensorboard_rows(os.path.join(output_dir, 'tensorboard'), missing)
  lost = [r for r in missing if r not in rebuilt]
  fieldnames = ['round'] + [f for f in header if f != 'round']
  for r in sorted(rebuilt):
    fieldnames += [t for t in rebuilt[r] if t not in fieldnames]
  out = {r: row for r, row in rows.items() if r <= completed_round}
  for r, values in rebuilt.items():
    out[r] = {'round': str(r), **{t: repr(v) for t, v in values.items()}}

  def write(f):
    writer = csv.DictWriter(f, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(out[r] for r in sorted(out))
  run_dir.atomic_write(path, write)
  if not missing:  # Only the row of a round that is run again was cut: nothing is lost.
    return
  cause = ('does not exist' if not existed else
           'has cut or unreadable rows' if damaged else 'lacks rows')
  said = [f'warning: {path} {cause} for round(s) {_round_list(missing)} of the '
          f'{completed_round} completed']
  if rebuilt:
    said.append(f'rebuilt round(s) {_round_list(sorted(rebuilt))} from '
                f'{os.path.join(output_dir, "tensorboard")} (float32 precision)')
  if lost:
    said.append(f'the metrics of round(s) {_round_list(lost)} are lost (tensorboard/ does not '
                'hold them either); the run itself resumes from its checkpoint')
  log('; '.join(said) + '.')
