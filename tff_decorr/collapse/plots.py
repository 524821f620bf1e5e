"""Figures of the dimensional-collapse analysis (the papers' log-scale spectrum plots).

We draw on a `matplotlib.figure.Figure` with the Agg canvas directly instead of going through
`pyplot`: no global backend switch, no GUI, no figure left open in pyplot's registry, so this works
in headless training jobs and inside tests whatever backend another module selected.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import numpy as np

from tff_decorr.collapse import analysis


def _spectrum(sv: Any, name: str) -> np.ndarray:
  """Checked (analysis.as_spectrum) and sorted in descending order, as the plots draw it."""
  return np.sort(analysis.as_spectrum(sv, name))[::-1]


def _check_top(top: int) -> None:
  if not isinstance(top, (int, np.integer)) or top < 1:
    raise ValueError(f'top must be a positive integer; got {top!r}.')


def _plot_curve(ax, sv: np.ndarray, top: int, label: str, **kwargs) -> None:
  head = sv[:top]
  index = np.arange(1, head.size + 1)
  # Zeros cannot be shown on a log axis; they are masked (the curve stops) rather than invented.
  ax.plot(index, np.where(head > 0, head, np.nan), label=label, **kwargs)


# The relative floor of normalised spectra (bin/report): singular values below 1e-7 of a spectrum's
# largest are numerical noise of a float32 covariance, and drawing them would stretch the log axis
# over dozens of decades (to 1e-77) and flatten everything that matters.
RELATIVE_FLOOR = 1e-7
# Formats every bin/report figure is written in: PNG for the page, SVG and PDF for papers.
FORMATS = ('png', 'svg', 'pdf')


def _save(fig: Figure, path: str, formats: Sequence[str] = ()) -> str:
  """Writes `path`, and beside it the same figure in each of `formats` (its extension replaced);
  returns `path`."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  FigureCanvasAgg(fig)
  stem, ext = os.path.splitext(path)
  for target in dict.fromkeys([path, *(f'{stem}.{f}' for f in formats if f != ext[1:])]):
    # No creation date in the PDF/SVG metadata: re-running a report changes only what changed.
    metadata = ({'CreationDate': None} if target.endswith('.pdf') else
                {'Date': None} if target.endswith('.svg') else None)
    fig.savefig(target, dpi=120, bbox_inches='tight', metadata=metadata)
  return path


def figure_paths(path: str, formats: Sequence[str] = FORMATS) -> Dict[str, str]:
  """The files a figure saved to `path` with `formats` lands in.

  Args:
    path: the main file; its extension is its format.
    formats: more formats, written beside it with the extension replaced.

  Returns:
    {format: file}, `path` under its own extension's format.
  """
  stem, ext = os.path.splitext(path)
  return {ext[1:]: path, **{f: f'{stem}.{f}' for f in formats if f != ext[1:]}}


def legend_outside(fig: Figure, axes: Sequence[Any], fontsize: float = 8) -> Any:
  """One legend for the figure, right of every axes (never over a curve), each label once (a
  configuration drawn in several panels is one entry). Call after the layout is final.

  Args:
    fig: the figure.
    axes: its axes, whose labelled artists make the legend (non-empty).
    fontsize: the legend's font size.

  Returns:
    The matplotlib Legend.
  """
  handles: Dict[str, Any] = {}
  for ax in axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  right = max(ax.get_position().x1 for ax in axes)
  top = max(ax.get_position().y1 for ax in axes)
  return fig.legend(list(handles.values()), list(handles), loc='upper left',
                    bbox_to_anchor=(right + 0.01, top), bbox_transform=fig.transFigure,
                    fontsize=fontsize, frameon=False, borderaxespad=0.0)


def _grid(n: int, width: float, height: float):
  cols = min(3, n)
  rows = (n + cols - 1) // cols
  return rows, cols, Figure(figsize=(width * cols, height * rows))


def _finish_axes(ax, last: int, title: Optional[str]) -> None:
  ax.set_yscale('log')
  ax.set_xlim(1, max(last, 2))
  ax.set_xlabel('index k (descending)')
  ax.set_ylabel('singular value of representation covariance (log scale)')
  ax.grid(True, which='both', alpha=0.3)
  if title:
    ax.set_title(title)


def plot_spectra(curves: Mapping[str, Any], path: str, top: int = 100,
                 title: Optional[str] = 'Singular values of the representation covariance') -> str:
  """Log-scale singular values vs index (top `top`) of several runs on one axes.

  Args:
    curves: {label: singular values (any order; 1-D, finite, non-negative)}, at least one.
    path: the image file to write (its extension chooses the format: .png, .svg, .pdf); parent
      directories are made.
    top: how many of the largest values to draw, >= 1.
    title: the axes' title, None for none.

  Returns:
    `path`.

  Raises:
    ValueError: no curves, a spectrum that is not 1-D, finite and non-negative, or top < 1.
    OSError: `path` cannot be written.
  """
  if not curves:
    raise ValueError('curves must map at least one label to a spectrum.')
  _check_top(top)
  fig = Figure(figsize=(6.4, 4.8))
  ax = fig.add_subplot(1, 1, 1)
  longest = 0
  for label, sv in curves.items():
    sv = _spectrum(sv, f'curves[{label!r}]')
    longest = max(longest, sv.size)
    _plot_curve(ax, sv, top, str(label))
  _finish_axes(ax, min(top, longest), title)
  ax.legend(loc='upper right')
  return _save(fig, path)


def plot_local_vs_global(sv_local: Any, sv_global: Any, path: str, r_value: float,
                         top: int = 100, title: Optional[str] = 'Local vs global spectrum') -> str:
  """The local model's and the global model's spectra on one log axes, with R written in the corner.

  Args:
    sv_local: the local model's singular values (1-D, finite, non-negative).
    sv_global: the global model's singular values (same requirements).
    path: the image file to write (its extension chooses the format); parent directories are
      made.
    r_value: the local-vs-global gap R to print (`analysis.local_global_gap`).
    top: how many of the largest values to draw, >= 1.
    title: the axes' title, None for none.

  Returns:
    `path`.

  Raises:
    ValueError: a spectrum that is not 1-D, finite and non-negative, or top < 1.
    OSError: `path` cannot be written.
  """
  _check_top(top)
  local = _spectrum(sv_local, 'sv_local')
  glob = _spectrum(sv_global, 'sv_global')
  fig = Figure(figsize=(6.4, 4.8))
  ax = fig.add_subplot(1, 1, 1)
  _plot_curve(ax, local, top, 'local')
  _plot_curve(ax, glob, top, 'global')
  _finish_axes(ax, min(top, max(local.size, glob.size)), title)
  ax.legend(loc='upper right')
  ax.text(0.03, 0.04, f'R = {float(r_value):.4g}', transform=ax.transAxes, ha='left', va='bottom',
          bbox={'boxstyle': 'round', 'facecolor': 'white', 'alpha': 0.8})
  return _save(fig, path)


def plot_count_matrix(counts: Any, path: str, title: Optional[str] = None,
                      xlabel: str = 'class', ylabel: str = 'client',
                      row_normalize: bool = False) -> str:
  """A heatmap of an integer matrix (confusion matrix; clients x classes counts).

  Args:
    counts: a non-empty 2-D array of counts.
    path: the image file to write (its extension chooses the format).
    title: the axes' title, None for none.
    xlabel: the columns' label.
    ylabel: the rows' label.
    row_normalize: colour by each row's fraction instead of the count (the numbers stay counts).

  Returns:
    `path`.

  Raises:
    ValueError: `counts` is not a non-empty 2-D array.
    OSError: `path` cannot be written.
  """
  counts = np.asarray(counts, dtype=np.float64)
  if counts.ndim != 2 or counts.size == 0:
    raise ValueError(f'counts must be a non-empty 2-D array; got shape {counts.shape}.')
  shown = counts / np.maximum(counts.sum(1, keepdims=True), 1) if row_normalize else counts
  rows, cols = counts.shape
  fig = Figure(figsize=(min(2 + 0.35 * cols, 16), min(1.5 + 0.3 * rows, 16)))
  ax = fig.add_subplot(1, 1, 1)
  im = ax.imshow(shown, aspect='auto', cmap='viridis', interpolation='nearest')
  fig.colorbar(im, ax=ax, label='fraction of row' if row_normalize else 'count')
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if cols <= 40:
    ax.set_xticks(range(cols))
  if rows <= 40:
    ax.set_yticks(range(rows))
  if rows * cols <= 400:
    for i in range(rows):
      for j in range(cols):
        ax.text(j, i, f'{int(counts[i, j])}', ha='center', va='center', fontsize=6,
                color='white' if shown[i, j] < 0.5 * shown.max() else 'black')
  if title:
    ax.set_title(title)
  return _save(fig, path)


def plot_confusion_matrix(conf: Any, path: str, title: Optional[str] = None) -> str:
  """`plot_count_matrix` of a confusion matrix, rows (true classes) normalised.

  Args:
    conf: [true class, predicted class] counts.
    path: the image file to write.
    title: the axes' title, None for none.

  Returns:
    `path`.

  Raises:
    ValueError: `conf` is not a non-empty 2-D array.
    OSError: `path` cannot be written.
  """
  return plot_count_matrix(conf, path, title=title, xlabel='predicted class',
                           ylabel='true class', row_normalize=True)


def curves_figure(panels: Mapping[str, Sequence[Mapping[str, Any]]], xlabel: str = 'round',
                  ylabel: str = 'test accuracy', title: Optional[str] = None) -> Figure:
  """Curves on one axes per panel (bin/report's accuracy per round), one legend outside them.

  `panels` maps a panel title to a list of curves, each a mapping with 'label', 'x', 'y', and
  optionally 'color' (the same configuration keeps its colour in every panel and figure; default:
  the next of matplotlib's cycle), 'std' (drawn as a +-std band around y), 'linestyle' and
  'incomplete' (drawn dotted, thin, with markers: a run that has not finished, shown but never
  part of a mean).

  Args:
    panels: as above, at least one panel.
    xlabel: the x axes' label.
    ylabel: the y axes' label.
    title: the figure's title, None for none.

  Returns:
    The matplotlib Figure (not saved).

  Raises:
    ValueError: no panels.
    KeyError: a curve without 'label', 'x' or 'y'.
  """
  if not panels:
    raise ValueError('panels must hold at least one panel of curves.')
  rows, cols, fig = _grid(len(panels), 4.6, 3.5)
  axes = []
  for i, (panel, curves) in enumerate(panels.items()):
    ax = fig.add_subplot(rows, cols, i + 1, sharey=axes[0] if axes else None)
    axes.append(ax)
    for k, curve in enumerate(curves):
      x = np.asarray(curve['x'], dtype=np.float64)
      y = np.asarray(curve['y'], dtype=np.float64)
      color = curve.get('color') or f'C{k % 10}'
      if curve.get('incomplete'):  # Markers: a run stopped after one round is a single point.
        ax.plot(x, y, linestyle=':', linewidth=1.0, marker='x', markersize=4, color=color,
                label=curve['label'])
        continue
      ax.plot(x, y, color=color, linestyle=curve.get('linestyle', '-'), label=curve['label'])
      if curve.get('std') is not None:
        std = np.asarray(curve['std'], dtype=np.float64)
        ax.fill_between(x, y - std, y + std, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # Rounds are whole numbers.
    ax.grid(True, alpha=0.3)
    if panel:
      ax.set_title(panel, fontsize=10)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  legend_outside(fig, axes)
  return fig


def plot_curves(panels: Mapping[str, Any], path: str, xlabel: str = 'round',
                ylabel: str = 'test accuracy', title: Optional[str] = None,
                formats: Sequence[str] = ()) -> str:
  """Curves on one axes per panel (`curves_figure`), written to `path`.

  Args:
    panels: {panel title: [curve, ...]}, each curve a mapping with 'label', 'x', 'y' and optionally
      'color', 'std' (a +-std band), 'linestyle', 'incomplete' (drawn dotted); at least one panel.
    path: the image file to write (its extension chooses the format); parent directories are
      made.
    xlabel: the x axis' label.
    ylabel: the y axis' label.
    title: the figure's title, None for none.
    formats: more formats written beside `path`, its extension replaced (e.g. FORMATS: svg, pdf).

  Returns:
    `path`.

  Raises:
    ValueError: no panels.
    KeyError: a curve without 'label', 'x' or 'y'.
    OSError: a file cannot be written.
  """
  return _save(curves_figure(panels, xlabel, ylabel, title), path, formats)


def relative_spectrum(sv: Any, floor: float = RELATIVE_FLOOR, name: str = 'sv') -> np.ndarray:
  """Descending singular values divided by the largest, NaN (not drawn) below `floor`: what
  `spectra_figure` draws, so spectra of differently scaled representations compare by shape.

  Args:
    sv: singular values, any order (1-D, finite, non-negative).
    floor: the smallest relative value kept.
    name: what the caller calls `sv`, for the error message.

  Returns:
    float64, descending; all NaN when the largest value is 0.

  Raises:
    ValueError: `sv` is not a valid spectrum.
  """
  sv = _spectrum(sv, name)
  if sv.size == 0 or sv[0] <= 0:
    return np.full(sv.shape, np.nan)
  rel = sv / sv[0]
  return np.where(rel >= floor, rel, np.nan)


def spectra_figure(panels: Mapping[str, Sequence[Mapping[str, Any]]], top: int = 100,
                   floor: float = RELATIVE_FLOOR,
                   title: Optional[str] = 'Singular values of the representation covariance'
                   ) -> Figure:
  """Normalised spectra on one axes per panel, panels and colours as `curves_figure`'s.

  `panels` maps a panel title to a list of spectra, each a mapping with 'label', 'sv' (singular
  values, any order) and optionally 'color' and 'linestyle'. Each spectrum is divided by its
  largest value and cut at `floor` (relative_spectrum), so the log y-axis spans [floor, 1] and
  says so.

  Args:
    panels: as above, at least one panel.
    top: how many of each spectrum's largest values to draw, >= 1.
    floor: in (0, 1).
    title: the figure's title, None for none.

  Returns:
    The matplotlib Figure (not saved).

  Raises:
    ValueError: no panels, top < 1, floor outside (0, 1), or an invalid spectrum.
    KeyError: a spectrum without 'label' or 'sv'.
  """
  if not panels:
    raise ValueError('panels must hold at least one panel of spectra.')
  _check_top(top)
  if not 0 < floor < 1:
    raise ValueError(f'floor must be in (0, 1); got {floor!r}.')
  rows, cols, fig = _grid(len(panels), 4.6, 3.5)
  axes = []
  longest = 1
  for i, (panel, spectra) in enumerate(panels.items()):
    ax = fig.add_subplot(rows, cols, i + 1, sharey=axes[0] if axes else None)
    axes.append(ax)
    for k, item in enumerate(spectra):
      rel = relative_spectrum(item['sv'], floor, f'{panel}: {item["label"]}')[:top]
      longest = max(longest, rel.size)
      ax.plot(np.arange(1, rel.size + 1), rel, color=item.get('color') or f'C{k % 10}',
              linestyle=item.get('linestyle', '-'), label=item['label'])
    ax.set_yscale('log')
    ax.set_xlabel('index k (descending)')
    ax.set_ylabel('singular value / largest')
    ax.grid(True, which='both', alpha=0.3)
    if panel:
      ax.set_title(panel, fontsize=10)
  for ax in axes:
    ax.set_xlim(1, max(longest, 2))
    ax.set_ylim(floor, 2.0)
  fig.text(0.01, 0.0, f'Each spectrum divided by its largest value; values below {floor:g} of it '
           'are not drawn.', fontsize=7, ha='left', va='top')
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  legend_outside(fig, axes)
  return fig


def plot_spectra_panels(panels: Mapping[str, Sequence[Mapping[str, Any]]], path: str,
                        top: int = 100, floor: float = RELATIVE_FLOOR,
                        title: Optional[str] = 'Singular values of the representation covariance',
                        formats: Sequence[str] = ()) -> str:
  """`spectra_figure` written to `path` (and beside it in `formats`).

  Args:
    panels: as `spectra_figure`'s.
    path: the image file to write (its extension chooses the format).
    top: as `spectra_figure`'s.
    floor: as `spectra_figure`'s.
    title: as `spectra_figure`'s.
    formats: more formats written beside `path` (e.g. FORMATS).

  Returns:
    `path`.

  Raises:
    ValueError: as `spectra_figure`.
    KeyError: as `spectra_figure`.
    OSError: a file cannot be written.
  """
  return _save(spectra_figure(panels, top, floor, title), path, formats)
