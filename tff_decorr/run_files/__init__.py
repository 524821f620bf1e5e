"""A run directory's files, each written and read by one module, and their one owner
(run_directory.RunDirectory: resuming, committing a round, repairing, the summary): the directory
itself (run_dir: lock, config.json and its comparison, leftovers, setting aside), the metrics
(metrics_log: metrics.csv and tensorboard/), checkpoints (checkpoint_files),
per-client states (client_state), the SavedModel export and the test-set evaluator of its weights
(export), the check of a SavedModel's operations before it is loaded (graph_check), TensorBoard's
HParams (tensorboard_hparams) and the differential-privacy releases a run adds to the ledger
(privacy_ledger).

A layer between the configuration (tff_decorr.configs) and the training program that writes these
files (tff_decorr.program).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
