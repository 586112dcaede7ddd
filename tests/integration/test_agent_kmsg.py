"""Kernel lines to NATS: every Xid line arrives once, with its Xid, PCI bus id and GPU UUID."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from chaos.sim.gpu_node import SimGpuNode, sim_agent
from remediator.agent.main import Agent, AgentConfig
from remediator.natsd import EmbeddedNats

from .agent_support import append_text, provisioned, wait_for_events

NODE = "gpu-node-0"


async def test_kmsg_lines_arrive_once_each_with_xid_pci_and_uuid(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=4)
    agent = sim_agent(sim, nats_url=nats_server.url, nvml_interval_s=0.2, file_poll_interval_s=0.05)
    await agent.start()
    try:
        expected: dict[int, tuple[int, int]] = {}  # kmsg seq -> (gpu, xid)
        for n in range(24):
            gpu, code = n % 4, (13, 31, 43, 48, 79, 94)[n % 6]
            expected[sim.inject_xid(gpu, code)] = (gpu, code)
            if n % 5 == 0:
                await asyncio.sleep(0.03)
        # an Xid for a PCI address that is no GPU the agent knows, with no identity line before it
        stranger = sim.kmsg("NVRM: Xid (PCI:0000:c1:00): 62, pid=2121, name=python3, 0000a0f5 0000a0f5")
        events = await wait_for_events(js, NODE, lambda ev: len([e for e in ev if e.kind == "xid"]) >= 25,
                                       settle=1.0)
        xids = [e for e in events if e.kind == "xid"]
        assert len(xids) == 25
        assert len({e.id for e in xids}) == 25
        by_seq = {int(e.labels["kmsg_seq"]): e for e in xids}
        assert set(by_seq) == {*expected, stranger}
        for seq, (gpu, code) in expected.items():
            e = by_seq[seq]
            ident = sim.identity(gpu)
            assert e.code == code
            assert e.gpu is not None
            assert (e.gpu.index, e.gpu.uuid, e.gpu.pci_bus_id) == (gpu, ident.uuid, ident.pci_bus_id)
            assert e.id == f"agent|{NODE}|{sim.boot_id}|{seq}"
            assert e.source == "agent" and e.node == NODE
        s = by_seq[stranger]
        assert s.code == 62 and s.gpu is not None
        assert (s.gpu.index, s.gpu.uuid, s.gpu.pci_bus_id) == (None, None, "0000:c1:00.0")
        assert agent.publisher.duplicates == 0
    finally:
        await agent.stop()
        await nc.close()


async def test_plain_syslog_file_with_rotation_and_a_late_start(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    log = tmp_path / "syslog"  # does not exist yet
    cfg = AgentConfig(node="worker4", state_dir=tmp_path / "state", nats_url=nats_server.url, kmsg_path=str(log),
                      file_poll_interval_s=0.05)
    line = ("Dec  2 11:38:47 worker4 kernel: [ 219.470994] NVRM: Xid (PCI:0000:3b:00): {code}, pid='<unknown>', "
            "name=<unknown>, Ch 00000010\n")
    agent = Agent(cfg)
    await agent.start()
    try:
        await asyncio.sleep(0.2)
        log.write_text("Dec  2 11:38:40 worker4 kernel: NVRM: GPU at PCI:0000:3b:00: "
                       "GPU-509665ad-aaaa-bbbb-cccc-dddddddddddd\n" + line.format(code=13))
        await wait_for_events(js, "worker4", lambda ev: len(ev) == 1)
        append_text(log, line.format(code=31))
        os.rename(log, tmp_path / "syslog.1")
        append_text(tmp_path / "syslog.1", line.format(code=43))  # the daemon has not reopened its file yet
        log.write_text(line.format(code=45))
        events = await wait_for_events(js, "worker4", lambda ev: len(ev) >= 4, settle=0.5)
        assert [e.code for e in events] == [13, 31, 43, 45]
        assert all(e.gpu is not None and e.gpu.uuid == "GPU-509665ad-aaaa-bbbb-cccc-dddddddddddd"
                   and e.gpu.pci_bus_id == "0000:3b:00.0" and e.gpu.index is None for e in events)
        assert all(e.id.startswith("agent|worker4|file|") for e in events)
    finally:
        await agent.stop()
        await nc.close()
