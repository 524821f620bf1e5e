"""Helpers shared by the tests: where the repository and the shared test data are."""

import os
import subprocess
import sys

# Resolve through Bazel's runfiles symlinks to the source tree.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
PYTHON = os.path.join(REPO_ROOT, '.venv', 'bin', 'python')


def shared_tfds_dir() -> str | None:
  """`../shared/data/tfds` beside the repository, or None when it is absent."""
  path = os.path.join(os.path.dirname(REPO_ROOT), 'shared', 'data', 'tfds')
  return path if os.path.isdir(os.path.join(path, 'cifar10')) else None


def run_module(module: str, *args: str, timeout: float = 600, env=None):
  """Runs `python -m module args...` from the repository root, as a user would."""
  python = PYTHON if os.path.exists(PYTHON) else sys.executable
  full_env = dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([python, '-m', module, *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=timeout, env=full_env)


def worker_binaries() -> list[str]:
  """Command lines of running TFF worker processes (for leak checks)."""
  out = subprocess.run(['pgrep', '-af', 'worker_binary'], capture_output=True, text=True)
  return [l for l in out.stdout.splitlines() if 'pgrep' not in l]
