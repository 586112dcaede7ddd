"""The agent process SIGKILLed and restarted in the middle of a burst neither repeats nor misses a line."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from chaos.sim.gpu_node import SimGpuNode
from remediator.natsd import EmbeddedNats

from .agent_support import agent_cli, provisioned, wait_for_events

NODE = "gpu-node-7"
BURST = 240


@pytest.mark.slow
async def test_sigkill_mid_burst_neither_repeats_nor_misses(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    state = tmp_path / "state"
    args = ["--node", NODE, "--nats", nats_server.url, "--sim-gpus", "2", "--state", str(state),
            "--interval", "0.5"]
    log = tmp_path / "agent.log"
    first = agent_cli(args, log=log)
    second = None
    try:
        deadline = time.monotonic() + 30
        while not (state / "sim" / "state.json").exists():
            assert first.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the agent did not create its simulated node"
            await asyncio.sleep(0.05)
        sim = SimGpuNode.attach(state / "sim")
        seqs: list[int] = []
        killed_after = None
        for n in range(BURST):
            seqs.append(sim.inject_xid(n % 2, (48, 94, 13)[n % 3]))
            await asyncio.sleep(0.004)
            if n == BURST // 3:
                # make sure the first agent is mid-stream (it has published some of the burst), then kill it
                await wait_for_events(js, NODE, lambda ev: len(ev) >= 10, within=30)
                first.send_signal(signal.SIGKILL)
                first.wait(10)
                killed_after = len(seqs)
            if n == BURST // 2:
                second = agent_cli(args, log=log)
        assert killed_after is not None and second is not None
        events = await wait_for_events(js, NODE, lambda ev: len(ev) >= BURST, within=60, settle=2.0)
        assert second.poll() is None, log.read_text()[-3000:]
        got = [int(e.labels["kmsg_seq"]) for e in events]
        assert len(got) == BURST, f"{len(got)} events for {BURST} lines"
        assert sorted(got) == sorted(seqs)
        assert len(set(got)) == BURST  # nothing repeated
        assert all(e.kind == "xid" and e.gpu is not None and e.gpu.uuid == sim.identity(e.gpu.index or 0).uuid
                   for e in events)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except Exception:
                    p.kill()
                    p.wait()
        await nc.close()
