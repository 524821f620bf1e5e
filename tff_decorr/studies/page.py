"""bin/report's page: the main table, its notes, the other tables and the figures, as Markdown
(table.md) and as one self-contained HTML page (report.html: inline style, images as data: URIs,
nothing fetched, no script; run text escaped).
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import List, Mapping, Sequence, Tuple


def _md_escape(text: str) -> str:
  return str(text).replace('|', '\\|')


Table = Tuple[str, Sequence[str], Sequence[list]]  # (title, header, rows of cells)


def _md_table(header: Sequence[str], body: Sequence[list]) -> List[str]:
  lines = ['| ' + ' | '.join(map(_md_escape, header)) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  return lines + ['| ' + ' | '.join(map(_md_escape, cells)) + ' |' for cells in body]


def markdown(title: str, header: Sequence[str], body: Sequence[list], notes: Sequence[str],
             images: Mapping[str, str], tables: Sequence[Table] = ()) -> str:
  """The page as Markdown: the main table first (bin/report prints it up to its notes), then the
  notes, the other `tables` and the images."""
  lines = [f'# {title}', '', *_md_table(header, body), '']
  lines += [f'- {n}' for n in notes]
  lines.append('')
  for name, extra_header, extra_body in tables:
    lines += [f'## {name}', '', *_md_table(extra_header, extra_body), '']
  lines += [f'![{name}]({os.path.basename(path)})' for name, path in images.items()]
  return '\n'.join(lines) + '\n'


def _data_uri(path: str) -> str:
  with open(path, 'rb') as f:
    return 'data:image/png;base64,' + base64.b64encode(f.read()).decode('ascii')


def _html_table(header: Sequence[str], body: Sequence[list]) -> str:
  e = html.escape
  out = '<table>\n<tr>' + ''.join(f'<th>{e(h)}</th>' for h in header) + '</tr>\n'
  for cells in body:
    out += '<tr>' + ''.join(
        f'<td class="num">{e(c)}</td>' if any(ch.isdigit() for ch in c[:2]) or c[:1] in '+-—'
        else f'<td>{e(c)}</td>' for c in map(str, cells)) + '</tr>\n'
  return out + '</table>\n'


def html_page(title: str, header: Sequence[str], body: Sequence[list], notes: Sequence[str],
              images: Mapping[str, str], tables: Sequence[Table] = ()) -> str:
  """One self-contained page: inline style, images as data: URIs, nothing fetched."""
  e = html.escape
  out = io.StringIO()
  out.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>{e(title)}</title><style>'
            'body{font-family:sans-serif;margin:2em;max-width:95em}'
            'table{border-collapse:collapse;font-size:0.9em}'
            'th,td{border:1px solid #bbb;padding:0.3em 0.6em;text-align:left}'
            'th{background:#eee}td.num{text-align:right;white-space:nowrap}'
            'img{max-width:100%;border:1px solid #ddd;margin:1em 0}'
            '</style></head><body>\n')
  out.write(f'<h1>{e(title)}</h1>\n' + _html_table(header, body))
  out.write('<ul>\n' + ''.join(f'<li>{e(n)}</li>\n' for n in notes) + '</ul>\n')
  for name, extra_header, extra_body in tables:
    out.write(f'<h2>{e(name)}</h2>\n' + _html_table(extra_header, extra_body))
  for name, path in images.items():
    out.write(f'<h2>{e(name)}</h2>\n<img alt="{e(name)}" src="{_data_uri(path)}">\n')
  out.write('</body></html>\n')
  return out.getvalue()
