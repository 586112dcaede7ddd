"""The node cache's list-then-watch loop over a scripted API: resourceVersions, 410 Gone, resync, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from remediator.adapters.nodecache import CHANGE_LOG, NodeCache, newer

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

    def lister(self, transform: Callable[[Mapping[str, Any]], dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.fail_lists:
            self.fail_lists -= 1
            raise OSError("connection refused")
        return [transform(n) for n in self.nodes.values()], str(self.rv)

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


def _real_node(name: str, rv: int) -> dict[str, Any]:
    """A GPU node as a kubelet reports it: 50 images and managedFields make up most of its JSON."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv),
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"nvidia.com/gpu.count": "8", "gpu-remediator.io/pool": "a"},
                     "annotations": {"gpu-remediator.io/withdrawn-gpus": '["GPU-1"]'},
                     "managedFields": [{"manager": "kubelet", "operation": "Update",
                                        "fieldsV1": {f"f:{i}": {} for i in range(200)}}]},
        "spec": {"providerID": "aws:///i-1", "podCIDR": "10.0.0.0/24", "unschedulable": True,
                 "taints": [{"key": "gpu-remediator.io/quarantine", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "7"},
                   "conditions": [{"type": t, "status": v, "reason": "KubeletReady", "message": "kubelet is posting",
                                   "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                                   "lastTransitionTime": "2026-11-01T00:00:00Z"}
                                  for t, v in (("Ready", "True"), ("MemoryPressure", "False"),
                                               ("DiskPressure", "False"), ("PIDPressure", "False"))],
                   "nodeInfo": {"bootID": "b-1", "kubeletVersion": "v1.33.1"},
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                   "images": [{"names": [f"nvcr.io/nvidia/image-{i}@sha256:{'0' * 64}"], "sizeBytes": 10**9}
                              for i in range(50)],
                   "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"]},
    }


def test_the_adapter_caches_only_what_it_reads_of_a_node_and_reads_the_same() -> None:
    import json

    from remediator.adapters.kube import KubeAdapter, slim_node

    full = _real_node("gpu-1", 3)
    api = ScriptedApi()
    api.nodes = {"gpu-1": full}
    cache = NodeCache(api.lister, api.watcher, transform=slim_node).start()
    try:
        assert cache.wait_synced(5)
        held = cache.get("gpu-1") or {}
        assert "managedFields" not in held["metadata"] and "images" not in held["status"]
        assert len(json.dumps(held)) * 4 < len(json.dumps(full))  # a quarter of the object, or less
        assert KubeAdapter._node_summary(held) == KubeAdapter._node_summary(full)  # every field read is kept
        assert KubeAdapter._is_gpu_node(held) and KubeAdapter._withdrawn(held) == ["GPU-1"]
        cache.observe(_real_node("gpu-1", 4))  # what a write of ours returned: slimmed too
        assert "images" not in (cache.get("gpu-1") or {})["status"]
    finally:
        cache.stop()


def _waiting(cache: NodeCache, after: int, names: set[str] | None) -> tuple[threading.Thread, list[int]]:
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(cache.wait_changed(after, names, 20.0)), daemon=True)
    t.start()
    return t, got


def test_a_wait_for_some_nodes_wakes_for_a_change_to_them_and_not_for_others() -> None:
    api = ScriptedApi()
    cache = NodeCache(api.lister, api.watcher).start()
    try:
        assert cache.wait_synced(5)
        t, got = _waiting(cache, cache.generation, {"a"})
        for rv in range(10, 60):
            cache.observe(node("b", rv))  # someone else's node, fifty times
        t.join(0.3)
        assert t.is_alive() and not got  # still waiting
        cache.observe(node("a", 100, unschedulable=True))
        t.join(5)
        assert got == [cache.generation]
        stale = cache.generation
        cache.observe(node("a", 99))  # older than what is held: not a change
        assert cache.generation == stale
    finally:
        cache.stop()


def test_a_change_made_before_the_wait_starts_is_not_missed() -> None:
    api = ScriptedApi()
    cache = NodeCache(api.lister, api.watcher).start()
    try:
        assert cache.wait_synced(5)
        token = cache.generation  # taken before the reader looked at "a"
        cache.observe(node("a", 10))
        started = time.monotonic()
        assert cache.wait_changed(token, {"a"}, 20.0) == cache.generation
        assert time.monotonic() - started < 10  # answered at once, not at the timeout
        assert cache.wait_changed(cache.generation, {"a"}, 0.1) == cache.generation  # nothing since: times out
    finally:
        cache.stop()


def test_a_wait_older_than_the_change_log_or_a_list_wakes_as_if_every_node_changed() -> None:
    api = ScriptedApi()
    cache = NodeCache(api.lister, api.watcher, resync_s=3600).start()
    try:
        assert cache.wait_synced(5)
        token = cache.generation
        for rv in range(10, 10 + CHANGE_LOG + 1):
            cache.observe(node("b", rv))  # the change log no longer reaches back to the token
        started = time.monotonic()
        assert cache.wait_changed(token, {"a"}, 20.0) == cache.generation
        assert time.monotonic() - started < 10
    finally:
        cache.stop()

    api = ScriptedApi()
    cache = NodeCache(api.lister, api.watcher, resync_s=0.3).start()
    try:
        assert cache.wait_synced(5)
        t, got = _waiting(cache, cache.generation, {"a"})
        t.join(10)
        assert got and api.lists >= 2  # the resync's list woke it: a list may carry any change
    finally:
        cache.stop()


def test_stopping_the_cache_ends_a_wait() -> None:
    api = ScriptedApi()
    cache = NodeCache(api.lister, api.watcher).start()
    assert cache.wait_synced(5)
    t, got = _waiting(cache, cache.generation, {"a"})
    t.join(0.1)
    cache.stop()
    t.join(5)
    assert not t.is_alive() and got
