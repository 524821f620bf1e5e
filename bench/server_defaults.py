"""`python -m bench.server_defaults`: runs bench/accuracy/server_defaults.py, flags and all, under the name that
long runs were started with. The benchmark, its flags and its docstring are there."""

import runpy

if __name__ == '__main__':
  runpy.run_module('bench.accuracy.server_defaults', run_name='__main__', alter_sys=True)
