"""An incident's timeline told as a story: the lines the incident page leads with.

Where it sits: between the read model (``reader.incident_timeline``) and the web view. Pure: records in,
``StoryLine``s out. It reads the typed fields and ``after`` shapes of ``remediator.audit`` (decision,
guard verdict, step, playbook finished); ``why`` is shown as the writer's own sentence, never parsed.
Consecutive guard verdicts become one line, duplicate deliveries one line, a step's started/ended pair one
line ("drain: evicted 1 pods … (1 evicted, 2 skipped)").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from remediator.contracts import AuditRecord

__all__ = ["StoryLine", "headline", "tell"]


@dataclass(frozen=True)
class StoryLine:
    """One sentence of the story: when, what kind of fact (``alert``, ``decision``, ``guards``, ``step``,
    ``approval``, ``outcome``, …), the text, whether it is a problem, and the chain positions it covers."""

    time: datetime
    kind: str
    text: str
    short: str
    problem: bool
    seqs: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time.isoformat(), "kind": self.kind, "text": self.text, "short": self.short,
                "problem": self.problem, "seqs": list(self.seqs)}


def _hhmmss(t: datetime) -> str:
    return t.strftime("%H:%M:%S")


def _step_counts(after: dict[str, Any]) -> str:
    """``(12 evicted, 0 left)`` for a drain or eviction, from the lists its after-state holds."""
    parts = []
    for key in ("evicted", "skipped", "remaining", "left"):
        v = after.get(key)
        if isinstance(v, list):
            parts.append(f"{len(v)} {key}")
    return f" ({', '.join(parts)})" if parts else ""


def tell(timeline: Sequence[AuditRecord]) -> list[StoryLine]:
    """The story of one incident's timeline, in the timeline's order."""
    lines: list[StoryLine] = []
    i = 0
    recs = list(timeline)
    while i < len(recs):
        r = recs[i]
        a = r.after
        if r.what == "guard_verdict":
            j = i
            while j < len(recs) and recs[j].what == "guard_verdict":
                j += 1
            group = recs[i:j]
            blocked = [g for g in group if g.after.get("allowed") is False]
            names = ", ".join(f"{g.after.get('guard')} {'passed' if g.after.get('allowed') else 'BLOCKED'}"
                              for g in group)
            detail = "; ".join(f"{g.after.get('guard')}: {g.after.get('reason', g.why)}" for g in group)
            short = (f"guard verdicts ({len(group) - len(blocked)} of {len(group)} passed"
                     + (f", {', '.join(str(g.after.get('guard')) for g in blocked)} blocked" if blocked else "")
                     + ")")
            lines.append(StoryLine(r.time, "guards", f"Guard verdicts: {names}. {detail}", short, bool(blocked),
                                   tuple(g.seq for g in group)))
            i = j
            continue
        if r.what == "duplicate_ignored":
            j = i
            while j < len(recs) and recs[j].what == "duplicate_ignored":
                j += 1
            n = j - i
            lines.append(StoryLine(r.time, "duplicate", f"{n} duplicate deliver{'y' if n == 1 else 'ies'} of "
                                   "the same event ignored (JetStream duplicate window)", f"{n} duplicate(s) ignored",
                                   False, tuple(x.seq for x in recs[i:j])))
            i = j
            continue
        if r.what == "step_started":
            # the step's end, when it is the next record of the same step, tells it; else it is running
            end = next((x for x in recs[i + 1:] if x.what.startswith("step_") and x.what != "step_started"
                        and x.after.get("step") == a.get("step")), None)
            if end is not None:
                i += 1
                continue
            lines.append(StoryLine(r.time, "step", f"Step {a.get('step')} started: {r.why}", f"{a.get('step')} …",
                                   False, (r.seq,)))
        elif r.what in ("step_succeeded", "step_failed", "step_skipped"):
            step = str(a.get("step") or "step")
            result = r.what.removeprefix("step_")
            counts = _step_counts(a)
            text = f"Step {step} {result}: {r.why.removeprefix(step + ': ')}{counts}"
            short = step + counts + ("" if result == "succeeded" else f" {result.upper()}")
            lines.append(StoryLine(r.time, "step", text, short, result == "failed", (r.seq,)))
        elif r.what == "event_accepted":
            fp = f" (alert fingerprint {r.fingerprint})" if r.fingerprint else ""
            text = f"Event received {_hhmmss(r.time)}{fp}: {r.why}"
            msg = a.get("message")
            if msg:
                text += f" — {msg}"
            gpu = f" on {r.gpu}" if r.gpu else ""
            short = (f"alert {r.fingerprint} received {_hhmmss(r.time)}" if r.fingerprint
                     else f"event received {_hhmmss(r.time)}") + f": {msg or r.why}{gpu}"
            lines.append(StoryLine(r.time, "alert", text, short, False, (r.seq,)))
        elif r.what == "decision" and "handler" in a:
            text = f"Handler {a.get('handler')} chose playbook {a.get('playbook')} because {r.why}"
            lines.append(StoryLine(r.time, "decision", text, f"playbook {a.get('playbook')} because {r.why}", False,
                                   (r.seq,)))
        elif r.what == "decision":
            lines.append(StoryLine(r.time, "receipt", f"Executor {r.actor} took the run: {r.why}",
                                   f"run taken by {r.actor}", False, (r.seq,)))
        elif r.what == "approval_requested":
            text = f"Waiting for a person: {r.why}"
            lines.append(StoryLine(r.time, "approval", text, f"waiting for approval of {a.get('step')}", True,
                                   (r.seq,)))
        elif r.what == "approval":
            who = a.get("by") or r.actor
            lines.append(StoryLine(r.time, "approval", f"Approved by {who}: {r.why}", f"approved by {who}", False,
                                   (r.seq,)))
        elif r.what == "escalated":
            action = a.get("action") or r.why
            sev = f" ({a['severity']})" if a.get("severity") else ""
            lines.append(StoryLine(r.time, "escalated", f"Escalated to a person{sev}: {r.why}",
                                   f"escalated: {action}", True, (r.seq,)))
        elif r.what == "playbook_finished":
            outcome = str(a.get("outcome", "finished"))
            lines.append(StoryLine(r.time, "outcome", f"Playbook {a.get('playbook')} finished: {outcome}",
                                   f"outcome {outcome}", outcome not in ("completed", "dry-run"), (r.seq,)))
        else:
            lines.append(StoryLine(r.time, r.what, f"{r.what.replace('_', ' ').capitalize()}: {r.why}",
                                   r.what.replace("_", " "), r.what in ("dead_letter", "breaker_trip", "override"),
                                   (r.seq,)))
        i += 1
    return lines


def headline(lines: Sequence[StoryLine]) -> str:
    """The story in one line: each fact's short form joined by arrows, consecutive steps as one list
    ("taint, cordon, drain (1 evicted, 2 skipped)")."""
    parts: list[str] = []
    steps: list[str] = []
    prev = ""
    for line in lines:
        escalation_step = line.kind == "step" and prev == "escalated"  # the step that wrote the escalation
        prev = line.kind
        if escalation_step:
            continue
        if line.kind == "step":
            steps.append(line.short)
            continue
        if steps:
            parts.append(", ".join(steps))
            steps = []
        if line.kind in ("receipt", "duplicate"):
            continue
        parts.append(line.short)
    if steps:
        parts.append(", ".join(steps))
    return " → ".join(parts)
