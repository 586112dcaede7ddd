"""The agent on a simulated node, over a real nats-server: lost GPU, ECC, orphans, container logs, and the
command responder (reset refused while a process holds the GPU, orphans killed); and the CLI agent with
``--nvml`` on the stub libnvidia-ml."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from chaos.sim.gpu_node import GIB, SimFleet, SimGpuNode, sim_agent
from remediator.contracts import AgentCommand, GpuRef
from remediator.natsd import EmbeddedNats

from .agent_support import TRUST, agent_cli, append_text, build_nvml_stub, command, provisioned, wait_for_events

NODE = "gpu-node-1"


async def test_lost_gpu_ecc_and_reset_refused_while_a_process_holds_the_gpu(nats_server: EmbeddedNats,
                                                                           tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=4)
    agent = sim_agent(sim, nats_url=nats_server.url, nvml_interval_s=0.2, file_poll_interval_s=0.05,
                      trust_keys=TRUST)
    await agent.start()
    try:
        await agent.link.up.wait()
        sim.fall_off_bus(2)
        sim.set_ecc(1, dbe=1, remap_pending=True)
        events = await wait_for_events(
            js, NODE, lambda ev: any(e.kind == "gpu_lost" and e.labels.get("source") == "nvml" for e in ev)
            and sum(e.kind == "ecc" for e in ev) >= 2, settle=0.6)
        lost = [e for e in events if e.kind == "gpu_lost" and e.labels["source"] == "nvml"]
        assert len(lost) == 1 and lost[0].is_fatal and lost[0].code == "NVML_ERROR_GPU_IS_LOST"
        assert lost[0].gpu is not None and lost[0].gpu.uuid == sim.identity(2).uuid
        assert [e.code for e in events if e.kind == "xid"] == [79]
        ecc = {e.code: e for e in events if e.kind == "ecc"}
        assert set(ecc) == {"dbe_volatile", "row_remap_pending"}
        assert ecc["dbe_volatile"].labels["value"] == "1" and ecc["dbe_volatile"].labels["previous"] == "0"

        uid = sim.add_pod("llama-worker-0", namespace="ml")
        sim.add_process(1, 4100, 30 * GIB, uid)
        refused = await command(nc, NODE, AgentCommand(id="cmd-1", verb="reset_gpu", gpu=GpuRef(index=1)))
        assert (refused.ok, refused.changed) == (False, False)
        assert "refused" in refused.detail and "4100" in refused.detail
        assert sim.gpu_state(1)["reset_count"] == 0
        lost_reset = await command(nc, NODE, AgentCommand(id="cmd-2", verb="reset_gpu", gpu=GpuRef(index=2)))
        assert not lost_reset.ok and "lost" in lost_reset.detail

        isolate = await command(nc, NODE, AgentCommand(id="cmd-3", verb="isolate_gpu",
                                                       gpu=GpuRef(uuid=sim.identity(1).uuid)))
        assert isolate.ok and isolate.changed and sim.gpu_state(1)["isolated"]
        sim.remove_process(4100)
        reset = await command(nc, NODE, AgentCommand(id="cmd-4", verb="reset_gpu", gpu=GpuRef(index=1)))
        assert reset.ok and reset.changed and sim.gpu_state(1)["reset_count"] == 1
        again = await command(nc, NODE, AgentCommand(id="cmd-4", verb="reset_gpu", gpu=GpuRef(index=1)))
        assert (again.ok, again.change) == (reset.ok, reset.change) and sim.gpu_state(1)["reset_count"] == 1
        health = await command(nc, NODE, AgentCommand(id="cmd-5", verb="health_check", gpu=GpuRef(index=1)))
        assert health.ok, health.detail
        # the reset cleared the pending remap: a healthy event closes it
        events = await wait_for_events(js, NODE, lambda ev: any(e.is_healthy and e.code == "row_remap_pending"
                                                                for e in ev))
        status = await command(nc, NODE, AgentCommand(id="cmd-6", verb="status"))
        assert status.ok and status.after["isolated"] == [sim.identity(1).uuid]
        assert status.after["gpus"][2]["lost"] is True and status.after["connected"] is True
        bad = await nc.request(f"agent.{NODE.replace('.', '_')}.cmd", b'{"id": "x", "verb": "explode"}', timeout=5)
        assert b'"ok":false' in bad.data and b"invalid command" in bad.data
    finally:
        await agent.stop()
        await nc.close()


async def test_orphan_is_found_published_and_killed(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=2)
    running = sim.add_pod("bert-master-0", namespace="ml")
    sim.add_process(0, 300, 8 * GIB, running)
    sim.add_process(1, 4242, 2 * GIB, "0f0f0f0f-1111-2222-3333-444444444444", visible=False)  # container pidns
    agent = sim_agent(sim, nats_url=nats_server.url, nvml_interval_s=0.2, trust_keys=TRUST)
    await agent.start()
    try:
        sim.orphan(1, 555, 6 * GIB)
        events = await wait_for_events(js, NODE, lambda ev: any(e.kind == "memory_leak" for e in ev), settle=0.6)
        leaks = [e for e in events if e.kind == "memory_leak"]
        assert len(leaks) == 1
        leak = leaks[0]
        assert leak.labels["orphan_pids"] == "555" and leak.labels["used_bytes"] == str(6 * GIB)
        assert leak.labels["pod_gone"] == "true"
        assert leak.gpu is not None and leak.gpu.index == 1 and leak.gpu.uuid == sim.identity(1).uuid
        reply = await command(nc, NODE, AgentCommand(id="kill-1", verb="kill_orphans"))
        assert reply.ok and reply.changed and reply.after["killed"] == [555]
        assert set(sim.gpu_state(1)["processes"]) == {"4242"} and set(sim.gpu_state(0)["processes"]) == {"300"}
        events = await wait_for_events(js, NODE, lambda ev: any(e.kind == "memory_leak" and e.is_healthy
                                                                for e in ev))
        assert sum(e.kind == "memory_leak" for e in events) == 2
    finally:
        await agent.stop()
        await nc.close()


async def test_container_log_nccl_timeouts_carry_pod_and_rank(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    async with SimFleet(tmp_path / "fleet", ["gpu-node-0", "gpu-node-1"], nats_url=nats_server.url, gpus=2,
                        agent_options={"podlog_poll_interval_s": 0.1, "podlog_rescan_s": 0.2}) as fleet:
        await asyncio.gather(*(a.link.up.wait() for a in fleet.agents.values()))
        for n, sim in enumerate(fleet.nodes.values()):
            pod = f"llama-worker-{n}"
            sim.add_pod(pod, namespace="train", job="llama-70b")
            await asyncio.sleep(0.5)  # let the scanner find the new pod
            sim.pod_log(pod, "step 1000 loss 1.93\nNCCL INFO Channel 00/32 : 0 1 2 3")
            sim.nccl_timeout(pod, rank=n + 4, seq=9120)
        for name in fleet.nodes:
            events = await wait_for_events(js, name, lambda ev: any(e.kind == "nccl_timeout" for e in ev),
                                           settle=0.5)
            (t,) = [e for e in events if e.kind == "nccl_timeout"]
            n = int(name.rsplit("-", 1)[1])
            assert t.labels["pod"] == f"llama-worker-{n}" and t.labels["namespace"] == "train"
            assert t.labels["rank"] == str(n + 4) and t.labels["seq"] == "9120"
            assert t.labels["job"] == "llama-70b" and t.labels["container"] == "trainer"
            assert t.node == name and t.code == "watchdog_timeout"
    await nc.close()


async def test_cli_agent_with_nvml_on_the_stub_library(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    lib = build_nvml_stub(tmp_path)
    state = tmp_path / "nvml.state"
    state.write_text("count=2\ngpu0.uuid=GPU-aaaaaaaa-0000-0000-0000-000000000000\ngpu0.pci=00000000:3B:00.0\n"
                     "gpu1.uuid=GPU-bbbbbbbb-0000-0000-0000-000000000000\ngpu1.pci=00000000:5D:00.0\n")
    proc = agent_cli(["--node", "nvml-node", "--nats", nats_server.url, "--nvml", "--interval", "0.2",
                      "--state", str(tmp_path / "agent"), "--proc-root", str(tmp_path / "proc"),
                      "--kubelet-pods-dir", str(tmp_path / "kubelet"), "--trust-key", TRUST[0]],
                     env={"NVML_STUB_STATE": str(state), "REMEDIATOR_NVML_LIBRARY": str(lib)},
                     log=tmp_path / "agent.log")
    try:
        status = None
        for _ in range(100):
            try:
                status = await command(nc, "nvml-node", AgentCommand(id="s1", verb="status"), within=1)
                break
            except Exception:
                assert proc.poll() is None, (tmp_path / "agent.log").read_text()
                await asyncio.sleep(0.2)
        assert status is not None and [g["uuid"] for g in status.after["gpus"]] == [
            "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"]
        append_text(state, "gpu0.ecc_dbe_volatile=2\ngpu1.lost=1\ngpu1.xids=79\n")
        events = await wait_for_events(js, "nvml-node", lambda ev: {e.kind for e in ev} >= {"ecc", "gpu_lost", "xid"},
                                       settle=0.5)
        ecc = [e for e in events if e.kind == "ecc"]
        assert [(e.code, e.labels["value"], e.gpu.pci_bus_id if e.gpu else None) for e in ecc] == [
            ("dbe_volatile", "2", "0000:3b:00.0")]
        lost = [e for e in events if e.kind == "gpu_lost"]
        assert len(lost) == 1 and lost[0].gpu is not None
        assert lost[0].gpu.uuid == "GPU-bbbbbbbb-0000-0000-0000-000000000000"
        xid = [e for e in events if e.kind == "xid"]  # no kernel log followed: NVML events publish Xids
        assert [(e.code, e.labels["source"]) for e in xid] == [(79, "nvml_event")]
        assert xid[0].gpu is not None and xid[0].gpu.index == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        await nc.close()
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-2000:]
