"""Federated algorithms written once as TF functions (see docs/algorithms.md)."""
