"""`python -m bench.reproduction`: runs bench/accuracy/reproduction.py, flags and all, under the name that
long runs were started with. The benchmark, its flags and its docstring are there."""

import runpy

if __name__ == '__main__':
  runpy.run_module('bench.accuracy.reproduction', run_name='__main__', alter_sys=True)
