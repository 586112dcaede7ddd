"""Service metrics, derived from the audit trail as it is written (DESIGN.md §9).

Where it sits: beside ``AuditLog``. Every fact the service acts on is already an audit record, so instead of
counters sprinkled through dispatch and the executor, ``ServiceMetrics.observe`` reads each record this
replica appends and keeps the Prometheus series: decisions by playbook, guard blocks by guard, steps by
result, playbook outcomes, breaker state, runs in progress, and the time from a decision to its first
action. The ingest app serves them on ``/metrics`` next to its own request counters.

One source is not the audit trail: the Kubernetes adapter's client-side rate limiter (``watch_limiter``),
read when the page is rendered — requests waiting now, sent, and seconds spent waiting, per lane
(``quarantine``, ``read``, ``bulk``: ``remediator.adapters.ratelimit``).

Only typed fields are read: the record's kind (``what``), ``incident``, ``time`` and the ``after`` shapes
defined in ``remediator.audit`` (``DecisionAfter``, ``GuardVerdictAfter``, ``StepAfter``,
``PlaybookFinishedAfter``); never the prose in ``why``. A step record without ``step`` is the step its
incident's last ``step_started`` named (steps of one run are sequential), and a ``playbook_finished``
without ``playbook`` is the playbook the incident's ``decision`` named.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Protocol, TypeVar

from remediator.contracts import AuditRecord

_Labels = tuple[tuple[str, str], ...]
_V = TypeVar("_V")


def _fmt(labels: _Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels)
    return "{" + inner + "}"


class LimiterView(Protocol):
    """What the metrics read of a rate limiter (``remediator.adapters.ratelimit.LanedLimiter``)."""

    def queued(self) -> Mapping[str, int]: ...

    def taken(self) -> Mapping[str, int]: ...

    def waited(self) -> Mapping[str, float]: ...


class ServiceMetrics:
    """Counters and gauges of one replica; thread-safe, rendered in the Prometheus text format."""

    _HELP = {
        "remediator_audit_records_total": ("counter", "Audit records written by this replica, by kind."),
        "remediator_decisions_total": ("counter", "Decisions made, by playbook."),
        "remediator_guard_blocks_total": ("counter", "Decisions a safety guard did not let through, by guard."),
        "remediator_steps_total": ("counter", "Playbook steps finished, by step and result."),
        "remediator_playbook_runs_total": ("counter", "Playbook runs finished, by playbook and outcome."),
        "remediator_breaker_open": ("gauge", "1 while the circuit breaker is open (as last seen here)."),
        "remediator_runs_in_progress": ("gauge", "Playbook runs started here and not finished yet."),
        "remediator_approvals_pending": (
            "gauge", "Incidents whose gated step waits for `remediator approve` (as last seen here)."),
        "remediator_decision_to_first_action_seconds": (
            "summary", "Time from a decision to its playbook's first completed step."),
        "remediator_ready": ("gauge", "1 while a readiness condition (bus, consumers, kubernetes) holds."),
        "remediator_kube_requests_queued": (
            "gauge", "Kubernetes requests waiting for the client-side rate limit now, by lane."),
        "remediator_kube_requests_total": ("counter", "Kubernetes requests sent (each retry included), by lane."),
        "remediator_kube_request_wait_seconds_total": (
            "counter", "Seconds Kubernetes requests waited for the client-side rate limit, by lane."),
        "remediator_events_refused_total": (
            "counter", "Events dispatch refused and audited as event_ignored, by reason (subject_mismatch: an "
                       "agent event naming another node or source than its subject)."),
        "remediator_identity_issued_total": (
            "counter", "Agent credentials issued by POST /v1/identity/agent after a TokenReview."),
        "remediator_identity_refusals_total": (
            "counter", "Requests POST /v1/identity/agent refused, by reason (remediator.identity.http codes)."),
        "remediator_agent_command_refusals_total": (
            "counter", "Commands an agent refused and reported (audited as command_refused), by reason."),
    }

    def __init__(self, pending_limit: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, _Labels], float] = {}
        self._gauges: dict[str, float] = {"remediator_breaker_open": 0.0, "remediator_runs_in_progress": 0.0,
                                          "remediator_approvals_pending": 0.0}
        # per incident, bounded: when it was decided, its playbook, the step running now
        self._decided_at: OrderedDict[str, datetime] = OrderedDict()
        self._playbook_of: OrderedDict[str, str] = OrderedDict()
        self._step_of: OrderedDict[str, str] = OrderedDict()
        self._running: set[str] = set()
        self._awaiting: set[str] = set()  # incidents with an unanswered approval_requested
        self._latency_sum = 0.0
        self._latency_count = 0
        self._pending_limit = pending_limit
        self._ready: dict[str, float] = {}
        self._limiter: LimiterView | None = None

    def _inc(self, name: str, labels: _Labels = (), n: float = 1.0) -> None:
        self._counters[(name, labels)] = self._counters.get((name, labels), 0.0) + n

    def observe(self, r: AuditRecord) -> None:
        """Account for one audit record (an ``AuditLog`` observer)."""
        after = r.after
        with self._lock:
            self._inc("remediator_audit_records_total", (("what", r.what),))
            if r.what == "decision":
                playbook = str(after.get("playbook"))
                if r.incident:
                    self._remember(self._playbook_of, r.incident, playbook)
                if "handler" in after:  # the dispatcher's decision, not the executor's receipt
                    self._inc("remediator_decisions_total", (("playbook", playbook),))
                    if r.incident:
                        self._remember(self._decided_at, r.incident, r.time)
            elif r.what == "guard_verdict" and after.get("allowed") is False:
                self._inc("remediator_guard_blocks_total", (("guard", str(after.get("guard"))),))
            elif r.what == "step_started" and r.incident:
                self._running.add(r.incident)
                self._remember(self._step_of, r.incident, str(after.get("step")))
            elif r.what in ("step_succeeded", "step_failed", "step_skipped"):
                step = after.get("step") or (self._step_of.get(r.incident) if r.incident else None)
                self._inc("remediator_steps_total",
                          (("step", str(step or "unknown")), ("result", r.what.removeprefix("step_"))))
                decided = self._decided_at.pop(r.incident, None) if r.incident and r.what == "step_succeeded" \
                    else None
                if decided is not None:
                    self._latency_sum += max(0.0, (r.time - decided).total_seconds())
                    self._latency_count += 1
            elif r.what == "playbook_finished":
                ran = after.get("playbook") or (self._playbook_of.get(r.incident) if r.incident else None)
                outcome = str(after.get("outcome", "unknown"))
                self._inc("remediator_playbook_runs_total",
                          (("playbook", str(ran or "unknown")), ("outcome", outcome)))
                if r.incident:
                    self._running.discard(r.incident)
                    for pending in (self._decided_at, self._playbook_of, self._step_of):
                        pending.pop(r.incident, None)
            elif r.what == "event_ignored" and isinstance(after.get("refused"), str):
                self._inc("remediator_events_refused_total", (("reason", str(after["refused"])[:64]),))
            elif r.what == "command_refused":  # one record per reason per report: after.count commands
                count = after.get("count", 1)
                self._inc("remediator_agent_command_refusals_total",
                          (("reason", str(after.get("refused", "unknown"))[:64]),),
                          float(count) if isinstance(count, int) and 0 < count < 2**31 else 1.0)
            elif r.what == "breaker_trip":
                self._gauges["remediator_breaker_open"] = 1.0
            elif r.what == "breaker_reset":
                self._gauges["remediator_breaker_open"] = 0.0
            if r.incident and r.what == "approval_requested":
                self._awaiting.add(r.incident)
            elif r.incident and (r.what in ("approval", "playbook_finished")
                                 or (r.what == "guard_verdict" and after.get("guard") == "approval"
                                     and after.get("allowed") is True)):
                self._awaiting.discard(r.incident)
            self._gauges["remediator_runs_in_progress"] = float(len(self._running))
            self._gauges["remediator_approvals_pending"] = float(len(self._awaiting))

    def identity_request(self, outcome: str) -> None:
        """Count one ``POST /v1/identity/agent``: ``issued`` or its refusal's code
        (``remediator.identity.http.REFUSAL_CODES``, a fixed vocabulary)."""
        with self._lock:
            if outcome == "issued":
                self._inc("remediator_identity_issued_total")
            else:
                self._inc("remediator_identity_refusals_total", (("reason", outcome[:64]),))

    def watch_limiter(self, limiter: LimiterView) -> None:
        """Show ``limiter``'s queue, requests and waiting per lane on every render."""
        self._limiter = limiter

    def set_ready(self, condition: str, ok: bool) -> None:
        """Record a readiness condition as last probed (``remediator.readiness``)."""
        with self._lock:
            self._ready[condition] = 1.0 if ok else 0.0

    def _remember(self, table: OrderedDict[str, _V], incident: str, value: _V) -> None:
        table[incident] = value
        table.move_to_end(incident)
        while len(table) > self._pending_limit:
            table.popitem(last=False)

    def render(self) -> bytes:
        with self._lock:
            by_name: dict[str, list[str]] = {}
            for (name, labels), value in sorted(self._counters.items()):
                by_name.setdefault(name, []).append(f"{name}{_fmt(labels)} {value:g}")
            for name, value in self._gauges.items():
                by_name.setdefault(name, []).append(f"{name} {value:g}")
            for condition, value in sorted(self._ready.items()):
                by_name.setdefault("remediator_ready", []).append(
                    f"remediator_ready{_fmt((('condition', condition),))} {value:g}")
            limiter = self._limiter
            if limiter is not None:
                for name, series in (("remediator_kube_requests_queued", limiter.queued()),
                                     ("remediator_kube_requests_total", limiter.taken()),
                                     ("remediator_kube_request_wait_seconds_total", limiter.waited())):
                    by_name[name] = [f"{name}{_fmt((('lane', lane),))} {value:g}"
                                     for lane, value in sorted(series.items())]
            summary = "remediator_decision_to_first_action_seconds"
            by_name[summary] = [f"{summary}_sum {self._latency_sum:g}", f"{summary}_count {self._latency_count}"]
        out: list[str] = []
        for name, (kind, text) in self._HELP.items():
            if name in by_name:
                out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *by_name[name]]
        return ("\n".join(out) + "\n").encode()
