"""Each safety guard, pure and table-driven: the case it blocks and the case it lets through."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from remediator import safety
from remediator.contracts import OPT_OUT_LABEL, Decision, GpuRef
from remediator.safety import (
    Attempt,
    BreakerState,
    GuardVerdict,
    PoolUsage,
    SafetyPolicy,
    SafetySnapshot,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
POLICY = SafetyPolicy(cooldown_s=600, attempt_window_s=86_400, max_node_attempts=3, max_gpu_attempts=2,
                      budget_max_node_fraction=0.1, budget_max_nodes=5, budget_max_gpu_fraction=0.1,
                      budget_max_gpus=64, breaker_threshold=3, breaker_window_s=300)


def decision(node: str = "gpu-node-1", gpu: int | None = 0, incident: str = "inc-1",
             playbook: str = "gpu-memory-fatal") -> Decision:
    return Decision(incident_id=incident, handler="xid", playbook=playbook, node=node,
                    gpu=GpuRef(index=gpu, uuid=f"GPU-{gpu}") if gpu is not None else None, group="g",
                    reason="test", event_id="ev-1", kind="xid", code=48, decided_at=NOW)


def snap(**kw: object) -> SafetySnapshot:
    base = SafetySnapshot(policy=POLICY, lock_holder="me", me="me", quarantine="gpu")
    return replace(base, **kw)  # type: ignore[arg-type]


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


def pool(out: int = 0, total: int = 100, gpus_out: int | None = None, node_gpus: int = 8) -> PoolUsage:
    nodes_out = frozenset(f"other-{i}" for i in range(out))
    return PoolUsage("a", total, total * 8, nodes_out, out * 8 if gpus_out is None else gpus_out, node_gpus)


CASES = [
    # guard, decision, snapshot, allowed, effect
    ("opt_out", decision(), snap(node_labels={OPT_OUT_LABEL: "true"}), False, "block"),
    ("opt_out", decision(), snap(node_labels={OPT_OUT_LABEL: "false"}), True, "proceed"),
    ("opt_out", decision(), snap(), True, "proceed"),
    ("dry_run", decision(), snap(policy=replace(POLICY, global_dry_run=True)), True, "shadow"),
    ("dry_run", decision(), snap(playbook_dry_run=True), True, "shadow"),
    ("dry_run", decision(), snap(), True, "proceed"),
    ("cooldown", decision(), snap(attempts=(Attempt("inc-0", "gpu-node-1", "GPU-0", ago(60)),)), False, "escalate"),
    ("cooldown", decision(), snap(attempts=(Attempt("inc-0", "gpu-node-1", "GPU-0", ago(3600)),)), True, "proceed"),
    ("cooldown", decision(), snap(attempts=(Attempt("inc-0", "gpu-node-1", "GPU-3", ago(60)),)), True, "proceed"),
    ("cooldown", decision(gpu=None), snap(attempts=(Attempt("inc-0", "gpu-node-1", "", ago(60)),)), False, "escalate"),
    ("cooldown", decision(), snap(attempts=tuple(Attempt(f"i{i}", "gpu-node-1", f"GPU-{i + 1}", ago(3600 * (i + 1)))
                                                 for i in range(3))), False, "escalate"),
    ("cooldown", decision(), snap(attempts=tuple(Attempt(f"i{i}", "gpu-node-1", "GPU-0", ago(3600 * (i + 1)))
                                                 for i in range(2))), False, "escalate"),
    ("cooldown", decision(), snap(attempts=tuple(Attempt(f"i{i}", "gpu-node-1", "GPU-0", ago(90_000 + i))
                                                 for i in range(5))), True, "proceed"),
    ("cooldown", decision(), snap(attempts=(Attempt("inc-1", "gpu-node-1", "GPU-0", ago(5)),)), True, "proceed"),
    # the decision this one supersedes (an NCCL suspect found after the no-suspect restart) is the same remediation
    ("cooldown", decision(gpu=None).model_copy(update={"labels": {"supersedes": "inc-0"}}),
     snap(attempts=(Attempt("inc-0", "gpu-node-1", "", ago(1)),)), True, "proceed"),
    ("cooldown", decision(gpu=None).model_copy(update={"labels": {"supersedes": "inc-9"}}),
     snap(attempts=(Attempt("inc-0", "gpu-node-1", "", ago(1)),)), False, "escalate"),
    # a job restart takes nothing out of the node: a GPU remediated there a moment ago does not hold it back
    ("cooldown", decision(gpu=None), snap(quarantine=None, attempts=(Attempt("inc-0", "gpu-node-1", "GPU-7",
                                                                             ago(4)),)), True, "proceed"),
    ("lock", decision(), snap(lock_holder="other"), False, "retry"),
    ("lock", decision(), snap(lock_holder=None), False, "retry"),
    ("lock", decision(), snap(), True, "proceed"),
    ("budget", decision(gpu=None), snap(quarantine="node", pool=pool(out=5)), False, "escalate"),
    ("budget", decision(gpu=None), snap(quarantine="node", pool=pool(out=4)), True, "proceed"),
    ("budget", decision(gpu=None), snap(quarantine="node", pool=pool(out=1, total=3)), False, "escalate"),
    ("budget", decision(gpu=None), snap(quarantine="node", pool=pool(out=0, total=3)), True, "proceed"),
    ("budget", decision(gpu=None), snap(quarantine="node", pool=replace(pool(out=5), nodes_out=frozenset(
        {"gpu-node-1", "a", "b", "c", "d"}))), True, "proceed"),
    ("budget", decision(), snap(quarantine="gpu", pool=pool(out=0, gpus_out=64)), False, "escalate"),
    ("budget", decision(), snap(quarantine="gpu", pool=pool(out=0, gpus_out=63)), True, "proceed"),
    ("budget", decision(), snap(quarantine=None, pool=pool(out=50)), True, "proceed"),
    ("breaker", decision(), snap(breaker=BreakerState(open=True, tripped_at=ago(10), reason="burst")), False, "block"),
    ("breaker", decision(), snap(breaker=BreakerState(quarantines=tuple((f"i{i}", ago(i)) for i in range(3)))),
     False, "trip"),
    ("breaker", decision(), snap(breaker=BreakerState(quarantines=tuple((f"i{i}", ago(i)) for i in range(2)))),
     True, "proceed"),
    ("breaker", decision(), snap(breaker=BreakerState(quarantines=tuple((f"i{i}", ago(400 + i)) for i in range(9)))),
     True, "proceed"),
    ("breaker", decision(), snap(quarantine=None, breaker=BreakerState(quarantines=tuple(
        (f"i{i}", ago(i)) for i in range(5)))), True, "proceed"),
    ("approval", decision(), snap(approval_steps=("reboot_node",)), False, "wait"),
    ("approval", decision(), snap(approval_steps=("reboot_node",), approved_by="alice"), True, "proceed"),
    ("approval", decision(), snap(), True, "proceed"),
]


@pytest.mark.parametrize(("guard", "dec", "snapshot", "allowed", "effect"), CASES,
                         ids=[f"{c[0]}-{i}-{'allows' if c[3] else 'blocks'}" for i, c in enumerate(CASES)])
def test_guard(guard: str, dec: Decision, snapshot: SafetySnapshot, allowed: bool, effect: str) -> None:
    fn = dict(safety.GUARDS)[guard]
    v = fn(dec, snapshot, NOW)
    assert isinstance(v, GuardVerdict)
    assert (v.name, v.allowed, v.effect) == (guard, allowed, effect), v.reason
    assert v.reason


def test_every_guard_has_a_blocking_and_a_passing_case() -> None:
    for name in safety.GUARD_NAMES:
        outcomes = {c[3] for c in CASES if c[0] == name}
        if name == "dry_run":
            assert {c[4] for c in CASES if c[0] == name} == {"shadow", "proceed"}
        else:
            assert outcomes == {True, False}, name


def test_evaluate_runs_in_order_and_stops_at_the_first_block() -> None:
    s = snap(node_labels={OPT_OUT_LABEL: "true"}, lock_holder="other")
    verdicts = safety.evaluate(decision(), s, NOW)
    assert [v.name for v in verdicts] == ["opt_out"]
    verdicts = safety.evaluate(decision(), snap(lock_holder="other"), NOW)
    assert [v.name for v in verdicts] == ["opt_out", "dry_run", "cooldown", "lock"]
    assert safety.blocking(verdicts) == verdicts[-1]
    verdicts = safety.evaluate(decision(), snap(), NOW)
    assert [v.name for v in verdicts] == list(safety.GUARD_NAMES)
    assert safety.blocking(verdicts) is None


def test_disabled_guards_are_reported_but_the_lock_is_always_on() -> None:
    policy = replace(POLICY, enabled=frozenset({"opt_out"}))
    s = snap(policy=policy, lock_holder="other", breaker=BreakerState(open=True))
    verdicts = safety.evaluate(decision(), s, NOW)
    by = {v.name: v for v in verdicts}
    assert by["dry_run"].reason == "disabled"
    assert by["lock"].allowed is False


def test_shadow_mode_is_visible_to_the_executor() -> None:
    verdicts = safety.evaluate(decision(), snap(playbook_dry_run=True), NOW)
    assert safety.shadow(verdicts)


def test_node_limit_always_allows_one_node_per_pool() -> None:
    assert POLICY.node_limit(1) == 1
    assert POLICY.node_limit(3) == 1
    assert POLICY.node_limit(40) == 4
    assert POLICY.node_limit(1000) == 5


def test_breaker_state_round_trips_and_forgets_old_quarantines() -> None:
    b = BreakerState().with_quarantine("a", ago(1000), 300).with_quarantine("b", NOW, 300)
    assert [i for i, _ in b.quarantines] == ["b"]
    assert b.with_quarantine("b", NOW, 300) is b
    t = b.tripped(NOW, "burst")
    assert BreakerState.from_json(t.to_json()) == t
    assert t.reset() == BreakerState()
