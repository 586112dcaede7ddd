"""Service metrics are derived from the audit records a replica writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from remediator.contracts import AuditRecord
from remediator.metrics import ServiceMetrics

T0 = datetime(2026, 11, 30, 3, 12, tzinfo=UTC)


def rec(what: str, why: str = "", after: dict[str, Any] | None = None, at: float = 0.0,
        incident: str | None = "inc-1") -> AuditRecord:
    return AuditRecord(seq=1, time=T0 + timedelta(seconds=at), incident=incident, node="gpu-node-1", actor="r",
                       what=what, why=why, after=after or {}, prev_hash="0" * 64, hash="x")  # type: ignore[arg-type]


def test_a_run_shows_up_in_every_series() -> None:
    m = ServiceMetrics()
    m.observe(rec("decision", "Xid 79", {"playbook": "gpu-lost", "handler": "xid"}))
    m.observe(rec("decision", "received by r: playbook gpu-lost", {"playbook": "gpu-lost"}))  # executor receipt
    m.observe(rec("guard_verdict", "budget: ok", {"name": "budget", "allowed": True}))
    m.observe(rec("guard_verdict", "cooldown: no", {"name": "cooldown", "allowed": False}))
    m.observe(rec("step_started", "taint: taint"))
    text = m.render().decode()
    assert "remediator_runs_in_progress 1" in text
    m.observe(rec("step_succeeded", "taint: tainted", at=1.5))
    m.observe(rec("step_failed", "drain: PDB", at=2.0))
    m.observe(rec("playbook_finished", "gpu-lost: escalated", {"outcome": "escalated"}, at=3.0))
    m.observe(rec("breaker_trip", "burst", incident=None))
    text = m.render().decode()
    assert 'remediator_decisions_total{playbook="gpu-lost"} 1' in text
    assert 'remediator_guard_blocks_total{guard="cooldown"} 1' in text and 'guard="budget"' not in text
    assert 'remediator_steps_total{step="taint",result="succeeded"} 1' in text
    assert 'remediator_steps_total{step="drain",result="failed"} 1' in text
    assert 'remediator_playbook_runs_total{playbook="gpu-lost",outcome="escalated"} 1' in text
    assert "remediator_breaker_open 1" in text and "remediator_runs_in_progress 0" in text
    assert "remediator_decision_to_first_action_seconds_sum 1.5" in text
    assert "remediator_decision_to_first_action_seconds_count 1" in text
    assert "# TYPE remediator_decisions_total counter" in text
