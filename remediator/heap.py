"""The cyclic garbage collector in a long-running process of ours: ``serve``, and the benchmarks' service
parts that measure it.

Where it sits: called by ``serve`` once its parts are started (``settle``), and again, freezing only, once
the node cache's first list is in (``remediator.cli.serve``); the benchmarks call ``settle`` at the same
point of their pipelines, so what they measure is what ``serve`` runs.

``settle``: what start-up allocated lives as long as the process (settings, the catalog, a listed node
cache), so it is collected once and frozen out of every later pass (``gc.freeze``); and the youngest
generation is collected every ``YOUNG_THRESHOLD`` net allocations instead of CPython's 700. A run, an event
and every request allocate thousands of short-lived objects, and at 700 the collector ran thousands of
passes over a storm, each promoting the objects of the requests then in flight, which the older
generations then walked again: over a 5,000-node burst the service spent 12.0-12.9 s in 4,284-4,303 passes
(32 of them full), against 2.1-2.3 s in 49 passes (none full) with the threshold raised (ARCHITECTURE.md,
"The young generation, collected less often").
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

YOUNG_THRESHOLD = 20_000
_MIDDLE, _OLD = 20, 10  # passes of the generation below before the next one is collected


def settle() -> None:
    """Collect and freeze what the process holds now, and set the collector's thresholds (idempotent)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, _MIDDLE, _OLD)
