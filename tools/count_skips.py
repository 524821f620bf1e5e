r"""Counts the tests a `bazel test` run skipped, and fails when one was skipped for a reason a
machine here can meet.

A skipped test passes silently: a fresh clone without a fixture, a browser or a data set reports
every target PASSED. `make test` runs this after `bazel test //...`:

  .venv/bin/python -m tools.count_skips --bazel_log=.bazel-test.log bazel-testlogs

It reads each test target's JUnit XML (`bazel-testlogs/<package>/<target>/test.xml`, written by
absltest from Bazel's XML_OUTPUT_FILE; one per shard), counts the test cases absltest marked
`status="notrun"` (skipped), prints the count and each skipped test, and exits 1 unless every
skipped test is allowed. absltest writes no skip reason into the XML or the log, so a test that
may skip for a reason no machine here can meet says so itself, through
`tests/testutil.skip_without_gpu` (the one such reason: the project's machines have no GPU),
which prints `ALLOWED_SKIP_MARK <Class>.<test>: <reason>` to the test's log
(`bazel-testlogs/.../test.log`) before skipping; those are counted apart and allowed.

`--bazel_log`: only the targets this run reported (its summary lines `//pkg:target  PASSED` ...),
so the XML of a test since deleted, left in bazel-testlogs, is not read. Exit status: 0 when no
test was skipped except allowed ones, 1 otherwise, 2 when no XML was found (nothing ran).
"""

import argparse
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

# What tests/testutil.skip_without_gpu prints before skipping (tests/count_skips_test.py checks
# that the two spell it the same).
ALLOWED_SKIP_MARK = 'count_skips: allowed skip:'
# Not tests: tf.test.TestCase's `test_session` (a deprecated context manager that unittest
# collects by its name and TensorFlow skips: "Tests that have the name "test_session" are
# automatically skipped"), one in every tf.test.TestCase class.
NOT_TESTS = frozenset({'test_session'})
_SUMMARY = re.compile(r'^(//[^ :]*:[^ ]+)\s+(?:\(cached\) )?(?:PASSED|FAILED|TIMEOUT|FLAKY|'
                      r'NO STATUS|INCOMPLETE)', re.MULTILINE)


def reported_targets(bazel_log_text):
  """{'//tests:foo_test', ...}: the targets a `bazel test` output names in its summary."""
  return set(_SUMMARY.findall(bazel_log_text))


def _target_of(xml_path, testlogs):
  """'//tests:foo_test' for bazel-testlogs/tests/foo_test/test.xml (shards: .../shard_1_of_2/)."""
  parts = os.path.relpath(os.path.dirname(xml_path), testlogs).split(os.sep)
  if parts and re.fullmatch(r'shard_\d+_of_\d+', parts[-1]):
    parts = parts[:-1]
  return f'//{"/".join(parts[:-1])}:{parts[-1]}'


def skipped_tests(xml_text):
  """['Class.test', ...] that a JUnit XML from absltest marks as not run (NOT_TESTS left out)."""
  out = []
  try:
    root = ET.fromstring(xml_text)
  except ET.ParseError:  # A target killed by its timeout leaves an empty file: it failed already.
    return out
  for case in root.iter('testcase'):
    if case.get('name') in NOT_TESTS:
      continue
    if case.get('status') == 'notrun' or case.find('skipped') is not None:
      out.append(f'{case.get("classname", "").rsplit(".", 1)[-1]}.{case.get("name")}')
  return out


def allowed_in_log(log_text):
  """{'Class.test': reason} printed by tests/testutil.skip_without_gpu."""
  out = {}
  for line in log_text.splitlines():
    at = line.find(ALLOWED_SKIP_MARK)
    if at >= 0:
      name, _, reason = line[at + len(ALLOWED_SKIP_MARK):].strip().partition(': ')
      out[name] = reason
  return out


def count(testlogs, targets=None):
  """(xml files read, [(target, test, reason or None)]) for every skipped test."""
  files, skips = 0, []
  for xml_path in sorted(glob.glob(os.path.join(testlogs, '**', 'test.xml'), recursive=True)):
    target = _target_of(xml_path, testlogs)
    if targets is not None and target not in targets:
      continue
    files += 1
    with open(xml_path) as f:
      names = skipped_tests(f.read())
    log_path = os.path.join(os.path.dirname(xml_path), 'test.log')
    allowed = {}
    if names and os.path.exists(log_path):
      with open(log_path, errors='replace') as f:
        allowed = allowed_in_log(f.read())
    # A parameterised test's XML name carries its parameters after a space.
    skips.extend((target, name, allowed.get(name, allowed.get(name.split(' ', 1)[0])))
                 for name in names)
  return files, skips


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('testlogs', nargs='?', default='bazel-testlogs')
  parser.add_argument('--bazel_log', help="read only the targets this `bazel test` output names")
  args = parser.parse_args(argv)
  targets = None
  if args.bazel_log:
    with open(args.bazel_log, errors='replace') as f:
      targets = reported_targets(f.read())
  files, skips = count(args.testlogs, targets)
  if not files:
    print(f'count_skips: no test.xml under {args.testlogs}: did the tests run?')
    return 2
  refused = [s for s in skips if s[2] is None]
  print(f'skipped tests: {len(skips)} ({len(skips) - len(refused)} allowed: no machine here can '
        f'meet their reason) in {files} test targets')
  for target, name, reason in skips:
    print(f'  {target} {name}: ' + (f'allowed ({reason})' if reason else
                                   'NOT ALLOWED (see its log for why it skipped)'))
  if refused:
    print(f'count_skips: {len(refused)} skipped test(s) a machine here can run: ship what they '
          'need or delete them (tools/count_skips.py)')
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
