"""The paths of before the split into tff_decorr.aggregators and tff_decorr.worker.

Deprecated; removed in 0.4.0 (CHANGELOG.md). `tff_decorr.federated.aggregation` is
`tff_decorr.aggregators` and `tff_decorr.federated.tff_context` is `tff_decorr.worker.tff_context`;
importing either warns once, naming the new path.
"""
