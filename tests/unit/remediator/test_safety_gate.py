"""The gate's pure part: guards over facts and one ledger, and the ledger they leave behind."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from remediator.contracts import OPT_OUT_LABEL, Decision, GpuRef
from remediator.safety import BreakerState, Facts, Ledger, SafetyPolicy, reservation_key
from remediator.safety.gate import decide, pool_usage

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
TAINT = "gpu-remediator.io/quarantine"
POLICY = SafetyPolicy(budget_max_node_fraction=0.5, budget_max_nodes=10, budget_max_gpu_fraction=1.0,
                      breaker_threshold=2, breaker_window_s=300)


def pool_node(name: str, *, cordoned: bool = False, tainted: bool = False) -> dict[str, Any]:
    return {"name": name, "gpus": 8, "unschedulable": cordoned,
            "taints": [{"key": TAINT, "effect": "NoSchedule"}] if tainted else []}


POOL = [pool_node(f"n{i}") for i in range(4)]


def facts(**kw: Any) -> Facts:
    base = Facts(node={"name": "n0", "pool": "a", "gpus": 8, "labels": {}}, quarantine="node",
                 playbook_dry_run=False, me="me", lock_holder="me", taint_key=TAINT, pool_nodes=POOL)
    return replace(base, **kw)


def decision(node: str = "n0", incident: str = "inc-1") -> Decision:
    return Decision(incident_id=incident, handler="xid", playbook="gpu-lost", node=node, gpu=GpuRef(index=0),
                    group="g", reason="test", event_id="ev-1", kind="xid", code=79, decided_at=NOW)


def test_a_run_that_goes_ahead_reserves_its_target_and_counts_a_quarantine() -> None:
    d = decision()
    ledger, result = decide(d, POLICY, facts(), Ledger(), NOW)
    assert result.stop is None and result.reserved and result.tripped is None
    assert ledger.reservations[reservation_key(d)]["pool"] == "a"
    assert [i for i, _ in ledger.breaker.quarantines] == ["inc-1"]
    again, second = decide(d, POLICY, facts(), ledger, NOW)  # a resumed run: nothing more to book
    assert again == ledger and second.reserved


@pytest.mark.parametrize(("kw", "guard"), [
    ({"node": {"name": "n0", "pool": "a", "labels": {OPT_OUT_LABEL: "true"}}}, "opt_out"),
    ({"lock_holder": "replica-b|inc-9|abcd"}, "lock"),
    ({"playbook_dry_run": True}, None),
], ids=["opt-out", "lock-held", "shadow"])
def test_nothing_is_booked_when_the_run_does_not_go_ahead_for_real(kw: dict[str, Any], guard: str | None) -> None:
    ledger, result = decide(decision(), POLICY, facts(**kw), Ledger(), NOW)
    assert ledger == Ledger() and not result.reserved
    assert (result.stop.name if result.stop else None) == guard
    if guard is None:
        assert result.shadow


def test_reservations_of_other_runs_count_against_the_budget() -> None:
    taken = Ledger().reserved(decision("n1", "inc-0"), "a", "node", NOW)
    ledger, result = decide(decision(), POLICY, facts(), taken, NOW)
    assert result.stop is None  # 2 of 4 allowed
    usage = pool_usage(facts(), ledger)
    assert usage is not None and usage.nodes_out == {"n0", "n1"}
    third = decide(decision("n2", "inc-2"), POLICY, facts(node={"name": "n2", "pool": "a", "gpus": 8}), ledger, NOW)
    assert third[1].stop is not None and third[1].stop.name == "budget" and third[0] == ledger


def test_the_burst_that_reaches_the_threshold_trips_the_breaker() -> None:
    b = BreakerState(quarantines=(("inc-a", NOW), ("inc-b", NOW)))
    ledger, result = decide(decision(), replace(POLICY, enabled=frozenset({"breaker"})), facts(), Ledger(b), NOW)
    assert result.stop is not None and result.stop.effect == "trip"
    assert result.tripped is not None and ledger.breaker == result.tripped and ledger.breaker.open
    assert not result.reserved


def test_settling_drops_or_finishes_only_the_runs_own_reservation() -> None:
    d = decision()
    ledger = Ledger().reserved(d, "a", "node", NOW)
    assert ledger.settled(d, released=True).reservations == {}
    assert ledger.settled(d, released=False).reservations[reservation_key(d)]["finished"] is True
    assert ledger.settled(decision(incident="inc-other"), released=True) == ledger
