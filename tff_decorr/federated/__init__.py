"""The paths of before the split into tff_decorr.aggregators and tff_decorr.worker.

Deprecated; removed in 0.4.0 (CHANGELOG.md). `tff_decorr.federated.aggregation` is
`tff_decorr.aggregators` and `tff_decorr.federated.tff_context` is `tff_decorr.worker.tff_context`;
importing either warns once, naming the new path.
"""

from tff_decorr import _moved

# tff_decorr.federated.aggregation and .tff_context: attributes imported on first use, as before.
__getattr__ = _moved.old_modules(__name__, ('aggregation', 'tff_context'))
