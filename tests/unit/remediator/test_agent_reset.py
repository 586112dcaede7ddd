"""The agent's safe reset: by UUID (never the index), persistence mode off for the reset and back on after,
verified afterwards (same UUID at the PCI address, nothing pending), holders named; the bug-report verb;
``SubprocessHostRunner`` running the real argv of ``nvidia-smi`` and the bug-report command (fake binaries)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from chaos.sim.gpu_node import GIB, SimGpuNode
from remediator.agent.commands import CommandResponder
from remediator.agent.host import GpuControl, GpuIdentity, ProcPodView, SubprocessHostRunner, gpu_reset_target
from remediator.agent.state import StateStore
from remediator.contracts import AgentCommand, AgentReply, GpuRef


@pytest.fixture
def sim(tmp_path: Path) -> SimGpuNode:
    return SimGpuNode(tmp_path / "sim", name="node-a", gpus=2)


def responder(sim: SimGpuNode, tmp: Path, host: Any = None) -> CommandResponder:
    return CommandResponder(node="node-a", gpus=sim, host=host or sim, pods=sim, state=StateStore(tmp / "state"))


async def run(r: CommandResponder, verb: str, cmd_id: str, gpu: GpuRef | None = None) -> AgentReply:
    return await r.handle(AgentCommand(id=cmd_id, verb=verb, gpu=gpu))


def test_the_reset_target_is_the_uuid_then_the_pci_bus_id_never_the_index() -> None:
    assert gpu_reset_target(GpuIdentity(3, "GPU-abc", "0000:3b:00.0")) == "GPU-abc"
    assert gpu_reset_target(GpuIdentity(3, None, "0000:3b:00.0")) == "0000:3b:00.0"
    assert gpu_reset_target(GpuIdentity(3)) is None


async def test_persistence_mode_is_turned_off_for_the_reset_and_restored(sim: SimGpuNode, tmp_path: Path) -> None:
    assert isinstance(sim, GpuControl) and sim.persistence_mode(1) is True
    reply = await run(responder(sim, tmp_path), "reset_gpu", "r1", GpuRef(index=1))
    assert reply.ok and reply.changed, reply.detail
    assert f"--gpu-reset -i {sim.identity(1).uuid}" in reply.detail
    assert reply.after["persistence"] == {"before": True, "during": False, "restored": True}
    assert sim.persistence_mode(1) is True and sim.gpu_state(1)["reset_count"] == 1
    v = reply.after["verification"]
    assert v["passed"] and v["uuid_before"] == v["uuid_after"] == sim.identity(1).uuid
    assert "persistence mode turned off for the reset and restored" in reply.detail


async def test_without_the_persistence_handling_the_simulated_driver_refuses(sim: SimGpuNode) -> None:
    result = await sim.reset_gpu(sim.identity(0))
    assert not result.ok and "persistence" in result.detail  # nvidia-persistenced holds the GPU open
    sim.set_persistence_mode(0, False)
    assert (await sim.reset_gpu(sim.identity(0))).ok


@pytest.mark.parametrize(("outcome", "problem"), [
    pytest.param("new_uuid", "a different GPU answers at", id="another-uuid"),
    pytest.param("retired_pending", "page retirement still pending", id="retirement-pending"),
])
async def test_a_reset_whose_verification_fails_is_a_failed_reset(sim: SimGpuNode, tmp_path: Path, outcome: str,
                                                                  problem: str) -> None:
    sim.set_reset_outcome(0, outcome)
    reply = await run(responder(sim, tmp_path), "reset_gpu", "r2", GpuRef(index=0))
    assert not reply.ok and reply.after["reset_failed"] is True and reply.after["reset"] is True
    assert any(problem in p for p in reply.after["verification"]["problems"]), reply.after["verification"]
    assert sim.persistence_mode(0) is True  # restored whatever the verification found


async def test_a_reset_that_fails_says_so_and_restores_persistence(sim: SimGpuNode, tmp_path: Path) -> None:
    sim.set_reset_outcome(0, "fail")
    reply = await run(responder(sim, tmp_path), "reset_gpu", "r3", GpuRef(index=0))
    assert not reply.ok and reply.after["reset_failed"] is True and reply.after["verification"] is None
    assert "Unable to reset GPU" in reply.detail and sim.persistence_mode(0) is True
    assert sim.gpu_state(0)["reset_count"] == 0


async def test_a_held_gpu_is_refused_naming_each_pid_and_its_pod(sim: SimGpuNode, tmp_path: Path) -> None:
    uid = sim.add_pod("nvidia-dcgm-exporter-x1", namespace="gpu-operator")
    sim.add_process(0, 4101, 64 << 20, uid)
    sim.add_process(0, 4102, GIB, None)  # a host process of no pod
    reply = await run(responder(sim, tmp_path), "reset_gpu", "r4", GpuRef(index=0))
    assert not reply.ok and reply.after["refused"] == "in_use"
    assert {(p["pid"], p["pod_uid"]) for p in reply.after["processes"]} == {(4101, uid), (4102, None)}
    assert f"4101 (pod {uid})" in reply.detail
    assert sim.persistence_mode(0) is True and sim.gpu_state(0)["reset_count"] == 0  # nothing touched


async def test_collect_bug_report_runs_the_configured_command(sim: SimGpuNode, tmp_path: Path) -> None:
    reply = await run(responder(sim, tmp_path), "collect_bug_report", "b1")
    assert reply.ok and reply.after["collected"] and "nvidia-bug-report.log.gz" in reply.after["output"]
    assert sim.bug_reports == 1
    none = SubprocessHostRunner(bug_report_command=None)
    refused = await run(responder(sim, tmp_path / "other", host=none), "collect_bug_report", "b2")
    assert not refused.ok and "--bug-report-command" in refused.detail


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


async def test_subprocess_runner_resets_by_uuid_and_keeps_only_the_output_tail(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    smi = _script(tmp_path / "nvidia-smi", f'echo "$@" > {log}\necho "GPU 00000000:3B:00.0 was successfully reset."\n')
    report = _script(tmp_path / "nvidia-bug-report.sh", "i=0; while [ $i -lt 3000 ]; do printf x; i=$((i+1)); done\n"
                                                       "echo; echo done\nexit 0\n")
    runner = SubprocessHostRunner(nvidia_smi=str(smi), bug_report_command=[str(report)], bug_report_timeout_s=20)
    r = await runner.reset_gpu(GpuIdentity(index=5, uuid="GPU-1234", pci_bus_id="0000:3b:00.0"))
    assert r.ok and log.read_text().split() == ["--gpu-reset", "-i", "GPU-1234"]
    no_id = await runner.reset_gpu(GpuIdentity(index=5))
    assert not no_id.ok and "by index" in no_id.detail
    bug = await runner.bug_report()
    assert bug is not None and bug.ok and bug.detail.endswith("done") and len(bug.detail) < 2300


async def test_subprocess_bug_report_is_bounded_in_time(tmp_path: Path) -> None:
    slow = _script(tmp_path / "slow.sh", "sleep 30 &\nsleep 30\n")  # a child keeps the pipe open too
    runner = SubprocessHostRunner(bug_report_command=[str(slow)], bug_report_timeout_s=0.5)
    r = await runner.bug_report()
    assert r is not None and not r.ok and "timed out after 0.5s" in r.detail


class MinorSim(SimGpuNode):
    """A simulated node whose backend also says each GPU's device minor, as NVML does."""

    def minor_number(self, index: int) -> int:
        return index + 4


def _proc(root: Path, pid: int, links: list[str], pod_uid: str | None = None) -> None:
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    for n, target in enumerate(links):
        (fd / str(n + 3)).symlink_to(target)
    slug = (pod_uid or "").replace("-", "_")
    (root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{slug}.slice/cri-containerd-1.scope\n" if pod_uid else "0::/init.scope\n")


async def test_a_device_node_held_open_without_a_compute_process_refuses_the_reset(tmp_path: Path) -> None:
    sim = MinorSim(tmp_path / "sim", name="node-a", gpus=2)
    proc = tmp_path / "proc"
    plugin = "0b3c1f5e-6d1a-4c47-9c8e-2f0e5b6d7a11"
    _proc(proc, 501, ["/dev/nvidiactl", "/dev/nvidia5"], plugin)  # the device plugin holds GPU 1 (minor 5)
    _proc(proc, 502, ["/dev/nvidia4", "/dev/null"])                # something on GPU 0 only
    _proc(proc, os.getpid(), ["/dev/nvidia5"])                     # the agent's own NVML handle does not count
    r = CommandResponder(node="node-a", gpus=sim, host=sim, pods=ProcPodView(proc, running_pods=lambda: None),
                         state=StateStore(tmp_path / "state"))
    reply = await run(r, "reset_gpu", "r5", GpuRef(index=1))
    assert not reply.ok and reply.after["refused"] == "in_use"
    assert reply.after["processes"] == [{"pid": 501, "used_bytes": None, "pod_uid": plugin}]
    assert "hold the device node of GPU 1 open: pid 501" in reply.detail
    assert sim.gpu_state(1)["reset_count"] == 0 and sim.persistence_mode(1) is True  # back on, untouched
    assert ProcPodView(proc).device_openers("/dev/nvidia4") == [502]
    assert ProcPodView(tmp_path / "nowhere").device_openers("/dev/nvidia4") == []
