"""The reconciler against a real nats-server and the simulated Kubernetes API: a deleted node settles its
handover, its reservation and its open incident; two replicas reconciling at once settle each thing once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from handlers.base import History, Incident
from remediator.natsd import EmbeddedNats
from remediator.reconciler import Reconciler
from remediator.safety import LedgerStore, reservation_key
from remediator.state import StateStore
from remediator.subjects import LEDGER_KEY, STATE_BUCKET, node_key

from .executor_support import T0, Rig, decision, rig

pytestmark = pytest.mark.timeout(90)


async def test_a_deleted_node_settles_its_handover_reservation_and_incident_once_across_two_replicas(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        kv = await r.js.key_value(STATE_BUCKET)
        store = LedgerStore(kv)
        escalated = await r.executor.execute(decision("gpu-node-1", "gpu-lost", incident="inc-esc"))
        assert escalated.outcome == "escalated"
        stuck = decision("gpu-node-1", "gpu-lost", gpu=4, incident="inc-stuck")
        await store.docs.update(LEDGER_KEY, lambda led: (led.reserved(stuck, "default", "gpu", T0), None))
        await StateStore(kv).update(node_key("gpu-node-1"), lambda h: (History(h.sightings, (
            Incident("inc-open", "gpu:gpu-node-1/GPU-7", "gpu-reset", T0, T0),)), None))
        run, _ = await r.executor._rails[2].get("inc-stuck") if r.executor._rails else (None, 0)
        assert run is None

        a = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        b = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        r.sim.delete("nodes", "gpu-node-1")
        got = await asyncio.gather(a.reconcile(incidents=True), b.reconcile(incidents=True))
        settled = sorted((s.subject, s.incident) for s in (*got[0], *got[1]))
        led = await store.read()
        assert led.handovers == {} and led.reservations == {}
        trail = [x for x in await r.audit_records("gpu-node-1") if x.what == "settled"]
        whats = sorted((x.after["subject"], x.incident) for x in trail)
        assert whats == [("handover", "inc-esc"), ("incident", "inc-open"), ("reservation", "inc-stuck")]
        assert settled == whats  # each settled by exactly one of the two replicas
        history, _ = await StateStore(kv).get(node_key("gpu-node-1"))
        assert history.incidents == ()
        assert reservation_key(stuck) not in led.reservations


async def _until(cond: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 20
    while not await cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _running(r: Rig, watch_timeout_s: float) -> AsyncIterator[tuple[Reconciler, LedgerStore]]:
    """A reconciler on the rig's node cache, running until the block ends; with the ledger it settles."""
    kv = await r.js.key_value(STATE_BUCKET)
    rec = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key,  # type: ignore[arg-type]
                     resync_s=600.0, watch_timeout_s=watch_timeout_s)
    stop = asyncio.Event()
    task = asyncio.create_task(rec.run(stop))
    try:
        yield rec, LedgerStore(kv)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_with_the_node_cache_only_the_nodes_the_ledger_names_wake_it_and_it_sends_no_watch(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A large cluster changes its nodes all the time (status updates: hundreds a second at 100,000 nodes). The
    reconciler must not wake, read the ledger and open a watch request (one limiter token each) for every
    one of them: with the node cache it waits on memory for the nodes its ledger names."""
    async with rig(nats_server.url, tmp_path, nodes=6) as r:
        kube = r.executor.kube
        assert await kube.start(wait_s=10)
        assert (await r.executor.execute(decision("gpu-node-1", "gpu-lost", incident="inc-esc"))).outcome == \
            "escalated"
        async with _running(r, watch_timeout_s=600.0) as (rec, store):
            async def watching() -> bool:
                return rec.passes >= 1 and rec.watched == {"gpu-node-1"}
            await _until(watching, "the first pass")
            passes, watches = rec.passes, r.sim.count("watch", "nodes")
            cache = r.kube.node_cache
            assert cache is not None
            before = cache.generation
            for i in range(60):  # someone else's changes to the other nodes
                r.sim.patch("nodes", f"gpu-node-{2 + i % 4}", {"metadata": {"labels": {"heartbeat": str(i)}}})

            async def seen() -> bool:
                return cache.generation >= before + 60
            await _until(seen, "the cache saw the changes")
            await asyncio.sleep(0.3)
            assert rec.passes == passes
            assert r.sim.count("watch", "nodes") <= watches + 1  # the cache's own watch, re-opened at most once

            r.kube.untaint("gpu-node-1", r.settings.taint_key)  # a person repairs the node
            r.kube.uncordon("gpu-node-1")

            async def settled() -> bool:
                return not (await store.read()).handovers
            await _until(settled, "the repair settled the handover")
            assert passes < rec.passes <= passes + 3
        trail = [x for x in await r.audit_records("gpu-node-1") if x.what == "settled"]
        assert [x.incident for x in trail] == ["inc-esc"]


async def test_a_handover_recorded_after_a_pass_is_settled_by_the_next_pass_within_the_wait(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The wait watches the nodes the ledger named at the last pass; a handover recorded after it (its node
    not watched yet) is read by the next pass, which comes at the latest ``watch_timeout_s`` later."""
    async with rig(nats_server.url, tmp_path, nodes=6) as r:
        kube = r.executor.kube
        assert await kube.start(wait_s=10)
        async with _running(r, watch_timeout_s=1.0) as (rec, store):
            async def first_pass() -> bool:
                return rec.passes >= 1
            await _until(first_pass, "the first pass")
            assert rec.watched == frozenset()
            assert (await r.executor.execute(decision("gpu-node-1", "gpu-lost", incident="inc-late"))).outcome == \
                "escalated"
            r.kube.untaint("gpu-node-1", r.settings.taint_key)  # repaired before any pass watched the node
            r.kube.uncordon("gpu-node-1")

            async def settled() -> bool:
                return not (await store.read()).handovers
            await _until(settled, "the next pass settled the handover")


async def test_with_the_node_cache_the_orphan_check_lists_no_nodes(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """It reads the names the cache holds: no list request, and no summary of every GPU node either."""
    async with rig(nats_server.url, tmp_path, nodes=4) as r:
        kube = r.executor.kube
        assert await kube.start(wait_s=10)
        summarised: list[object] = []
        every_gpu_node = r.kube.list_gpu_nodes
        r.kube.list_gpu_nodes = lambda pool=None: summarised.append(pool) or every_gpu_node(pool)  # type: ignore[method-assign]
        kv = await r.js.key_value(STATE_BUCKET)
        await StateStore(kv).update(node_key("gpu-node-9"), lambda h: (History(h.sightings, (
            Incident("inc-gone", "gpu:gpu-node-9/GPU-1", "gpu-reset", T0, T0),)), None))
        rec = Reconciler(kv, kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        lists = r.sim.count("list", "nodes")
        settled = await rec.reconcile(incidents=True)
        assert [(s.subject, s.incident) for s in settled] == [("incident", "inc-gone")]
        assert r.sim.count("list", "nodes") == lists and summarised == []
