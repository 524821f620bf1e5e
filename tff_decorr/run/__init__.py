"""The run program: its composition (experiment), the round loop with checkpoints, metrics,
evaluation and export (program, training, personalized, phases), and spectra tracked during
training (collapse_tracking, over tff_decorr.collapse.analysis). The files it writes are a layer
down (tff_decorr.run_files), its configuration another (tff_decorr.configs), and so is the
binaries' TensorFlow environment (tff_decorr.tf_env); studies of many runs are a layer up
(tff_decorr.studies).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
