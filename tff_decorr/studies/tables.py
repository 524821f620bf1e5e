"""bin/report's tables: the paper-style table over seeds as cells, CSV and LaTeX, and the tables of
rounds to an accuracy and of collapse by round.

Accuracies are in percent in the printed tables (mean ± sample std over a row's finished runs) and
fractions at full precision in the CSV; '—' (empty in the CSV) where a value is undefined.
"""

from __future__ import annotations

import csv
import math
from typing import List, Optional, Sequence, Tuple

from tff_decorr.studies import aggregate

Cells = Tuple[List[str], List[list]]  # (header, rows of cells)


def _pct(mean: float, std: float) -> str:
  if math.isnan(mean):
    return '—'
  return f'{100 * mean:.2f} ± {100 * std:.2f}' if not math.isnan(std) else f'{100 * mean:.2f}'


def _signed_pct(delta: float) -> str:
  return '—' if delta is None or math.isnan(delta) else f'{100 * delta:+.2f}'


def _num(mean: float, std: float) -> str:
  if math.isnan(mean):
    return '—'
  return f'{mean:.2f} ± {std:.2f}' if not math.isnan(std) else f'{mean:.2f}'


def compares_regularizers(rows: Sequence[aggregate.Row], axes: Sequence[str]) -> bool:
  """Whether the table has the Δ vs --regularizer=none columns: it has more than one regulariser
  (a report of run directories shows the regulariser of a single one too)."""
  return 'regularizer' in axes and len({row.value('regularizer') for row in rows}) > 1


def table(rows: Sequence[aggregate.Row], axes: Sequence[str], spectra: bool) -> Cells:
  """(header, cells) of the paper-style table, accuracies in percent."""
  columns = [a for a in axes if a != aggregate.SEED]
  deltas = compares_regularizers(rows, axes)
  header = [*columns, 'seeds done', 'final acc. (%)', 'best acc. (%)']
  if deltas:
    header += ['Δ final vs none', 'Δ best vs none']
  if spectra:
    header += ['effective rank']
  header += ['not finished']
  body = []
  for row in rows:
    s = row.stats
    cells = [row.value(a) or '—' for a in columns]
    cells += [f'{s["n_done"]}/{s["n_runs"]}',
              _pct(s['final_test_accuracy_mean'], s['final_test_accuracy_std']),
              _pct(s['best_test_accuracy_mean'], s['best_test_accuracy_std'])]
    if deltas:
      cells += [_signed_pct(s.get('final_test_accuracy_delta_vs_none')),
                _signed_pct(s.get('best_test_accuracy_delta_vs_none'))]
    if spectra:
      cells += [_num(s['effective_rank_mean'], s['effective_rank_std'])]
    cells += ['; '.join(s['not_done']) or '']
    body.append(cells)
  return header, body


def progress_table(rows: Sequence[aggregate.Row], axes: Sequence[str],
                   thresholds: Sequence[float]) -> Cells:
  """(header, cells): per configuration, the first round at which the test accuracy reached each
  threshold, mean ± std over the finished runs that reached it, and how many did."""
  columns = [a for a in axes if a != aggregate.SEED]
  header = [*columns, *(f'rounds to {100 * t:g} %' for t in thresholds)]
  body = []
  for row in rows:
    cells = [row.value(a) or '—' for a in columns]
    for t in thresholds:
      mean, std, reached, n = row.stats['rounds_to'][t]
      cells.append(f'{_num(mean, std) if reached else "not reached"} ({reached}/{n} runs)')
    body.append(cells)
  return header, body


def collapse_table(rows: Sequence[aggregate.Row], axes: Sequence[str]) -> Cells:
  """(header, cells): per configuration, the global model's effective rank at each round that has
  spectra, and each saved local model's gap R to the global model of its round (analysis.
  local_global_gap: < 0 when the local model is the more collapsed) with its effective rank."""
  columns = [a for a in axes if a != aggregate.SEED]
  rounds = sorted({r for row in rows for r in row.stats['effective_rank_by_round']})
  locals_ = sorted({k for row in rows for k in row.stats['local_gap']},
                   key=lambda k: (k[1], k[0]))
  header = [*columns, *(f'effective rank, round {r}' for r in rounds)]
  for client, rnd in locals_:
    header += [f'gap R local-global (client {client}, round {rnd})',
               f'local effective rank (client {client}, round {rnd})']
  body = []
  for row in rows:
    st = row.stats
    cells = [row.value(a) or '—' for a in columns]
    for r in rounds:
      mean, std, _ = st['effective_rank_by_round'].get(r, (math.nan, math.nan, 0))
      cells.append(_num(mean, std))
    for k in locals_:
      g_mean, g_std, e_mean, e_std, _ = st['local_gap'].get(k, (math.nan,) * 4 + (0,))
      cells += [_num(g_mean, g_std), _num(e_mean, e_std)]
    body.append(cells)
  return header, body

def write_csv(path: str, rows: Sequence[aggregate.Row], axes: Sequence[str]) -> str:
  """Machine-readable table: accuracies as fractions, full precision, empty where undefined."""
  columns = [a for a in axes if a != aggregate.SEED]
  fields = ['final_test_accuracy_mean', 'final_test_accuracy_std', 'best_test_accuracy_mean',
            'best_test_accuracy_std', 'final_test_accuracy_delta_vs_none',
            'best_test_accuracy_delta_vs_none', 'effective_rank_mean', 'effective_rank_std']
  with open(path, 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow([*columns, 'n_done', 'n_runs', 'seeds_done', *fields, 'not_done'])
    for row in rows:
      s = row.stats
      values = [s.get(k) for k in fields]
      w.writerow([*(row.value(a) for a in columns), s['n_done'], s['n_runs'],
                  ' '.join(s['seeds_done']),
                  *('' if v is None or math.isnan(v) else repr(float(v)) for v in values),
                  '; '.join(s['not_done'])])
  return path


_LATEX_SPECIAL = {'\\': r'\textbackslash{}', '&': r'\&', '%': r'\%', '$': r'\$', '#': r'\#',
                  '_': r'\_', '{': r'\{', '}': r'\}', '~': r'\textasciitilde{}',
                  '^': r'\textasciicircum{}', '—': '--', '±': r'$\pm$', 'Δ': r'$\Delta$'}


def latex_escape(text: str) -> str:
  return ''.join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_columns(spectra: bool, deltas: bool) -> List[Tuple[str, str, float]]:
  """(heading, stats key, scale) of the table's numeric columns, each with its mean and std in
  row.stats[key + '_mean' / '_std'] (the Δ columns: key alone, no std)."""
  columns = [('final acc. (%)', 'final_test_accuracy', 100.0),
             ('best acc. (%)', 'best_test_accuracy', 100.0)]
  if deltas:
    columns += [('Δ final vs none', 'final_test_accuracy_delta_vs_none', 100.0),
                ('Δ best vs none', 'best_test_accuracy_delta_vs_none', 100.0)]
  if spectra:
    columns += [('effective rank', 'effective_rank', 1.0)]
  return columns


def latex(rows: Sequence[aggregate.Row], axes: Sequence[str], spectra: bool) -> str:
  """The table as a LaTeX tabular (booktabs: \\toprule, \\midrule, \\bottomrule): mean ± std
  per configuration, the best value of each numeric column in bold (the highest: accuracy, its
  difference from --regularizer=none, and the effective rank, which FedDecorr raises), compared as
  printed so ties are all bold. Needs \\usepackage{booktabs}."""
  grid = [a for a in axes if a != aggregate.SEED]
  numeric = latex_columns(spectra, compares_regularizers(rows, axes))
  cells: List[List[str]] = []
  shown: List[List[Optional[float]]] = []  # The printed means, to find each column's best.
  for row in rows:
    st = row.stats
    texts, means = [], []
    for _, key, scale in numeric:
      delta = key.endswith('_delta_vs_none')
      mean = st.get(key if delta else f'{key}_mean', math.nan)
      std = math.nan if delta else st.get(f'{key}_std', math.nan)
      if mean is None or math.isnan(mean):
        texts.append('--')
        means.append(None)
        continue
      text = f'{scale * mean:+.2f}' if delta else f'{scale * mean:.2f}'
      means.append(float(text))
      text = text.replace('-', '$-$', 1)  # A minus sign, not a hyphen.
      texts.append(text + (f' $\\pm$ {scale * std:.2f}' if not math.isnan(std) else ''))
    cells.append(texts)
    shown.append(means)
  best = []
  for j in range(len(numeric)):
    values = [m[j] for m in shown if m[j] is not None]
    best.append(max(values) if len(values) > 1 else None)  # One value is no contest.
  lines = ['% ' + line for line in (
      'Generated by bin/report --latex; needs \\usepackage{booktabs}.',
      'Mean ± sample std (ddof=1) over the finished runs of each row (seeds); accuracies in %;',
      'bold: the best (highest) value of each column.')]
  lines.append('\\begin{tabular}{' + 'l' * len(grid) + 'c' + 'r' * len(numeric) + '}')
  lines.append('\\toprule')
  lines.append(' & '.join([*(latex_escape(a) for a in grid), 'seeds',
                          *(latex_escape(h) for h, _, _ in numeric)]) + r' \\')
  lines.append('\\midrule')
  for row, texts, means in zip(rows, cells, shown):
    values = [latex_escape(row.value(a) or '—') for a in grid]
    values.append(f'{row.stats["n_done"]}/{row.stats["n_runs"]}')
    for j, text in enumerate(texts):
      values.append(f'\\textbf{{{text}}}' if best[j] is not None and means[j] == best[j]
                    else text)
    lines.append(' & '.join(values) + r' \\')
  lines.append('\\bottomrule')
  lines.append('\\end{tabular}')
  return '\n'.join(lines) + '\n'
