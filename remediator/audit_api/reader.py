"""The audit read model: incidents, timelines, node histories and fleet state over the AUDIT stream and KV.

Where it sits: under the audit API (``remediator.audit_api.routes``) and the web view (``views``), beside
``remediator audit`` (which selects an incident's timeline with the same ``incident_timeline``). Read-only:
it never publishes, never writes KV. It lists the AUDIT stream once and then reads only what was appended
since (``AuditReader.refresh``, at most every ``refresh_s``), like an informer's cache; the fleet state
(breaker, budget reservations, approvals) is read from the state bucket on every request, so every replica
and ``audit serve`` show the same cluster-wide state.

An incident is summarised from its records alone (``summarize``): the node, GPU, job and fingerprint every
record carries (DESIGN.md §8), the playbook of its ``decision`` (``DecisionAfter``), the outcome of its
``playbook_finished`` (``PlaybookFinishedAfter``), and whether an ``approval_requested`` is still unanswered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from remediator.audit import ChainReport, parse_entry, verify_trail
from remediator.contracts import AuditRecord
from remediator.kv import json_documents
from remediator.safety.ledger import Ledger, LedgerStore
from remediator.signing import TrustSet
from remediator.subjects import AUDIT_STREAM, AUDIT_WILDCARD, CLUSTER_TOKEN, STATE_BUCKET, approval_key

__all__ = [
    "MAX_FILTER_LEN",
    "MAX_LIMIT",
    "AuditReader",
    "IncidentFilter",
    "IncidentSummary",
    "Page",
    "StateUnreadable",
    "chain_status",
    "incident_timeline",
    "summarize",
]

MAX_LIMIT = 200
"""The largest page of incidents or records one request returns."""
MAX_FILTER_LEN = 256
"""The longest filter value accepted (a node name is at most 253 characters, a UUID 40)."""
MAX_TIMELINE = 10_000
"""The most records one incident's timeline returns (``truncated`` says when there were more)."""

# kinds that tie an event to an incident through its event id, written before the incident existed
_EVENT_KINDS = frozenset({"event_accepted", "duplicate_ignored"})
OPEN = "open"
PENDING_APPROVAL = "pending-approval"


def incident_timeline(records: Iterable[AuditRecord], incident: str) -> list[AuditRecord]:
    """Every record of ``incident`` in stream order: the records that name it, and the records of the
    events it was opened or updated by (``event_accepted``, ``duplicate_ignored`` with one of its event ids
    on its node), which are written before the incident has an id. ``remediator audit show`` and
    ``GET /v1/audit/incidents/<id>`` both select with this function."""
    recs = list(records)
    named = [r for r in recs if r.incident == incident]
    if not named:
        return []
    events = {(r.node, r.event_id) for r in named if r.event_id}
    return [r for r in recs if r.incident == incident
            or (r.incident is None and r.what in _EVENT_KINDS and (r.node, r.event_id) in events)]


@dataclass(frozen=True)
class IncidentSummary:
    """One incident as the list shows it; every field comes from typed record fields, never from ``why``."""

    id: str
    node: str
    gpu: str | None
    job: str | None
    fingerprint: str | None
    trace_id: str | None
    event_id: str | None
    playbook: str | None
    handler: str | None
    kind: str | None
    code: int | str | None
    reason: str
    outcome: str
    opened: datetime
    updated: datetime
    records: int
    pending_approval: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["opened"] = self.opened.isoformat()
        d["updated"] = self.updated.isoformat()
        d["pending_approval"] = list(self.pending_approval)
        return d


def summarize(timeline: Sequence[AuditRecord]) -> IncidentSummary:
    """The summary of one incident's timeline (``incident_timeline``); the timeline is not empty."""
    named = [r for r in timeline if r.incident]
    first = named[0]
    playbook = handler = kind = None
    code: int | str | None = None
    reason = ""
    outcome = OPEN
    waiting: dict[str, None] = {}
    for r in named:
        a = r.after
        if r.what == "decision":
            if playbook is None and isinstance(a.get("playbook"), str):
                playbook = a["playbook"]
            if "handler" in a and handler is None:
                handler = str(a["handler"])
                reason = r.why
                for ev in a.get("evidence") or []:
                    if isinstance(ev, dict) and kind is None:
                        kind, code = ev.get("kind"), ev.get("code")
        elif r.what == "approval_requested":
            waiting[str(a.get("step") or "")] = None
        elif r.what == "approval" or (r.what == "guard_verdict" and a.get("guard") == "approval"
                                      and a.get("allowed") is True):
            waiting.clear()
        elif r.what == "playbook_finished":
            outcome = str(a.get("outcome") or "finished")
            playbook = playbook or (str(a["playbook"]) if a.get("playbook") else None)
            waiting.clear()
    if waiting and outcome == OPEN:
        outcome = PENDING_APPROVAL
    pick = next((r for r in named if r.gpu), first)
    job = next((r.job for r in named if r.job), None)
    fp = next((r.fingerprint for r in named if r.fingerprint), None)
    trace = next((r.trace_id for r in named if r.trace_id), None)
    return IncidentSummary(
        id=str(first.incident), node=first.node if first.node != CLUSTER_TOKEN else pick.node, gpu=pick.gpu,
        job=job, fingerprint=fp, trace_id=trace, event_id=next((r.event_id for r in named if r.event_id), None),
        playbook=playbook, handler=handler, kind=kind, code=code, reason=reason, outcome=outcome,
        opened=timeline[0].time, updated=max(r.time for r in timeline), records=len(timeline),
        pending_approval=tuple(waiting))


def _bounded(name: str, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > MAX_FILTER_LEN:
        raise ValueError(f"{name} is longer than {MAX_FILTER_LEN} characters")
    return value


@dataclass(frozen=True)
class IncidentFilter:
    """The incident list's filters; every given one must match. ``q`` is a case-insensitive substring of
    the incident id, node, GPU, job, fingerprint or playbook (the view's search box)."""

    node: str | None = None
    gpu: str | None = None
    job: str | None = None
    fingerprint: str | None = None
    playbook: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None

    def __post_init__(self) -> None:
        for name in ("node", "gpu", "job", "fingerprint", "playbook", "outcome", "q"):
            object.__setattr__(self, name, _bounded(name, getattr(self, name)))

    def matches(self, s: IncidentSummary) -> bool:
        q = self.q.lower() if self.q else None
        return (
            (self.node is None or s.node == self.node)
            and (self.gpu is None or s.gpu == self.gpu)
            and (self.job is None or s.job == self.job)
            and (self.fingerprint is None or s.fingerprint == self.fingerprint)
            and (self.playbook is None or s.playbook == self.playbook)
            and (self.outcome is None or s.outcome == self.outcome)
            # an incident overlaps [since, until]
            and (self.since is None or s.updated >= self.since)
            and (self.until is None or s.opened <= self.until)
            and (q is None or any(q in (v or "").lower()
                                  for v in (s.id, s.node, s.gpu, s.job, s.fingerprint, s.playbook)))
        )


def encode_cursor(s: IncidentSummary) -> str:
    return base64.urlsafe_b64encode(json.dumps([s.opened.isoformat(), s.id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (opened, id) position a cursor names; ``ValueError`` for anything we did not hand out."""
    if len(cursor) > 512:
        raise ValueError("cursor is too long")
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        at, ident = raw
        return datetime.fromisoformat(str(at)), str(ident)
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise ValueError("cursor is not one this API handed out") from None


@dataclass(frozen=True)
class Page:
    """One page of incidents, newest first; ``next_cursor`` continues after its last item (None: the end)."""

    items: list[IncidentSummary]
    total: int
    next_cursor: str | None


def page_incidents(summaries: Iterable[IncidentSummary], flt: IncidentFilter, limit: int,
                   cursor: str | None = None) -> Page:
    """Matching incidents sorted by opening time, newest first (ties by id), ``limit`` after ``cursor``."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    ordered = sorted((s for s in summaries if flt.matches(s)), key=lambda s: (s.opened, s.id), reverse=True)
    start = 0
    if cursor:
        at, ident = decode_cursor(cursor)
        start = next((i for i, s in enumerate(ordered) if (s.opened, s.id) < (at, ident)), len(ordered))
    items = ordered[start:start + limit]
    more = start + limit < len(ordered)
    return Page(items, len(ordered), encode_cursor(items[-1]) if more and items else None)


async def chain_status(js: JetStreamContext, trust: TrustSet | None) -> list[ChainReport]:
    """Verification of every chain (hashes, links, signatures against ``trust``, signed checkpoints): the one
    place the audit API and view call the trail's verifier, ``remediator.audit.verify_trail``, the same one
    ``remediator audit verify`` runs."""
    return await verify_trail(js, trust)


@dataclass
class _Index:
    records: list[AuditRecord] = field(default_factory=list)
    last_seq: int = 0
    truncated: bool = False


class AuditReader:
    """The read model of one process: a cache of the AUDIT stream refreshed from its last sequence."""

    def __init__(self, js: JetStreamContext, *, refresh_s: float = 1.0, max_records: int = 1_000_000,
                 batch: int = 512, trust: TrustSet | None = None) -> None:
        self.js = js
        self.trust = trust
        self.refresh_s = refresh_s
        self.max_records = max_records
        self.batch = batch
        self._index = _Index()
        self._lock = asyncio.Lock()
        self._refreshed_at = float("-inf")
        self._summaries: dict[str, IncidentSummary] | None = None
        self._chains: list[ChainReport] | None = None  # verified once per change of the cache
        self._unreadable: tuple[float, str] | None = None  # when and why the ledger last could not be read

    async def refresh(self, *, force: bool = False) -> None:
        """Read what was appended to AUDIT since the last refresh (at most every ``refresh_s``)."""
        async with self._lock:
            if not force and time.monotonic() - self._refreshed_at < self.refresh_s:
                return
            info = await self.js.stream_info(AUDIT_STREAM)
            last = info.state.last_seq
            if last < self._index.last_seq:  # the stream was recreated: list it again
                self._index = _Index()
                self._summaries = self._chains = None
            idx = self._index
            if last > idx.last_seq and info.state.messages:
                start = max(idx.last_seq + 1, info.state.first_seq)
                cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
                                     ack_policy=AckPolicy.NONE, inactive_threshold=30.0)
                psub = await self.js.pull_subscribe(AUDIT_WILDCARD, stream=AUDIT_STREAM, config=cfg)
                try:
                    while idx.last_seq < last:
                        try:
                            msgs = await psub.fetch(self.batch, timeout=2.0)
                        except TimeoutError:
                            break
                        for m in msgs:
                            entry = parse_entry(m.subject, m.metadata.sequence.stream, m.data)
                            if isinstance(entry, AuditRecord):  # garbage is verify's to report, not ours
                                idx.records.append(entry)
                            idx.last_seq = m.metadata.sequence.stream
                finally:
                    await psub.unsubscribe()
                if len(idx.records) > self.max_records:
                    del idx.records[: len(idx.records) - self.max_records]
                    idx.truncated = True
                self._summaries = self._chains = None
            if self._chains is None:
                self._chains = await chain_status(self.js, self.trust)
            self._refreshed_at = time.monotonic()

    @property
    def records(self) -> list[AuditRecord]:
        return self._index.records

    @property
    def truncated(self) -> bool:
        """Whether the oldest records were dropped from the cache (``max_records``)."""
        return self._index.truncated

    def summaries(self) -> dict[str, IncidentSummary]:
        if self._summaries is None:
            by_incident: dict[str, None] = {}
            for r in self._index.records:
                if r.incident:
                    by_incident.setdefault(r.incident, None)
            self._summaries = {}
            grouped = _group(self._index.records)
            for inc in by_incident:
                self._summaries[inc] = summarize(grouped[inc])
        return self._summaries

    def timeline(self, incident: str) -> list[AuditRecord]:
        return incident_timeline(self._index.records, incident)

    def node_records(self, node: str) -> list[AuditRecord]:
        return [r for r in self._index.records if r.node == node]

    def chains(self) -> list[ChainReport]:
        """The chains' verification as of the last ``refresh`` (re-verified whenever records arrived)."""
        return self._chains or []

    async def ledger(self) -> Ledger:
        """The safety ledger (breaker and budget reservations) as every replica sees it (empty when the
        state bucket does not exist yet); ``StateUnreadable`` when this identity may not read it."""
        if self._unreadable and time.monotonic() - self._unreadable[0] < 60.0:  # do not wait on each request
            raise StateUnreadable(self._unreadable[1])
        try:
            return await LedgerStore(await self.js.key_value(STATE_BUCKET)).read()
        except NotFoundError:
            return Ledger()
        except (NatsError, TimeoutError) as e:
            why = (f"the state bucket {STATE_BUCKET} (safety ledger) could not be read: {type(e).__name__} "
                   f"{e}").rstrip()
            self._unreadable = (time.monotonic(), why)
            raise StateUnreadable(why) from e

    async def approval(self, incident: str) -> dict[str, Any] | None:
        """The approval stored for ``incident`` (``approval.<incident>``), or None (also when this identity
        may not read the state bucket: the audit's ``approval`` record still tells it)."""
        try:
            kv = await self.js.key_value(STATE_BUCKET)
            return (await json_documents(kv).get(approval_key(incident))).value
        except (NotFoundError, NatsError, TimeoutError):
            return None


class StateUnreadable(Exception):
    """The state bucket is out of this identity's reach (e.g. a role that reads AUDIT only)."""


def _group(records: Iterable[AuditRecord]) -> dict[str, list[AuditRecord]]:
    """Every incident's timeline (``incident_timeline``) in one pass over the records."""
    recs = list(records)
    events: dict[tuple[str, str], list[str]] = {}
    out: dict[str, list[AuditRecord]] = {}
    for r in recs:
        if r.incident:
            out.setdefault(r.incident, [])
            if r.event_id:
                incs = events.setdefault((r.node, r.event_id), [])
                if r.incident not in incs:
                    incs.append(r.incident)
    for r in recs:
        if r.incident:
            out[r.incident].append(r)
        elif r.what in _EVENT_KINDS and r.event_id:
            for inc in events.get((r.node, r.event_id), ()):
                out[inc].append(r)
    return out
