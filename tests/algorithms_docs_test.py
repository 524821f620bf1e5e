"""Every default docs/algorithms.md states is the code's: the page is read, not trusted.

Two kinds of statement are read:
- the HParams paragraph of "Building an algorithm": `<algorithm>` field (default), ..., one
  algorithm after another, separated by ';'. A field that takes a name lists its choices, the
  default first. Every registered algorithm's every field must be there (and nothing else).
- defaults stated in the text ("Default tau = 0.1", "`bn='reference'`, the default",
  "fedavgm's default `bn='average'`", ...), each read with the algorithm(s) of the section it is
  in (a paragraph opening with **<name>** or a bullet "- <Name>:"), or named in the statement.
  Every word "default" on the page must belong to such a statement or to one of the listed
  phrases that state no default of ours (the reference's, a task's, one before a commit); so a new
  sentence stating a default either is checked here or fails until it is listed.
A failure names the page's line.
"""

import dataclasses
import inspect
import os
import re

from absl.testing import absltest

from tests import testutil
from tff_decorr import algorithms

DOC = os.path.join('docs', 'algorithms.md')
_NUMBER = r'(?:true|false|-?\d+(?:\.\d+)?(?:e-?\d+)?)'
_PAIR = r'\w+ = ' + _NUMBER
# The page's short names of fields (its formulas' symbols).
_ALIASES = {'T': 'temperature', 'b1': 'beta1', 'b2': 'beta2'}


def _pattern(regex):
  """`regex` with each space matching any white space (the page breaks its lines anywhere)."""
  return re.compile(regex.replace(' ', r'\s+'))


# Statements of defaults in the text. Groups: `alg` (else the section's algorithms), and either
# `pairs` ("f = v, f = v"), `items` ("`f='v'`, `f`": a bare `f` means true) or `field` + `value`.
_CLAIMS = [
    _pattern(r"\b(?P<alg>\w+)'s default `(?P<field>\w+)='(?P<value>\w+)'`"),
    _pattern(r"\b(?P<alg>(?:\w+, )*\w+ and \w+) `(?P<field>\w+)='(?P<value>\w+)'` by default"),
    _pattern(r'\bDefaults?(?: and their sources:)? (?P<pairs>(?:' + _PAIR + r', )*' + _PAIR
             + r')'),
    _pattern(r'`(?P<field>\w+)`, default (?P<value>' + _NUMBER + ')'),
    _pattern(r"`(?P<field>\w+)='(?P<value>\w+)'`, the default"),
    _pattern(r"\(`(?P<field>\w+)`\): '(?P<value>\w+)' \(default\)"),
    _pattern(r"The default is `(?P<field>\w+)='(?P<value>\w+)'`"),
    _pattern(r"\b(?P<field>\w+) = (?P<value>" + _NUMBER + r") \(the reference's default"),
    _pattern(r"The project's default\s+\((?P<items>`[^)]+`)\)"),
]
# Words "default" that state no default of an algorithm's HParams, each with why.
_NOT_CLAIMS = [
    r'default 1; bin/train passes',  # build()'s local_epochs: test_build_keyword_defaults
    r'by default \(`--fedavgm_bn`,\s+below',  # stated below: "The default is `bn='average'`"
    r'Until then the\s+default was',  # history
    r'was the default before',  # history
    r'\(the default before commit',  # history
    r'embedded default',  # a task's settings (the table's column)
    r'refuses the new default',  # about resuming old runs
    r"reference's `--\w+` default",  # the reference's
    r"\(the reference's default\)",  # the reference's (FedSAM's rho, stated beside ours)
    r"reference's default and run script",  # part of the eps statement (_CLAIMS)
    r'at its default 0\.05',  # the reference's SAM radius
    r"reference's argparse\s+defaults",  # part of "Defaults and their sources" (_CLAIMS)
    r'its argparse default is 1\.0',  # the reference's
    r'at their defaults\)',  # the aggregators'
    r"PyTorch's defaults",  # Keras and PyTorch
]


def _read_doc():
  with open(os.path.join(testutil.REPO_ROOT, DOC)) as f:
    return f.read()


def _line(text, pos):
  return text.count('\n', 0, pos) + 1


def _value(token):
  """A page's value as Python: a quoted name, true/false, or a number."""
  token = token.strip()
  if not re.fullmatch(_NUMBER, token):
    return token.strip("'")
  if token in ('true', 'false'):
    return token == 'true'
  return float(token)


def _defaults(name):
  return {f.name: f.default for f in dataclasses.fields(algorithms.hparams_class(name))}


def _same(doc_value, code_value):
  if isinstance(code_value, bool) or isinstance(doc_value, (bool, str)):
    return doc_value == code_value
  return isinstance(code_value, (int, float)) and abs(doc_value - code_value) <= 1e-12 * max(
      1.0, abs(code_value))


def _split_top(text, sep=';'):
  """`text` split at `sep` outside parentheses."""
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    depth += {'(': 1, ')': -1}.get(ch, 0)
    if ch == sep and depth == 0:
      parts.append((start, text[start:i]))
      start = i + 1
  parts.append((start, text[start:]))
  return parts


def hparams_paragraph(text):
  """{algorithm: {field: (doc value, choices or None, line)}} from the HParams paragraph."""
  start = text.index('`fedprox` mu (')
  end = text.index('. On the command line', start)
  para = text[start:end]
  out, previous = {}, {}
  for offset, chunk in _split_top(para):
    names = re.match(r'\s*((?:`\w+`(?:,| and)?\s*)+)', chunk)
    if not names:
      raise AssertionError(f'{DOC}:{_line(text, start + offset)}: a part naming no algorithm: '
                           f'{chunk.strip()!r}')
    algs = re.findall(r'`(\w+)`', names.group(1))
    fields = dict(previous) if chunk[names.end():].startswith('the same') else {}
    body = re.sub(r'plus\s+`\w+=`\s+\([^()]*\)', '', chunk[names.end():])  # build() keywords
    for m in re.finditer(r'(\w+)\s+\(([^()]*)\)', body):
      where = _line(text, start + offset + names.end() + m.start())
      first = m.group(2).split(';')[0]
      if '|' in first:
        choices = [_value(c) for c in first.split('|')]
        aliases = re.findall(r"'(\w+)' is\s+an\s+alias", m.group(2))
        fields[m.group(1)] = (choices[0], choices + aliases, where)
      else:
        fields[m.group(1)] = (_value(first), None, where)
    for alg in algs:
      out[alg] = fields
    previous = fields
  return out


def section_algorithms(text):
  """[(start offset, [algorithm, ...])]: where each algorithm's section begins on the page."""
  names = set(algorithms.names())
  starts = []
  for m in re.finditer(r'^(?:\*\*([\w, ]+)\.?\*\*|- (\w+):|#+ )', text, re.MULTILINE):
    heading = m.group(1) or m.group(2) or ''
    algs = [a.strip().lower() for a in heading.split(',') if a.strip().lower() in names]
    starts.append((m.start(), algs))
  return starts


def text_claims(text):
  """[(line, algorithm, field, doc value, (start, end))] for every default stated in the text."""
  sections = section_algorithms(text)
  claims = []
  for pattern in _CLAIMS:
    for m in pattern.finditer(text):
      groups = m.groupdict()
      if groups.get('alg'):
        algs = re.split(r', | and ', groups['alg'])
      else:
        algs = [a for s, a in sections if s <= m.start()][-1] if sections else []
      if groups.get('pairs'):
        items = [re.split(r'\s+=\s+', p) for p in re.split(r',\s+', groups['pairs'])]
        items = [(_ALIASES.get(f, f), _value(v)) for f, v in items]
      elif groups.get('items'):
        items = []
        for item in re.findall(r'`([^`]+)`', groups['items']):
          field, _, value = item.partition('=')
          items.append((field, _value(value) if value else True))
      else:
        items = [(groups['field'], _value(groups['value']))]
      line = _line(text, m.start())
      if not algs:
        raise AssertionError(f'{DOC}:{line}: a default stated outside any algorithm\'s section: '
                             f'{m.group(0)!r}')
      for alg in algs:
        for field, value in items:
          # A section of several algorithms: each that has the field (fedadagrad has no beta2).
          if len(algs) > 1 and alg in algorithms.names() and field not in _defaults(alg):
            continue
          claims.append((line, alg, field, value, m.span()))
  return claims


class AlgorithmsDocDefaultsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.text = _read_doc()

  def test_hparams_paragraph_lists_every_field_with_the_codes_default(self):
    documented = hparams_paragraph(self.text)
    errors = []
    for name in algorithms.names():
      code = _defaults(name)
      doc = documented.get(name, {})
      if code and name not in documented:
        errors.append(f'{DOC}: the HParams paragraph lacks `{name}` ({", ".join(code)})')
      for field in sorted(set(code) - set(doc)):
        errors.append(f'{DOC}: the HParams paragraph lacks {name} {field} ({code[field]!r})')
    for name, fields in documented.items():
      if name not in algorithms.names():
        errors.append(f'{DOC}: the HParams paragraph names `{name}`, no algorithm')
        continue
      code = _defaults(name)
      hp = {f.name: f for f in dataclasses.fields(algorithms.hparams_class(name))}
      for field, (value, choices, line) in fields.items():
        if field not in code:
          errors.append(f'{DOC}:{line}: {name} has no field {field}')
          continue
        if not _same(value, code[field]):
          errors.append(f'{DOC}:{line}: {name} {field} ({value!r}), the code says '
                        f'{code[field]!r}')
        if choices is not None and sorted(choices) != sorted(hp[field].metadata['choices']):
          errors.append(f'{DOC}:{line}: {name} {field} lists {choices}, the code allows '
                        f'{list(hp[field].metadata["choices"])}')
    self.assertEmpty(errors, '\n'.join(errors))

  def test_every_default_stated_in_the_text_is_the_codes(self):
    claims = text_claims(self.text)
    errors = []
    for line, alg, field, value, _ in claims:
      if alg not in algorithms.names():
        errors.append(f'{DOC}:{line}: `{alg}` is no algorithm')
        continue
      code = _defaults(alg)
      if field not in code:
        errors.append(f'{DOC}:{line}: {alg} has no field {field}')
      elif not _same(value, code[field]):
        errors.append(f'{DOC}:{line}: {alg} {field} default {value!r}, the code says '
                      f'{code[field]!r}')
    self.assertEmpty(errors, '\n'.join(errors))
    # The statements this test knows of are all still there (a rewrite that drops one is seen).
    self.assertGreaterEqual(len({(c[1], c[2]) for c in claims}), 20, claims)

  def test_every_default_on_the_page_is_read_or_listed(self):
    spans = [c[4] for c in text_claims(self.text)]
    # The HParams paragraph with its sentence on how it states defaults (the test above).
    intro = self.text.index("Each field's default is in parentheses")
    spans.append((intro, self.text.index('. On the command line', intro)))
    listed = [m.span() for p in _NOT_CLAIMS for m in re.finditer(p, self.text)]
    unread = []
    for m in re.finditer(r'\bdefaults?\b', self.text, re.IGNORECASE):
      if not any(s <= m.start() < e for s, e in spans + listed):
        start = self.text.rfind('\n', 0, m.start()) + 1
        unread.append(f'{DOC}:{_line(self.text, m.start())}: '
                      f'{self.text[start:self.text.find(chr(10), m.start())]}')
    self.assertEmpty(unread, 'a default this test does not read; state it in one of the forms '
                     'of _CLAIMS, or list the phrase in _NOT_CLAIMS with why:\n'
                     + '\n'.join(unread))
    for p in _NOT_CLAIMS:
      self.assertRegex(self.text, p, 'a listed phrase no longer on the page: remove it')

  def test_build_keyword_defaults(self):
    # "plus `local_epochs=` (the passes its dataset holds, default 1; ...)".
    self.assertRegex(self.text, r'plus\s+`local_epochs=`\s+\(the passes its dataset holds, '
                     r'default\s+1;')
    self.assertEqual(inspect.signature(algorithms.build).parameters['local_epochs'].default, 1)

  def test_a_stale_default_fails_with_its_line(self):
    # The page as it was before this test: fedavgm's BN rule named as 'ema' in two places.
    stale = self.text.replace("fedavgm's default `bn='average'`", "fedavgm's default `bn='ema'`")
    stale = stale.replace("bn ('average' | 'ema' | 'reference')", "bn ('ema' | 'reference' | "
                          "'average')")
    bad = [c for c in text_claims(stale) if c[1:3] == ('fedavgm', 'bn') and c[3] == 'ema']
    self.assertLen(bad, 1)
    self.assertEqual(bad[0][0], _line(stale, stale.index("fedavgm's default `bn='ema'`")))
    self.assertEqual(hparams_paragraph(stale)['fedavgm']['bn'][0], 'ema')


if __name__ == '__main__':
  absltest.main()
