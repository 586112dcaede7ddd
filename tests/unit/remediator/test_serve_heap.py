"""``serve`` freezes its heap once the node cache's first list is in, when start-up did not wait for it."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

from remediator.cli.serve import _freeze_once_nodes_listed


class SlowCache:
    """A node cache whose first list completes after ``listing`` calls to ``wait_synced``."""

    def __init__(self, listing: int) -> None:
        self.left = listing
        self.waits = 0

    @property
    def synced(self) -> bool:
        return self.left <= 0

    def wait_synced(self, timeout_s: float) -> bool:
        self.waits += 1
        self.left -= 1
        return self.synced


def _service(cache: SlowCache | None) -> SimpleNamespace:
    return SimpleNamespace(kube=SimpleNamespace(sync=SimpleNamespace(node_cache=cache)))


async def test_the_heap_is_frozen_again_once_the_nodes_are_listed() -> None:
    cache = SlowCache(listing=3)
    before = gc.get_freeze_count()
    try:
        await asyncio.wait_for(_freeze_once_nodes_listed(_service(cache)), 10)
        assert cache.waits == 3 and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


async def test_nothing_to_wait_for_when_the_cache_was_listed_at_start_or_there_is_none() -> None:
    listed = SlowCache(listing=0)
    await _freeze_once_nodes_listed(_service(listed))
    await _freeze_once_nodes_listed(_service(None))
    assert listed.waits == 0
