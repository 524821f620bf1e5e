"""Measuring dimensional collapse: spectra and effective rank (analysis) and their plots (plots).
Spectra tracked during training are the run program's (tff_decorr.run.collapse_tracking, a layer
up).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
