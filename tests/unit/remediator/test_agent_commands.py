"""Command responder on a simulated node: refusals, effects, idempotency by command id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.sim.gpu_node import GIB, SimGpuNode
from remediator.agent.commands import CommandResponder
from remediator.agent.host import GpuIdentity, RunResult, SubprocessHostRunner
from remediator.agent.state import StateStore
from remediator.contracts import AgentCommand, AgentReply, GpuRef


@pytest.fixture
def sim(tmp_path: Path) -> SimGpuNode:
    return SimGpuNode(tmp_path / "sim", name="node-a", gpus=2)


def responder(sim: SimGpuNode, tmp: Path, host: Any = None) -> CommandResponder:
    return CommandResponder(node="node-a", gpus=sim, host=host or sim, pods=sim, state=StateStore(tmp / "state"),
                            kill_wait_s=0.5)


async def run(r: CommandResponder, verb: str, cmd_id: str, gpu: GpuRef | None = None, **params: Any) -> AgentReply:
    return await r.handle(AgentCommand(id=cmd_id, verb=verb, gpu=gpu, params=params))


async def test_isolate_then_release_check_before_act(sim: SimGpuNode, tmp_path: Path) -> None:
    r = responder(sim, tmp_path)
    ref = GpuRef(pci_bus_id="0000:2A:00.0")
    first = await run(r, "isolate_gpu", "c1", ref)
    assert (first.ok, first.changed) == (True, True)
    assert "drain -p 0000:2a:00.0 -m 1" in first.detail
    assert sim.gpu_state(1)["isolated"] is True
    again = await run(r, "isolate_gpu", "c2", ref)
    assert (again.ok, again.changed) == (True, False)
    released = await run(r, "release_gpu", "c3", GpuRef(uuid=sim.identity(1).uuid))
    assert (released.ok, released.changed) == (True, True) and sim.gpu_state(1)["isolated"] is False


async def test_reset_is_refused_while_a_process_holds_the_gpu(sim: SimGpuNode, tmp_path: Path) -> None:
    r = responder(sim, tmp_path)
    uid = sim.add_pod("llama-worker-0")
    sim.add_process(0, 321, 10 * GIB, uid)
    sim.set_ecc(0, dbe=2, remap_pending=True)
    refused = await run(r, "reset_gpu", "r1", GpuRef(index=0))
    assert (refused.ok, refused.changed) == (False, False)
    assert "refused" in refused.detail and "321" in refused.detail
    assert sim.gpu_state(0)["reset_count"] == 0
    sim.remove_process(321)
    done = await run(r, "reset_gpu", "r1", GpuRef(index=0))  # a refusal is not cached: re-evaluated
    assert (done.ok, done.changed) == (True, True)
    assert done.before["ecc"]["dbe_volatile"] == 2 and done.after["ecc"]["dbe_volatile"] == 0
    assert done.after["remapped_rows"]["pending"] is False
    assert sim.gpu_state(0)["reset_count"] == 1
    repeat = await run(r, "reset_gpu", "r1", GpuRef(index=0))  # same id: the first reply, no second reset
    assert repeat == done and sim.gpu_state(0)["reset_count"] == 1
    # idempotency survives a restart of the agent
    assert await run(responder(sim, tmp_path), "reset_gpu", "r1", GpuRef(index=0)) == done
    assert sim.gpu_state(0)["reset_count"] == 1


async def test_reset_of_a_lost_gpu_is_refused(sim: SimGpuNode, tmp_path: Path) -> None:
    sim.fall_off_bus(1)
    reply = await run(responder(sim, tmp_path), "reset_gpu", "r2", GpuRef(index=1))
    assert not reply.ok and "lost" in reply.detail


async def test_kill_orphans_kills_only_orphans(sim: SimGpuNode, tmp_path: Path) -> None:
    r = responder(sim, tmp_path)
    uid = sim.add_pod("llama-worker-0")
    sim.add_process(0, 100, 4 * GIB, uid)
    sim.orphan(1, 555, 3 * GIB)
    sim.add_process(1, 4242, GIB, "0f0f0f0f-1111-2222-3333-444444444444", visible=False)
    reply = await run(r, "kill_orphans", "k1")
    assert (reply.ok, reply.changed) == (True, True)
    assert [o["pid"] for o in reply.before["orphans"]] == [555]
    assert reply.after["killed"] == [555] and reply.after["orphans"] == []
    assert set(sim.gpu_state(1)["processes"]) == {"4242"} and set(sim.gpu_state(0)["processes"]) == {"100"}
    none_left = await run(r, "kill_orphans", "k2")
    assert (none_left.ok, none_left.changed) == (True, False)


async def test_an_unkillable_orphan_is_reported(sim: SimGpuNode, tmp_path: Path) -> None:
    sim.orphan(0, 777, GIB, unkillable=True)
    reply = await run(responder(sim, tmp_path), "kill_orphans", "k3")
    assert not reply.ok and "777" in reply.detail and "still hold" in reply.detail


async def test_health_check_nvml_and_configured_command(sim: SimGpuNode, tmp_path: Path) -> None:
    r = responder(sim, tmp_path)
    ok = await run(r, "health_check", "h1")
    assert ok.ok and ok.after["gpus"]["0"]["passed"] and "command" not in ok.after
    sim.set_ecc(1, remap_pending=True)
    sim.set_health_command(False, "Fail: Memory test")
    bad = await run(r, "health_check", "h2")
    assert not bad.ok
    assert bad.after["gpus"]["1"]["failed"] == ["row remapping pending (needs a GPU reset)"]
    assert "Memory test" in bad.detail and bad.after["command"]["ok"] is False
    only0 = await run(r, "health_check", "h3", GpuRef(index=0))
    assert list(only0.after["gpus"]) == ["0"] and not only0.ok  # the command still fails


async def test_reboot_node_sim_and_refused_without_a_hook(sim: SimGpuNode, tmp_path: Path) -> None:
    boot = sim.boot_id
    sim.add_process(0, 9, GIB, None)
    reply = await run(responder(sim, tmp_path), "reboot_node", "b1")
    assert reply.ok and sim.reboots == 1 and sim.boot_id != boot and sim.gpu_state(0)["processes"] == {}
    real = SubprocessHostRunner()  # no --reboot-command
    refused = await run(responder(sim, tmp_path / "other", host=real), "reboot_node", "b2")
    assert not refused.ok and "no reboot hook" in refused.detail


async def test_status_and_unknown_gpu(sim: SimGpuNode, tmp_path: Path) -> None:
    r = responder(sim, tmp_path)
    status = await run(r, "status", "s1")
    assert status.ok and [g["index"] for g in status.after["gpus"]] == [0, 1]
    missing = await run(r, "isolate_gpu", "i9", GpuRef(index=7))
    assert not missing.ok and "no GPU" in missing.detail


async def test_a_failing_host_action_is_reported(sim: SimGpuNode, tmp_path: Path) -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(sim, name)

        async def isolate_gpu(self, gpu: GpuIdentity) -> RunResult:
            return RunResult(False, "nvidia-smi drain: exit 3: Insufficient Permissions")

    reply = await run(responder(sim, tmp_path, host=Broken()), "isolate_gpu", "x1", GpuRef(index=0))
    assert (reply.ok, reply.changed) == (False, False) and "Insufficient" in reply.detail
