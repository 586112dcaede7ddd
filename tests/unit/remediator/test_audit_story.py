"""The audit read model and story, pure: an incident's timeline (its records and the records of its events),
its summary (playbook, outcome, a pending approval), the cursor pages of the incident list, the story lines
and headline, and the pending-approvals gauge — over records built here the way the service writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from remediator.audit_api.reader import (
    MAX_LIMIT,
    IncidentFilter,
    incident_timeline,
    page_incidents,
    summarize,
)
from remediator.audit_api.story import headline, tell
from remediator.contracts import GENESIS_HASH, AuditRecord
from remediator.metrics import ServiceMetrics

T0 = datetime(2026, 11, 30, 3, 11, 58, tzinfo=UTC)


class Chain:
    """Records of one node's chain, linked and hashed as ``AuditLog`` links them."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.records: list[AuditRecord] = []

    def add(self, what: str, why: str = "", *, incident: str | None = None, after: dict[str, Any] | None = None,
            event_id: str | None = "ev-1", fingerprint: str | None = "fp-79", gpu: str | None = "GPU-aaa",
            seconds: float | None = None) -> AuditRecord:
        prev = self.records[-1] if self.records else None
        fields = {"version": 1, "seq": len(self.records) + 1,
                  "time": (T0 + timedelta(seconds=len(self.records) if seconds is None else seconds)).isoformat(),
                  "incident": incident, "node": self.node, "gpu": gpu, "actor": "replica-0", "what": what,
                  "why": why, "before": {}, "after": after or {}, "trace_id": "t" * 32, "event_id": event_id,
                  "job": None, "fingerprint": fingerprint, "prev_hash": prev.hash if prev else GENESIS_HASH}
        draft = AuditRecord.model_validate({**fields, "hash": ""}).model_dump(mode="json")
        rec = AuditRecord.model_validate({**draft, "hash": AuditRecord.digest(draft)})
        self.records.append(rec)
        return rec


def gpu_lost(chain: Chain, inc: str = "inc-1", *, finish: bool = True, gated: bool = False) -> list[AuditRecord]:
    chain.add("duplicate_ignored", "already on FAULTS")
    chain.add("event_accepted", "xid 79 from alertmanager", after={"message": "Xid 79 on GPU 3"})
    chain.add("decision", "Xid 79 on GPU GPU-aaa: fallen off the bus", incident=inc,
              after={"playbook": "gpu-lost", "handler": "xid", "group": "node:n",
                     "evidence": [{"kind": "xid", "code": 79, "detail": "Xid 79"}]})
    chain.add("decision", "received by replica-0", incident=inc, after={"playbook": "gpu-lost", "resumed": False})
    for guard in ("opt_out", "budget"):
        chain.add("guard_verdict", f"{guard}: ok", incident=inc,
                  after={"guard": guard, "allowed": True, "reason": "ok", "effect": "proceed"})
    for step in ("taint", "cordon"):
        chain.add("step_started", f"{step}: {step}", incident=inc, after={"step": step})
        chain.add("step_succeeded", f"{step}: done", incident=inc, after={"step": step, "changed_by_us": True})
    if gated:
        chain.add("step_started", "drain: drain", incident=inc, after={"step": "drain"})
        chain.add("approval_requested", "step drain waits for `remediator approve inc-1`", incident=inc,
                  after={"step": "drain", "playbook": "gpu-lost"})
        return chain.records
    chain.add("step_started", "drain: drain", incident=inc, after={"step": "drain"})
    chain.add("step_succeeded", "drain: evicted 12 pods", incident=inc,
              after={"step": "drain", "evicted": [{"name": f"p{i}"} for i in range(12)], "remaining": []})
    chain.add("escalated", "power-cycle the node", incident=inc,
              after={"action": "power-cycle the node", "severity": "critical"})
    chain.add("step_succeeded", "escalate: escalated", incident=inc, after={"step": "escalate"})
    if finish:
        chain.add("playbook_finished", "gpu-lost: escalated", incident=inc,
                  after={"playbook": "gpu-lost", "outcome": "escalated", "steps": []})
    return chain.records


def test_the_timeline_holds_the_records_naming_the_incident_and_those_of_its_event() -> None:
    c = Chain("gpu-node-17")
    c.add("event_accepted", "another event", event_id="ev-other")
    recs = gpu_lost(c)
    tl = incident_timeline(recs, "inc-1")
    assert tl[0].what == "duplicate_ignored" and tl[1].what == "event_accepted"
    assert tl[-1].what == "playbook_finished"  # first and last both there
    assert all(r.event_id == "ev-1" for r in tl)
    assert len(tl) == len(recs) - 1  # only the other event's record is left out
    assert incident_timeline(recs, "inc-unknown") == []


def test_summary_reads_playbook_fault_and_outcome_from_the_typed_fields() -> None:
    s = summarize(incident_timeline(gpu_lost(Chain("gpu-node-17")), "inc-1"))
    assert (s.node, s.gpu, s.fingerprint, s.playbook, s.handler, s.kind, s.code, s.outcome) == (
        "gpu-node-17", "GPU-aaa", "fp-79", "gpu-lost", "xid", "xid", 79, "escalated")
    assert s.pending_approval == () and s.trace_id == "t" * 32


def test_an_unanswered_approval_request_is_pending_until_the_approval() -> None:
    c = Chain("n")
    recs = gpu_lost(c, gated=True)
    s = summarize(incident_timeline(recs, "inc-1"))
    assert s.outcome == "pending-approval" and s.pending_approval == ("drain",)
    c.add("approval", "checked", incident="inc-1", after={"by": "nats:OPS/alice"})
    assert summarize(incident_timeline(c.records, "inc-1")).outcome == "open"
    lines = tell(incident_timeline(c.records, "inc-1"))
    assert any(line.kind == "approval" and "nats:OPS/alice" in line.text for line in lines)


def test_the_story_and_its_headline() -> None:
    lines = tell(incident_timeline(gpu_lost(Chain("gpu-node-17")), "inc-1"))
    kinds = [line.kind for line in lines]
    assert kinds == ["duplicate", "alert", "decision", "receipt", "guards", "step", "step", "step", "escalated",
                     "step", "outcome"]
    text = headline(lines)
    assert text.startswith("alert fp-79 received 03:11:5")
    assert ("playbook gpu-lost because Xid 79 on GPU GPU-aaa: fallen off the bus → guard verdicts (2 of 2 passed)"
            " → taint, cordon, drain (12 evicted, 0 remaining) → escalated: power-cycle the node → outcome escalated"
            ) in text
    guards = next(line for line in lines if line.kind == "guards")
    assert len(guards.seqs) == 2 and not guards.problem


def test_a_blocked_guard_and_a_failed_step_are_problems() -> None:
    c = Chain("n")
    c.add("guard_verdict", "budget: no", incident="i", after={"guard": "budget", "allowed": False, "reason": "no",
                                                              "effect": "block"})
    c.add("step_failed", "drain: PDB", incident="i", after={"step": "drain"})
    lines = tell(c.records)
    assert [line.problem for line in lines] == [True, True]
    assert "budget blocked" in lines[0].short and "FAILED" in lines[1].short


def summaries(n: int) -> list[Any]:
    out = []
    for i in range(n):
        c = Chain(f"node-{i % 3}")
        recs = gpu_lost(c, inc=f"inc-{i:02d}", finish=i % 2 == 0)
        shifted = [r.model_copy(update={"time": r.time + timedelta(minutes=i)}) for r in recs]
        out.append(summarize(incident_timeline(shifted, f"inc-{i:02d}")))
    return out


def test_pages_walk_every_match_once_newest_first() -> None:
    all_ = summaries(7)
    seen: list[str] = []
    cursor = None
    while True:
        page = page_incidents(all_, IncidentFilter(), 3, cursor)
        assert page.total == 7
        seen += [s.id for s in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [f"inc-{i:02d}" for i in reversed(range(7))]
    only = page_incidents(all_, IncidentFilter(node="node-1", outcome="open"), MAX_LIMIT)
    assert [s.id for s in only.items] == [s.id for s in reversed(all_) if s.node == "node-1" and s.outcome == "open"]


@pytest.mark.parametrize(("kwargs", "limit", "cursor"), [
    ({}, 0, None), ({}, MAX_LIMIT + 1, None), ({}, 10, "garbage!"), ({"node": "x" * 257}, 10, None)], ids=str)
def test_bad_inputs_are_refused(kwargs: dict[str, str], limit: int, cursor: str | None) -> None:
    with pytest.raises(ValueError):
        page_incidents(summaries(1), IncidentFilter(**kwargs), limit, cursor)


def test_the_pending_approvals_gauge() -> None:
    m = ServiceMetrics()
    for r in gpu_lost(Chain("n"), gated=True):
        m.observe(r)
    assert "remediator_approvals_pending 1" in m.render().decode()
    c = Chain("n")
    m.observe(c.add("guard_verdict", "approval: ok", incident="inc-1",
                    after={"guard": "approval", "allowed": True, "reason": "approved", "effect": "proceed"}))
    assert "remediator_approvals_pending 0" in m.render().decode()
