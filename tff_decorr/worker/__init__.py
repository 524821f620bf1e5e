"""TFF's worker process and the sandbox around it: the TFF execution context the project owns
(tff_context), its workers' own network namespace behind an owner-only Unix socket (netns,
netns_bridge) and the loopback opt-in where there is none (loopback). The aggregators behind
--aggregator are tff_decorr.aggregators, a layer down; the runtimes are a layer up.

Submodules are imported on first use (tff_decorr.lazy.lazy_submodules).
"""

from tff_decorr.lazy import lazy_submodules

__getattr__ = lazy_submodules(__name__)
