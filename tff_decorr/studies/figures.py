"""bin/report's figures as data: the panels tff_decorr/collapse/plots.py draws.

Accuracy curves (mean over a configuration's finished runs with a +-std band; unfinished runs
dotted) and representation spectra (mean normalised singular values, at the last round and by
round), one colour and label per configuration in every figure (`styles`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_decorr.studies import aggregate


def _curve_axes(axes: Sequence[str]) -> Tuple[List[str], List[str]]:
  """(axes told apart by line, axes told apart by panel): a panel compares algorithms and
  regularisers (with their own settings, e.g. --fedprox_mu) at one setting of everything else
  (the partition's --dirichlet_alpha, --client_lr, ...)."""
  from tff_decorr.configs import config  # pylint: disable=g-import-not-at-top
  own = {spec.name for kind, _, spec in config.component_flag_specs()
         if kind in ('algorithm', 'regularizer')}
  columns = [a for a in axes if a != aggregate.SEED]
  lines = [a for a in columns if a in ('algorithm', 'regularizer') or a in own]
  panels = [a for a in columns if a not in lines]
  return (lines, panels) if lines else (panels, [])


@dataclasses.dataclass(frozen=True)
class Style:
  """How a configuration is drawn in every figure: its legend label and its colour."""
  label: str
  color: str


def _part(axis: str, value: str) -> str:
  return value if axis in ('algorithm', 'regularizer') else f'{axis}={value}'


def styles(rows: Sequence[aggregate.Row], axes: Sequence[str]) -> Dict[tuple, Style]:
  """{line key: Style}: one colour per configuration (the values of the axes told apart by line,
  `line_key`), the same in the curves and the spectra, in the order configurations first appear.

  Labels name only what tells the configurations apart: an axis is left out of every label when
  the labels stay distinct without it (`fedprox_mu=0.01` beside `fedprox`, when FedProx has one
  value of it), the regulariser's and algorithm's names last of all."""
  line_axes, _ = _curve_axes(axes)
  keys = list(dict.fromkeys(line_key(row, line_axes) for row in rows))
  shown = list(line_axes)
  for axis in sorted(line_axes, key=lambda a: a in ('algorithm', 'regularizer')):
    rest = [a for a in shown if a != axis]
    labels = {tuple((a, dict(k).get(a, '')) for a in rest) for k in keys}
    if len(labels) == len(keys):
      shown = rest
  palette = [f'C{i}' for i in range(10)]
  if len(keys) > len(palette):  # More configurations than tab10 has colours: tab20's.
    from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
    palette = [colormaps['tab20'](i) for i in range(20)]
    palette = ['#%02x%02x%02x' % tuple(int(255 * c) for c in rgba[:3]) for rgba in palette]
  out = {}
  for i, key in enumerate(keys):
    values = dict(key)
    label = ' + '.join(_part(a, values[a]) for a in shown if values.get(a)) or 'mean over seeds'
    out[key] = Style(label=label, color=palette[i % len(palette)])
  return out


def line_key(row: aggregate.Row, line_axes: Sequence[str]) -> tuple:
  """The values of the axes told apart by line (`_curve_axes`): the configuration a colour
  stands for."""
  return tuple((a, row.value(a)) for a in line_axes)


def panel_title(row: aggregate.Row, panel_axes: Sequence[str]) -> str:
  """The setting of the axes told apart by panel, e.g. 'dirichlet_alpha=0.1' ('' for one panel)."""
  return ' '.join(f'{a}={row.value(a)}' for a in panel_axes if row.value(a))


def curves(rows: Sequence[aggregate.Row], axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.curves_figure panels: per row, the mean test accuracy over its finished runs with a
  +-std band, on the rounds every one of them recorded; unfinished runs dotted, on their own.
  Labels and colours are `styles`'."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  panels: Dict[str, List[dict]] = {}
  for row in rows:
    s = style[line_key(row, line_axes)]
    out = panels.setdefault(panel_title(row, panel_axes), [])
    finished = [aggregate.read_curve(r.path) for r in row.runs if r.done]
    finished = [c for c in finished if c[0].size]
    if finished:
      common = sorted(set.intersection(*(set(x.tolist()) for x, _ in finished)))
      ys = np.stack([y[np.isin(x, common)] for x, y in finished])
      out.append({'label': s.label, 'color': s.color, 'x': common, 'y': ys.mean(0),
                  'std': ys.std(0, ddof=1) if len(finished) > 1 else None})
    for r in row.runs:
      if not r.done:
        x, y = aggregate.read_curve(r.path)
        if x.size:
          seed = f'{aggregate.SEED}={r.flags.get(aggregate.SEED, "?")}'
          out.append({'label': f'{s.label}, {seed} ({r.status}, {r.rounds_done}/{r.rounds} '
                               'rounds)', 'color': s.color, 'x': x, 'y': y, 'incomplete': True})
  return {p: c for p, c in panels.items() if c}


def mean_spectrum(row: aggregate.Row) -> Optional[np.ndarray]:
  """The mean over a row's finished runs of their descending singular values, each divided by its
  largest (runs whose representations differ in scale weigh the same); None without spectra."""
  return _mean_normalised([r.spectrum for r in row.runs if r.done and r.spectrum is not None])


def spectra_panels(rows: Sequence[aggregate.Row], axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.spectra_figure panels: per row with spectra, its mean normalised spectrum, in the
  panels of `curves` with `styles`' labels and colours."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  panels: Dict[str, List[dict]] = {}
  for row in rows:
    sv = mean_spectrum(row)
    if sv is not None:
      s = style[line_key(row, line_axes)]
      panels.setdefault(panel_title(row, panel_axes), []).append(
          {'label': s.label, 'color': s.color, 'sv': sv})
  return panels


def spectra_by_round_panels(rows: Sequence[aggregate.Row],
                            axes: Sequence[str]) -> Dict[str, List[dict]]:
  """plots.spectra_figure panels, one per round with spectra (and per panel of `curves` when the
  study has more than one): each configuration's mean normalised spectrum at that round, and the
  saved local models' of that round dashed."""
  style = styles(rows, axes)
  line_axes, panel_axes = _curve_axes(axes)
  rounds = sorted({r for row in rows for run in row.runs if run.done and run.measures
                   for r in run.measures['global']})
  panels: Dict[str, List[dict]] = {}
  for rnd in rounds:
    for row in rows:
      s = style[line_key(row, line_axes)]
      title = ' '.join(filter(None, [f'round {rnd}', panel_title(row, panel_axes)]))
      svs = [run.measures['global'][rnd] for run in row.runs
             if run.done and run.measures and rnd in run.measures['global']]
      sv = _mean_normalised(svs)
      if sv is not None:
        panels.setdefault(title, []).append({'label': s.label, 'color': s.color, 'sv': sv})
      local = [item['sv'] for run in row.runs if run.done and run.measures
               for item in run.measures['local'] if item['round'] == rnd]
      sv = _mean_normalised(local)
      if sv is not None:
        panels.setdefault(title, []).append({'label': f'{s.label}, a local model',
                                             'color': s.color, 'sv': sv, 'linestyle': '--'})
  return panels


def _mean_normalised(svs: Sequence[np.ndarray]) -> Optional[np.ndarray]:
  svs = [np.sort(np.asarray(v))[::-1] for v in svs]
  svs = [v / v[0] for v in svs if v.size and v[0] > 0]
  if not svs or len({v.size for v in svs}) != 1:
    return None
  return np.mean(np.stack(svs), 0)
