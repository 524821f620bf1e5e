"""Benchmark scripts (docs/benchmarks.md): `python -m bench.<name> [flags]`.

`python -m bench.<name>` imports this package first, so the TensorFlow environment (oneDNN on
unless the user chose, tff_decorr.tf_env) is set before any script imports TensorFlow, as in bin/.
"""

from tff_decorr import tf_env  # pylint: disable=unused-import
