"""Service metrics fed by the records the real producers write: the dispatcher deciding on real events and
the executor running the decisions against the simulated cluster, with the budget guard blocking the second
node. Counting only what the typed record shapes say, the guard that blocked is named (issue 8: it was
always ``guard="None"``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from handlers.registry import default_registry
from remediator.audit import iter_records
from remediator.contracts import FaultEvent, GpuRef, Origin
from remediator.dispatch import Dispatcher
from remediator.metrics import ServiceMetrics
from remediator.natsd import EmbeddedNats

from .executor_support import rig

T0 = datetime(2026, 11, 30, 3, 12, tzinfo=UTC)


def xid79(node: str) -> FaultEvent:
    return FaultEvent(id=f"alertmanager|fp-{node}|firing|2026-11-30T03:12:00Z", source="alertmanager", node=node,
                      kind="xid", code=79, is_fatal=True, gpu=GpuRef(index=0, uuid=f"GPU-{node}-0"),
                      observed_at=T0, received_at=T0, message="Xid 79: GPU has fallen off the bus",
                      origin=Origin(fingerprint=f"fp-{node}"))


async def test_metrics_from_the_real_dispatcher_and_executor(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, nodes=4, budget_max_node_fraction=0.25) as r:
        dispatcher = await Dispatcher.create(r.nc, r.js, r.settings, r.audit, default_registry())
        results = []
        for node in ("gpu-node-0", "gpu-node-1"):
            [decision] = await dispatcher.handle(xid79(node))
            results.append(await r.executor.execute(decision))
        assert results[0].done()[:3] == ["taint", "cordon", "drain"]
        assert any(v.name == "budget" and not v.allowed for v in results[1].verdicts)
        metrics = ServiceMetrics()
        async for record in iter_records(r.js):
            metrics.observe(record)
    text = metrics.render().decode()
    assert 'remediator_guard_blocks_total{guard="budget"} 1' in text
    assert 'guard="None"' not in text
    assert 'remediator_decisions_total{playbook="gpu-lost"} 2' in text  # the dispatcher's, not the receipts
    for step in ("taint", "cordon", "drain", "escalate"):
        assert f'remediator_steps_total{{step="{step}",result="succeeded"}}' in text, text
    assert 'step="unknown"' not in text
    assert 'remediator_playbook_runs_total{playbook="gpu-lost",outcome="escalated"} 2' in text
    assert "remediator_runs_in_progress 0" in text
    assert "remediator_decision_to_first_action_seconds_count 2" in text
