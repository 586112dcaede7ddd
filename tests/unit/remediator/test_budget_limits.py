"""Budget limits for small pools: two budgets per pool (whole nodes; GPUs isolated on their own), the first
node of a pool always allowed, and a run's reservation released at every end (handovers kept apart)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediator.contracts import Decision, GpuRef, StepRecord
from remediator.run import RunRecord, handover_of, left_by_run
from remediator.safety import Facts, Ledger, SafetyPolicy, reservation_key
from remediator.safety.gate import decide, pool_usage

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
TAINT = "gpu-remediator/quarantine"
DEFAULTS = SafetyPolicy()  # the shipped limits: 10 % of nodes, 10 % of GPUs, at least one each


def node(name: str, *, gpus: int = 8, allocatable: int | None = None, cordoned: bool = False,
         tainted: bool = False) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "gpus_allocatable": gpus if allocatable is None else allocatable,
            "unschedulable": cordoned, "taints": [{"key": TAINT, "effect": "NoSchedule"}] if tainted else []}


def facts(pool: list[dict[str, Any]], target: str, quarantine: str) -> Facts:
    return Facts(node={"name": target, "pool": "p", "gpus": 8, "labels": {}}, quarantine=quarantine,  # type: ignore[arg-type]
                 playbook_dry_run=False, me="me", lock_holder="me", taint_key=TAINT, pool_nodes=pool)


def decision(node_name: str, incident: str, gpu: int | None = None, playbook: str = "gpu-lost") -> Decision:
    return Decision(incident_id=incident, handler="xid", playbook=playbook, node=node_name,
                    gpu=GpuRef(index=gpu, uuid=f"GPU-{node_name}-{gpu}") if gpu is not None else None, group="g",
                    reason="test", event_id="ev", kind="xid", code=79, decided_at=NOW)


def budget_verdict(pool: list[dict[str, Any]], d: Decision, quarantine: str, ledger: Ledger = Ledger(),
                   policy: SafetyPolicy = DEFAULTS) -> tuple[bool, str]:
    only_budget = SafetyPolicy(**{**policy.__dict__, "enabled": frozenset({"budget"})})
    _, result = decide(d, only_budget, facts(pool, d.node, quarantine), ledger, NOW)
    v = next(v for v in result.verdicts if v.name == "budget")
    return v.allowed, v.reason


EIGHT_BY_EIGHT = [node(f"n{i}") for i in range(8)]


def test_one_isolated_gpu_does_not_block_draining_a_dead_node_in_an_8x8_pool() -> None:
    pool = [node("n0", allocatable=7), *EIGHT_BY_EIGHT[1:]]  # GPU 3 of n0 isolated (allocatable 7 of 8)
    allowed, why = budget_verdict(pool, decision("n5", "inc-lost"), "node")
    assert allowed, why


def test_a_running_gpu_reservation_does_not_block_a_node_quarantine() -> None:
    ledger = Ledger().reserved(decision("n0", "inc-gpu", gpu=3, playbook="gpu-memory-fatal"), "p", "gpu", NOW)
    allowed, why = budget_verdict(EIGHT_BY_EIGHT, decision("n5", "inc-lost"), "node", ledger)
    assert allowed, why


@pytest.mark.parametrize("total", [1, 2, 3, 4, 9])
def test_the_first_node_of_any_pool_is_always_allowed(total: int) -> None:
    pool = [node(f"n{i}", allocatable=6) for i in range(total)]  # GPUs isolated everywhere
    allowed, why = budget_verdict(pool, decision("n0", "inc-1"), "node",
                                  policy=SafetyPolicy(budget_max_node_fraction=0.01, budget_max_gpu_fraction=0.01))
    assert allowed, why


def test_a_second_node_in_a_small_pool_is_refused_while_the_first_is_out() -> None:
    pool = [node("n0", cordoned=True, tainted=True), *[node(f"n{i}") for i in range(1, 4)]]
    allowed, why = budget_verdict(pool, decision("n1", "inc-2"), "node")
    assert not allowed and "1 of 4 GPU nodes out" in why


def test_once_a_person_uncordons_and_untaints_the_node_the_next_one_is_allowed() -> None:
    pool = [node("n0"), *[node(f"n{i}") for i in range(1, 4)]]  # n0 repaired by a person
    allowed, why = budget_verdict(pool, decision("n1", "inc-2"), "node")
    assert allowed, why


def test_a_dead_node_out_does_not_block_isolating_a_gpu_elsewhere() -> None:
    pool = [node("n0", cordoned=True), *EIGHT_BY_EIGHT[1:]]
    allowed, why = budget_verdict(pool, decision("n3", "inc-g", gpu=1, playbook="gpu-memory-fatal"), "gpu")
    assert allowed, why


def test_gpu_isolations_are_limited_by_the_gpu_budget() -> None:
    # 8x8 = 64 GPUs, 10 % -> 6 GPUs on their own; six isolated already
    pool = [node(f"n{i}", allocatable=7 if i < 6 else 8) for i in range(8)]
    allowed, why = budget_verdict(pool, decision("n7", "inc-g", gpu=1, playbook="gpu-memory-fatal"), "gpu")
    assert not allowed and "6 of 64 GPUs isolated" in why
    allowed, _ = budget_verdict(pool, decision("n0", "inc-g", gpu=1, playbook="gpu-memory-fatal"), "gpu")
    assert not allowed  # n0 is still in service: another GPU of it is one more


def test_isolated_gpus_count_once_whether_reserved_or_seen_in_allocatable() -> None:
    d = decision("n0", "inc-gpu", gpu=3, playbook="gpu-memory-fatal")
    ledger = Ledger().reserved(d, "p", "gpu", NOW)
    pool = [node("n0", allocatable=7), *EIGHT_BY_EIGHT[1:]]
    usage = pool_usage(facts(pool, "n1", "gpu"), ledger)
    assert usage is not None and usage.isolated == 1 and usage.nodes_out == frozenset()


@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["node", "gpu"])), max_size=30))
def test_the_budgets_never_let_more_out_than_their_limits(requests: list[tuple[int, str]]) -> None:
    """Whatever arrives, booking every allowed request: nodes out <= node limit, GPUs on their own <= GPU limit."""
    ledger = Ledger()
    for i, (n, q) in enumerate(requests):
        d = decision(f"n{n}", f"inc-{i}", gpu=i % 8 if q == "gpu" else None)
        only_budget = SafetyPolicy(enabled=frozenset({"budget"}))
        ledger, _ = decide(d, only_budget, facts(EIGHT_BY_EIGHT, d.node, q), ledger, NOW)
        usage = pool_usage(facts(EIGHT_BY_EIGHT, "n0", "gpu"), ledger)
        assert usage is not None
        assert len(usage.nodes_out) <= DEFAULTS.node_limit(8)
        assert usage.isolated <= DEFAULTS.gpu_limit(64)


def test_every_end_of_a_run_releases_its_reservation_and_records_a_handover_only_when_left_out() -> None:
    d = decision("n0", "inc-1")
    ledger = Ledger().reserved(d, "p", "node", NOW)
    left = {"ours": ["taint", "cordon"], "pool": "p", "out_of_service": True}
    after = ledger.finished(d, handover_of(d, "escalated", left, NOW))
    assert after.reservations == {}
    assert after.handovers[reservation_key(d)]["kind"] == "node"
    assert after.finished(d, None).handovers == {}  # a later run of the same incident returned it
    assert ledger.finished(decision("n0", "inc-other"), None) == ledger  # another incident's stays


def _rec(name: str, changed: bool = True, **after: Any) -> StepRecord:
    return StepRecord(name=name, status="succeeded", after={"changed_by_us": changed, **after})


@pytest.mark.parametrize(("records", "left"), [
    ([_rec("taint"), _rec("cordon"), _rec("drain"), _rec("escalate")], ["taint", "cordon"]),
    ([_rec("isolate_gpu"), _rec("reset_gpu"), _rec("health_check"), _rec("return_to_service", returned=True)], []),
    ([_rec("taint", changed=False), _rec("cordon")], ["cordon"]),
    ([_rec("isolate_gpu"), _rec("release_gpu")], []),
], ids=["gpu-lost-escalated", "returned", "taint-not-ours", "rolled-back"])
def test_what_a_run_leaves_in_place(records: list[StepRecord], left: list[str]) -> None:
    run = RunRecord("inc-1", "n0", "pb", "me")
    for i, r in enumerate(records):
        run.put(f"{r.name}#{i}", r)
    assert left_by_run(run) == left
