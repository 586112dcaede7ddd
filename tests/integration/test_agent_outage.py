"""NATS away for 30 s in the middle of a burst (and the agent restarted meanwhile): every event arrives
exactly once, in order, after the bus returns — through the durable spool."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from chaos.sim.gpu_node import SimGpuNode, sim_agent
from remediator import bus
from remediator.agent.main import Agent
from remediator.natsd import EmbeddedNats

from .agent_support import provisioned, until, wait_for_events

NODE = "gpu-node-3"
OUTAGE_S = float(os.environ.get("AGENT_OUTAGE_S", "30"))


async def _outage_burst(nats_server: EmbeddedNats, tmp_path: Path, outage_s: float, *,
                        restart_agent: bool) -> Agent:
    """Burst of Xids before, during and after ``outage_s`` without NATS; returns the agent that ran last."""
    nc, _ = await provisioned(nats_server.url)
    await nc.close()
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=2)

    def make_agent() -> Agent:
        return sim_agent(sim, nats_url=nats_server.url, state_dir=tmp_path / "agent", nvml_interval_s=0.3,
                         file_poll_interval_s=0.05, publish_timeout_s=1.0)

    agent = make_agent()
    await agent.start()
    loop = asyncio.get_running_loop()
    seqs: list[int] = []
    try:
        for n in range(20):
            seqs.append(sim.inject_xid(n % 2, 94))
            await asyncio.sleep(0.02)
        await until(lambda: agent.publisher.published >= 10)

        nats_server.stop()
        start = loop.time()
        restarted = False
        while loop.time() - start < outage_s:
            seqs.append(sim.inject_xid(len(seqs) % 2, (48, 94)[len(seqs) % 2]))
            if len(seqs) == 25:
                sim.set_ecc(1, dbe=3)
            if restart_agent and not restarted and loop.time() - start > outage_s / 2:
                # the spool must survive the agent going away while NATS is down
                assert agent.spool.pending > 0
                await agent.stop()
                agent = make_agent()
                await agent.start()
                restarted = True
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert agent.spool.pending > 0
        assert not agent.link.connected
        nats_server.start()

        for _ in range(10):
            seqs.append(sim.inject_xid(0, 13))
            await asyncio.sleep(0.05)

        nc, js = await bus.connect(nats_server.url, name="agent-test")
        events = await wait_for_events(
            js, NODE, lambda ev: len([e for e in ev if e.kind == "xid"]) >= len(seqs), within=60, settle=2.0)
        await nc.close()
        xids = [int(e.labels["kmsg_seq"]) for e in events if e.kind == "xid"]
        assert len(xids) == len(seqs), f"{len(xids)} events for {len(seqs)} lines"
        assert xids == seqs  # each exactly once, and in the order the kernel wrote them
        ecc = [e for e in events if e.kind == "ecc"]
        assert [(e.code, e.labels["value"]) for e in ecc] == [("dbe_volatile", "3")]
        assert agent.spool.pending == 0 and agent.publisher.spooled > 0
        return agent
    finally:
        await agent.stop()


@pytest.mark.slow
@pytest.mark.timeout(OUTAGE_S + 90)
async def test_events_during_a_nats_outage_arrive_exactly_once_after_it(nats_server: EmbeddedNats,
                                                                         tmp_path: Path) -> None:
    agent = await _outage_burst(nats_server, tmp_path, OUTAGE_S, restart_agent=False)
    assert agent.link.disconnects >= 1  # the client lost the server and reconnected to it


@pytest.mark.timeout(90)
async def test_the_spool_survives_an_agent_restart_during_the_outage(nats_server: EmbeddedNats,
                                                                     tmp_path: Path) -> None:
    agent = await _outage_burst(nats_server, tmp_path, 4.0, restart_agent=True)
    assert agent.link.disconnects == 0  # this agent started while NATS was down and connected later
