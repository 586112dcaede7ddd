"""The agent verifies the bus without any right beyond its own, against a real nats-server: FAULTS must store
what it publishes on ``faults.agent.<node>``; the check stores nothing. A missing stream is one ERROR line
naming ``remediator bus init`` and shows in the agent's stats while its events stay spooled; once the bus is
provisioned the agent says so and publishes them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chaos.sim.gpu_node import SimGpuNode, sim_agent
from remediator import bus
from remediator.agent import main as agent_main
from remediator.identity import creds
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.subjects import FAULTS_STREAM

from .agent_support import TRUST, wait_for_events

pytestmark = pytest.mark.timeout(90)

NODE = "gpu-node-1"


async def test_verify_capture_says_what_is_missing_and_stores_nothing(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=str(tmp_path / "data"), secure=True) as server:
        assert server.store is not None
        admin_nc, admin_js = await bus.connect(server.url, name="admin", credentials=bus.Credentials(
            creds_file=server.creds("admin")))
        issued = server.store.issue("agent", node=NODE, now=datetime.now(UTC))
        assert issued.user is not None
        agent_creds = creds.write(tmp_path / "agent.creds", issued.jwt, issued.user)
        nc, js = await bus.connect(server.url, name="agent", credentials=bus.Credentials(creds_file=str(agent_creds)))
        try:
            missing = await bus.verify_capture(js, f"faults.agent.{NODE}", FAULTS_STREAM, timeout=2)
            assert missing is not None and "remediator bus init" in missing
            await bus.provision(admin_js, Settings())
            assert await bus.verify_capture(js, f"faults.agent.{NODE}", FAULTS_STREAM) is None  # the agent's rights
            svc_nc, svc_js = await bus.connect(server.url, name="service", credentials=bus.Credentials(
                creds_file=server.creds("service")))
            try:  # the service may publish remediation.<node>, which REMEDIATIONS captures, not FAULTS
                other = await bus.verify_capture(svc_js, "remediation.gpu-node-1", FAULTS_STREAM)
            finally:
                await svc_nc.close()
            assert other is not None and "another stream" in other
            denied = await bus.verify_capture(js, "faults.agent.gpu-node-2", FAULTS_STREAM, timeout=1)
            assert denied is not None and "may not publish" in denied  # another node's subject: not its own
            assert (await admin_js.stream_info(FAULTS_STREAM)).state.messages == 0  # the checks stored nothing
        finally:
            await nc.close()
            await admin_nc.close()


async def test_the_agent_reports_a_missing_stream_then_publishes_once_it_exists(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(agent_main, "BUS_RECHECK_S", 0.2)
    caplog.set_level(logging.INFO, logger="remediator.agent.main")
    sim = SimGpuNode(tmp_path / "node", name=NODE, gpus=2)
    async with sim_agent(sim, nats_url=nats_server.url, state_dir=tmp_path / "state", trust_keys=TRUST) as agent:
        deadline = time.monotonic() + 20
        while "remediator bus init" not in str(agent.stats()["bus"]):
            assert time.monotonic() < deadline, agent.stats()["bus"]
            await asyncio.sleep(0.1)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "bus init" in r.getMessage()]
        assert len(errors) == 1  # one line per problem, not one per check
        sim.inject_xid(0, 79)  # spooled while FAULTS is missing
        nc, js = await bus.connect(nats_server.url, name="provisioner")
        try:
            await bus.provision(js, Settings())
            while agent.stats()["bus"] != "ok":
                assert time.monotonic() < deadline + 20, agent.stats()["bus"]
                await asyncio.sleep(0.1)
            assert any("stores this node's events again" in r.getMessage() for r in caplog.records)
            events = await wait_for_events(js, NODE, lambda evs: any(e.code == 79 for e in evs))
            assert [e.code for e in events if e.kind == "xid"] == [79]
        finally:
            await nc.close()
