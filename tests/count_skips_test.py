"""tools/count_skips.py, `make test`'s skip count: on synthetic Bazel test logs, and on the XML
and log absltest itself writes for a test file with a passing, a skipped and an allowed test."""

import os
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest

from tests import testutil
from tools import count_skips


def _xml(suite, cases):
  """A JUnit XML as absltest writes it: cases = [(name, skipped)]."""
  rows = ''.join(
      f'  <testcase name="{n}" status="{"notrun" if s else "run"}" '
      f'result="{"suppressed" if s else "completed"}" time="0.0" classname="__main__.{suite}">\n'
      '  </testcase>\n' for n, s in cases)
  return (f'<?xml version="1.0"?>\n<testsuites name="" tests="{len(cases)}">\n'
          f'<testsuite name="{suite}" tests="{len(cases)}">\n{rows}</testsuite>\n</testsuites>\n')


class CountSkipsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.logs = self.create_tempdir().full_path

  def write(self, relative, text):
    path = os.path.join(self.logs, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)

  def run_main(self, *args):
    with tempfile.TemporaryFile('w+') as out:
      stdout, sys.stdout = sys.stdout, out
      try:
        code = count_skips.main([self.logs, *args])
      finally:
        sys.stdout = stdout
      out.seek(0)
      return code, out.read()

  def test_no_skip_passes_and_prints_zero(self):
    self.write('tests/a_test/test.xml', _xml('A', [('test_one', False), ('test_two', False)]))
    code, out = self.run_main()
    self.assertEqual(code, 0)
    self.assertIn('skipped tests: 0 (0 allowed', out)

  def test_an_empty_xml_of_a_timed_out_target_is_no_crash(self):
    self.write('tests/a_test/test.xml', '')
    self.write('tests/b_test/test.xml', _xml('B', [('test_browser', True)]))
    code, out = self.run_main()
    self.assertEqual(code, 1)
    self.assertIn('B.test_browser', out)

  def test_a_skip_fails_and_is_named(self):
    self.write('tests/a_test/test.xml', _xml('A', [('test_one', False)]))
    self.write('tests/b_test/test.xml', _xml('B', [('test_browser', True), ('test_ok', False)]))
    self.write('tests/b_test/test.log', '[  SKIPPED ] B.test_browser\n')
    code, out = self.run_main()
    self.assertEqual(code, 1)
    self.assertIn('skipped tests: 1 (0 allowed', out)
    self.assertIn('//tests:b_test B.test_browser: NOT ALLOWED', out)

  def test_a_gpu_skip_is_allowed_only_for_the_test_that_printed_the_mark(self):
    self.write('tests/g_test/test.xml', _xml('G', [("test_gpu0 ('fp16')", True),
                                                   ('test_other', True)]))
    self.write('tests/g_test/test.log',
               f'{testutil.ALLOWED_SKIP_MARK} G.test_gpu0: needs a GPU (mixed precision)\n')
    code, out = self.run_main()
    self.assertEqual(code, 1)
    self.assertIn('skipped tests: 2 (1 allowed', out)
    self.assertIn("G.test_gpu0 ('fp16'): allowed (needs a GPU (mixed precision))", out)
    self.assertIn('G.test_other: NOT ALLOWED', out)
    self.write('tests/g_test/test.xml', _xml('G', [("test_gpu0 ('fp16')", True)]))
    self.assertEqual(self.run_main()[0], 0)

  def test_shards_and_only_the_targets_the_run_reported(self):
    self.write('tests/s_test/shard_1_of_2/test.xml', _xml('S', [('test_a', True)]))
    self.write('tests/s_test/shard_2_of_2/test.xml', _xml('S', [('test_b', False)]))
    self.write('tests/gone_test/test.xml', _xml('Gone', [('test_old', True)]))
    bazel_log = os.path.join(self.create_tempdir().full_path, 'bazel.log')
    with open(bazel_log, 'w') as f:
      f.write('//tests:s_test                                  (cached) PASSED in 3.1s\n'
              '//tests:other_test                              FAILED in 2.0s\n')
    with open(bazel_log) as f:
      self.assertEqual(count_skips.reported_targets(f.read()),
                       {'//tests:s_test', '//tests:other_test'})
    code, out = self.run_main('--bazel_log', bazel_log)
    self.assertEqual(code, 1)
    self.assertIn('skipped tests: 1 (0 allowed: no machine here can meet their reason) in 2 test '
                  'targets', out)
    self.assertIn('//tests:s_test S.test_a', out)
    self.assertNotIn('Gone', out)

  def test_tensorflow_test_session_is_not_a_test(self):
    self.write('tests/t_test/test.xml', _xml('T', [('test_session', True), ('test_x', False)]))
    code, out = self.run_main()
    self.assertEqual(code, 0)
    self.assertIn('skipped tests: 0', out)

  def test_nothing_ran(self):
    self.assertEqual(self.run_main()[0], 2)

  def test_on_what_absltest_writes(self):
    # A test file run as Bazel runs it (XML_OUTPUT_FILE), with the project's GPU skip: this
    # machine has no GPU, so it skips, and is allowed; the plain skip is not; tf.test.TestCase's
    # test_session (skipped by TensorFlow) is no test.
    work = self.create_tempdir().full_path
    with open(os.path.join(work, 'demo_test.py'), 'w') as f:
      f.write(textwrap.dedent('''\
          import sys
          sys.path.insert(0, sys.argv.pop(1))
          from absl.testing import absltest
          import tensorflow as tf
          from tests import testutil

          class Demo(tf.test.TestCase):  # Its test_session is skipped by TensorFlow: no test.
            def test_runs(self):
              pass
            def test_needs_gpu(self):
              testutil.skip_without_gpu(self, 'a test of the skip count')
            def test_needs_a_browser(self):
              self.skipTest('no browser')

          if __name__ == '__main__':
            absltest.main()
          '''))
    target = os.path.join(self.logs, 'tests', 'demo_test')
    os.makedirs(target)
    with open(os.path.join(target, 'test.log'), 'w') as log:
      proc = subprocess.run(
          [sys.executable, os.path.join(work, 'demo_test.py'), testutil.REPO_ROOT],
          stdout=log, stderr=subprocess.STDOUT, timeout=300,
          env=dict(os.environ, XML_OUTPUT_FILE=os.path.join(target, 'test.xml')))
    self.assertEqual(proc.returncode, 0)
    code, out = self.run_main()
    self.assertEqual(code, 1, out)
    self.assertIn('skipped tests: 2 (1 allowed', out)
    self.assertIn('Demo.test_needs_gpu: allowed (needs a GPU (a test of the skip count); '
                  'TensorFlow sees none)', out)
    self.assertIn('Demo.test_needs_a_browser: NOT ALLOWED', out)

  def test_the_mark_is_the_tools(self):
    self.assertEqual(testutil.ALLOWED_SKIP_MARK, count_skips.ALLOWED_SKIP_MARK)


if __name__ == '__main__':
  absltest.main()
