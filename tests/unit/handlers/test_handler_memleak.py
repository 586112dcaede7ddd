"""The memory-leak handler: orphans, memory held without an owner, growth trends, OOM, PID namespaces."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers import default_registry
from handlers.base import History
from handlers.incidents import gpu_group
from handlers.memleak import GIB, MIB, MemleakPolicy, evaluate
from handlers.xid import XidPolicy
from handlers.xid import evaluate as xid_evaluate
from tests.unit.handlers.helpers import GPU_A, JOB, T0, at, decisions, ev, run

POLICY = MemleakPolicy()


def _decide(e, h, now):  # type: ignore[no-untyped-def]
    return evaluate(e, h, now, POLICY)


def leak(**labels: str):  # type: ignore[no-untyped-def]
    return ev("memory_leak", "fb_used", labels=labels)


def oom(**labels: str):  # type: ignore[no-untyped-def]
    return ev("cuda_oom", None, labels=labels)


def test_registered_for_both_kinds() -> None:
    registry = default_registry()
    assert [s.name for s in registry.for_event(leak())] == ["memleak"]
    assert [s.name for s in registry.for_event(oom())] == ["memleak"]


@pytest.mark.parametrize(
    ("labels", "cause"),
    [
        pytest.param({"orphan_pids": "4242,4243", "used_bytes": str(8 * GIB)}, "orphan", id="orphan-pids"),
        pytest.param({"orphan_pids": " ", "used_bytes": str(8 * GIB), "process_count": "2"}, None,
                     id="blank-orphans-with-owner"),
        pytest.param({"orphan_pids": "4242", "host_view": "false"}, None, id="pid-namespace-excluded"),
        pytest.param({"used_bytes": str(8 * GIB), "process_count": "0", "host_view": "false"}, None,
                     id="empty-process-list-in-container"),
        pytest.param({"used_bytes": str(8 * GIB), "process_count": "0"}, None, id="no-process-first-sighting"),
        pytest.param({"used_bytes": str(GIB // 2), "process_count": "0"}, None, id="under-threshold"),
        pytest.param({"used_bytes": str(GIB + 400 * MIB), "reserved_bytes": str(500 * MIB), "process_count": "0"},
                     None, id="reserve-subtracted"),
    ],
)
def test_single_report(labels: dict[str, str], cause: str | None) -> None:
    e = leak(**labels)
    v = _decide(e, History(), at(0))
    assert (v.decision.labels["cause"] if v.decision else None) == cause
    assert v.reason
    assert any(s.event_id == e.id for s in v.history.sightings)
    if v.decision:
        d = v.decision
        assert (d.playbook, d.group, d.handler) == ("memory-leak", gpu_group("node-1", GPU_A), "memleak")
        assert d.labels["orphan_pids"] == "4242,4243"


def test_pid_namespace_reason_says_so() -> None:
    v = _decide(leak(used_bytes=str(8 * GIB), process_count="0", host_view="false"), History(), at(0))
    assert "PID namespace" in v.reason


@pytest.mark.parametrize(
    ("labels", "cause"),
    [pytest.param({"process_count": "0"}, "no_process", id="no-process"),
     pytest.param({"pod_gone": "true", "pod": "train-7", "process_count": "1"}, "pod_gone", id="pod-gone")],
)
def test_memory_without_owner_for_ten_minutes(labels: dict[str, str], cause: str) -> None:
    steps = [(leak(used_bytes=str(4 * GIB), **labels), at(minutes=m)) for m in range(0, 13)]
    verdicts, h = run(_decide, steps)
    made = [(i, v.decision.labels["cause"]) for i, v in enumerate(verdicts) if v.decision]
    assert made == [(10, cause)]
    assert "watching (5 of 10 min)" in verdicts[5].reason
    assert all(v.updated_incident for v in verdicts[11:])
    assert len(h.sightings) == 2  # a steady report coalesces


@pytest.mark.parametrize(
    ("last", "decides"),
    [pytest.param(timedelta(minutes=10), True, id="exactly-orphan-for"),
     pytest.param(timedelta(minutes=9, seconds=59), False, id="just-short")],
)
def test_orphan_for_boundary(last: timedelta, decides: bool) -> None:
    steps = [(leak(used_bytes=str(4 * GIB), process_count="0"), T0),
             (leak(used_bytes=str(4 * GIB), process_count="0"), T0 + last)]
    verdicts, _ = run(_decide, steps)
    assert (verdicts[-1].decision is not None) == decides


def test_an_owner_in_between_restarts_the_clock() -> None:
    steps = [(leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=0)),
             (leak(used_bytes=str(4 * GIB), process_count="1"), at(minutes=5)),
             (leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=6)),
             (leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=12)),
             (leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=16))]
    verdicts, _ = run(_decide, steps)
    assert [v.decision is not None for v in verdicts] == [False, False, False, False, True]


def _samples(pid: str, start_bytes: int, per_min: int, minutes: list[int]) -> list[tuple[object, object]]:
    return [(leak(pid=pid, process_used_bytes=str(start_bytes + per_min * m)), at(minutes=m)) for m in minutes]


@pytest.mark.parametrize(
    ("per_min", "minutes", "decides"),
    [pytest.param(100 * MIB, list(range(0, 21, 5)), True, id="steady-growth-20-min"),
     pytest.param(100 * MIB, list(range(0, 16, 5)), False, id="too-short-a-span"),
     pytest.param(10 * MIB, list(range(0, 31, 5)), False, id="slow-growth"),
     pytest.param(0, list(range(0, 31, 5)), False, id="flat")],
)
def test_per_process_growth(per_min: int, minutes: list[int], decides: bool) -> None:
    verdicts, _ = run(_decide, _samples("77", 2 * GIB, per_min, minutes))  # type: ignore[arg-type]
    d = verdicts[-1].decision
    assert (d is not None) == decides
    if d:
        assert d.labels == {"cause": "growth", "pid": "77"}


def test_sawtooth_is_not_a_trend() -> None:
    values = [2, 6, 2, 6, 2, 9]
    steps = [(leak(pid="9", process_used_bytes=str(v * GIB)), at(minutes=5 * i)) for i, v in enumerate(values)]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == []


def test_growth_outside_window_is_forgotten() -> None:
    old = _samples("5", GIB, 200 * MIB, [0, 5, 10])
    new = _samples("5", 3 * GIB, 0, [60, 65])
    verdicts, _ = run(_decide, old + new)  # type: ignore[arg-type]
    assert decisions(verdicts) == []


@pytest.mark.parametrize(
    ("rate", "window_s", "decides"),
    [pytest.param(64 * MIB, 1200, True, id="agent-trend-at-threshold"),
     pytest.param(64 * MIB - 1, 1200, False, id="agent-trend-under"),
     pytest.param(500 * MIB, 600, False, id="agent-trend-too-short")],
)
def test_agent_reported_growth(rate: int, window_s: int, decides: bool) -> None:
    v = _decide(leak(pid="1", growth_bytes_per_min=str(rate), growth_window_s=str(window_s)), History(), at(0))
    assert (v.decision is not None) == decides


@pytest.mark.parametrize(
    ("labels", "decides"),
    [pytest.param({"capacity_bytes": str(80 * GIB), "free_bytes": str(GIB), "process_bytes": str(60 * GIB)}, True,
                  id="held-elsewhere"),
     pytest.param({"capacity_bytes": str(80 * GIB), "free_bytes": str(GIB), "process_bytes": str(78 * GIB + 512 * MIB)},
                  False,
                  id="own-memory"),
     pytest.param({"capacity_bytes": str(80 * GIB), "free_bytes": str(GIB), "process_bytes": str(60 * GIB),
                   "gpu_pods": "2"}, False, id="shared-gpu"),
     pytest.param({}, False, id="message-without-numbers")],
)
def test_cuda_oom(labels: dict[str, str], decides: bool) -> None:
    v = _decide(oom(**{JOB: "train", **labels}), History(), at(0))
    assert (v.decision is not None) == decides
    if v.decision:
        assert v.decision.labels["cause"] == "oom_held_elsewhere" and v.decision.job == "train"
    else:
        assert "recorded" in v.reason


def test_leak_folds_into_a_more_severe_open_gpu_incident() -> None:
    v1 = xid_evaluate(ev("xid", 48), History(), at(0), XidPolicy())
    v2 = _decide(leak(orphan_pids="1"), v1.history, at(10))
    assert v2.decision is None and v2.updated_incident == v1.decision.incident_id  # type: ignore[union-attr]


def test_without_gpu_is_recorded() -> None:
    v = _decide(ev("memory_leak", None, gpu=None, labels={"orphan_pids": "3"}), History(), at(0))
    assert v.decision is None and "names no GPU" in v.reason


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["orphan", "noproc", "owned", "sample"]), st.integers(0, 600)),
                min_size=1, max_size=40))
def test_never_two_open_incidents_per_gpu(seq: list[tuple[str, int]]) -> None:
    h = History()
    now = T0
    for i, (what, gap) in enumerate(seq):
        now += timedelta(seconds=gap)
        e = {"orphan": leak(orphan_pids="1"), "noproc": leak(used_bytes=str(4 * GIB), process_count="0"),
             "owned": leak(used_bytes=str(4 * GIB), process_count="1"),
             "sample": leak(pid="2", process_used_bytes=str(i * GIB))}[what]
        v = _decide(e, h, now)
        h = v.history
        assert len(h.incidents) <= 1
        assert v.decision is None or v.updated_incident is None


def test_agent_orphan_event_and_its_clearing() -> None:
    found = ev("memory_leak", "orphaned_memory",
               labels={"orphan_pids": "11,12", "used_bytes": str(3 * GIB), "pod_gone": "true", "pod_uids": "u1"})
    cleared = ev("memory_leak", "orphaned_memory", labels={"orphan_pids": ""}, is_healthy=True)
    verdicts, _ = run(_decide, [(found, at(0)), (cleared, at(60))])
    assert decisions(verdicts) == ["memory-leak"]
    assert verdicts[1].decision is None and "clear" in verdicts[1].reason


def test_healthy_report_ends_a_no_owner_run() -> None:
    steps = [(leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=0)),
             (ev("memory_leak", "orphaned_memory", labels={"orphan_pids": ""}, is_healthy=True), at(minutes=5)),
             (leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=6)),
             (leak(used_bytes=str(4 * GIB), process_count="0"), at(minutes=12))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == []
