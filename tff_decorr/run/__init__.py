"""The run program: a configuration (config, its deprecated flag spellings), its composition
(experiment), the round loop with checkpoints, metrics, evaluation and export (program,
training, export, personalized, client_state, run_dir), spectra tracked during training
(collapse_tracking, over tff_decorr.collapse.analysis), what the binaries share (cli; their
TensorFlow environment is tff_decorr.tf_env, a layer down), and grids of runs (study, report when
present).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
