"""tff_decorr used as a library from a Python program: nothing printed at interpreter exit.

TensorFlow Federated 0.87 sets a default context when it is imported, whose ServiceManager's
`__del__` reads `subprocess.Popen`; run during the interpreter's teardown, after `subprocess` is
gone, it prints "Exception ignored in ... ServiceManager.__del__ ... 'NoneType' object has no
attribute 'Popen'". `import tff_decorr` releases that context at exit (tff_decorr/__init__.py).
"""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest

from tests import testutil

_PYTHON = testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable


def _run(code: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=testutil.REPO_ROOT)
  # From outside the checkout, as a researcher's own script runs.
  return subprocess.run([_PYTHON, '-c', code], cwd=tempfile.gettempdir(), capture_output=True,
                        text=True, timeout=900, env=env)


class InterpreterExitTest(absltest.TestCase):

  def test_tff_alone_prints_the_ignored_exception(self):
    # The check below can fail: without tff_decorr, TFF's import alone prints it at exit.
    proc = _run('import tensorflow_federated')
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn('Exception ignored', proc.stderr)
    self.assertIn("'NoneType' object has no attribute 'Popen'", proc.stderr)

  def test_train_from_python_exits_cleanly(self):
    out = os.path.join(self.create_tempdir().full_path, 'run')
    proc = _run('import tff_decorr\n'
                'from tff_decorr.configs import config\n'
                f"c = config.make(task='digits', regularizer='feddecorr', rounds=1, num_clients=4,"
                f" clients_per_round=2, local_epochs=1, output_dir={out!r})\n"
                'summary = tff_decorr.train(c)\n'
                "print('accuracy', summary['final_test_accuracy'])\n")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('accuracy', proc.stdout)
    for text in ('Exception ignored', 'Traceback'):
      self.assertNotIn(text, proc.stderr)


if __name__ == '__main__':
  absltest.main()
