"""The run program: its composition (experiment), the round loop with checkpoints, metrics,
evaluation and export (program, training, personalized), spectra tracked during training
(collapse_tracking, over tff_decorr.collapse.analysis), and grids of runs (study, report). The files
it writes are a layer down (tff_decorr.run_files), its configuration another (tff_decorr.configs),
and so is the binaries' TensorFlow environment (tff_decorr.tf_env).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
