"""Benchmark scripts (docs/benchmarks.md), grouped by the question they answer:

  bench/speed/      what a step, a round, a run, a client, memory, a regulariser, an aggregator
                    or a worker costs (docs/benchmarks.md §1-5, §8, §9; docs/remote_workers.md)
  bench/accuracy/   what training reaches: fidelity to the reference, the combination matrix,
                    whether each algorithm trains, the reproduction, defaults chosen by measurement
                    (docs/benchmarks.md §6, §7, §10; docs/reproduction.md, docs/algorithms.md)
  bench/reference/  the PyTorch reference's harness: its main.py and client step run here, the
                    fixtures made from its code, and the step-by-step comparison with them (§6)

Each runs as `.venv/bin/python -m bench.<group>.<name> [flags]`; the shared pieces stay here
(_common.py, settings.py).

`python -m bench.<...>` imports this package first, so the TensorFlow environment (oneDNN on unless
the user chose, tff_decorr.tf_env) is set before any script imports TensorFlow, as in bin/.
"""

from tff_decorr import tf_env  # pylint: disable=unused-import
