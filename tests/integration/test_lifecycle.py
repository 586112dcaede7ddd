"""The lifecycle of a run against the cluster (real nats-server, the simulated Kubernetes API through the real
client): every end releases the budget reservation and settles the incident; a target left out of service is
handed over and settled by the reconciler once a person repairs it; a dead-lettered decision escalates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from handlers.base import History, Incident
from remediator.contracts import AgentCommand
from remediator.natsd import EmbeddedNats
from remediator.reconciler import Reconciler
from remediator.safety import LedgerStore
from remediator.state import StateStore
from remediator.subjects import STATE_BUCKET, node_key, remediation_subject

from .executor_support import Rig, SimAgents, decision, rig

pytestmark = pytest.mark.timeout(120)


def budget_verdict(r: Rig, incident: str) -> tuple[bool, str]:
    """The budget guard's verdict of ``incident``, from the run's record."""
    for rec in r.executor.results:
        if rec.incident == incident:
            v = next(v for v in rec.verdicts if v.name == "budget")
            return v.allowed, v.reason
    raise AssertionError(f"{incident} did not run")


async def wait_for(cond: object, within: float = 10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if await cond():  # type: ignore[operator]
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_after_an_escalation_and_a_persons_repair_the_next_xid79_in_the_pool_is_not_refused(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path, nodes=4) as r:
        kv = await r.js.key_value(STATE_BUCKET)
        ledger = LedgerStore(kv)
        first = decision("gpu-node-0", "gpu-lost", gpu=3, incident="inc-lost-0")
        result = await r.executor.execute(first)
        assert result.outcome == "escalated"  # "power-cycle the node": handed to a person
        led = await ledger.read()
        assert led.reservations == {}  # released at the end of the run
        assert [h["incident"] for h in led.handovers.values()] == ["inc-lost-0"]
        finished = next(x for x in await r.audit_records("gpu-node-0")
                        if x.what == "playbook_finished" and x.incident == "inc-lost-0")
        assert finished.after["left"]["ours"] == ["taint", "cordon"] and finished.after["incident"] == "handed-over"

        # While the node is out, a 4-node pool has no room for a second node.
        await r.executor.execute(decision("gpu-node-1", "gpu-lost", gpu=0, incident="inc-lost-1"))
        allowed, why = budget_verdict(r, "inc-lost-1")
        assert not allowed and "1 of 4 GPU nodes out" in why

        stop = asyncio.Event()
        rec = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key,  # type: ignore[arg-type]
                         resync_s=60.0, watch_timeout_s=5.0)
        task = asyncio.create_task(rec.run(stop))
        try:
            await asyncio.sleep(0.5)  # the reconciler is watching
            # A person power-cycles the node, removes our taint and uncordons it (as kubectl would).
            r.kube.untaint("gpu-node-0", r.settings.taint_key)
            r.kube.uncordon("gpu-node-0")

            async def settled() -> bool:
                return not (await ledger.read()).handovers

            took = await wait_for(settled, within=10.0)
            assert took < 5.0, f"settled after {took:.1f}s"
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
        trail = [x for x in await r.audit_records("gpu-node-0") if x.what == "settled"]
        assert len(trail) == 1 and trail[0].incident == "inc-lost-0" and trail[0].after["by"] == "reconciler"
        assert "repaired" in trail[0].why

        await r.executor.execute(decision("gpu-node-2", "gpu-lost", gpu=5, incident="inc-lost-2"))
        allowed, why = budget_verdict(r, "inc-lost-2")
        assert allowed, why


class AgentOutage(SimAgents):
    """The node agents answer the isolation and the eviction's holder query, then go away (an agent outage in
    the middle of a playbook: nobody serves ``agent.*.cmd``, so each call fails at once with no responders)."""

    async def start(self) -> None:
        self.sub = await self.nc.subscribe("agent.*.cmd", cb=self._on)

    async def _on(self, msg: Msg) -> None:
        cmd = AgentCommand.model_validate_json(msg.data)
        await super()._on(msg)
        if cmd.verb == "status":
            await self.sub.unsubscribe()


async def test_a_dead_lettered_gpu_playbook_escalates_releases_its_reservation_and_hands_the_gpu_over(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    async with rig(nats_server.url, tmp_path, nodes=4, max_deliver=3, nak_delay_s=0.2) as r:
        outage = AgentOutage(r.nc, r.sim, r.agents.trust, keys=r.agents.keys, verifiers=r.agents.verifiers)
        for sub in list(r.nc._subs.values()):  # the rig's healthy responder goes; the outage one answers
            if sub.subject == "agent.*.cmd":
                await sub.unsubscribe()
        await outage.start()
        kv = await r.js.key_value(STATE_BUCKET)
        d = decision("gpu-node-1", "gpu-memory-fatal", gpu=2, incident="inc-dbe",
                     group="gpu:gpu-node-1/GPU-gpu-node-1-2")
        states = StateStore(kv)
        # the incident dispatch opened for it
        await states.update(node_key("gpu-node-1"), lambda h: (History(h.sightings, (
            Incident("inc-dbe", d.group, d.playbook, d.decided_at, d.decided_at),)), None))
        await r.js.publish(remediation_subject(d.node), d.model_dump_json().encode(),
                           headers={"Nats-Msg-Id": f"decision|{d.incident_id}"})
        stop = asyncio.Event()
        task = asyncio.create_task(r.executor.run(stop))
        try:
            async def finished() -> bool:
                run, _ = await r.executor._rails[2].get("inc-dbe") if r.executor._rails else (None, 0)
                return run is not None and run.finished

            await wait_for(finished, within=30.0)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
        whats = await r.whats("gpu-node-1", "inc-dbe")
        assert "dead_letter" in whats and "escalated" in whats and whats[-1] == "playbook_finished"
        led = await LedgerStore(kv).read()
        assert led.reservations == {}
        hand = list(led.handovers.values())
        assert [(h["incident"], h["kind"], h["outcome"]) for h in hand] == [("inc-dbe", "gpu", "dead-lettered")]
        history, _ = await states.get(node_key("gpu-node-1"))
        assert history.open_incident(d.group) is None  # a later fault on that GPU opens a new incident
        # escalated like any other failure: the node annotation and Event (and the webhook of playbooks that ask)
        assert "gpu-remediator.io/escalated" in r.kube.get_node("gpu-node-1")["annotations"]
        assert hand[0]["left"] == ["isolate_gpu"] and r.sim.unhealthy_gpus("gpu-node-1")  # stated: GPU isolated
        trail = [x for x in await r.audit_records("gpu-node-1") if x.incident == "inc-dbe"]
        dead = [x for x in trail if x.what == "dead_letter"]
        assert dead and dead[0].incident == "inc-dbe"

        # A person resets the GPU and puts it back (allocatable again): the reconciler settles the handover.
        rec = Reconciler(kv, r.executor.kube, r.audit, taint_key=r.settings.taint_key)  # type: ignore[arg-type]
        assert await rec.reconcile() == []  # still isolated: nothing to settle
        r.sim.set_gpu_health("gpu-node-1", 2, True)
        settled = await rec.reconcile()
        assert [(x.subject, x.incident) for x in settled] == [("handover", "inc-dbe")]
        assert "every GPU allocatable" in settled[0].reason and not (await LedgerStore(kv).read()).handovers
