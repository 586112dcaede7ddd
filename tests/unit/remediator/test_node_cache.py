"""The node cache's list-then-watch loop over a scripted API: resourceVersions, 410 Gone, resync, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from remediator.adapters.nodecache import NodeCache, newer

pytestmark = pytest.mark.timeout(30)


def node(name: str, rv: int, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "spec": spec}


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.005)


class ScriptedApi:
    """A list that answers the nodes held, and watches that play the scripted events then end."""

    def __init__(self) -> None:
        self.nodes = {"a": node("a", 1), "b": node("b", 2)}
        self.rv = 2
        self.watches: list[list[dict[str, Any]]] = []
        self.watched_from: list[str] = []
        self.lists = 0
        self.fail_lists = 0
        self.idle = threading.Event()

    def lister(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.fail_lists:
            self.fail_lists -= 1
            raise OSError("connection refused")
        return list(self.nodes.values()), str(self.rv)

    def watcher(self, rv: str, _timeout: float) -> Iterator[dict[str, Any]]:
        self.watched_from.append(rv)
        if self.watches:
            yield from self.watches.pop(0)
            return
        self.idle.set()
        time.sleep(0.05)


def test_newer_compares_resource_versions_as_numbers() -> None:
    assert newer("10", "9") and not newer("9", "10") and not newer("5", "5")
    assert newer("x", "") and newer("b", "a")


def test_events_apply_only_when_newer_and_the_watch_resumes_from_the_last_rv() -> None:
    api = ScriptedApi()
    api.watches = [[
        {"type": "MODIFIED", "object": node("a", 5, unschedulable=True)},
        {"type": "MODIFIED", "object": node("a", 4)},  # older than what is held: ignored
        {"type": "ADDED", "object": node("c", 6)},
        {"type": "DELETED", "object": node("b", 7)},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    ]]
    cache = NodeCache(api.lister, api.watcher).start()
    try:
        assert cache.wait_synced(5)
        _until(api.idle.is_set)
        assert (cache.get("a") or {})["spec"] == {"unschedulable": True}
        assert cache.get("b") is None and cache.get("c") is not None
        assert api.watched_from[:2] == ["2", "9"]  # listed at 2; re-watched from the bookmark
        assert api.lists == 1
    finally:
        cache.stop()


def test_410_gone_lists_again() -> None:
    api = ScriptedApi()
    api.watches = [[{"type": "ERROR", "object": {"code": 410, "reason": "Expired",
                                                 "message": "too old resource version: 2 (40)"}}]]
    api.nodes["d"] = node("d", 50)
    api.rv = 50
    cache = NodeCache(api.lister, api.watcher).start()
    try:
        _until(api.idle.is_set)
        assert api.lists == 2  # the first list, and the relist after 410
        assert api.watched_from[-1] == "50"
        assert cache.get("d") is not None
    finally:
        cache.stop()


def test_a_full_resync_lists_again_on_schedule() -> None:
    api = ScriptedApi()
    now = [0.0]
    cache = NodeCache(api.lister, api.watcher, resync_s=10.0, clock=lambda: now[0]).start()
    try:
        _until(api.idle.is_set)
        assert api.lists == 1
        now[0] = 11.0
        _until(lambda: api.lists == 2)
    finally:
        cache.stop()


def test_an_api_that_keeps_failing_stops_serving_reads_after_stale_after_s() -> None:
    api = ScriptedApi()
    now = [0.0]
    cache = NodeCache(api.lister, api.watcher, stale_after_s=30.0, clock=lambda: now[0])
    assert not cache.synced  # nothing listed yet: the adapter reads the API server
    cache.start()
    try:
        _until(api.idle.is_set)
        assert cache.synced
        api.fail_lists = 10_000
        api.watches = [[{"type": "ERROR", "object": {"code": 500}}]]
        _until(lambda: api.lists >= 3)
        assert cache.synced  # failing for less than stale_after_s: still answering
        now[0] = 31.0
        assert not cache.synced
    finally:
        cache.stop()
