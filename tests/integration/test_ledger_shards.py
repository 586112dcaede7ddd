"""The safety ledger at fleet scale against a real nats-server: handovers live in their shards, so thousands
of targets left out of service fit (in one document they passed NATS's 1 MB message limit at about 4,000,
and every run's end then failed); handovers written inline by older code are still read, counted and
settled; and the gate counts a sharded handover when it decides."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from nats.js.kv import KeyValue

from remediator.kv import DocumentTooLarge, json_documents
from remediator.run import handover_of
from remediator.safety import LedgerStore, reservation_key
from remediator.safety.ledger import Ledger
from remediator.subjects import HANDOVER_SHARD_KEYS, LEDGER_KEY, handover_shard_key

from .executor_support import T0, decision

pytestmark = pytest.mark.timeout(180)

LEFT = {"out_of_service": True, "ours": ["taint", "cordon"], "pool": "default"}


async def test_five_thousand_handovers_fit_and_the_ledger_document_stays_small(kv: KeyValue) -> None:
    store = LedgerStore(kv)
    runs = [decision(f"gpu-node-{i:05d}", "gpu-lost", gpu=0, incident=f"inc-{i:05d}") for i in range(5000)]
    for start in range(0, len(runs), 500):  # as a storm's runs end: many at once
        await asyncio.gather(*(store.finish(d, handover_of(d, "escalated", LEFT, T0)) for d in runs[start:start + 500]))
    led = await store.read()
    assert len(led.handovers) == 5000
    # each decision's guards read the ledger: with no shard changed since, the view of the last read is reused
    # (16 fetches, nothing decoded; ARCHITECTURE "How far one bus goes"), and nobody can change it in place
    assert (await store.read()).handovers is led.handovers
    with pytest.raises(TypeError):
        led.handovers["gpu-node-x|0"] = {}  # type: ignore[index]
    assert led.handovers[reservation_key(runs[1234])]["incident"] == "inc-01234"
    as_one_document = len(json.dumps({k: dict(v) for k, v in led.handovers.items()}))
    assert as_one_document > 1024 * 1024  # would not have fitted in one NATS message
    # the document holds the breaker and the reservations only (here: never written, nothing reserved)
    assert len(json.dumps((await json_documents(kv).get(LEDGER_KEY)).value or {})) < 1000
    sizes = [len((await kv.get(k)).value or b"") for k in HANDOVER_SHARD_KEYS]
    assert max(sizes) < 1.5 * sum(sizes) / len(sizes)  # spread evenly over the shards

    # A run's end that left nothing out removes its own handover and nobody else's.
    await store.finish(runs[7], None)
    await store.finish(runs[8].model_copy(update={"incident_id": "inc-someone-else"}), None)
    after = (await store.read()).handovers
    assert reservation_key(runs[7]) not in after and reservation_key(runs[8]) in after and len(after) == 4999


async def test_handovers_written_inline_by_older_code_are_read_counted_and_settled(kv: KeyValue) -> None:
    store = LedgerStore(kv)
    old = decision("gpu-node-1", "gpu-lost", gpu=0, incident="inc-old")
    legacy = {"breaker": {"open": False}, "reservations": {},
              "handovers": {reservation_key(old): handover_of(old, "escalated", LEFT, T0)}}
    await json_documents(kv).put(LEDGER_KEY, legacy, 0)
    new = decision("gpu-node-2", "gpu-lost", gpu=0, incident="inc-new")
    await store.finish(new, handover_of(new, "escalated", LEFT, T0))
    led = await store.read()
    assert {h["incident"] for h in led.handovers.values()} == {"inc-old", "inc-new"}
    # a gate decision rewrites the document and keeps the inline handover in it
    await store.update(lambda whole: (replace(whole, reservations={"x|": {"incident": "inc-x"}}), None))
    assert "inc-old" in json.dumps(json.loads((await kv.get(LEDGER_KEY)).value or b"")["handovers"])
    assert (await store.settle_handover(reservation_key(old), "inc-old")) is not None
    assert (await store.settle_handover(reservation_key(old), "inc-old")) is None  # already gone
    led = await store.read()
    assert set(led.handovers) == {reservation_key(new)} and led.inline == {}


async def test_the_gate_reads_the_sharded_handovers_inside_its_compare_and_set(kv: KeyValue) -> None:
    store = LedgerStore(kv)
    gone = decision("gpu-node-3", "gpu-lost", gpu=0, incident="inc-gone")
    await store.finish(gone, handover_of(gone, "escalated", LEFT, T0))
    seen: list[Ledger] = []

    def look(whole: Ledger) -> tuple[Ledger, None]:
        seen.append(whole)
        return whole, None

    await store.update(look)
    assert [h["incident"] for h in seen[-1].handovers.values()] == ["inc-gone"]
    assert handover_shard_key(reservation_key(gone)) in HANDOVER_SHARD_KEYS


async def test_a_document_over_the_message_limit_is_refused_with_the_fix_named(kv: KeyValue) -> None:
    docs = json_documents(kv)
    with pytest.raises(DocumentTooLarge, match="max_payload"):
        await docs.put("doc.huge", {"x": "y" * (1024 * 1024 + 10)}, 0)


async def test_the_budget_counts_a_sharded_handover_the_cluster_no_longer_shows(kv: KeyValue) -> None:
    from remediator.safety import Facts, Gate, SafetyPolicy

    gate = Gate(kv)
    gone = decision("n0", "gpu-lost", gpu=0, incident="inc-gone")
    await gate.ledger.finish(gone, {**handover_of(gone, "escalated", LEFT, T0), "pool": "p"})
    pool = [{"name": f"n{i}", "gpus": 8, "gpus_allocatable": 8, "unschedulable": False, "taints": []}
            for i in range(4)]  # the cluster view shows n0 back in service already (seconds old, say)
    only_budget = SafetyPolicy(enabled=frozenset({"budget"}), budget_max_node_fraction=0.25)

    def facts(target: str) -> Facts:
        return Facts(node={"name": target, "pool": "p", "gpus": 8, "labels": {}}, quarantine="node",
                     playbook_dry_run=False, me="me", lock_holder="me", taint_key="t", pool_nodes=pool)

    result = await gate.evaluate(decision("n1", "gpu-lost", gpu=0, incident="inc-next"), only_budget, facts("n1"), T0)
    budget = next(v for v in result.verdicts if v.name == "budget")
    assert not budget.allowed and "1 of 4" in budget.reason, budget.reason  # the handover still counts
    await gate.ledger.settle_handover(reservation_key(gone), "inc-gone")
    result = await gate.evaluate(decision("n2", "gpu-lost", gpu=0, incident="inc-after"), only_budget, facts("n2"), T0)
    assert next(v for v in result.verdicts if v.name == "budget").allowed


async def test_a_handover_another_replica_wrote_is_in_the_next_read(kv: KeyValue) -> None:
    """The view a replica reuses is keyed by the shards' revisions: another replica's write is read, decoded
    and counted; a removal too."""
    mine, theirs = LedgerStore(kv), LedgerStore(kv)
    runs = [decision(f"gpu-node-{i}", "gpu-lost", gpu=0, incident=f"inc-{i}") for i in range(3)]
    await mine.finish(runs[0], handover_of(runs[0], "escalated", LEFT, T0))
    assert set((await mine.read()).handovers) == {reservation_key(runs[0])}
    await theirs.finish(runs[1], handover_of(runs[1], "escalated", LEFT, T0))
    await theirs.finish(runs[2], handover_of(runs[2], "escalated", LEFT, T0))
    assert set((await mine.read()).handovers) == {reservation_key(r) for r in runs}
    assert await theirs.settle_handover(reservation_key(runs[0])) is not None
    assert set((await mine.read()).handovers) == {reservation_key(r) for r in runs[1:]}
