"""Measuring dimensional collapse: spectra and effective rank (analysis) and their plots (plots).
Spectra tracked during training are the training program's
(tff_decorr.program.collapse_tracking, a layer up).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

# analysis's defaults, here where importing them imports no TensorFlow: bin/analyze's flags
# default to them and answer --help before TensorFlow is loaded.
DEFAULT_LOG10_TAU = -2.0  # significance threshold log10(tau) of num_significant
DEFAULT_TOP = 100  # singular values plotted and listed

__getattr__ = lazy_submodules(__name__)
