"""Benchmark scripts (docs/benchmarks.md): `python -m bench.<name> [flags]`."""
