"""Agent command refusals reach the audit trail, against a real nats-server in operator mode: the real
agent (on a simulated GPU node) with its own node's credentials — no right beyond publishing its faults
subject — reports what it refused, signed; dispatch verifies the report against the node's announced key
and writes ``command_refused`` records, batched (a flood of forged commands costs a few records, never one
per command); a report from another node's agent or signed by a key that is not the announced one is
refused and audited as ``event_ignored``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chaos.sim.gpu_node import SimGpuNode, sim_agent
from handlers.registry import default_registry
from remediator import bus
from remediator.audit import AuditLog, iter_records
from remediator.contracts import AgentCommand, AgentReply, GpuRef
from remediator.dispatch import Dispatcher
from remediator.identity import agents, creds, reports
from remediator.identity.reports import RefusedCommands
from remediator.metrics import ServiceMetrics
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.signing import load_signer
from remediator.subjects import agent_cmd_subject, faults_subject

from .agent_support import TRUST

pytestmark = pytest.mark.timeout(90)

NODE, OTHER = "gpu-node-1", "gpu-node-2"


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, Any, Any]]:
    """A secure embedded server with the bus provisioned: (server, service nc, service js)."""
    with EmbeddedNats(data_dir=str(tmp_path / "data"), secure=True) as server:
        admin_nc, admin_js = await bus.connect(server.url, name="admin", credentials=bus.Credentials(
            creds_file=server.creds("admin")))
        await bus.provision(admin_js, Settings())
        nc, js = await bus.connect(server.url, name="service", credentials=bus.Credentials(
            creds_file=server.creds("service")))
        try:
            yield server, nc, js
        finally:
            await nc.close()
            await admin_nc.close()


async def _issue(server: EmbeddedNats, node: str, path: Path, *, announce: bool) -> Path:
    assert server.store is not None
    issued = server.store.issue("agent", node=node, now=datetime.now(UTC))
    assert issued.user is not None
    creds.write(path, issued.jwt, issued.user)
    if announce:
        nc, js = await bus.connect(server.url, name="announcer", credentials=bus.Credentials(
            creds_file=server.creds("admin")))
        try:
            await agents.announce(js, issued)
        finally:
            await nc.close()
    return path


@contextlib.asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[None]:
    """The dispatcher consuming FAULTS for the block."""
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def until(check: Callable[[], Any], timeout: float = 30.0) -> None:  # noqa: ASYNC109 - a test's deadline
    """Wait until ``check()`` (a plain or async predicate) holds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def _records(js: Any, what: str) -> list[Any]:
    return [r async for r in iter_records(js, NODE) if r.what == what]


async def test_refused_commands_are_audited_from_the_agents_signed_report(
        secured: tuple[EmbeddedNats, Any, Any], tmp_path: Path) -> None:
    server, nc, js = secured
    agent_creds = await _issue(server, NODE, tmp_path / "agent.creds", announce=True)
    metrics = ServiceMetrics()
    settings = Settings()
    dispatcher = await Dispatcher.create(nc, js, settings, AuditLog(js, "test", observers=[metrics.observe]),
                                         registry=default_registry())
    sim = SimGpuNode(tmp_path / "node", name=NODE, gpus=2)
    forged = AgentCommand(id="forged-reset", verb="reset_gpu", gpu=GpuRef(index=0), node=NODE)
    async with running(dispatcher), sim_agent(sim, nats_url=server.url, state_dir=tmp_path / "state",
                                              trust_keys=TRUST, creds_file=str(agent_creds),
                                              signing_seed_file=str(agent_creds)) as agent:
        await until(lambda: agent.link.connected)
        for i in range(40):  # a flood of unsigned commands, as a client the permissions let through
            msg = await nc.request(agent_cmd_subject(NODE), forged.model_copy(update={"id": f"f-{i}"})
                                   .model_dump_json().encode(), timeout=10)
            assert AgentReply.model_validate_json(msg.data).after["refused"] == "unsigned"
        await nc.request(agent_cmd_subject(NODE), b"{not json", timeout=10)

        async def all_counted() -> bool:
            refused = await _records(js, "command_refused")
            return sum(r.after["count"] for r in refused if r.after["refused"] == "unsigned") == 40 and any(
                r.after["refused"] == "malformed" for r in refused)

        await until(all_counted, timeout=30)
        refused = await _records(js, "command_refused")
        # batched: the first at once, the rest in the next report (10 s interval), never one per command
        assert len(refused) <= 4, [(r.after["refused"], r.after["count"]) for r in refused]
        last = next(r for r in reversed(refused) if r.after["refused"] == "unsigned")
        assert last.after["last_verb"] == "reset_gpu" and last.after["last_command_id"].startswith("f-")
        assert last.after["signer"] == load_signer(agent_creds).public_key
        assert agent.stats()["refusal_reports"]["pending"] == 0
        assert not sim.gpu_state(0).get("reset_count")  # nothing acted
    text = metrics.render().decode()
    assert 'remediator_agent_command_refusals_total{reason="unsigned"} 40' in text, text


async def test_a_report_for_another_node_or_by_another_key_is_refused_and_audited(
        secured: tuple[EmbeddedNats, Any, Any], tmp_path: Path) -> None:
    server, nc, js = secured
    await _issue(server, NODE, tmp_path / "announced.creds", announce=True)
    impostor = await _issue(server, NODE, tmp_path / "impostor.creds", announce=False)  # node 1, unannounced key
    other = await _issue(server, OTHER, tmp_path / "other.creds", announce=True)
    dispatcher = await Dispatcher.create(nc, js, Settings(), AuditLog(js, "test"),
                                         registry=default_registry())
    now = datetime.now(UTC)
    lie = {"unsigned": RefusedCommands(count=1000, last_verb="reset_gpu")}

    async def publish_as(path: Path, node_in_body: str, subject_node: str, rid: str) -> None:
        anc, ajs = await bus.connect(server.url, name="agent", credentials=bus.Credentials(creds_file=str(path)))
        try:
            body = reports.build(load_signer(path), report_id=rid, node=node_in_body, since=now, until=now,
                                 refusals=lie)
            await ajs.publish(faults_subject("agent", subject_node), body,
                              headers={"Nats-Msg-Id": rid, reports.REPORT_HEADER: reports.REFUSALS_KIND})
        finally:
            await anc.close()

    await publish_as(impostor, NODE, NODE, "r-impostor")  # its own subject, but not the announced key
    await publish_as(other, NODE, OTHER, "r-other")  # node 2's agent speaking for node 1
    async with running(dispatcher):
        async def both_refused() -> bool:
            ignored = [r async for r in iter_records(js) if r.what == "event_ignored"]
            return {r.after.get("refused") for r in ignored} >= {"unverified_report", "subject_mismatch"}

        await until(both_refused, timeout=30)
    assert not [r async for r in iter_records(js) if r.what == "command_refused"]
