"""Measuring dimensional collapse: spectra and effective rank (analysis), their plots
(plots), and spectra tracked during training (collapse_tracking).

Submodules are imported on first use (tff_decorr.lazy_submodules).
"""

from tff_decorr import lazy_submodules

__getattr__ = lazy_submodules(__name__)
