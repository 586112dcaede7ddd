"""The agent's memory-trend watch on a simulated node, over a real nats-server: a leaking process is reported
with its pod, the health check's memory verdict fails while it leaks, and passes once the restarted pod's
process runs at its container's baseline; framebuffer held by no process is reported and cleared; an agent
restart keeps the baselines."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from chaos.sim.gpu_node import GIB, SimGpuNode, sim_agent, sim_agent_config
from remediator.agent.host import GpuHolder, GpuIdentity
from remediator.agent.main import Agent
from remediator.contracts import AgentCommand, GpuRef
from remediator.natsd import EmbeddedNats

from .agent_support import TRUST, agent_cli, build_nvml_stub, command, fault_events, provisioned, until, wait_for_events

NODE = "gpu-node-2"
FAST: dict[str, Any] = {"nvml_interval_s": 0.1, "memtrend_interval_s": 0.2, "memtrend_warmup_s": 0.4,
                        "memtrend_window_s": 1.0, "trust_keys": TRUST}


class Allocation:
    """The kubelet's device allocation as PodResources gives it (pod, namespace, UID, container), for a
    node that is not attached to a simulated cluster: which pod holds GPU 0."""

    def __init__(self) -> None:
        self.holder: GpuHolder | None = None

    def gpu_holders(self, gpu: GpuIdentity) -> tuple[GpuHolder, ...] | None:
        return (self.holder,) if self.holder is not None and gpu.index == 0 else ()


async def test_a_leak_is_reported_with_its_pod_and_verified_back_after_a_restart(nats_server: EmbeddedNats,
                                                                               tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=2)
    alloc = Allocation()
    uid = sim.add_pod("pytorch-7-master-0", namespace="training", job="pytorch-7")
    alloc.holder = GpuHolder("training", "pytorch-7-master-0", uid, "pytorch")
    sim.add_process(0, 5100, 20 * GIB, uid)
    agent = Agent(sim_agent_config(sim, nats_url=nats_server.url, **FAST), gpus=sim, host=sim, pods=sim,
                  pod_resources=alloc)
    await agent.start()
    try:
        await agent.link.up.wait()
        await until(lambda: agent.memtrend is not None and any(
            t.baseline for t in agent.memtrend.state.processes.values()), within=10)
        pid = sim.leak_memory(0, "pytorch-7-master-0", bytes_per_s=8 * GIB)
        events = await wait_for_events(js, NODE, lambda ev: any(e.code == "process_growth" for e in ev))
        (leak,) = [e for e in events if e.code == "process_growth"]
        assert leak.kind == "memory_leak" and leak.gpu is not None and leak.gpu.uuid == sim.identity(0).uuid
        assert leak.labels["pid"] == str(pid) and leak.labels["baseline_bytes"] == str(20 * GIB)
        assert float(leak.labels["growth_factor"]) >= 1.3 and int(leak.labels["growth_window_s"]) >= 1
        assert (leak.origin.namespace, leak.origin.pod, leak.origin.pod_uid, leak.origin.container) == (
            "training", "pytorch-7-master-0", uid, "pytorch")
        sick = await command(nc, NODE, AgentCommand(id="hc-1", verb="health_check", gpu=GpuRef(index=0),
                                                     params={"checks": ["memory"]}))
        assert not sick.ok and "baseline" in sick.detail
        other = await command(nc, NODE, AgentCommand(id="hc-2", verb="health_check", gpu=GpuRef(index=0),
                                                      params={"checks": ["nvml", "ecc"]}))
        assert other.ok, other.detail  # the memory verdict only where memory is asked for

        # the job restarts: the pod goes with its process; the new pod (same name, new UID) runs at the baseline
        sim.remove_process(pid)
        sim.delete_pod(uid)
        new_uid = sim.add_pod("pytorch-7-master-0", namespace="training", uid="7a7a7a7a-1111-2222-3333-444444444444",
                              job="pytorch-7")
        alloc.holder = GpuHolder("training", "pytorch-7-master-0", new_uid, "pytorch")
        assert sim.start_restarted(new_uid, [0])
        await until(lambda: any(t.pod_uid == new_uid for t in agent.memtrend.state.processes.values())
                    if agent.memtrend else False, within=10)
        (t,) = [t for t in agent.memtrend.state.processes.values() if t.pod_uid == new_uid]  # type: ignore[union-attr]
        assert t.baseline == 20 * GIB  # its container's baseline, at once
        back = await command(nc, NODE, AgentCommand(id="hc-3", verb="health_check", gpu=GpuRef(index=0),
                                                     params={"checks": ["memory"]}))
        assert back.ok, back.detail
        status = await command(nc, NODE, AgentCommand(id="st-1", verb="status"))
        trend = status.after["memory_trend"]
        assert trend["samples"] > 5 and trend["processes"] == 1 and trend["containers"] == 1
    finally:
        await agent.stop()

    # a restarted agent keeps the baselines (state dir) and reports nothing again
    again = Agent(sim_agent_config(sim, nats_url=nats_server.url, **FAST), gpus=sim, host=sim, pods=sim,
                  pod_resources=alloc)
    assert again.memtrend is None  # built at start
    await again.start()
    try:
        assert again.memtrend is not None
        assert again.memtrend.state.containers == {"training/pytorch-7-master-0/pytorch": 20 * GIB}
        await asyncio.sleep(1.5)
        events = await wait_for_events(js, NODE, lambda ev: True)
        assert sum(e.code == "process_growth" for e in events) == 1
    finally:
        await again.stop()
        await nc.close()


async def test_framebuffer_held_by_no_process_is_reported_and_cleared(nats_server: EmbeddedNats,
                                                                     tmp_path: Path) -> None:
    nc, js = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "sim", name=NODE, gpus=2)
    agent = sim_agent(sim, nats_url=nats_server.url, **FAST)
    await agent.start()
    try:
        await agent.link.up.wait()
        sim.hold_framebuffer(1, 6 * GIB, reserved_bytes=512 << 20)
        events = await wait_for_events(js, NODE, lambda ev: sum(e.code == "fb_no_owner" for e in ev) >= 2)
        held = [e for e in events if e.code == "fb_no_owner"]
        assert all(e.gpu is not None and e.gpu.index == 1 and e.labels["process_count"] == "0" for e in held)
        assert int(held[0].labels["used_bytes"]) - int(held[0].labels["reserved_bytes"]) == 6 * GIB
        sick = await command(nc, NODE, AgentCommand(id="hc-1", verb="health_check", gpu=GpuRef(index=1)))
        assert not sick.ok and "held by no process" in sick.detail
        sim.hold_framebuffer(1, 0)
        events = await wait_for_events(js, NODE, lambda ev: any(e.code == "fb_no_owner" and e.is_healthy for e in ev))
        health = await command(nc, NODE, AgentCommand(id="hc-2", verb="health_check", gpu=GpuRef(index=1)))
        assert health.ok, health.detail
    finally:
        await agent.stop()
        await nc.close()


async def test_the_cli_agent_on_nvml_reports_a_leak_and_ownerless_memory(nats_server: EmbeddedNats,
                                                                        tmp_path: Path) -> None:
    """The production path: ``remediator agent --nvml`` on the stub libnvidia-ml (per-process memory from
    nvmlDeviceGetComputeRunningProcesses, the reserve from memory info v2), the PID's pod from its cgroup."""
    nc, js = await provisioned(nats_server.url)
    lib = build_nvml_stub(tmp_path)
    state = tmp_path / "nvml.state"
    uid = "5e5e5e5e-1111-2222-3333-444444444444"
    cgroup = tmp_path / "proc" / "4242" / "cgroup"
    cgroup.parent.mkdir(parents=True)
    cgroup.write_text(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-ab.scope\n")
    (tmp_path / "kubelet" / uid).mkdir(parents=True)

    def gpus(proc_bytes: int) -> None:
        text = ("count=2\ngpu0.uuid=GPU-aaaaaaaa-0000-0000-0000-000000000000\ngpu0.pci=00000000:3B:00.0\n"
                f"gpu0.procs=4242:{proc_bytes}\ngpu0.mem_used={proc_bytes + (512 << 20)}\n"
                f"gpu0.mem_reserved={512 << 20}\n"
                "gpu1.uuid=GPU-bbbbbbbb-0000-0000-0000-000000000000\ngpu1.pci=00000000:5D:00.0\n"
                f"gpu1.mem_used={6 * GIB}\ngpu1.mem_reserved={512 << 20}\n")
        tmp = state.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(state)  # the stub reads the file on every call: never half of it

    gpus(10 * GIB)
    proc = agent_cli(["--node", "nvml-node", "--nats", nats_server.url, "--nvml", "--interval", "0.1",
                      "--memtrend-interval", "0.2", "--memtrend-warmup", "0.4", "--memtrend-window", "1",
                      "--state", str(tmp_path / "agent"), "--proc-root", str(tmp_path / "proc"),
                      "--kubelet-pods-dir", str(tmp_path / "kubelet"), "--trust-key", TRUST[0]],
                     env={"NVML_STUB_STATE": str(state), "REMEDIATOR_NVML_LIBRARY": str(lib)},
                     log=tmp_path / "agent.log")
    try:
        await asyncio.sleep(2.0)  # the baseline is taken after the warm-up
        for step in range(1, 60):
            gpus(10 * GIB + step * GIB)
            events = await fault_events(js, "nvml-node")
            if any(e.code == "process_growth" for e in events):
                break
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
            await asyncio.sleep(0.2)
        events = await wait_for_events(js, "nvml-node", lambda ev: any(e.code == "fb_no_owner" for e in ev)
                                       and any(e.code == "process_growth" for e in ev))
        (leak,) = [e for e in events if e.code == "process_growth"]
        assert leak.labels["pid"] == "4242" and leak.labels["pod_uid"] == uid and leak.origin.pod_uid == uid
        assert leak.gpu is not None and leak.gpu.pci_bus_id == "0000:3b:00.0"
        assert int(leak.labels["process_used_bytes"]) >= 1.3 * int(leak.labels["baseline_bytes"])
        held = [e for e in events if e.code == "fb_no_owner"]
        assert held[0].gpu is not None and held[0].gpu.index == 1
        assert (held[0].labels["used_bytes"], held[0].labels["reserved_bytes"]) == (str(6 * GIB), str(512 << 20))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        await nc.close()
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-2000:]
