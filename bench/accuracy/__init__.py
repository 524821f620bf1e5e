"""What training reaches: fidelity to the PyTorch reference, the combination matrix, whether each
algorithm trains, the reproduction, and the defaults chosen by measurement (docs/benchmarks.md §6,
§7, §10; docs/reproduction.md; docs/algorithms.md). `.venv/bin/python -m bench.accuracy.<name>
--help`."""
