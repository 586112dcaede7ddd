"""Service metrics are derived from the audit records a replica writes, from their typed fields only.

The records here are built with the producers' own shape builders (``remediator.audit``'s, and
``GuardVerdict.to_json``); ``tests/integration/test_metrics_producers.py`` feeds records the real dispatcher
and executor wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from remediator.audit import decision_after, finished_after, step_after
from remediator.contracts import AuditRecord, Decision
from remediator.metrics import ServiceMetrics
from remediator.safety.guards import GuardVerdict

T0 = datetime(2026, 11, 30, 3, 12, tzinfo=UTC)
DECISION = Decision(incident_id="inc-1", handler="xid", playbook="gpu-lost", node="gpu-node-1", group="gpu:0",
                    reason="Xid 79", event_id="e1", kind="xid", code=79, decided_at=T0)


def rec(what: str, why: str = "", after: Mapping[str, Any] | None = None, at: float = 0.0,
        incident: str | None = "inc-1") -> AuditRecord:
    return AuditRecord(seq=1, time=T0 + timedelta(seconds=at), incident=incident, node="gpu-node-1", actor="r",
                       what=what, why=why, after=dict(after or {}), prev_hash="0" * 64, hash="x")  # type: ignore[arg-type]


def test_a_run_shows_up_in_every_series() -> None:
    m = ServiceMetrics()
    m.observe(rec("decision", "Xid 79", decision_after(DECISION)))
    m.observe(rec("decision", "received by r: playbook gpu-lost", {"playbook": "gpu-lost", "resumed": False}))
    m.observe(rec("guard_verdict", "budget: ok", GuardVerdict("budget", True, "ok").to_json()))
    m.observe(rec("guard_verdict", "cooldown: no", GuardVerdict("cooldown", False, "no", "escalate").to_json()))
    m.observe(rec("step_started", "taint: taint", step_after("taint", {"params": {}})))
    text = m.render().decode()
    assert "remediator_runs_in_progress 1" in text
    m.observe(rec("step_succeeded", "taint: tainted", step_after("taint", {"changed_by_us": True}), at=1.5))
    m.observe(rec("step_failed", "drain: PDB", step_after("drain"), at=2.0))
    m.observe(rec("playbook_finished", "gpu-lost: escalated", finished_after("gpu-lost", "escalated"), at=3.0))
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


def test_prose_is_never_read() -> None:
    """``why`` may say anything: the series come from the typed fields alone."""
    m = ServiceMetrics()
    m.observe(rec("guard_verdict", "lock: held by replica-b", GuardVerdict("lock", False, "held", "retry").to_json()))
    m.observe(rec("step_succeeded", "not-a-step-name: whatever", step_after("cordon")))
    m.observe(rec("playbook_finished", "misleading: text", finished_after("gpu-reset", "completed")))
    text = m.render().decode()
    assert 'remediator_guard_blocks_total{guard="lock"} 1' in text
    assert 'remediator_steps_total{step="cordon",result="succeeded"} 1' in text
    assert 'remediator_playbook_runs_total{playbook="gpu-reset",outcome="completed"} 1' in text
    assert "not-a-step-name" not in text and "misleading" not in text


def test_a_step_record_without_its_key_is_the_step_its_run_started() -> None:
    """Steps of one run are sequential: the last ``step_started`` of the incident names the step that ended,
    and the decision names the playbook that finished."""
    m = ServiceMetrics()
    m.observe(rec("decision", "received", {"playbook": "gpu-lost", "resumed": False}))
    m.observe(rec("step_started", "drain: drain", step_after("drain")))
    m.observe(rec("step_succeeded", "drain: 3 pods evicted", {"evicted": 3}))
    m.observe(rec("playbook_finished", "gpu-lost: escalated", {"outcome": "escalated"}))
    text = m.render().decode()
    assert 'remediator_steps_total{step="drain",result="succeeded"} 1' in text
    assert 'remediator_playbook_runs_total{playbook="gpu-lost",outcome="escalated"} 1' in text


def test_refusals_are_counted_by_reason() -> None:
    m = ServiceMetrics()
    m.observe(rec("event_ignored", "gpu-node-2 on gpu-node-1's subject", {"refused": "subject_mismatch"},
                  incident=None))
    m.observe(rec("event_ignored", "no handler for kind thermal", {}, incident=None))  # not a refusal
    m.observe(rec("command_refused", "3 unsigned", {"refused": "unsigned", "count": 3}, incident=None))
    m.observe(rec("command_refused", "1 replayed", {"refused": "replayed", "count": 1}, incident=None))
    m.observe(rec("command_refused", "junk count", {"refused": "replayed", "count": "many"}, incident=None))
    m.identity_request("no_token")
    m.identity_request("no_token")
    m.identity_request("issued")
    text = m.render().decode()
    assert 'remediator_events_refused_total{reason="subject_mismatch"} 1' in text
    assert text.count("remediator_events_refused_total{") == 1
    assert 'remediator_agent_command_refusals_total{reason="unsigned"} 3' in text
    assert 'remediator_agent_command_refusals_total{reason="replayed"} 2' in text
    assert 'remediator_identity_refusals_total{reason="no_token"} 2' in text
    assert "remediator_identity_issued_total 1" in text
