"""Memory trends (remediator.agent.memtrend): the pure rules over samples with an injected clock, the events
they become, and the state that survives an agent restart."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from handlers.base import History
from handlers.memleak import MemleakPolicy
from handlers.memleak import decide as memleak_decide
from remediator.agent.host import GpuHolder, GpuIdentity, GpuProcess, GpuSnapshot, PidInfo
from remediator.agent.memtrend import (
    GpuMemory,
    MemoryTrend,
    ProcessSample,
    TrendPolicy,
    TrendState,
    observe,
    over_baseline,
)
from remediator.agent.state import StateStore
from tests.unit.handlers.helpers import ev

GIB = 1 << 30
MIB = 1 << 20
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GPU = GpuIdentity(index=2, uuid="GPU-aaaa", pci_bus_id="0000:3a:00.0")
POLICY = TrendPolicy(factor=1.3, window=timedelta(minutes=10), warmup=timedelta(minutes=2),
                     min_growth_bytes=256 * MIB, no_owner_bytes=GIB, repeat=timedelta(minutes=1))
HOLDER = GpuHolder(namespace="training", name="pytorch-0-worker-0", uid="uid-1", container="pytorch")


def minutes(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


def sample(used: int, *, pid: int = 100, uid: str | None = "uid-1", holder: GpuHolder | None = HOLDER
           ) -> ProcessSample:
    return ProcessSample(GPU, pid, used, uid, holder)


def gpu(used: int, processes: int | None, reserved: int = 0) -> GpuMemory:
    return GpuMemory(GPU, used, reserved, processes)


Series = Sequence[tuple[float, list[ProcessSample], list[GpuMemory] | None]]


def run(series: Series, policy: TrendPolicy = POLICY,
        state: TrendState | None = None) -> tuple[TrendState, list[list[str]]]:
    """Feed ``(minute, samples, gpus)`` in order; the findings' kinds at each step."""
    st = state or TrendState()
    out: list[list[str]] = []
    for m, samples, gpus in series:
        st, found = observe(st, gpus if gpus is not None else [gpu(sum(s.used_bytes for s in samples), len(samples))],
                            samples, minutes(m), policy)
        out.append([f.what for f in found])
    return st, out


def leak(start: int, per_min: int, until: int, step: int = 1, *, pid: int = 100) -> Series:
    return [(m, [sample(start + per_min * m, pid=pid)], None) for m in range(0, until + 1, step)]


@pytest.mark.parametrize(
    ("per_min", "until", "reported_at"),
    [pytest.param(1 * GIB, 20, 16, id="steady-leak-reported-once-sustained"),
     pytest.param(0, 60, None, id="flat"),
     pytest.param(20 * MIB, 60, None, id="slow-drift-under-the-factor-in-an-hour")],
)
def test_growth_past_baseline_times_factor_sustained(per_min: int, until: int, reported_at: int | None) -> None:
    # baseline at 2 min (warm-up) = 10 GiB + 2 x per_min; over once >= 1.3 x; reported after 10 min over
    _, found = run(leak(10 * GIB, per_min, until))
    at = [m for m, f in enumerate(found) if "growth" in f]
    assert at == ([] if reported_at is None else [reported_at])


def test_a_spike_that_falls_back_restarts_the_window() -> None:
    series: list[tuple[float, list[ProcessSample], list[GpuMemory] | None]]
    series = [(m, [sample(10 * GIB)], None) for m in range(0, 3)]
    series += [(m, [sample(14 * GIB)], None) for m in range(3, 10)]  # over for 7 min
    series += [(10, [sample(10 * GIB)], None)]  # back under: the window starts again
    series += [(m, [sample(14 * GIB)], None) for m in range(11, 20)]  # over for 9 min: not yet
    _, found = run(series)
    assert not any(found)
    _, found = run([*series, (21, [sample(14 * GIB)], None)])
    assert found[-1] == ["growth"]


def test_min_growth_bytes_keeps_small_processes_quiet() -> None:
    _, found = run(leak(100 * MIB, 10 * MIB, 40))  # 100 MiB -> 500 MiB: 5 x, but under 256 MiB above baseline
    # over only from 376 MiB (256 MiB above the 120 MiB baseline), at minute 28; reported 10 minutes later
    assert [m for m, f in enumerate(found) if f] == [38]


def test_reported_again_only_after_another_factor() -> None:
    _, found = run(leak(10 * GIB, GIB, 60))
    assert [m for m, f in enumerate(found) if f] == [16, 24, 35, 49]


def test_a_restarted_container_inherits_its_baseline_and_passes_when_back_down() -> None:
    st, found = run(leak(10 * GIB, GIB, 16))
    assert found[-1] == ["growth"]
    assert over_baseline(st, GPU, POLICY)  # the health check's memory verdict: not back
    # the job is restarted: the old process is gone, the new one (same pod name and container, new UID) runs
    new = GpuHolder(namespace=HOLDER.namespace, name=HOLDER.name, uid="uid-2", container=HOLDER.container)
    st, found = run([(17, [sample(10 * GIB, pid=300, uid="uid-2", holder=new)], None)], state=st)
    assert not any(found)
    (t,) = st.processes.values()
    assert t.pid == 300 and t.baseline == 12 * GIB  # the container's baseline, at once: no warm-up
    assert over_baseline(st, GPU, POLICY) == []
    # and if it starts above the container's baseline x factor, it is not back
    leaked, _ = run(leak(10 * GIB, GIB, 16))
    st2, _ = run([(17, [sample(16 * GIB, pid=300, uid="uid-2", holder=new)], None)], state=leaked)
    assert over_baseline(st2, GPU, POLICY)


def test_ended_processes_are_forgotten_but_an_unreadable_list_keeps_them() -> None:
    st, _ = run(leak(10 * GIB, 0, 3))
    st_unread, _ = observe(st, [gpu(10 * GIB, None)], [], minutes(4), POLICY)
    assert len(st_unread.processes) == 1
    st_gone, _ = observe(st, [gpu(0, 0)], [], minutes(4), POLICY)
    assert st_gone.processes == {}


def test_the_number_of_tracked_processes_is_capped() -> None:
    policy = TrendPolicy(max_processes=3, max_containers=2)
    samples = [ProcessSample(GPU, pid, GIB, f"u{pid}", GpuHolder("ns", f"p{pid}", f"u{pid}", "c"))
               for pid in range(10)]
    st, _ = observe(TrendState(), [gpu(10 * GIB, 10)], samples, minutes(0), policy)
    st, _ = observe(st, [gpu(10 * GIB, 10)], samples, minutes(5), policy)
    assert len(st.processes) == 3 and st.untracked == 7 + 7
    assert len(st.containers) == 2


@pytest.mark.parametrize(
    ("series", "expected"),
    [pytest.param([(0, 8 * GIB, 0), (1, 8 * GIB, 0), (1.5, 8 * GIB, 0), (2, 8 * GIB, 0), (3, 0, 0)],
                  [[], ["no_owner"], [], ["no_owner"], ["no_owner_cleared"]], id="held-repeated-then-freed"),
     pytest.param([(0, 8 * GIB, 0), (1, 8 * GIB, 1)], [[], []], id="an-owner-appears-before-confirmation"),
     pytest.param([(0, GIB + 100 * MIB, 0), (1, GIB + 100 * MIB, 0)], [[], []], id="reserve-subtracted"),
     pytest.param([(0, 8 * GIB, None), (1, 8 * GIB, None)], [[], []], id="process-list-unreadable")],
)
def test_framebuffer_held_with_no_process(series: list[tuple[float, int, int | None]],
                                          expected: list[list[str]]) -> None:
    st = TrendState()
    out = []
    for m, used, procs in series:
        st, found = observe(st, [gpu(used, procs, reserved=200 * MIB)], [], minutes(m), POLICY)
        out.append([f.what for f in found])
    assert out == expected


# --- the agent side: events, the handler's verdict, restart -------------------------------------------


class _Pods:
    def __init__(self, uids: dict[int, str]) -> None:
        self.uids = uids

    def running_pod_uids(self) -> frozenset[str] | None:
        return frozenset(self.uids.values())

    def pid_info(self, pid: int) -> PidInfo:
        return PidInfo(visible=True, pod_uid=self.uids.get(pid))


class _Holders:
    def gpu_holders(self, gpu: GpuIdentity) -> tuple[GpuHolder, ...] | None:
        return (HOLDER,)


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _snap(used: int) -> GpuSnapshot:
    return GpuSnapshot(identity=GPU, memory_used=used + 300 * MIB, memory_total=80 * GIB,
                       memory_reserved=300 * MIB, processes=(GpuProcess(100, used),))


def _trend(tmp_path: Path, clock: _Clock, boot: str = "boot-1") -> MemoryTrend:
    return MemoryTrend(node="gpu-node-0", state=StateStore(tmp_path), boot_id=lambda: boot,
                       pods=_Pods({100: "uid-1"}), pod_resources=_Holders(), policy=POLICY, interval_s=60,
                       clock=clock)


def test_events_name_the_pod_and_the_handler_restarts_the_job(tmp_path: Path) -> None:
    clock = _Clock()
    trend = _trend(tmp_path, clock)
    events = []
    for m in range(0, 17):
        clock.now = minutes(m)
        events += trend.sample([_snap(10 * GIB + m * GIB)])
        trend.commit()
    (e,) = events
    assert (e.kind, e.code, e.node, e.gpu and e.gpu.uuid) == ("memory_leak", "process_growth", "gpu-node-0", "GPU-aaaa")
    assert (e.origin.namespace, e.origin.pod, e.origin.pod_uid, e.origin.container) == (
        "training", "pytorch-0-worker-0", "uid-1", "pytorch")
    assert e.labels["pid"] == "100" and e.labels["baseline_bytes"] == str(12 * GIB)
    assert e.labels["process_used_bytes"] == str(26 * GIB) and e.labels["growth_window_s"] == "600"
    assert e.id == "agent|gpu-node-0|boot-1|memgrowth|GPU-aaaa|100|uid-1|1"
    verdict = memleak_decide(e, History(), minutes(16), MemleakPolicy(growth_min_span=timedelta(minutes=10)))
    assert verdict.decision is not None
    assert verdict.decision.playbook == "memory-leak-growth"
    assert verdict.decision.labels["cause"] == "growth"


def test_a_sample_only_every_interval(tmp_path: Path) -> None:
    clock = _Clock()
    trend = _trend(tmp_path, clock)
    for s in range(0, 300, 5):  # a poll every 5 s for 5 min, a sample every 60 s
        clock.now = T0 + timedelta(seconds=s)
        trend.sample([_snap(GIB)])
        trend.commit()
    assert trend.samples == 5


def test_baselines_survive_a_restart_and_a_reboot_keeps_only_the_containers(tmp_path: Path) -> None:
    clock = _Clock()
    trend = _trend(tmp_path, clock)
    for m in range(0, 17):
        clock.now = minutes(m)
        trend.sample([_snap(10 * GIB + m * GIB)])
        trend.commit()
    again = _trend(tmp_path, clock)
    assert again.state == trend.state
    clock.now = minutes(18)
    assert again.sample([_snap(28 * GIB)]) == []  # not reported twice: 28 < 26 x 1.3
    rebooted = _trend(tmp_path, clock, boot="boot-2")
    assert rebooted.state.processes == {} and rebooted.state.containers == trend.state.containers


@pytest.mark.parametrize(
    ("used", "window_s", "decides"),
    [pytest.param(13 * GIB, 1200, True, id="at-1.3x-for-the-min-span"),
     pytest.param(13 * GIB - 1, 1200, False, id="just-under-the-factor"),
     pytest.param(20 * GIB, 1199, False, id="not-yet-sustained")],
)
def test_the_handler_judges_the_agents_baseline_report(used: int, window_s: int, decides: bool) -> None:
    e = ev("memory_leak", "process_growth", labels={
        "pid": "100", "process_used_bytes": str(used), "baseline_bytes": str(10 * GIB),
        "growth_bytes_per_min": str(MIB), "growth_window_s": str(window_s)})
    v = memleak_decide(e, History(), T0, MemleakPolicy())
    assert (v.decision is not None) == decides
    if v.decision is not None:
        assert (v.decision.playbook, v.decision.labels["cause"]) == ("memory-leak-growth", "growth")


def test_ownerless_memory_reported_by_the_agent_becomes_a_decision_after_orphan_for(tmp_path: Path) -> None:
    clock = _Clock()
    trend = _trend(tmp_path, clock)
    held = GpuSnapshot(identity=GPU, memory_used=8 * GIB + 300 * MIB, memory_total=80 * GIB,
                       memory_reserved=300 * MIB, processes=())
    policy = MemleakPolicy(orphan_for=timedelta(minutes=10))
    history, decided = History(), []
    for m in range(0, 16):
        clock.now = minutes(m)
        for e in trend.sample([held]):
            v = memleak_decide(e, history, clock.now, policy)
            history = v.history
            decided += [(m, v.decision.labels["cause"])] if v.decision else []
        trend.commit()
    assert decided == [(11, "no_process")]  # first reported at minute 1, acted on once it lasted 10 minutes
    clock.now = minutes(16)
    (cleared,) = trend.sample([GpuSnapshot(identity=GPU, memory_used=300 * MIB, memory_total=80 * GIB,
                                           memory_reserved=300 * MIB, processes=())])
    assert cleared.is_healthy and cleared.code == "fb_no_owner"


class _Gone(_Pods):
    def running_pod_uids(self) -> frozenset[str] | None:
        return frozenset()


def test_the_memory_check_fails_while_a_process_outlives_its_pod(tmp_path: Path) -> None:
    clock = _Clock()
    trend = MemoryTrend(node="gpu-node-0", state=StateStore(tmp_path), boot_id=lambda: "b", pods=_Gone({100: "uid-1"}),
                        pod_resources=None, policy=POLICY, clock=clock)
    (why,) = trend.check(_snap(3 * GIB))
    assert "pid 100" in why and "uid-1 is gone" in why
    assert _trend(tmp_path / "running", clock).check(_snap(3 * GIB)) == []
