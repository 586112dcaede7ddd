"""The audit chain and the CAS state store against a real nats-server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import nats
import pytest
from nats.js.api import StreamConfig

from handlers.base import History, Incident
from remediator.audit import AuditLog, AuditQuery, iter_records, query, verify_chains
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats
from remediator.state import StateStore
from remediator.subjects import AUDIT_STREAM, STATE_BUCKET, audit_subject

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _js(server: EmbeddedNats):  # type: ignore[no-untyped-def]
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=AUDIT_STREAM, subjects=["audit.>"]))
    return nc, js


async def test_two_writers_never_fork_a_chain(nats_server: EmbeddedNats) -> None:
    nc, js = await _js(nats_server)
    a, b = AuditLog(js, "replica-a"), AuditLog(js, "replica-b")
    await asyncio.gather(*(w.append("gpu-node-1", "decision", f"r{i}") for i in range(20) for w in (a, b)))
    records = [r async for r in iter_records(js, "gpu-node-1")]
    assert [r.seq for r in records] == list(range(1, 41))
    assert {r.actor for r in records} == {"replica-a", "replica-b"}
    [report] = verify_chains(records)
    assert report.ok and report.records == 40
    await nc.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct-gets", "declared-without-direct-gets"])
async def test_a_writer_whose_head_went_stale_relinks_after_the_other_writers_record(
        nats_server: EmbeddedNats, direct: bool) -> None:
    """Two replicas take turns on one node's chain: each append after the other's is refused once and re-linked
    (``AuditLog.relinked``, ``bench dispatch``'s ``audit_records``), its head read by direct get where AUDIT
    allows them (``bus init`` declares it so) and from the leader where it does not."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=AUDIT_STREAM, subjects=["audit.>"], allow_direct=direct))
    a, b = AuditLog(js, "replica-a"), AuditLog(js, "replica-b")
    for i in range(3):
        await a.append("gpu-node-1", "event_accepted", f"a{i}")
        await b.append("gpu-node-1", "event_accepted", f"b{i}")
    assert (a.appended, b.appended) == (3, 3)
    assert (a.relinked, b.relinked) == (2, 2)  # b's first head was read, not stale; a's first append had none
    assert (a._direct, b._direct) == (direct, direct)
    records = [r async for r in iter_records(js, "gpu-node-1")]
    assert [r.why for r in records] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    [report] = verify_chains(records)
    assert report.ok and report.records == 6
    await nc.close()


async def test_tampering_is_detected(nats_server: EmbeddedNats) -> None:
    nc, js = await _js(nats_server)
    log = AuditLog(js, "r")
    for i in range(3):
        await log.append("gpu-node-2", "step_succeeded", f"step {i}", incident="inc-1")
    await log.append(None, "breaker_trip", "burst")
    records = [r async for r in iter_records(js)]
    assert verify_chains(records)[0].ok
    forged = records[1].model_dump(mode="json") | {"why": "nothing happened"}
    tampered = [records[0], AuditRecord.model_validate(forged), *records[2:]]
    report = {r.chain: r for r in verify_chains(tampered)}
    assert not report["gpu-node-2"].ok and "hash" in report["gpu-node-2"].problem
    assert report["_cluster"].ok
    # dropping a record breaks the link
    report = {r.chain: r for r in verify_chains([records[0], records[2]])}
    assert "prev_hash" in report["gpu-node-2"].problem
    assert [r.why for r in await query(js, AuditQuery(incident="inc-1"))] == ["step 0", "step 1", "step 2"]
    raw = await js.get_last_msg(AUDIT_STREAM, audit_subject(None))
    assert json.loads(raw.data)["what"] == "breaker_trip"
    await nc.close()


async def test_state_cas_loses_no_update(nats_server: EmbeddedNats) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=STATE_BUCKET)
    stores = [StateStore(kv), StateStore(kv)]

    def add(i: int):  # type: ignore[no-untyped-def]
        def fn(h: History) -> tuple[History, int]:
            inc = Incident(f"inc-{i}", f"g{i}", "gpu-lost", T0, T0)
            return h.with_incident(inc), len(h.incidents)
        return fn

    await asyncio.gather(*(stores[i % 2].update("node.n1", add(i)) for i in range(16)))
    history, revision = await stores[0].get("node.n1")
    assert {i.group for i in history.incidents} == {f"g{i}" for i in range(16)}
    # two stores (as two replicas) racing by revision, each combining its own overlapping updates: every
    # update kept, in fewer writes than updates (the bucket is new, so the revision counts the writes)
    assert 2 <= revision < 16
    await stores[1].close_incident("node.n1", "g3")
    history, _ = await stores[0].get("node.n1")
    assert history.open_incident("g3") is None and history.open_incident("g4") is not None
    await nc.close()


@pytest.mark.parametrize("n", [1])
async def test_empty_stream_iterates_nothing(nats_server: EmbeddedNats, n: int) -> None:
    nc, js = await _js(nats_server)
    assert [r async for r in iter_records(js)] == []
    await nc.close()
