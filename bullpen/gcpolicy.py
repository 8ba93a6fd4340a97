"""How Bullpen's long-running processes use Python's cyclic garbage collector.

With the default thresholds a process holding many live streams collects its youngest
generation hundreds of times a second and its oldest, which holds every stream's state, every
few seconds, each pass stopping the event loop for hundreds of milliseconds: in the streams
bench (500 streams) the worker spent a fifth of its CPU in the collector. Almost everything
Bullpen allocates per token is freed by reference counting, so the collector only needs to
run rarely.
"""

from __future__ import annotations

import gc

# A young-generation pass per 20,000 net container allocations (default 700), an older one per
# 20 of those (default 10), the oldest per 20 of those (default 10, and then only when a
# quarter of the long-lived objects are new).
THRESHOLDS = (20_000, 20, 20)


def settle() -> None:
    """Call once start-up is done: start-up objects (modules, routes, compiled queries) live as
    long as the process, so they leave every future pass; the rest collects rarely."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
