"""Deprecated path of tff_decorr.program.training (removed in 0.4.0)."""

from tff_decorr import _moved

_moved.alias(__name__, 'tff_decorr.program.training')
