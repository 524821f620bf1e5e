"""tff_decorr.tf_env: the binaries' stderr filter drops TensorFlow's known noise lines only,
keeps everything else in order (partial lines too), survives a SIGKILL of its process, and keeps
the exit status; TFF_DECORR_NOISE=1 shows every line."""

import os
import signal
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest

from tests import testutil

# Writes to file descriptor 2 directly, as TensorFlow's C++ logging does.
_PROGRAM = textwrap.dedent('''
    import os, sys, time
    from tff_decorr import tf_env
    tf_env.quiet_known_noise()
    os.write(2, b'2026-11-25 E cuda_dnn.cc:9342] Unable to register cuDNN factory: Attempting\\n')
    os.write(2, b'first real line\\n')
    print('second real line', file=sys.stderr, flush=True)
    os.write(2, b'a prompt without newline')
    time.sleep(0.4)
    os.write(2, b' and its end\\nE grappler_item_builder.cc:435] Failed to detect the fetch '
             b'node(s), skipping this input\\nlast real line\\n')
    if sys.argv[1] == 'kill':
      os.kill(os.getpid(), 9)
    if sys.argv[1] == 'group':  # Ctrl-C in a terminal: SIGINT to the whole process group
      import signal
      signal.signal(signal.SIGINT, lambda *a: None)
      os.killpg(os.getpgrp(), signal.SIGINT)
      time.sleep(0.3)
      os.write(2, b'said after the interrupt\\n')
    sys.exit(3)
''')


def _run(mode, **env):
  python = testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable
  return subprocess.run([python, '-c', _PROGRAM, mode], cwd=testutil.REPO_ROOT,
                        capture_output=True, text=True, timeout=60,
                        env={**os.environ, 'TFF_DECORR_NOISE': '', **env})


class QuietKnownNoiseTest(absltest.TestCase):

  def test_noise_is_dropped_and_the_rest_kept_in_order(self):
    proc = _run('exit')
    self.assertEqual(proc.returncode, 3)
    self.assertEqual(proc.stderr, 'first real line\nsecond real line\na prompt without newline'
                     ' and its end\nlast real line\n')

  def test_lines_written_before_a_sigkill_still_arrive(self):
    proc = _run('kill')
    self.assertEqual(proc.returncode, -signal.SIGKILL)
    self.assertIn('last real line\n', proc.stderr)
    self.assertNotIn('cuDNN', proc.stderr)

  def test_a_ctrl_c_to_the_process_group_does_not_end_the_filter_first(self):
    python = testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable
    proc = subprocess.run([python, '-c', _PROGRAM, 'group'], cwd=testutil.REPO_ROOT,
                          capture_output=True, text=True, timeout=60, start_new_session=True,
                          env={**os.environ, 'TFF_DECORR_NOISE': ''})
    self.assertEqual(proc.returncode, 3)
    self.assertTrue(proc.stderr.endswith('last real line\nsaid after the interrupt\n'),
                    proc.stderr)

  def test_every_line_on_request(self):
    proc = _run('exit', TFF_DECORR_NOISE='1')
    self.assertIn('Unable to register cuDNN factory', proc.stderr)
    self.assertIn('Failed to detect the fetch node(s)', proc.stderr)


class EveryProgramTest(absltest.TestCase):

  def test_tensorflow_imported_after_the_filter_prints_nothing(self):
    # What each program does first; TensorFlow's start-up lines (oneDNN, the CPU's instructions,
    # the CUDA plugins of a machine without a GPU) are its C++ log's "<date> <time>: I|W|E" lines.
    python = testutil.PYTHON if os.path.exists(testutil.PYTHON) else sys.executable
    env = {k: v for k, v in os.environ.items()
           if k not in ('TF_CPP_MIN_LOG_LEVEL', 'TFF_DECORR_NOISE')}
    proc = subprocess.run(
        [python, '-c', 'from tff_decorr import tf_env; tf_env.quiet_known_noise(); '
         'import tensorflow as tf; tf.constant(1.0) + 1.0; print("imported")'],
        cwd=testutil.REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertEqual(proc.stdout, 'imported\n')
    self.assertEqual(proc.stderr, '')

  def test_every_program_filters_before_tensorflow(self):
    bin_dir = os.path.join(testutil.REPO_ROOT, 'bin')
    programs = sorted(n for n in os.listdir(bin_dir) if n.endswith('.py') and n != '__init__.py')
    self.assertGreaterEqual(len(programs), 7)
    for name in programs:
      with open(os.path.join(bin_dir, name)) as f:
        source = f.read()
      self.assertIn('tf_env.quiet_known_noise()', source, name)


if __name__ == '__main__':
  absltest.main()
