"""The NCCL handler: ranks of one job correlated across nodes; hardware, stragglers, links, no suspect."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers import default_registry
from handlers.base import History
from handlers.incidents import job_group
from handlers.nccl import NcclPolicy, correlation_of, evaluate, history_key, matches
from remediator.contracts import Origin
from tests.unit.handlers.helpers import GPU_A, GPU_B, GPU_C, JOB, T0, at, decisions, ev, run

POLICY = NcclPolicy()
GROUP = job_group("ml", "llm")


def _decide(e, h, now):  # type: ignore[no-untyped-def]
    return evaluate(e, h, now, POLICY)


def timeout(rank: int, node: str, seq: int = 1580, *, gpu: str = GPU_A, op: str = "ALLREDUCE",
            **labels: str):  # type: ignore[no-untyped-def]
    return ev("nccl_timeout", "watchdog_timeout", node=node, gpu=gpu,
              labels={JOB: "llm", "namespace": "ml", "pod": f"llm-{rank}", "rank": str(rank), "seq": str(seq),
                      "op_type": op, **labels})


def ib_error(rank: int, node: str, peer: str, **labels: str):  # type: ignore[no-untyped-def]
    return ev("nccl_error", "ib_status_12", node=node,
              labels={JOB: "llm", "namespace": "ml", "rank": str(rank), "peer": peer, **labels})


# --- keying and registration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "key"),
    [pytest.param({JOB: "llm", "namespace": "ml"}, "job.ml.llm", id="job-and-namespace"),
     pytest.param({"training.kubeflow.org/job-name": "llm"}, "job.default.llm", id="kubeflow-default-ns"),
     pytest.param({"job-name": "a.b", "namespace": "x"}, "job.x.a_b", id="dots-tokenised"),
     pytest.param({"batch.kubernetes.io/job-name": "b", "namespace": "x"}, "job.x.b", id="batch-label"),
     # the defect fixed: old main keyed a pod without a job label as the job "p-1" (job.default.p-1)
     pytest.param({"pod": "p-1"}, "pod.default.p-1", id="pod-is-its-own-key-not-a-job"),
     pytest.param({"job": "llm"}, "node.node-1", id="bare-job-label-is-no-job"),
     pytest.param({}, "node.node-1", id="no-job-keys-by-node")],
)
def test_history_key(labels: dict[str, str], key: str) -> None:
    assert history_key(ev("nccl_timeout", None, labels=labels)) == key


def test_history_key_prefers_the_origin() -> None:
    """The owner reference's job (``origin.job``) and the origin's namespace and pod come before labels."""
    origin = Origin(job="llm", namespace="ml", pod="llm-worker-0")
    assert history_key(ev("nccl_timeout", None, origin=origin, labels={JOB: "other", "namespace": "x"})) == "job.ml.llm"
    assert history_key(ev("nccl_timeout", None, origin=Origin(pod="p-2", namespace="ml"))) == "pod.ml.p-2"
    assert correlation_of(ev("nccl_timeout", None)) is None


def test_two_single_pod_jobs_are_never_merged() -> None:
    """Pods without a job are correlated by their own identity, in a key space of their own: old main took
    the pod name for the job, so pod ``alpha`` and job ``alpha`` shared ``job.ml.alpha`` and the decision
    named a job that does not exist."""
    a = ev("nccl_timeout", "watchdog_timeout", node="node-1", labels={"pod": "alpha", "namespace": "ml", "rank": "0",
                                                                      "seq": "1580"})
    b = ev("nccl_timeout", "watchdog_timeout", node="node-2", labels={"pod": "beta", "namespace": "ml", "rank": "0",
                                                                      "seq": "1580"})
    assert history_key(a) != history_key(b)
    job = ev("nccl_timeout", "watchdog_timeout", labels={JOB: "alpha", "namespace": "ml"})
    assert history_key(a) != history_key(job)  # a pod named like a job is not that job
    va = _decide(a, History(), at(0))
    assert va.decision is None and "pod ml/alpha" in va.reason
    vb = _decide(b, History(), at(1))
    assert vb.decision is None and "pod ml/beta" in vb.reason


def test_ranks_of_one_pod_without_a_job_correlate_with_each_other() -> None:
    """A multi-GPU pod runs several ranks: without a job its reports still meet, under the pod's key and
    group, and the decision names no job."""
    def rank(r: int):  # type: ignore[no-untyped-def]
        return ev("nccl_timeout", "watchdog_timeout", labels={"pod": "solo", "namespace": "ml", "rank": str(r),
                                                              "seq": "1580", "op_type": "ALLREDUCE"})

    verdicts, _h = run(_decide, [(rank(0), at(0)), (rank(1), at(1))])
    d = verdicts[1].decision
    assert d is not None and d.playbook == "nccl-timeout-no-suspect"
    assert d.job is None and d.group == "pod:ml/solo"
    assert d.labels == {"pod": "solo", "namespace": "ml", "history_key": "pod.ml.solo"}


def test_registration_and_matching() -> None:
    registry = default_registry()
    spec = registry.specs["nccl"]
    assert spec.history_key is history_key and spec.matches is matches
    assert {"nccl_timeout", "nccl_error", "job_failure", "xid", "ecc", "gpu_lost"} <= spec.kinds
    assert matches(ev("nccl_timeout", None))
    assert not matches(ev("xid", 79))  # hardware without a job: only the node's Xid handler
    assert matches(ev("xid", 79, labels={JOB: "llm"}))
    assert sorted(s.name for s in registry.for_event(ev("xid", 79, labels={JOB: "llm"}))) == ["nccl", "xid"]


# --- decision table ------------------------------------------------------------------------------


def test_first_report_alone_is_correlating() -> None:
    v = _decide(timeout(0, "node-1"), History(), at(0))
    assert v.decision is None and "correlating" in v.reason


def test_all_ranks_same_seq_no_suspect_restarts_job_only() -> None:
    verdicts, _h = run(_decide, [(timeout(0, "node-1"), at(0)), (timeout(1, "node-2"), at(1)),
                                (timeout(2, "node-3"), at(2))])
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]
    d = verdicts[1].decision
    assert d is not None and d.group == GROUP and d.gpu is None and d.job == "llm"
    assert d.labels == {"job": "llm", "namespace": "ml", "history_key": "job.ml.llm"}
    assert verdicts[2].updated_incident == d.incident_id
    assert "2 rank(s) on 2 node(s)" in d.reason


def test_settle_time_decides_a_single_rank() -> None:
    verdicts, _ = run(_decide, [(timeout(0, "node-1"), at(0)), (timeout(0, "node-1"), at(59)),
                                (timeout(0, "node-1"), at(60))])
    assert [v.decision is not None for v in verdicts] == [False, False, True]


def test_job_failure_settles_at_once() -> None:
    fail = ev("job_failure", "exitcode_-6", labels={JOB: "llm", "namespace": "ml", "rank": "0"})
    verdicts, _ = run(_decide, [(timeout(0, "node-1"), at(0)), (fail, at(5))])
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]


@pytest.mark.parametrize(
    ("signal", "cause"),
    [pytest.param(ev("xid", 79, node="node-2", gpu=GPU_B, labels={JOB: "llm", "namespace": "ml"}), "hardware",
                  id="xid-79-on-a-rank-node"),
     pytest.param(ev("ecc", "dbe_volatile", node="node-2", gpu=GPU_B,
                     labels={JOB: "llm", "namespace": "ml", "value": "1"}), "hardware", id="dbe-on-a-rank-node"),
     pytest.param(ev("nccl_timeout", None, node="node-2", gpu=GPU_B,
                     labels={JOB: "llm", "namespace": "ml", "rank": "1", "cuda_error": "214"}), "hardware",
                  id="cuda-214-in-watchdog"),
     pytest.param(ev("nccl_timeout", None, node="node-2", gpu=GPU_B,
                     labels={JOB: "llm", "namespace": "ml", "rank": "1"},
                     message="NCCL watchdog thread terminated with exception: CUDA error: uncorrectable NVLink "
                             "error detected during the execution"), "hardware", id="nvlink-text"),
     pytest.param(ev("nccl_timeout", None, node="node-2", gpu=GPU_B,
                     labels={JOB: "llm", "namespace": "ml", "rank": "1"},
                     message="ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress"),
                  "hardware", id="watchdog-hang")],
)
def test_concurrent_hardware_signal_names_the_suspect(signal: object, cause: str) -> None:
    verdicts, _ = run(_decide, [(timeout(0, "node-1"), at(0)), (signal, at(10))])  # type: ignore[list-item]
    d = verdicts[-1].decision
    assert d is not None and d.playbook == "nccl-timeout-suspect"
    assert (d.node, d.labels["suspect_node"], d.labels["cause"]) == ("node-2", "node-2", cause)
    assert d.gpu is not None and d.gpu.uuid == GPU_B
    assert d.group == GROUP and d.evidence


def test_application_xid_is_not_a_hardware_signal() -> None:
    xid13 = ev("xid", 13, node="node-2", labels={JOB: "llm", "namespace": "ml"})
    verdicts, _ = run(_decide, [(timeout(0, "node-1"), at(0)), (xid13, at(5))])
    assert decisions(verdicts) == [] and "not a hardware signal" in verdicts[1].reason


def test_hardware_before_any_nccl_failure_is_remembered() -> None:
    xid79 = ev("xid", 79, node="node-3", gpu=GPU_C, labels={JOB: "llm", "namespace": "ml"})
    verdicts, _ = run(_decide, [(xid79, at(0)), (timeout(0, "node-1"), at(30))])
    assert verdicts[0].decision is None and "no NCCL failure" in verdicts[0].reason
    d = verdicts[1].decision
    assert d is not None and d.labels["suspect_node"] == "node-3"


@pytest.mark.parametrize(
    ("age", "suspect"),
    [pytest.param(timedelta(minutes=10), True, id="hardware-exactly-10-min-before"),
     pytest.param(timedelta(minutes=10, seconds=1), False, id="hardware-just-outside-window")],
)
def test_hardware_window_boundary(age: timedelta, suspect: bool) -> None:
    xid79 = ev("xid", 79, node="node-3", gpu=GPU_C, labels={JOB: "llm", "namespace": "ml"})
    fail = ev("job_failure", None, labels={JOB: "llm", "namespace": "ml"})
    verdicts, _ = run(_decide, [(xid79, T0), (fail, T0 + age)])
    d = verdicts[-1].decision
    assert d is not None
    assert (d.playbook == "nccl-timeout-suspect") == suspect


def test_hardware_after_no_suspect_supersedes() -> None:
    xid48 = ev("xid", 48, node="node-2", gpu=GPU_B, labels={JOB: "llm", "namespace": "ml"})
    verdicts, h = run(_decide, [(timeout(0, "node-1"), at(0)), (timeout(1, "node-2"), at(1)), (xid48, at(20))])
    assert decisions(verdicts) == ["nccl-timeout-no-suspect", "nccl-timeout-suspect"]
    d = verdicts[2].decision
    assert d is not None and d.labels["supersedes"] == verdicts[1].decision.incident_id  # type: ignore[union-attr]
    assert len(h.incidents) == 1 and h.incidents[0].playbook == "nccl-timeout-suspect"


def test_desync_report_lagging_ranks_on_one_node() -> None:
    steps = [(timeout(0, "node-1", gpu=GPU_A, lagging_ranks="6,7"), at(0)),
             (timeout(6, "node-4", gpu=GPU_A, seq=1579), at(1)), (timeout(7, "node-4", gpu=GPU_B, seq=1579), at(2))]
    verdicts, _ = run(_decide, steps)
    assert verdicts[1].decision is None and "waiting for lagging rank(s) 7" in verdicts[1].reason
    d = verdicts[2].decision
    assert d is not None and d.playbook == "nccl-timeout-suspect"
    assert (d.labels["suspect_node"], d.labels["cause"]) == ("node-4", "lagging_ranks")
    assert d.labels["suspect_gpu"] == ""  # ranks 6 and 7 sit on different GPUs of node-4
    assert d.gpu is None


def test_minority_behind_on_seqnum_is_the_straggler() -> None:
    steps = [(timeout(0, "node-1", seq=96120), at(0)), (timeout(1, "node-1", seq=96120, gpu=GPU_B), at(1)),
             (timeout(2, "node-2", seq=96120), at(2)), (timeout(7, "node-3", seq=64088, gpu=GPU_C), at(3))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["nccl-timeout-no-suspect", "nccl-timeout-suspect"]
    d = verdicts[3].decision
    assert d is not None and d.node == "node-3" and d.gpu is not None and d.gpu.uuid == GPU_C
    assert "behind the others' SeqNum" in d.reason


def test_lagging_ranks_on_two_nodes_is_no_suspect() -> None:
    steps = [(timeout(0, "node-1", lagging_ranks="3,5"), at(0)), (timeout(3, "node-2", seq=1), at(1)),
             (timeout(5, "node-3", seq=1), at(2))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]
    assert verdicts[2].decision is not None


def test_unheard_lagging_rank_is_no_suspect_after_settle() -> None:
    steps = [(timeout(0, "node-1", lagging_ranks="9"), at(0)), (timeout(1, "node-2"), at(1)),
             (timeout(2, "node-2"), at(60))]
    verdicts, _ = run(_decide, steps)
    assert [v.decision.playbook if v.decision else None for v in verdicts] == [
        None, None, "nccl-timeout-no-suspect"]


def test_op_mismatch_is_a_program_bug_not_hardware() -> None:
    steps = [(timeout(0, "node-1", seq=317, op="ALLREDUCE"), at(0)),
             (timeout(1, "node-1", seq=317, op="_ALLGATHER_BASE", gpu=GPU_B), at(1)),
             (timeout(2, "node-2", seq=315, op="ALLREDUCE"), at(2))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]
    assert "program-order bug" in verdicts[1].decision.reason  # type: ignore[union-attr]


def test_early_collective_is_not_hardware() -> None:
    steps = [(timeout(0, "node-1", seq=5, lagging_ranks="3"), at(0)), (timeout(3, "node-2", seq=4), at(1))]
    verdicts, _ = run(_decide, steps)
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]
    assert "never started" in verdicts[1].decision.reason  # type: ignore[union-attr]


def test_repeated_peer_with_known_node_points_at_the_link() -> None:
    steps = [(ib_error(0, "node-1", "10.0.0.9", peer_node="node-9"), at(0)),
             (ib_error(4, "node-2", "10.0.0.9", peer_node="node-9"), at(1))]
    verdicts, _ = run(_decide, steps)
    d = verdicts[1].decision
    assert d is not None and d.playbook == "nccl-timeout-suspect"
    assert (d.node, d.labels["cause"]) == ("node-9", "peer_link")


def test_repeated_peer_without_node_restarts_job_and_names_the_peer() -> None:
    steps = [(ib_error(0, "node-1", "10.0.0.9"), at(0)), (ib_error(4, "node-2", "10.0.0.9"), at(1))]
    verdicts, _ = run(_decide, steps)
    d = verdicts[1].decision
    assert d is not None and d.playbook == "nccl-timeout-no-suspect"
    assert d.labels["suspect_peer"] == "10.0.0.9" and "peer 10.0.0.9" in d.reason


def test_errors_from_one_node_to_many_peers_point_at_its_nic() -> None:
    steps = [(ib_error(0, "node-1", "10.0.0.2"), at(0)), (ib_error(1, "node-1", "10.0.0.3"), at(1))]
    verdicts, _ = run(_decide, steps)
    d = verdicts[1].decision
    assert d is not None and (d.playbook, d.node, d.labels["cause"]) == ("nccl-timeout-suspect", "node-1",
                                                                         "local_nic")


def test_storm_of_ranks_is_one_incident() -> None:
    steps = [(timeout(r, f"node-{r % 8}"), at(r)) for r in range(64)]
    verdicts, h = run(_decide, steps)
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]
    assert len(h.incidents) == 1 and h.incidents[0].count == 63


def test_event_without_job_is_recorded() -> None:
    v = _decide(ev("nccl_timeout", None), History(), at(0))
    assert v.decision is None and "names no job" in v.reason


def test_policy_is_a_parameter() -> None:
    policy = NcclPolicy(min_ranks=5, settle=timedelta(hours=1))
    verdicts, _ = run(lambda e, h, n: evaluate(e, h, n, policy),
                      [(timeout(r, "node-1"), at(r)) for r in range(4)])
    assert decisions(verdicts) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["timeout", "ib", "xid79", "xid13", "fail"]), st.integers(0, 7),
                          st.integers(0, 120)), min_size=1, max_size=30))
def test_never_more_than_one_open_incident_per_job(seq: list[tuple[str, int, int]]) -> None:
    h = History()
    now = T0
    for what, rank, gap in seq:
        now += timedelta(seconds=gap)
        node = f"node-{rank % 3}"
        e = {"timeout": timeout(rank, node, seq=1000 + rank % 2),
             "ib": ib_error(rank, node, f"10.0.0.{rank % 2}"),
             "xid79": ev("xid", 79, node=node, labels={JOB: "llm", "namespace": "ml"}),
             "xid13": ev("xid", 13, node=node, labels={JOB: "llm", "namespace": "ml"}),
             "fail": ev("job_failure", None, node=node, labels={JOB: "llm", "namespace": "ml"})}[what]
        v = _decide(e, h, now)
        h = v.history
        assert [i.group for i in h.incidents] in ([], [GROUP])
        assert v.decision is None or v.updated_incident is None


def test_healthy_hardware_event_is_not_a_signal() -> None:
    back = ev("gpu_lost", "NVML_ERROR_GPU_IS_LOST", node="node-2", is_healthy=True,
              labels={JOB: "llm", "namespace": "ml"})
    verdicts, _ = run(_decide, [(timeout(0, "node-1"), at(0)), (back, at(5)), (timeout(1, "node-1"), at(6))])
    assert decisions(verdicts) == ["nccl-timeout-no-suspect"]


def test_incident_id_is_derived_from_the_reporting_node() -> None:
    from handlers.base import incident_id_for

    xid79 = ev("xid", 79, node="node-3", gpu=GPU_C, labels={JOB: "llm", "namespace": "ml"})
    first = timeout(0, "node-1")
    verdicts, _ = run(_decide, [(xid79, at(0)), (first, at(5))])
    d = verdicts[1].decision
    assert d is not None and d.node == "node-3"
    assert d.incident_id == incident_id_for("node-1", GROUP, first.id)
