"""The adapter's node cache against the simulated API server (real HTTP, the official client, a real watch).

Reads come from memory once the first list is in; a change made by someone else arrives by the watch; our own
write is seen at once; a cache that is behind never makes a write lose someone else's change (the PATCH
keeps its resourceVersion precondition and a conflict re-reads from the API server).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.sim import ClusterState, KubeApiServer, seed_cluster
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.adapters.nodecache import NodeCache

TAINT_KEY = "gpu-remediator/quarantine"

pytestmark = pytest.mark.timeout(60)


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture
def cluster() -> ClusterState:
    return seed_cluster(nodes=6)


@pytest.fixture
def kube(cluster: ClusterState, tmp_path: Path) -> Iterator[KubeAdapter]:
    with KubeApiServer(cluster) as srv:
        adapter = KubeAdapter(str(srv.write_kubeconfig(tmp_path / "kubeconfig")), taint_key=TAINT_KEY,
                              retry_budget_s=10.0, page_size=4)
        yield adapter
        adapter.close()


def test_reads_come_from_memory_after_one_list(kube: KubeAdapter, cluster: ClusterState) -> None:
    cache = kube.start_node_cache(watch_timeout_s=5)
    assert cache.wait_synced(10)
    assert cluster.count("list", "nodes") == 2  # one list, two pages of 4
    gets = cluster.count("get", "nodes")
    for _ in range(20):
        assert kube.get_node("gpu-node-3")["name"] == "gpu-node-3"
    assert len(kube.list_gpu_nodes("pool-a")) == 6
    assert kube.find_node("gpu-node-9") is None  # not held: confirmed with the API server (404)
    assert cluster.count("get", "nodes") == gets + 1
    assert cluster.count("list", "nodes") == 2


def test_a_change_by_someone_else_arrives_by_the_watch(kube: KubeAdapter, cluster: ClusterState) -> None:
    assert kube.start_node_cache(watch_timeout_s=5).wait_synced(10)
    cluster.patch("nodes", "gpu-node-2", {"spec": {"unschedulable": True}})
    _until(lambda: kube.get_node("gpu-node-2")["unschedulable"], "the watch never brought the cordon")
    cluster.patch("nodes", "gpu-node-2", {"metadata": {"labels": {"gpu-remediator.io/pool": "pool-z"}}})
    _until(lambda: [n["name"] for n in kube.list_gpu_nodes("pool-z")] == ["gpu-node-2"],
           "the watch never brought the label")


def test_our_own_write_is_read_back_at_once(kube: KubeAdapter, cluster: ClusterState) -> None:
    assert kube.start_node_cache(watch_timeout_s=5).wait_synced(10)
    gets = cluster.count("get", "nodes")
    kube.quarantine("gpu-node-1", TAINT_KEY, "gpu-lost")
    node = kube.get_node("gpu-node-1")  # no watch event needed: the PATCH's answer is in the cache
    assert node["unschedulable"] and [t["key"] for t in node["taints"]] == [TAINT_KEY]
    assert cluster.count("get", "nodes") == gets  # the quarantine read the cache, too
    assert cluster.count("patch", "nodes") == 1


def test_a_stale_cache_makes_the_write_conflict_and_reread_never_overwrite(kube: KubeAdapter,
                                                                           cluster: ClusterState) -> None:
    # A cache that listed once and then hears nothing (its watch hangs): always behind.
    hold = threading.Event()

    def silent(_rv: str, _timeout: float) -> Iterator[dict[str, Any]]:
        hold.wait(5)
        return iter(())

    stale = NodeCache(kube._node_snapshot, silent).start()
    kube.node_cache = stale
    try:
        assert stale.wait_synced(10)
        cluster.patch("nodes", "gpu-node-0", {"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}})
        change = kube.taint("gpu-node-0", TAINT_KEY, "gpu-lost")
        assert change.changed
        assert cluster.count("patch", "nodes") == 2  # the first lost on resourceVersion, the second won
        assert [t["key"] for t in cluster.node("gpu-node-0")["spec"]["taints"]] == ["other", TAINT_KEY]
    finally:
        hold.set()
        stale.stop()
        kube.node_cache = None


async def test_the_async_port_reads_a_cached_node_on_the_loop_without_a_thread(kube: KubeAdapter,
                                                                                cluster: ClusterState) -> None:
    from remediator.adapters.kube import AsyncKube

    port = AsyncKube(kube, max_workers=1)
    assert await port.start(wait_s=10)
    used: list[str] = []
    real = port._call

    async def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        used.append(getattr(fn, "__name__", "?"))
        return await real(fn, *args, **kwargs)

    port._call = counted  # type: ignore[method-assign]
    assert kube.cached_node("gpu-node-2") == kube.get_node("gpu-node-2")  # the same summary as the adapter's
    assert (await port.get_node("gpu-node-2"))["name"] == "gpu-node-2"
    assert (await port.find_node("gpu-node-4")) is not None
    assert used == []  # both answered from memory on the loop
    assert await port.find_node("gpu-node-99") is None  # not held: the API server says, through the pool
    assert used == ["find_node"]
    kube.node_cache.stop()  # type: ignore[union-attr]
    assert kube.cached_node("gpu-node-2") is None  # not synced: only the API server may answer
    port._pool.shutdown(wait=False)


def test_the_pool_view_comes_from_the_watch_without_a_list_per_decision(kube: KubeAdapter,
                                                                         cluster: ClusterState) -> None:
    assert kube.cached_pool_view("pool-a") is None  # no cache yet: the view is a list of the pool's nodes
    listed = kube.pool_view("pool-a")
    assert (listed.nodes, listed.notable) == (6, ())
    assert kube.start_node_cache(watch_timeout_s=5).wait_synced(10)
    lists = cluster.count("list", "nodes")
    cluster.patch("nodes", "gpu-node-2", {"spec": {"unschedulable": True}})  # someone else's cordon
    _until(lambda: [n["name"] for n in kube.pool_view("pool-a").notable] == ["gpu-node-2"],
           "the watch never brought the cordon to the pool view")
    kube.quarantine("gpu-node-4", TAINT_KEY, "gpu-lost")  # ours: in the view at once, from the PATCH's answer
    view = kube.pool_view("pool-a")
    assert sorted(n["name"] for n in view.notable) == ["gpu-node-2", "gpu-node-4"]
    assert (view.nodes, view.gpus) == (6, sum(kube.get_node(f"gpu-node-{i}")["gpus"] for i in range(6)))
    cluster.patch("nodes", "gpu-node-2", {"metadata": {"labels": {"gpu-remediator.io/pool": "pool-z"}}})
    _until(lambda: kube.pool_view("pool-a").nodes == 5 and kube.pool_view("pool-z").nodes == 1,
           "the watch never moved the node to its new pool")
    assert [n["name"] for n in kube.pool_view("pool-a").notable] == ["gpu-node-4"]
    assert cluster.count("list", "nodes") == lists  # every view above came from memory


def test_without_a_synced_cache_one_list_of_the_pool_serves_every_run_that_asks(kube: KubeAdapter,
                                                                                cluster: ClusterState) -> None:
    port = AsyncKube(kube, max_workers=4)

    async def ask() -> list[int]:
        views = await asyncio.gather(*(port.pool_view("pool-a") for _ in range(8)))
        again = await port.pool_view("pool-a")  # within POOL_LIST_TTL_S: the same list
        return [v.nodes for v in (*views, again)]

    lists = cluster.count("list", "nodes")
    assert asyncio.run(ask()) == [6] * 9
    assert cluster.count("list", "nodes") == lists + 2  # one list of the nodes, in two pages of 4
