#!/bin/sh
# Bazel's Python interpreter: the project's virtual environment. Bazel runs this through a
# runfiles symlink, so resolve it to the source tree first, then exec the venv's python without
# resolving that symlink (the venv is found from the path of the executable).
here=$(dirname "$(readlink -f "$0")")
venv_python="$here/../../.venv/bin/python3"
if [ ! -x "$venv_python" ]; then
  echo "tff_decorr: no virtual environment at ${here%/tools/python}/.venv; run 'make setup' first." >&2
  exit 2
fi
exec "$venv_python" "$@"
