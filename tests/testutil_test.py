"""testutil.ClassTempDir: a class's folder exists for its tests and is gone after them, also when
its setUpClass fails or skips after making it."""

import os
import unittest

from absl.testing import absltest

from tests import testutil


def _run(case: type) -> unittest.TestResult:
  """Runs the tests of `case` as a test runner does (class set-up and cleanups included)."""
  result = unittest.TestResult()
  unittest.TestSuite([unittest.defaultTestLoader.loadTestsFromTestCase(case)]).run(result)
  return result


class ClassTempDirTest(absltest.TestCase):

  def test_one_folder_for_the_class_removed_after_its_tests(self):
    seen = []

    class Case(testutil.ClassTempDir, unittest.TestCase):

      def test_a(self):
        seen.append(self.tmp)
        self.assertTrue(os.path.isdir(self.tmp))
        with open(os.path.join(self.tmp, 'a.txt'), 'w') as f:
          f.write('a')

      def test_b(self):
        seen.append(self.tmp)
        self.assertTrue(os.path.isfile(os.path.join(self.tmp, 'a.txt')))  # test_a's, kept.

    result = _run(Case)
    self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
    self.assertLen(seen, 2)
    self.assertEqual(seen[0], seen[1])
    self.assertFalse(os.path.exists(seen[0]))

  def test_removed_when_set_up_fails_or_skips_after_making_it(self):
    for error in (RuntimeError('set-up failed'), unittest.SkipTest('no compiler')):
      made = []

      class Case(testutil.ClassTempDir, unittest.TestCase):

        @classmethod
        def setUpClass(cls):
          super().setUpClass()
          made.append(cls.tmp)
          raise error  # pylint: disable=cell-var-from-loop

        def test_never_runs(self):
          raise AssertionError('set-up failed; no test runs')

      result = _run(Case)
      with self.subTest(error=type(error).__name__):
        self.assertLen(made, 1)
        self.assertFalse(os.path.exists(made[0]))
        self.assertLen(result.errors if isinstance(error, RuntimeError) else result.skipped, 1)


if __name__ == '__main__':
  absltest.main()
