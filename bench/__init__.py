"""Benchmark scripts (docs/benchmarks.md): `python -m bench.<name> [flags]`.

`python -m bench.<name>` imports this package first, so the TensorFlow environment (oneDNN on
unless the user chose, tff_decorr.run.tf_env) is set before any script imports TensorFlow, as in bin/.
"""

from tff_decorr.run import tf_env  # pylint: disable=unused-import
