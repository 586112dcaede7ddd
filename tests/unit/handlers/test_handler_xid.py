"""The Xid handler: catalog routing, co-occurrence rules, application repeats, flapping, windows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handlers
from handlers import default_registry
from handlers.base import History, Incident
from handlers.incidents import close_incident, gpu_group, node_group
from handlers.xid import XidPolicy, evaluate
from remediator.contracts import Origin
from tests.unit.handlers.helpers import GPU_A, GPU_B, GPU_C, JOB, T0, at, decisions, ev, run

POLICY = XidPolicy()


def xid(code: int, **kw: object) -> object:
    return ev("xid", code, **kw)  # type: ignore[arg-type]


def _decide(e, h, now):  # type: ignore[no-untyped-def]
    return evaluate(e, h, now, POLICY)


# --- registration ---------------------------------------------------------------------------------


def test_default_registry_has_xid_for_its_kinds() -> None:
    spec = default_registry().specs["xid"]
    assert spec.kinds == frozenset({"xid", "sxid", "gpu_lost"})
    assert spec.history_key is None  # per node
    assert spec.policy == XidPolicy()
    assert [s.name for s in default_registry().for_event(ev("xid", 79))] == ["xid"]


def test_the_registered_decide_uses_the_policy_it_was_registered_with() -> None:
    spec = handlers.build_registry(handlers.HandlerPolicies(xid=XidPolicy.from_settings(3600, 2))).specs["xid"]
    v1 = spec.decide(ev("xid", 13, labels={JOB: "a"}), History(), at(0), spec.policy)
    v2 = spec.decide(ev("xid", 13, labels={JOB: "b"}), v1.history, at(60), spec.policy)
    assert v1.decision is None
    assert v2.decision is not None and v2.decision.playbook == "app-xid-hardware-suspect"


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        XidPolicy(app_threshold=0)
    with pytest.raises(ValueError):
        XidPolicy(app_window=timedelta(0))


# --- single events: the decision table ------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "playbook", "group"),
    [
        pytest.param(79, "gpu-lost", node_group("node-1"), id="79-gpu-lost-node-wide"),
        pytest.param(48, "gpu-memory-fatal", gpu_group("node-1", GPU_A), id="48-dbe"),
        pytest.param(95, "gpu-memory-fatal", gpu_group("node-1", GPU_A), id="95-uncontained"),
        pytest.param(140, "gpu-memory-fatal", gpu_group("node-1", GPU_A), id="140-ecc-escape"),
        pytest.param(63, "row-remap-pending", gpu_group("node-1", GPU_A), id="63-remap-pending"),
        pytest.param(64, "memory-retirement-failure", gpu_group("node-1", GPU_A), id="64-remap-failure"),
        pytest.param(74, "nvlink", gpu_group("node-1", GPU_A), id="74-nvlink"),
        pytest.param(149, "nvlink", gpu_group("node-1", GPU_A), id="149-nvlink5"),
        pytest.param(119, "gsp-hang", gpu_group("node-1", GPU_A), id="119-gsp"),
        pytest.param(120, "gsp-hang", gpu_group("node-1", GPU_A), id="120-gsp"),
        pytest.param(62, "gsp-hang", gpu_group("node-1", GPU_A), id="62-halt"),
        pytest.param(110, "gpu-reset", gpu_group("node-1", GPU_A), id="110-reset-bucket"),
        pytest.param(151, "node-reboot", node_group("node-1"), id="151-restart-vm"),
        pytest.param(1, "unknown-xid", gpu_group("node-1", GPU_A), id="1-unused-escalates"),
        pytest.param(167, "unknown-xid", gpu_group("node-1", GPU_A), id="167-empty-bucket"),
        pytest.param(4242, "unknown-xid", gpu_group("node-1", GPU_A), id="not-in-catalog"),
    ],
)
def test_single_xid_decides(code: int, playbook: str, group: str) -> None:
    e = ev("xid", code)
    v = _decide(e, History(), at(0))
    assert v.decision is not None
    d = v.decision
    assert (d.playbook, d.group, d.handler, d.node) == (playbook, group, "xid", "node-1")
    assert d.decided_at == at(0) and d.event_id == e.id and d.code == code
    assert d.evidence and d.evidence[0].event_id == e.id
    assert d.reason and "\n" not in d.reason
    assert v.history.open_incident(group) is not None
    assert any(s.event_id == e.id for s in v.history.sightings)


@pytest.mark.parametrize(
    "code",
    [pytest.param(13, id="13"), pytest.param(31, id="31"), pytest.param(43, id="43"),
     pytest.param(45, id="45-solo"), pytest.param(94, id="94-contained"), pytest.param(8, id="8-restart-app"),
     pytest.param(106, id="106-ignore"), pytest.param(92, id="92-sbe-rate")],
)
def test_application_and_ignore_codes_are_recorded_once(code: int) -> None:
    e = ev("xid", code, labels={JOB: "train-1"})
    v = _decide(e, History(), at(0))
    assert v.decision is None
    assert "recorded" in v.reason
    assert v.history.incidents == ()
    assert [s.event_id for s in v.history.sightings] == [e.id]


def test_xid_13_once_says_recorded_with_the_count() -> None:
    v = _decide(ev("xid", 13, labels={JOB: "a"}), History(), at(0))
    assert v.decision is None
    assert "recorded" in v.reason and "1 of 3" in v.reason


def test_gpu_lost_kind_is_node_wide() -> None:
    v = _decide(ev("gpu_lost", None, message="GPU_IS_LOST"), History(), at(0))
    assert v.decision is not None
    assert (v.decision.playbook, v.decision.group) == ("gpu-lost", node_group("node-1"))


def test_xid_without_gpu_identity_is_grouped_on_the_node() -> None:
    v = _decide(ev("xid", 48, gpu=None), History(), at(0))
    assert v.decision is not None and v.decision.group == node_group("node-1")


@pytest.mark.parametrize(
    ("fatal", "playbook"),
    [pytest.param(True, "nvlink", id="fatal-sxid"), pytest.param(False, None, id="nonfatal-sxid")],
)
def test_sxid(fatal: bool, playbook: str | None) -> None:
    v = _decide(ev("sxid", 20034, gpu=None, is_fatal=fatal), History(), at(0))
    assert (v.decision.playbook if v.decision else None) == playbook
    if v.decision:
        assert v.decision.group == node_group("node-1")


def test_healthy_xid_event_does_nothing() -> None:
    v = _decide(ev("xid", 48, is_healthy=True), History(), at(0))
    assert v.decision is None and v.history.incidents == ()


# --- application Xids across jobs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "value"),
    [pytest.param("batch.kubernetes.io/job-name", "j", id="label-batch"),
     pytest.param("job-name", "j", id="label-job-name"),
     pytest.param("training.kubeflow.org/job-name", "j", id="label-kubeflow"),
     pytest.param("jobset.sigs.k8s.io/jobset-name", "j", id="label-jobset"),
     pytest.param("origin", "j", id="origin-owner-reference")],
)
def test_13_in_three_jobs_is_hardware_suspect(label: str, value: str) -> None:
    def event(i: int):  # type: ignore[no-untyped-def]
        if label == "origin":
            return ev("xid", 13, origin=Origin(pod=f"pod-{i}", namespace="ml", job=f"{value}{i}"))
        return ev("xid", 13, labels={label: f"{value}{i}"})

    steps = [(event(i), at(hours=i)) for i in range(3)]
    verdicts, _h = run(_decide, steps)
    assert [v.decision for v in verdicts[:2]] == [None, None]
    d = verdicts[2].decision
    assert d is not None
    assert (d.playbook, d.group) == ("app-xid-hardware-suspect", gpu_group("node-1", GPU_A))
    assert len(d.evidence) == 3 and {e.detail.split()[4] for e in d.evidence} == {f"{value}0", f"{value}1",
                                                                                  f"{value}2"}
    assert "3 different jobs" in d.reason


@pytest.mark.parametrize(
    "labels",
    [pytest.param(lambda i: {"pod": f"train-{i}"}, id="pod-names"),
     pytest.param(lambda i: {"job": f"j{i}"}, id="bare-job-label"),
     pytest.param(lambda i: {"job": f"j{i}", "pod": f"j{i}-0"}, id="both")],
)
def test_pods_without_a_job_are_not_different_jobs(labels) -> None:  # type: ignore[no-untyped-def]
    """The pod name (and a bare ``job`` label, which is Prometheus' scrape job on an alert) is no job: three
    restarts of one job on this GPU, each in a new pod, are not three jobs. Old main counted them."""
    verdicts, _h = run(_decide, [(ev("xid", 13, labels=labels(i)), at(hours=i)) for i in range(3)])
    assert decisions(verdicts) == []
    assert "no job label, so it is not counted" in verdicts[-1].reason


def test_the_owner_reference_wins_over_the_labels() -> None:
    """``origin.job`` (owner references) first, then the labels: one job under two label spellings is one."""
    steps = [(ev("xid", 13, origin=Origin(job="llm"), labels={JOB: f"other-{i}"}), at(hours=i)) for i in range(3)]
    verdicts, _h = run(_decide, steps)
    assert decisions(verdicts) == []
    assert "in job llm recorded" in verdicts[-1].reason


def test_13_many_times_in_one_job_is_not_hardware() -> None:
    steps = [(ev("xid", 13, labels={JOB: "same"}), at(minutes=10 * i)) for i in range(20)]
    verdicts, _h = run(_decide, steps)
    assert decisions(verdicts) == []
    assert "1 of 3" in verdicts[-1].reason


def test_mixed_application_codes_count_together_on_one_gpu() -> None:
    steps = [(ev("xid", 13, labels={JOB: "a"}), at(0)), (ev("xid", 31, labels={JOB: "b"}), at(hours=1)),
             (ev("xid", 13, labels={JOB: "c"}), at(hours=2))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["app-xid-hardware-suspect"]


def test_application_xids_on_different_gpus_do_not_add_up() -> None:
    steps = [(ev("xid", 13, gpu=g, labels={JOB: j}), at(hours=i))
             for i, (g, j) in enumerate([(GPU_A, "a"), (GPU_B, "b"), (GPU_C, "c")])]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == []


def test_application_xid_without_job_is_not_counted() -> None:
    steps = [(ev("xid", 13), at(hours=i)) for i in range(5)]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == []
    assert "no job label" in verdicts[-1].reason


@pytest.mark.parametrize(
    ("first_age", "decides"),
    [pytest.param(timedelta(hours=24), True, id="exactly-24h-inside"),
     pytest.param(timedelta(hours=24, microseconds=1), False, id="24h-plus-1us-outside"),
     pytest.param(timedelta(hours=23, minutes=59, seconds=59), True, id="just-inside")],
)
def test_application_window_boundary(first_age: timedelta, decides: bool) -> None:
    now = T0 + timedelta(days=2)
    steps = [(ev("xid", 13, labels={JOB: "a"}), now - first_age),
             (ev("xid", 13, labels={JOB: "b"}), now - timedelta(hours=1)),
             (ev("xid", 13, labels={JOB: "c"}), now)]
    verdicts, _ = run(_decide, steps)
    assert (verdicts[-1].decision is not None) == decides


def test_threshold_and_window_are_policy() -> None:
    policy = XidPolicy(app_window=timedelta(hours=1), app_threshold=2)
    steps = [(ev("xid", 31, labels={JOB: "a"}), at(0)), (ev("xid", 31, labels={JOB: "b"}), at(minutes=59))]
    verdicts, _ = run(lambda e, h, n: evaluate(e, h, n, policy), steps)
    assert decisions(verdicts) == ["app-xid-hardware-suspect"]
    steps = [(ev("xid", 31, labels={JOB: "a"}), at(0)), (ev("xid", 31, labels={JOB: "b"}), at(minutes=61))]
    verdicts, _ = run(lambda e, h, n: evaluate(e, h, n, policy), steps)
    assert decisions(verdicts) == []


def test_fourth_job_folds_into_the_suspect_incident() -> None:
    steps = [(ev("xid", 13, labels={JOB: f"j{i}"}), at(hours=i)) for i in range(4)]
    verdicts, _h = run(_decide, steps)
    assert decisions(verdicts) == ["app-xid-hardware-suspect"]
    assert verdicts[3].updated_incident == verdicts[2].decision.incident_id  # type: ignore[union-attr]


# --- co-occurrence (gpu-faults.md §1.7) --------------------------------------------------------------


def test_43_after_13_is_not_counted() -> None:
    steps = [(ev("xid", 13, labels={JOB: "a"}), at(0)), (ev("xid", 43, labels={JOB: "b"}), at(10)),
             (ev("xid", 13, labels={JOB: "c"}), at(hours=1))]
    verdicts, _ = run(_decide, steps)
    assert "teardown after Xid 13" in verdicts[1].reason
    assert decisions(verdicts) == []  # b's 43 followed a's 13, so only 2 jobs count


def test_43_after_quiet_gap_counts_as_its_own() -> None:
    steps = [(ev("xid", 13, labels={JOB: "a"}), at(0)), (ev("xid", 43, labels={JOB: "b"}), at(minutes=4)),
             (ev("xid", 13, labels={JOB: "c"}), at(hours=1))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["app-xid-hardware-suspect"]


def test_45_follows_48_into_its_incident() -> None:
    steps = [(ev("xid", 48), at(0)), (ev("xid", 45), at(5))]
    verdicts, _h = run(_decide, steps)
    assert decisions(verdicts) == ["gpu-memory-fatal"]
    assert verdicts[1].updated_incident == verdicts[0].decision.incident_id  # type: ignore[union-attr]
    assert "follows Xid 48" in verdicts[1].reason


def test_45_caused_by_text_follows_without_history() -> None:
    v = _decide(ev("xid", 45, message="Xid (PCI:0000:3b:00): 45, caused by previous Xid 149"), History(), at(0))
    assert v.decision is None and "follows Xid 149" in v.reason and "recorded" in v.reason


@pytest.mark.parametrize(
    ("second", "playbooks", "open_playbook"),
    [pytest.param(63, ["gpu-memory-fatal"], "gpu-memory-fatal", id="48-then-63-drain-and-reset"),
     pytest.param(64, ["gpu-memory-fatal", "memory-retirement-failure"], "memory-retirement-failure",
                  id="48-then-64-rma-candidate")],
)
def test_48_with_63_or_64(second: int, playbooks: list[str], open_playbook: str) -> None:
    verdicts, h = run(_decide, [(ev("xid", 48), at(0)), (ev("xid", second), at(30))])
    assert decisions(verdicts) == playbooks
    inc = h.open_incident(gpu_group("node-1", GPU_A))
    assert inc is not None and inc.playbook == open_playbook
    if second == 64:
        d = verdicts[1].decision
        assert d is not None and d.labels["supersedes"] == verdicts[0].decision.incident_id  # type: ignore[union-attr]


def test_63_then_48_escalates_and_says_so() -> None:
    verdicts, _ = run(_decide, [(ev("xid", 63), at(0)), (ev("xid", 48), at(30))])
    assert decisions(verdicts) == ["row-remap-pending", "gpu-memory-fatal"]
    assert "with Xid 63 in the same burst" in verdicts[1].reason  # type: ignore[union-attr]


def test_171_qualifies_48() -> None:
    verdicts, _ = run(_decide, [(ev("xid", 48), at(0)), (ev("xid", 171), at(1))])
    assert decisions(verdicts) == ["gpu-memory-fatal"]
    assert verdicts[1].updated_incident is not None and "DRAM" in verdicts[1].reason


def test_79_then_119_is_one_node_incident() -> None:
    verdicts, h = run(_decide, [(ev("xid", 79), at(0)), (ev("xid", 119), at(20)), (ev("xid", 120, gpu=GPU_B),
                                                                                    at(40))])
    assert decisions(verdicts) == ["gpu-lost"]
    inc = verdicts[0].decision.incident_id  # type: ignore[union-attr]
    assert [v.updated_incident for v in verdicts[1:]] == [inc, inc]
    assert [i.group for i in h.incidents] == [node_group("node-1")]


def test_119_then_79_escalates_to_the_node() -> None:
    verdicts, _h = run(_decide, [(ev("xid", 119), at(0)), (ev("xid", 79), at(10)), (ev("xid", 119), at(20))])
    assert decisions(verdicts) == ["gsp-hang", "gpu-lost"]
    assert verdicts[2].updated_incident == verdicts[1].decision.incident_id  # type: ignore[union-attr]


def test_74_on_several_peers_targets_the_first_gpu_in_time() -> None:
    steps = [(ev("xid", 74, gpu=GPU_B), at(0)), (ev("xid", 74, gpu=GPU_A), at(2)), (ev("xid", 74, gpu=GPU_C),
                                                                                     at(4))]
    verdicts, h = run(_decide, steps)
    assert decisions(verdicts) == ["nvlink"]
    first = verdicts[0].decision
    assert first is not None and first.gpu is not None and first.gpu.uuid == GPU_B
    assert [v.updated_incident for v in verdicts[1:]] == [first.incident_id] * 2
    assert "first in time" in verdicts[1].reason
    assert [i.group for i in h.incidents] == [gpu_group("node-1", GPU_B)]


def test_74_on_peer_after_quiet_gap_is_its_own_incident() -> None:
    verdicts, _ = run(_decide, [(ev("xid", 74, gpu=GPU_B), at(0)), (ev("xid", 74, gpu=GPU_A), at(minutes=3,
                                                                                                    seconds=1))])
    assert decisions(verdicts) == ["nvlink", "nvlink"]


@pytest.mark.parametrize(
    ("message", "labels", "playbook"),
    [pytest.param("Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
                  "Required)", {}, "gpu-reset", id="gpu-reset-required"),
     pytest.param("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", {}, "node-reboot",
                  id="node-reboot-required"),
     pytest.param("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", {}, "gpu-reset",
                  id="drain-and-reset"),
     pytest.param("", {"recovery_action": "Node Reboot Required"}, "node-reboot", id="from-label"),
     pytest.param("", {"recovery_action_code": "2"}, "node-reboot", id="from-code-label"),
     pytest.param("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", {}, None,
                  id="none"),
     pytest.param("garbled", {}, "unknown-xid", id="unreadable-escalates")],
)
def test_154_does_what_it_says(message: str, labels: dict[str, str], playbook: str | None) -> None:
    v = _decide(ev("xid", 154, message=message, labels=labels), History(), at(0))
    assert (v.decision.playbook if v.decision else None) == playbook


def test_154_overrides_a_later_linked_xid() -> None:
    none154 = ev("xid", 154, message="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    verdicts, _ = run(_decide, [(none154, at(0)), (ev("xid", 120), at(5))])
    assert decisions(verdicts) == []
    assert "overrides the catalog" in verdicts[1].reason


def test_154_node_reboot_after_48_escalates() -> None:
    reboot = ev("xid", 154, message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    verdicts, _ = run(_decide, [(ev("xid", 48), at(0)), (reboot, at(2))])
    assert decisions(verdicts) == ["gpu-memory-fatal", "node-reboot"]


def test_154_gpu_reset_after_48_folds() -> None:
    reset = ev("xid", 154, message="GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    verdicts, _ = run(_decide, [(ev("xid", 48), at(0)), (reset, at(2))])
    assert decisions(verdicts) == ["gpu-memory-fatal"]
    assert verdicts[1].updated_incident is not None


# --- flapping, duplicates, closing, lapsing --------------------------------------------------------


def test_flapping_xid_is_one_incident_updated() -> None:
    steps = [(ev("xid", 119), at(minutes=10 * i)) for i in range(12)]
    verdicts, h = run(_decide, steps)
    assert decisions(verdicts) == ["gsp-hang"]
    inc_id = verdicts[0].decision.incident_id  # type: ignore[union-attr]
    assert all(v.updated_incident == inc_id for v in verdicts[1:])
    inc = h.open_incident(gpu_group("node-1", GPU_A))
    assert inc is not None and inc.count == 12 and inc.updated_at == at(minutes=110)


def test_duplicate_event_is_folded_not_redecided() -> None:
    e = ev("xid", 79)
    verdicts, _ = run(_decide, [(e, at(0)), (e, at(1))])
    assert decisions(verdicts) == ["gpu-lost"]
    assert verdicts[1].updated_incident == verdicts[0].decision.incident_id  # type: ignore[union-attr]


def test_closed_incident_lets_a_recurrence_decide_again() -> None:
    _verdicts, h = run(_decide, [(ev("xid", 48), at(0))])
    h = close_incident(h, gpu_group("node-1", GPU_A))
    assert h.incidents == ()
    verdicts2, _ = run(_decide, [(ev("xid", 48), at(hours=1))], h)
    assert decisions(verdicts2) == ["gpu-memory-fatal"]


def test_close_of_unknown_group_is_a_noop() -> None:
    h = History(incidents=(Incident("inc-1", "gpu:x/y", "gpu-reset", T0, T0),))
    assert close_incident(h, "gpu:nope") == h


@pytest.mark.parametrize(
    ("idle", "folds"),
    [pytest.param(timedelta(hours=6), True, id="ttl-exactly-still-open"),
     pytest.param(timedelta(hours=6, seconds=1), False, id="ttl-passed-lapses")],
)
def test_incident_lapses_after_ttl(idle: timedelta, folds: bool) -> None:
    _verdicts, h = run(_decide, [(ev("xid", 119), at(0))])
    v = _decide(ev("xid", 119), h, T0 + idle)
    assert (v.decision is None) == folds


def test_incident_ids_are_deterministic() -> None:
    e = ev("xid", 48, event_id="fixed-id")
    d1 = _decide(e, History(), at(0)).decision
    d2 = _decide(e, History(), at(5)).decision
    assert d1 is not None and d2 is not None and d1.incident_id == d2.incident_id


def test_storm_keeps_history_small() -> None:
    steps = [(ev("xid", 13, labels={JOB: "a"}), at(i)) for i in range(500)]
    _, h = run(_decide, steps)
    assert len(h.sightings) == 2


# --- properties -------------------------------------------------------------------------------------

_CODES = st.sampled_from([13, 31, 43, 45, 48, 62, 63, 64, 74, 79, 94, 95, 119, 120, 149, 154, 4242])
_GPUS = st.sampled_from([GPU_A, GPU_B])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_CODES, _GPUS, st.integers(0, 600), st.sampled_from(["a", "b", "c", "d"])),
                min_size=1, max_size=40))
def test_bursts_and_flapping_never_open_two_incidents_per_group(
        seq: list[tuple[int, str, int, str]]) -> None:
    h = History()
    now = T0
    for code, gpu, gap, job in seq:
        now = now + timedelta(seconds=gap)
        message = "recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)" if code == 154 else ""
        v = _decide(ev("xid", code, gpu=gpu, labels={JOB: job}, message=message), h, now)
        h = v.history
        groups = [i.group for i in h.incidents]
        assert len(groups) == len(set(groups))
        if v.decision is None:
            assert v.reason
        else:
            assert h.open_incident(v.decision.group) is not None
            assert v.updated_incident is None


@settings(max_examples=100, deadline=None)
@given(code=st.sampled_from([48, 63, 64, 74, 79, 119, 149, 4242]), n=st.integers(2, 30),
       gaps=st.lists(st.integers(0, 3600), min_size=29, max_size=29))
def test_the_same_xid_flapping_decides_once(code: int, n: int, gaps: list[int]) -> None:
    h = History()
    now = T0
    made = 0
    for i in range(n):
        now = now + timedelta(seconds=gaps[i - 1] if i else 0)
        v = _decide(ev("xid", code), h, now)
        made += v.decision is not None
        h = v.history
    assert made == 1
    assert len(h.incidents) == 1 and h.incidents[0].count == n


@pytest.mark.parametrize(
    ("kind", "code"),
    [pytest.param("gpu_lost", "NVML_ERROR_GPU_IS_LOST", id="gpu-answers-again"),
     pytest.param("xid", 79, id="healthy-79"), pytest.param("sxid", 20034, id="healthy-sxid")],
)
def test_healthy_events_never_decide_nor_count_as_a_loss(kind: str, code: int | str) -> None:
    verdicts, _h = run(_decide, [(ev(kind, code, is_healthy=True), at(0)), (ev("xid", 48), at(10))])
    assert verdicts[0].decision is None and "healthy" in verdicts[0].reason
    assert decisions(verdicts) == ["gpu-memory-fatal"]  # not folded as "follows a lost GPU"
