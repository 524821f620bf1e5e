"""Studies: grids of runs and what is read from them, above the training program
(tff_decorr.program), whose runs they start as bin/train child processes and whose files
(tff_decorr.run_files) they read. A grid, its plan (each cell checked as bin/train checks it), its
manifest and the local runner (study); a run's collapse measures over rounds (run_spectra); runs
read and folded over seeds (aggregate) into tables (tables), curves and spectra (figures) and a
page (page), put together by report; and a study's archive (archive).

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
