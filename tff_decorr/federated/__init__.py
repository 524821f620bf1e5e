"""The TFF face: the tff.learning API (learning), tff.aggregators behind --aggregator
(aggregation), and the TFF execution context the project owns (tff_context).

Submodules are imported on first use (tff_decorr.lazy_submodules).
"""

from tff_decorr import lazy_submodules

__getattr__ = lazy_submodules(__name__)
