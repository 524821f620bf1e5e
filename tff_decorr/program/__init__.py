"""The training program: a run from its configuration to its summary (training: `train`, also
tff_decorr.train), the run's pieces composed from its configuration (experiment), the round loop
that trains, evaluates and writes each round's metrics, checkpoints and exports (round_loop), its
parts (personalized: per-client evaluation; phases: wall time by phase), and spectra tracked
during training (collapse_tracking, over tff_decorr.collapse.analysis). The files it writes are a
layer down (tff_decorr.run_files), its configuration another (tff_decorr.configs), and so is the
binaries' TensorFlow environment (tff_decorr.tf_env); studies of many runs are a layer up
(tff_decorr.studies).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
