"""Figures of the dimensional-collapse analysis (the papers' log-scale spectrum plots).

We draw on a `matplotlib.figure.Figure` with the Agg canvas directly instead of going through
`pyplot`: no global backend switch, no GUI, no figure left open in pyplot's registry, so this works
in headless training jobs and inside tests whatever backend another module selected.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

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


def _save(fig: Figure, path: str) -> str:
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path, dpi=120, bbox_inches='tight')
  return path


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
  """Log-scale singular values vs index (top `top`) of several runs on one axes; returns `path`."""
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
  """The local model's and the global model's spectra, with R written in the corner."""
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
  """A heatmap of an integer matrix (confusion matrix; clients x classes counts)."""
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
  return plot_count_matrix(conf, path, title=title, xlabel='predicted class',
                           ylabel='true class', row_normalize=True)


def plot_curves(panels: Mapping[str, Any], path: str, xlabel: str = 'round',
                ylabel: str = 'test accuracy', title: Optional[str] = None) -> str:
  """Curves on one axes per panel (bin/report's accuracy per round).

  `panels` maps a panel title to a list of curves, each a mapping with 'label', 'x', 'y', and
  optionally 'std' (drawn as a +-std band around y) and 'incomplete' (drawn dotted, thin: a run
  that has not finished, shown but never part of a mean)."""
  if not panels:
    raise ValueError('panels must hold at least one panel of curves.')
  cols = min(3, len(panels))
  rows = (len(panels) + cols - 1) // cols
  fig = Figure(figsize=(5.2 * cols, 3.9 * rows))
  for i, (panel, curves) in enumerate(panels.items()):
    ax = fig.add_subplot(rows, cols, i + 1)
    k = 0
    for curve in curves:
      x = np.asarray(curve['x'], dtype=np.float64)
      y = np.asarray(curve['y'], dtype=np.float64)
      if curve.get('incomplete'):  # Markers: a run stopped after one round is a single point.
        ax.plot(x, y, linestyle=':', linewidth=1.0, marker='x', markersize=4, color='0.4',
                label=curve['label'])
        continue
      color = f'C{k % 10}'
      k += 1
      ax.plot(x, y, color=color, label=curve['label'])
      if curve.get('std') is not None:
        std = np.asarray(curve['std'], dtype=np.float64)
        ax.fill_between(x, y - std, y + std, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # Rounds are whole numbers.
    ax.grid(True, alpha=0.3)
    if panel:
      ax.set_title(panel, fontsize=10)
    ax.legend(loc='lower right', fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return _save(fig, path)
