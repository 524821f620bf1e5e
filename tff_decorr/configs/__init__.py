"""A run's configuration, a layer below the training program: the settings and their validation
(config: Config, resolve, make, reading config.json) and the command line that turns flags into
Configs (cli: bin/train's flags, the binaries' exit codes and error handler; flag_table: those
flags as data, read without TensorFlow).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
