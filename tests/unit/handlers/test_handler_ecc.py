"""The ECC handler: DBE, row remap, retirement, and the correctable-rate watch, on an injected clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers import default_registry, memleak
from handlers import xid as xid_handler
from handlers.base import History
from handlers.ecc import EccPolicy, canonical_code, evaluate
from handlers.incidents import gpu_group
from handlers.xid import XidPolicy
from handlers.xid import evaluate as xid_evaluate
from tests.unit.handlers.helpers import GPU_A, GPU_B, JOB, T0, at, decisions, ev, run

POLICY = EccPolicy()


def _decide(e, h, now):  # type: ignore[no-untyped-def]
    return evaluate(e, h, now, POLICY)


def ecc(code: str | int, value: str | None, **kw: object):  # type: ignore[no-untyped-def]
    labels = {} if value is None else {"value": value}
    return ev("ecc", code, labels=labels, **kw)  # type: ignore[arg-type]


def test_registered_for_ecc() -> None:
    assert [s.name for s in default_registry().for_event(ecc("dbe_volatile", "1"))] == ["ecc"]


@pytest.mark.parametrize(
    ("code", "value", "playbook"),
    [
        pytest.param("dbe_volatile", "2", "gpu-memory-fatal", id="dbe-volatile"),
        pytest.param("dbe_volatile", "0", None, id="dbe-volatile-zero"),
        pytest.param(311, "1", "gpu-memory-fatal", id="dbe-dcgm-field-id"),
        pytest.param("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "1", "gpu-memory-fatal", id="dbe-dcgm-field-name"),
        pytest.param("dbe_volatile", None, "gpu-memory-fatal", id="dbe-alert-without-value"),
        pytest.param("row_remap_pending", "1", "row-remap-pending", id="remap-pending"),
        pytest.param("row_remap_pending", "0", None, id="remap-not-pending"),
        pytest.param("retired_pages_pending", "1", "row-remap-pending", id="retirement-pending"),
        pytest.param("row_remap_failure", "1", "memory-retirement-failure", id="remap-failure"),
        pytest.param("DCGM_FI_DEV_ROW_REMAP_FAILED", "1", "memory-retirement-failure", id="remap-failed-new-name"),
        pytest.param("retirement_failure", "1", "memory-retirement-failure", id="retirement-failure"),
        pytest.param("sram_threshold_exceeded", "1", "memory-retirement-failure", id="sram-threshold"),
        pytest.param("retired_pages_dbe", "60", "memory-retirement-failure", id="retired-pages-at-limit"),
        pytest.param("retired_pages_dbe", "59", None, id="retired-pages-under-limit"),
        pytest.param("remapped_rows_correctable", "12", None, id="remapped-rows-trend-only"),
        pytest.param("sbe_volatile", "100000", None, id="sbe-first-reading-no-rate"),
        pytest.param("dbe_aggregate", "3", None, id="dbe-aggregate-first-reading-is-baseline"),
        pytest.param("bogus_counter", "1", None, id="unknown-code-recorded"),
        pytest.param("DCGM_FR_VOLATILE_DBE_DETECTED", None, "gpu-memory-fatal", id="dcgm-health-dbe"),
        pytest.param("DCGM_FR_PENDING_ROW_REMAP", None, "row-remap-pending", id="dcgm-health-remap-pending"),
        pytest.param("DCGM_FR_RETIRED_PAGES_LIMIT", None, "memory-retirement-failure", id="dcgm-health-pages"),
        pytest.param("DCGM_FR_UNCONTAINED_ERROR", None, "gpu-memory-fatal", id="dcgm-health-uncontained"),
        pytest.param("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE", "1", None, id="bank-histogram-trend-only"),
    ],
)
def test_single_value(code: str | int, value: str | None, playbook: str | None) -> None:
    e = ecc(code, value)
    v = _decide(e, History(), at(0))
    assert (v.decision.playbook if v.decision else None) == playbook
    assert v.reason
    assert any(s.event_id == e.id for s in v.history.sightings)
    if v.decision is not None:
        d = v.decision
        assert d.group == gpu_group("node-1", GPU_A) and d.handler == "ecc" and d.decided_at == at(0)
        assert d.evidence[0].event_id == e.id and "=" in d.evidence[0].detail


def test_remap_pending_is_reset_when_idle() -> None:
    v = _decide(ecc("row_remap_pending", "1"), History(), at(0))
    assert v.decision is not None and v.decision.labels == {"reset_when": "idle"}


def test_value_without_gpu_is_recorded() -> None:
    v = _decide(ecc("dbe_volatile", "5", gpu=None), History(), at(0))
    assert v.decision is None and "names no GPU" in v.reason


def test_healthy_flag_is_recorded() -> None:
    v = _decide(ecc("row_remap_pending", "0", is_healthy=True), History(), at(0))
    assert v.decision is None and "healthy" in v.reason


@pytest.mark.parametrize(
    ("values", "playbooks"),
    [pytest.param(["3", "3"], [], id="aggregate-unchanged"),
     pytest.param(["3", "4"], ["gpu-memory-fatal"], id="aggregate-rises"),
     pytest.param(["3", "4", "4", "5"], ["gpu-memory-fatal"], id="aggregate-rises-twice-one-incident")],
)
def test_dbe_aggregate_acts_on_rise(values: list[str], playbooks: list[str]) -> None:
    verdicts, _ = run(_decide, [(ecc("dbe_aggregate", val), at(minutes=i)) for i, val in enumerate(values)])
    assert decisions(verdicts) == playbooks


def test_retired_pages_add_dbe_and_sbe() -> None:
    verdicts, _ = run(_decide, [(ecc("retired_pages_sbe", "40"), at(0)), (ecc("retired_pages_dbe", "20"), at(1))])
    assert decisions(verdicts) == ["memory-retirement-failure"]
    assert "60 retired pages" in verdicts[1].reason


def test_dbe_polled_repeatedly_is_one_incident() -> None:
    verdicts, h = run(_decide, [(ecc("dbe_volatile", "1"), at(seconds=30 * i)) for i in range(20)])
    assert decisions(verdicts) == ["gpu-memory-fatal"]
    inc = h.open_incident(gpu_group("node-1", GPU_A))
    assert inc is not None and inc.count == 20
    assert len(h.sightings) == 2  # identical readings coalesce


def test_xid_48_and_dbe_value_are_one_incident() -> None:
    v1 = xid_evaluate(ev("xid", 48), History(), at(0), XidPolicy())
    v2 = _decide(ecc("dbe_volatile", "1"), v1.history, at(30))
    assert v1.decision is not None and v2.decision is None
    assert v2.updated_incident == v1.decision.incident_id


def test_remap_failure_supersedes_open_dbe_incident() -> None:
    verdicts, h = run(_decide, [(ecc("dbe_volatile", "1"), at(0)), (ecc("row_remap_failure", "1"), at(30))])
    assert decisions(verdicts) == ["gpu-memory-fatal", "memory-retirement-failure"]
    assert len(h.incidents) == 1 and h.incidents[0].playbook == "memory-retirement-failure"


# --- correctable rate ------------------------------------------------------------------------------


def _sbe_series(per_min: int, minutes: int, start: int = 0, base: int = 0) -> list[tuple[object, object]]:
    return [(ecc("sbe_volatile", str(base + per_min * i)), at(minutes=start + i)) for i in range(minutes + 1)]


def test_sbe_rate_over_threshold_watches_then_decides() -> None:
    verdicts, _h = run(_decide, _sbe_series(per_min=20, minutes=40))  # type: ignore[arg-type]
    made = [(i, v.decision.playbook) for i, v in enumerate(verdicts) if v.decision]
    assert made == [(31, "ecc-correctable-rate")]  # watch starts at minute 1, decides 30 min later
    assert "watching for 30 min" in verdicts[1].reason
    assert "watched 15 of 30 min" in verdicts[16].reason
    assert all(v.updated_incident for v in verdicts[32:])


def test_sbe_rate_under_threshold_never_decides() -> None:
    verdicts, _ = run(_decide, _sbe_series(per_min=5, minutes=120))  # type: ignore[arg-type]
    assert decisions(verdicts) == []
    assert "recorded" in verdicts[-1].reason


def test_sbe_rate_dropping_ends_the_watch() -> None:
    steps = _sbe_series(per_min=20, minutes=10) + _sbe_series(per_min=0, minutes=120, start=11, base=200)
    verdicts, _ = run(_decide, steps)  # type: ignore[arg-type]
    assert decisions(verdicts) == []
    assert any("watch ended" in v.reason for v in verdicts)


@pytest.mark.parametrize(
    ("watch_minutes", "decides"),
    [pytest.param(29, False, id="just-inside-watch"), pytest.param(30, True, id="watch-period-reached")],
)
def test_sbe_watch_boundary(watch_minutes: int, decides: bool) -> None:
    steps = _sbe_series(per_min=20, minutes=1 + watch_minutes)
    verdicts, _ = run(_decide, steps)  # type: ignore[arg-type]
    assert (verdicts[-1].decision is not None) == decides


def test_sbe_counter_reset_starts_the_rate_afresh() -> None:
    steps = [(ecc("sbe_volatile", "0"), at(0)), (ecc("sbe_volatile", "10000"), at(minutes=30)),
             (ecc("sbe_volatile", "0"), at(minutes=31)), (ecc("sbe_volatile", "1"), at(minutes=33))]
    verdicts, _ = run(_decide, steps)
    assert "watching" in verdicts[1].reason
    assert "watch ended" in verdicts[3].reason  # 1 error in 2 min after the reset


@pytest.mark.parametrize(
    ("rise", "over"),
    [pytest.param(600, True, id="exactly-threshold-over-window"),
     pytest.param(599, False, id="just-under-threshold")],
)
def test_sbe_rate_uses_the_reading_at_the_window_start(rise: int, over: bool) -> None:
    # A flat counter for hours, then a rise: the rate is the rise over the one-hour window.
    steps = [(ecc("sbe_volatile", "1000"), at(hours=h)) for h in range(3)] + [
        (ecc("sbe_volatile", str(1000 + rise)), at(hours=3))]
    verdicts, _ = run(_decide, steps)
    assert ("over the threshold" in verdicts[-1].reason) == over


def test_policy_is_a_parameter() -> None:
    policy = EccPolicy(sbe_rate_per_min=1.0, sbe_watch=timedelta(minutes=5), retired_pages_limit=10)
    verdicts, _ = run(lambda e, h, n: evaluate(e, h, n, policy), _sbe_series(per_min=2, minutes=8))  # type: ignore[arg-type]
    assert decisions(verdicts) == ["ecc-correctable-rate"]
    v = evaluate(ecc("retired_pages_dbe", "10"), History(), at(0), policy)
    assert v.decision is not None


@pytest.mark.parametrize(
    ("code", "name"),
    [pytest.param(310, "sbe_volatile", id="310"), pytest.param("396", "row_remap_pending", id="396-text"),
     pytest.param("dcgm_fi_dev_retired_pending", "retired_pages_pending", id="lower-name"),
     pytest.param("nope", None, id="unknown"), pytest.param(None, None, id="none")],
)
def test_canonical_code(code: int | str | None, name: str | None) -> None:
    assert canonical_code(code) == name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dbe_volatile", "row_remap_pending", "row_remap_failure",
                                           "sbe_volatile", "retired_pages_pending"]),
                          st.integers(0, 5000), st.integers(0, 900)), min_size=1, max_size=40))
def test_never_more_than_one_open_incident_per_gpu(seq: list[tuple[str, int, int]]) -> None:
    h = History()
    now = T0
    for code, value, gap in seq:
        now += timedelta(seconds=gap)
        v = _decide(ecc(code, str(value)), h, now)
        h = v.history
        assert len([i for i in h.incidents if i.group == gpu_group("node-1", GPU_A)]) <= 1
        assert v.decision is None or v.updated_incident is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["xid48", "xid63", "xid119", "xid79", "xid13", "dbe", "remap", "fail",
                                           "leak"]),
                          st.sampled_from([GPU_A, GPU_B]), st.integers(0, 400)), min_size=1, max_size=40))
def test_families_share_one_incident_per_group_on_a_node(seq: list[tuple[str, str, int]]) -> None:
    h = History()
    now = T0
    for what, gpu, gap in seq:
        now += timedelta(seconds=gap)
        if what.startswith("xid"):
            v = xid_handler.evaluate(ev("xid", int(what[3:]), gpu=gpu, labels={JOB: str(gap % 4)}), h, now,
                                     XidPolicy())
        elif what == "leak":
            v = memleak.evaluate(ev("memory_leak", "orphaned_memory", gpu=gpu, labels={"orphan_pids": "1"}), h, now,
                                 memleak.MemleakPolicy())
        else:
            code = {"dbe": "dbe_volatile", "remap": "row_remap_pending", "fail": "row_remap_failure"}[what]
            v = _decide(ecc(code, "1", gpu=gpu), h, now)
        h = v.history
        groups = [i.group for i in h.incidents]
        assert len(groups) == len(set(groups))
        assert v.decision is None or v.updated_incident is None
