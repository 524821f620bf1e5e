"""The PyTorch reference's harness: its main.py and client step run on this machine, the fixtures
made once from its own code, the facts they show, its argument parsers as data, and the
step-by-step comparison of the project with it (docs/benchmarks.md §6, docs/reference.md).

The scripts that run under PyTorch's Python (reference_main.py, reference_fixtures*.py,
reference_step_worker.py) are run by path and import no module of `bench` (importing the package would import TensorFlow).
"""
