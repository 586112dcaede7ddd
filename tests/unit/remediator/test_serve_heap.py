"""``serve`` settles its heap once started (``remediator.heap``: frozen, the young collected less often) and
freezes it again once the node cache's first list is in, when start-up did not wait for it."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from types import SimpleNamespace

import pytest

from remediator import heap
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


def test_settle_freezes_what_start_up_holds_and_collects_the_young_less_often() -> None:
    code = ("import gc; from remediator import heap; held = [{} for _ in range(5000)]; heap.settle(); "
            "print(gc.get_freeze_count(), *gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    frozen, *threshold = map(int, out.stdout.split())
    assert frozen > 5000  # what start-up allocated, out of every later pass
    assert threshold == [heap.YOUNG_THRESHOLD, 20, 10] and heap.YOUNG_THRESHOLD > 700  # CPython's is 700


async def test_serve_settles_its_heap_once_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import remediator.service
    from remediator.cli.serve import _serve
    from remediator.settings import Settings

    seen: list[tuple[int, int, int]] = []

    class Started:  # a service that starts and is asked to stop at once
        kube = nats = None
        http_url, nats_url = "http://127.0.0.1:0", "nats://127.0.0.1:0"

        def __init__(self, settings: Settings) -> None:
            pass

        async def start(self) -> None:
            pass

        async def wait(self) -> None:
            seen.append(gc.get_threshold())

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(remediator.service, "Service", Started)
    was = gc.get_threshold()
    try:
        await _serve(Settings(insecure_no_auth=True))
    finally:
        gc.set_threshold(*was)
        gc.unfreeze()
    assert seen == [(heap.YOUNG_THRESHOLD, 20, 10)]
