"""The executor's rails and provenance against a real nats-server and the simulated cluster: a refused node
lock is an audited ``lock`` verdict; every record of an incident carries its alert fingerprint and the trace
continued from the remediation message, with a span for the run and one per step; expected conditions
are settled without a traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from playbooks.catalog import PlaybookCatalog
from remediator import telemetry
from remediator.audit import AuditLog
from remediator.contracts import Decision, Origin
from remediator.executor import Executor
from remediator.kv import LostRace
from remediator.natsd import EmbeddedNats
from remediator.safety import LockHeld
from remediator.subjects import remediation_subject

from .executor_support import Rig, decision, rig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
FINGERPRINT = "a1b2c3d4e5f60718"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry.setup(span_exporter=exporter)
    try:
        yield exporter
    finally:
        telemetry.setup()  # back to no destinations


def second_replica(r: Rig, actor: str) -> Executor:
    return Executor(r.nc, r.js, r.settings, r.executor.kube, AuditLog(r.js, actor), PlaybookCatalog.load(),
                    r.agent_client(), actor=actor)


async def wait_for(pred: object, within_s: float = 30.0) -> None:
    for _ in range(int(within_s / 0.05)):
        if pred():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_a_refused_node_lock_is_an_audited_lock_verdict(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, lock_wait_s=0.5) as r:
        r.sim.block_pdb("training", "train-2-pdb")  # replica A's drain stalls, holding the lock of gpu-node-2
        first = decision("gpu-node-2", "gpu-lost", gpu=0, incident="inc-a")
        a = asyncio.create_task(r.executor.execute(first))
        await wait_for(lambda: r.sim.is_cordoned("gpu-node-2"))
        b = second_replica(r, "replica-b")
        second = decision("gpu-node-2", "gpu-memory-fatal", gpu=5, incident="inc-b")
        with pytest.raises(LockHeld) as refused:
            await b.execute(second)
        assert refused.value.holder.startswith("test-executor|inc-a|")
        assert refused.value.delay == b.policy().lock_retry_s  # the message waits as the guard says
        records = [x for x in await r.audit_records("gpu-node-2") if x.incident == "inc-b"]
        assert [(x.what, x.actor) for x in records] == [("guard_verdict", "replica-b")]
        v = records[0].after
        assert (v["guard"], v["allowed"], v["effect"]) == ("lock", False, "retry")
        assert v["holder"] == refused.value.holder and "locked by test-executor|inc-a|" in records[0].why
        assert records[0].event_id == second.event_id and records[0].gpu == second.gpu.key  # type: ignore[union-attr]
        assert not any(c.verb == "isolate_gpu" for c in r.agents.calls)  # B touched nothing

        r.sim.block_pdb("training", "train-2-pdb", blocked=False)
        assert (await asyncio.wait_for(a, 60)).outcome == "escalated"
        done = await b.execute(second)  # the redelivery, once A released the node
        assert done.outcome in ("completed", "escalated") and done.actions
        lock_verdicts = [x.after for x in await r.audit_records("gpu-node-2")
                         if x.incident == "inc-b" and x.what == "guard_verdict" and x.after["guard"] == "lock"]
        assert [x["allowed"] for x in lock_verdicts] == [False, True]


async def test_every_record_of_an_xid79_incident_carries_its_fingerprint_and_trace(
        nats_server: EmbeddedNats, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        base = decision("gpu-node-1", "gpu-lost", gpu=2, incident="inc-xid79")
        d = Decision.model_validate({**base.model_dump(), "origin": Origin(fingerprint=FINGERPRINT).model_dump()})
        await r.js.publish(remediation_subject(d.node), d.model_dump_json().encode(),
                           headers={"Nats-Msg-Id": f"decision|{d.incident_id}",
                                    "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"})
        stop = asyncio.Event()
        task = asyncio.create_task(r.executor.run(stop))
        await wait_for(lambda: r.executor.results, 60)
        stop.set()
        await asyncio.wait_for(task, 15)
        result = r.executor.results[0]
        assert result.done() == ["taint", "cordon", "drain", "escalate"]

        records = [x for x in await r.audit_records("gpu-node-1") if x.incident == d.incident_id]
        whats = [x.what for x in records]
        assert whats[0] == "decision" and whats[-1] == "playbook_finished"
        assert {"guard_verdict", "step_started", "step_succeeded", "escalated"} <= set(whats)
        assert [(x.what, x.fingerprint, x.trace_id) for x in records if x.fingerprint != FINGERPRINT
                or x.trace_id != TRACE_ID] == []
        assert {(x.event_id, x.gpu, x.node) for x in records} == {(d.event_id, "GPU-gpu-node-1-2", "gpu-node-1")}
        # The typed after-shapes metrics read (remediator.audit): each step record names its step.
        assert [x.after["step"] for x in records if x.what == "step_succeeded"] == [
            "taint", "cordon", "drain", "escalate"]
        assert (records[-1].after["playbook"], records[-1].after["outcome"]) == ("gpu-lost", "escalated")

        finished = {s.name: s for s in spans.get_finished_spans()}
        run = finished["executor.run"]
        assert f"{run.context.trace_id:032x}" == TRACE_ID
        assert run.parent is not None and f"{run.parent.span_id:016x}" == PARENT_SPAN
        assert run.attributes is not None and run.attributes["remediator.outcome"] == "escalated"
        for step in ("taint", "cordon", "drain", "escalate"):
            s = finished[f"step {step}"]
            assert s.parent is not None and s.parent.span_id == run.context.span_id, step
            assert s.attributes is not None and s.attributes["remediator.step.status"] == "succeeded"


class _Msg:
    """Just enough of a JetStream delivery for ``on_message`` and ``settle``."""

    def __init__(self, d: Decision) -> None:
        self.data = d.model_dump_json().encode()
        self.subject = remediation_subject(d.node)
        self.headers: dict[str, str] = {}
        self.settled: list[tuple[str, float | None]] = []

    class metadata:  # the attribute JetStream messages have
        num_delivered = 1

    async def ack(self) -> None:
        self.settled.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append(("nak", delay))

    async def term(self) -> None:
        self.settled.append(("term", None))

    async def in_progress(self) -> None:
        pass


@pytest.mark.parametrize("error", [LockHeld("gpu-node-0 is locked by r|i|n", holder="r|i|n", delay=5.0),
                                   LostRace("run.inc: changed by another writer since revision 3")],
                         ids=["lock-held", "lost-race"])
async def test_expected_conditions_nak_in_one_line_without_a_traceback(
        nats_server: EmbeddedNats, tmp_path: Path, caplog: pytest.LogCaptureFixture, error: Exception) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        async def execute(d: Decision, msg: object = None) -> None:
            raise error

        r.executor.execute = execute  # type: ignore[method-assign,assignment]
        msg = _Msg(decision("gpu-node-0", "gpu-lost", gpu=0))
        with caplog.at_level(logging.INFO):
            await r.executor.on_message(msg)  # type: ignore[arg-type]
        assert msg.settled == [("nak", 5.0 if isinstance(error, LockHeld) else r.settings.nak_delay_s)]
        assert [x for x in caplog.records if x.exc_info or "unexpected" in x.getMessage()] == []
        assert any(str(error) in x.getMessage() for x in caplog.records)


@pytest.mark.timeout(60)
async def test_a_decision_for_a_node_that_does_not_exist_is_refused_and_an_alerts_says_what_to_fix(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        agent = decision("nvidia-dcgm-exporter-x7k2p", "gpu-lost", incident="inc-agent")
        alert = decision("nvidia-dcgm-exporter-x7k2p", "gpu-lost", incident="inc-alert").model_copy(
            update={"origin": Origin(fingerprint=FINGERPRINT)})
        for d in (agent, alert):
            assert (await r.executor.execute(d)).outcome != "succeeded"
        why = {x.incident: x.why for x in await r.audit_records("nvidia-dcgm-exporter-x7k2p")
               if x.what == "guard_verdict"}
        assert why["inc-agent"] == "opt_out: node nvidia-dcgm-exporter-x7k2p does not exist"
        assert why["inc-alert"].startswith("opt_out: node nvidia-dcgm-exporter-x7k2p does not exist (")
        assert "NODE_NAME" in why["inc-alert"]
