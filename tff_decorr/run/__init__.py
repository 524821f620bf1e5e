"""The paths of before the training program was named tff_decorr.program.

Deprecated; removed in 0.4.0 (CHANGELOG.md). Each module here is the module of the same name in
tff_decorr.program (`tff_decorr.run.composition` is `tff_decorr.program.experiment`); importing
one warns once, naming the new path. "run" now means one thing: one training run and its directory
(docs/DESIGN.md, "Words").
"""

from tff_decorr import _moved

# tff_decorr.run.training, ...: attributes imported on first use, as before; 0.2.0's removed names
# (tff_decorr.run.config, .experiment, .tf_env) stay AttributeErrors.
__getattr__ = _moved.old_modules(__name__, ('training', 'composition', 'round_loop', 'personalized',
                                            'phases', 'collapse_tracking'))
