"""Runtimes that execute an algorithm's TF functions: `tff_runtime` (TFF) and `tf_runtime`."""
