"""NVML poller change rules and orphan detection, on the simulated node (the agent's GpuBackend/PodView)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from chaos.sim.gpu_node import GIB, SimGpuNode
from remediator.agent.host import ProcPodView, pod_uid_from_cgroup
from remediator.agent.nvml_poller import NvmlPoller
from remediator.agent.orphans import OrphanDetector, find_orphans
from remediator.agent.state import StateStore

NOW = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def sim(tmp_path: Path) -> SimGpuNode:
    return SimGpuNode(tmp_path / "sim", name="node-a", gpus=2)


def poller(sim: SimGpuNode, tmp: Path) -> NvmlPoller:
    return NvmlPoller(sim, node="node-a", state=StateStore(tmp / "state"), boot_id=lambda: "boot-1",
                      clock=lambda: NOW)


def step(p: NvmlPoller) -> list[tuple[str, object, str, str, bool]]:
    events = p.diff(p.take_snapshots())
    p.commit()
    return [(e.kind, e.code, e.labels.get("value", ""), e.labels.get("previous", ""), e.is_healthy)
            for e in events]


def test_ecc_changes_are_published_once_with_value_and_previous(sim: SimGpuNode, tmp_path: Path) -> None:
    p = poller(sim, tmp_path)
    assert step(p) == []
    sim.set_ecc(1, dbe=2, sbe=5)
    assert step(p) == [("ecc", "dbe_volatile", "2", "0", False), ("ecc", "sbe_volatile", "5", "0", False)]
    assert step(p) == []
    sim.set_ecc(1, remap_pending=True, retired_pending=True, retired_dbe=3)
    assert step(p) == [("ecc", "row_remap_pending", "1", "0", False), ("ecc", "retired_pages_pending", "1", "0", False),
                       ("ecc", "retired_pages_dbe", "3", "0", False)]
    sim.set_ecc(1, remap_failure=True, remap_pending=False)
    assert step(p) == [("ecc", "row_remap_pending", "0", "1", True), ("ecc", "row_remap_failure", "1", "0", False)]
    sim.set_ecc(1, dbe=0)  # a reset cleared the volatile counter: baseline only
    assert step(p) == []
    sim.set_ecc(1, dbe=1)
    assert step(p) == [("ecc", "dbe_volatile", "1", "0", False)]


def test_event_ids_are_stable_and_baselines_survive_a_restart(sim: SimGpuNode, tmp_path: Path) -> None:
    p = poller(sim, tmp_path)
    step(p)
    sim.set_ecc(0, dbe=1)
    events = p.diff(p.take_snapshots())
    uuid = sim.identity(0).uuid
    assert [e.id for e in events] == [f"agent|node-a|boot-1|nvml|{uuid}|1|dbe_volatile"]
    assert events[0].is_fatal and events[0].gpu is not None and events[0].gpu.index == 0
    # not committed (the agent crashed before the hand-off finished): a restart computes the same id
    again = poller(sim, tmp_path).diff(p.take_snapshots())
    assert [e.id for e in again] == [e.id for e in events]
    p.commit()
    assert poller(sim, tmp_path).diff(p.take_snapshots()) == []


def test_lost_gpu_yields_gpu_lost_and_its_return_clears_it(sim: SimGpuNode, tmp_path: Path) -> None:
    p = poller(sim, tmp_path)
    step(p)
    sim.fall_off_bus(0)
    events = p.diff(p.take_snapshots())
    p.commit()
    assert [(e.kind, e.code, e.is_fatal) for e in events] == [("gpu_lost", "NVML_ERROR_GPU_IS_LOST", True)]
    assert events[0].gpu is not None and events[0].gpu.uuid == sim.identity(0).uuid
    assert step(p) == []


def test_thermal_slowdown_and_unsupported_fields(sim: SimGpuNode, tmp_path: Path) -> None:
    p = poller(sim, tmp_path)
    step(p)
    sim.set_thermal(0, temperature=93, throttle=0x40)
    assert step(p) == [("thermal", "hw_thermal_slowdown", "1", "0", False)]
    sim.set_unsupported(1, ["ecc", "remapped_rows"])
    sim.set_ecc(1, dbe=4, remap_pending=True)
    assert step(p) == []  # NOT_SUPPORTED fields are skipped, nothing invented
    assert p.latest[1].unsupported == frozenset({"ecc", "remapped_rows"})


@pytest.mark.parametrize(("text", "uid"), [
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f2c9a10_1111_2222_3333_444444444444"
     ".slice/cri-containerd-abc.scope\n", "5f2c9a10-1111-2222-3333-444444444444"),
    ("12:memory:/kubepods/besteffort/pod5f2c9a10-1111-2222-3333-444444444444/0123abcd\n",
     "5f2c9a10-1111-2222-3333-444444444444"),
    ("0::/system.slice/nvidia-persistenced.service\n", None),
], ids=["systemd-driver", "cgroupfs-v1", "host-process"])
def test_pod_uid_from_cgroup(text: str, uid: str | None) -> None:
    assert pod_uid_from_cgroup(text) == uid


def test_orphans_exclude_invisible_pids_host_processes_and_running_pods(sim: SimGpuNode) -> None:
    running = sim.add_pod("llama-worker-0", namespace="ml")
    sim.add_process(0, 100, 4 * GIB, running)
    sim.add_process(0, 101, 1 * GIB, None)  # a host process, no pod
    sim.add_process(1, 4242, 2 * GIB, "0f0f0f0f-1111-2222-3333-444444444444", visible=False)  # other namespace
    gone = sim.orphan(1, 555, 3 * GIB)
    snaps = [sim.snapshot(i) for i in range(2)]
    found = find_orphans(snaps, sim)
    assert [(o.gpu.index, o.pid, o.used_bytes, o.pod_uid) for o in found] == [(1, 555, 3 * GIB, gone)]
    # the real ProcPodView reading the same /proc tree agrees
    real = ProcPodView(sim.proc_root, running_pods=sim.running_pod_uids)
    assert [o.pid for o in find_orphans(snaps, real)] == [555]
    # a deleted pod whose process survived becomes an orphan
    sim.delete_pod("llama-worker-0")
    assert sorted(o.pid for o in find_orphans([sim.snapshot(i) for i in range(2)], sim)) == [100, 555]


def test_orphan_detector_confirms_then_reports_once_then_clears(sim: SimGpuNode) -> None:
    det = OrphanDetector(sim, node="node-a", boot_id=lambda: "boot-1", clock=lambda: NOW, confirmations=2)

    def check() -> list[tuple[str, bool, dict[str, str]]]:
        events = det.check([sim.snapshot(i) for i in range(2)])
        det.commit()
        return [(e.kind, e.is_healthy, e.labels) for e in events]

    sim.orphan(1, 555, 3 * GIB)
    assert check() == []  # seen once: could be a pod being torn down
    (kind, healthy, labels), = check()
    assert (kind, healthy) == ("memory_leak", False)
    assert labels["orphan_pids"] == "555" and labels["used_bytes"] == str(3 * GIB) and labels["pod_gone"] == "true"
    assert check() == []
    sim.remove_process(555)
    (kind, healthy, labels), = check()
    assert (kind, healthy) == ("memory_leak", True)


def test_an_orphan_event_names_the_pod_that_owned_the_memory(sim: SimGpuNode) -> None:
    det = OrphanDetector(sim, node="node-a", boot_id=lambda: "boot-1", clock=lambda: NOW, confirmations=1)
    gone = sim.orphan(1, 555, 3 * GIB)
    (event,) = det.check([sim.snapshot(i) for i in range(2)])
    assert event.origin.pod_uid == gone and event.labels["pod_uids"] == gone
