"""The run program: its composition (experiment), the round loop with checkpoints, metrics,
evaluation and export (program, training, export, personalized, client_state, run_dir), spectra
tracked during training (collapse_tracking, over tff_decorr.collapse.analysis), and grids of runs
(study, report). Its configuration is a layer down (tff_decorr.configs: config, deprecated_flags,
cli), and so is the binaries' TensorFlow environment (tff_decorr.tf_env).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
