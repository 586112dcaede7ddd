"""The audit trail: one hash-chained record per fact, on the AUDIT stream (DESIGN.md §8).

Where it sits: at the side of the whole flow. Ingest (duplicates), dispatch (event accepted, decision,
incident updated), the executor (guard verdicts, steps, escalations) and operators (approvals, breaker
resets) all call ``AuditLog.append``; ``remediator audit list/show/verify/export`` read it back.

Chains are per subject (``audit.<node>``, ``audit._cluster``). Each append carries
``Nats-Expected-Last-Subject-Sequence``, so two replicas appending to the same chain cannot fork or
reorder it: the loser re-reads the chain head and re-links its record.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from remediator.contracts import GENESIS_HASH, AuditRecord, AuditWhat, Decision, FaultEvent, resolve_job, utcnow
from remediator.errors import Conflict
from remediator.subjects import AUDIT_STREAM, AUDIT_WILDCARD, audit_subject

log = logging.getLogger(__name__)

_WRONG_LAST_SEQUENCE = (10071, 10164)
_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"


class AuditAppendError(Conflict):
    """The chain head kept moving under us; the caller's message is redelivered and tries again."""


@dataclass
class _Head:
    stream_seq: int  # stream sequence of the chain's last record (0: empty chain)
    chain_seq: int
    hash: str


class AuditLog:
    """Appends records to the per-node chains; safe to share between tasks of one process."""

    def __init__(self, js: JetStreamContext, actor: str, clock: Callable[[], datetime] = utcnow,
                 max_attempts: int = 20, observers: Iterable[Callable[[AuditRecord], None]] = ()) -> None:
        self._js = js
        self._observers = tuple(observers)
        self.actor = actor
        self._clock = clock
        self._max_attempts = max_attempts
        self._heads: dict[str, _Head] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def _load_head(self, subject: str) -> _Head:
        try:
            raw = await self._js.get_last_msg(AUDIT_STREAM, subject)
        except NotFoundError:
            return _Head(0, 0, GENESIS_HASH)
        assert raw.data is not None and raw.seq is not None
        rec = json.loads(raw.data)
        return _Head(raw.seq, int(rec["seq"]), str(rec["hash"]))

    async def append(
        self,
        node: str | None,
        what: AuditWhat,
        why: str = "",
        *,
        incident: str | None = None,
        gpu: str | None = None,
        before: Mapping[str, Any] | None = None,
        after: Mapping[str, Any] | None = None,
        event_id: str | None = None,
        job: str | None = None,
        fingerprint: str | None = None,
        trace_id: str | None = None,
        actor: str | None = None,
    ) -> AuditRecord:
        """Append one record to ``node``'s chain (the cluster chain when ``node`` is None) and return it."""
        subject = audit_subject(node)
        lock = self._locks.setdefault(subject, asyncio.Lock())
        async with lock:
            for _attempt in range(self._max_attempts):
                head = self._heads.get(subject) or await self._load_head(subject)
                fields: dict[str, Any] = {
                    "version": 1, "seq": head.chain_seq + 1, "time": self._clock().isoformat(),
                    "incident": incident, "node": node or "_cluster", "gpu": gpu,
                    "actor": actor or self.actor, "what": what, "why": why,
                    "before": dict(before or {}), "after": dict(after or {}), "trace_id": trace_id,
                    "event_id": event_id, "job": job, "fingerprint": fingerprint,
                    "prev_hash": head.hash,
                }
                # Round-trip through the model so the digest covers exactly what is serialised.
                draft = AuditRecord.model_validate({**fields, "hash": ""}).model_dump(mode="json")
                record = AuditRecord.model_validate({**draft, "hash": AuditRecord.digest(draft)})
                try:
                    ack = await self._js.publish(
                        subject, record.model_dump_json().encode(), stream=AUDIT_STREAM,
                        headers={_EXPECTED_LAST_SUBJECT_SEQ: str(head.stream_seq)},
                    )
                except APIError as err:
                    if err.err_code in _WRONG_LAST_SEQUENCE:
                        self._heads.pop(subject, None)  # another writer appended: re-read and re-link
                        continue
                    raise
                self._heads[subject] = _Head(ack.seq, record.seq, record.hash)
                for observe in self._observers:  # metrics: cheap, synchronous, never fail the append
                    try:
                        observe(record)
                    except Exception:
                        log.exception("audit observer failed")
                return record
            raise AuditAppendError(f"could not append to {subject} after {self._max_attempts} attempts")

    def bind(self, context: AuditContext) -> IncidentAudit:
        """An appender whose every record carries ``context`` (incident, node, GPU, event, job, fingerprint,
        trace)."""
        return IncidentAudit(self, context)


# --- typed record bodies ----------------------------------------------------------------------------
#
# The ``after`` of the records whose content other code reads (``remediator.metrics``, drills, the audit
# view): one shape per kind, defined here and nowhere else. Producers build them with the functions below
# (or, for guard verdicts, ``GuardVerdict.to_json``); readers read these keys and never parse ``why``.


class DecisionAfter(TypedDict):
    """``decision`` written by dispatch when a handler decides (the executor's receipt has no ``handler``)."""

    playbook: str
    handler: str
    group: str
    evidence: list[dict[str, Any]]


class RunReceivedAfter(TypedDict):
    """``decision`` written by the executor when it takes (or resumes) a decision's run."""

    playbook: str
    resumed: bool


class GuardVerdictAfter(TypedDict):
    """``guard_verdict``: one guard's answer (``GuardVerdict.to_json``); ``step`` for an approval gate."""

    guard: str
    allowed: bool
    reason: str
    effect: str
    step: NotRequired[str]


class StepAfter(TypedDict):
    """``step_started``/``step_succeeded``/``step_failed``/``step_skipped``: the step's key in the playbook
    (``drain``, ``reset_gpu#2``), besides whatever state the step reports; the result is the record's kind."""

    step: str


class PlaybookFinishedAfter(TypedDict):
    """``playbook_finished``: which playbook ended how (``completed``, ``escalated``, ``rolled-back``,
    ``cancelled``, ``dry-run``, ``blocked``), with each step's ``key:status``."""

    playbook: str
    outcome: str
    steps: list[str]


def decision_after(decision: Decision) -> DecisionAfter:
    return {"playbook": decision.playbook, "handler": decision.handler, "group": decision.group,
            "evidence": [e.model_dump(mode="json") for e in decision.evidence]}


def step_after(step: str, reported: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A step record's ``after``: what the step ``reported`` (its after-state), with ``step`` set to its key."""
    return {**(reported or {}), "step": step}


def finished_after(playbook: str, outcome: str, steps: Iterable[str] = ()) -> PlaybookFinishedAfter:
    return {"playbook": playbook, "outcome": outcome, "steps": list(steps)}


# --- appending for one incident ----------------------------------------------------------------------


@dataclass(frozen=True)
class AuditContext:
    """What every record about one event or incident carries (DESIGN.md §8), fixed once.

    Built from the event (``of_event``) at dispatch and from the decision (``of_decision``) at the executor,
    so records of one incident agree on node, GPU, event id, job, fingerprint and trace id by construction.
    """

    node: str
    incident: str | None = None
    gpu: str | None = None
    event_id: str | None = None
    job: str | None = None
    fingerprint: str | None = None
    trace_id: str | None = None

    @staticmethod
    def of_event(event: FaultEvent, trace_id: str | None = None) -> AuditContext:
        return AuditContext(node=event.node, gpu=event.gpu.key if event.gpu else None, event_id=event.id,
                            job=resolve_job(event.origin, event.labels), fingerprint=event.origin.fingerprint,
                            trace_id=trace_id)

    @staticmethod
    def of_decision(decision: Decision, trace_id: str | None = None) -> AuditContext:
        return AuditContext(node=decision.node, incident=decision.incident_id,
                            gpu=decision.gpu.key if decision.gpu else None, event_id=decision.event_id,
                            job=decision.job or resolve_job(decision.origin, decision.labels),
                            fingerprint=decision.origin.fingerprint, trace_id=trace_id)


class IncidentAudit:
    """An ``AuditLog`` bound to one ``AuditContext``: ``append`` takes only what differs per record."""

    def __init__(self, log: AuditLog, context: AuditContext) -> None:
        self.log = log
        self.context = context

    def for_incident(self, incident: str, *, gpu: str | None = None, job: str | None = None) -> IncidentAudit:
        """The same binding, for the incident a decision named (and its GPU or job, when it knows better)."""
        ctx = self.context
        return IncidentAudit(self.log, replace(ctx, incident=incident, gpu=gpu or ctx.gpu, job=job or ctx.job))

    async def append(self, what: AuditWhat, why: str = "", *, before: Mapping[str, Any] | None = None,
                     after: Mapping[str, Any] | None = None, actor: str | None = None) -> AuditRecord:
        c = self.context
        return await self.log.append(c.node, what, why, incident=c.incident, gpu=c.gpu, before=before, after=after,
                                     event_id=c.event_id, job=c.job, fingerprint=c.fingerprint,
                                     trace_id=c.trace_id, actor=actor)


# --- reading, querying, verifying --------------------------------------------------------------------


async def iter_records(js: JetStreamContext, node: str | None = None, batch: int = 256,
                       fetch_timeout: float = 2.0) -> AsyncIterator[AuditRecord]:
    """Every record of one node's chain (``node``), or of all chains, in stream order."""
    subject = audit_subject(node) if node else AUDIT_WILDCARD
    info = await js.stream_info(AUDIT_STREAM)
    last = info.state.last_seq
    if info.state.messages == 0:
        return
    psub = await js.pull_subscribe(subject, stream=AUDIT_STREAM)
    try:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=fetch_timeout)
            except TimeoutError:
                return
            for m in msgs:
                yield AuditRecord.model_validate_json(m.data)
                await m.ack()
                if m.metadata.sequence.stream >= last or m.metadata.num_pending == 0:
                    return
    finally:
        await psub.unsubscribe()


@dataclass(frozen=True)
class AuditQuery:
    """Filters of ``remediator audit list``; every given field must match."""

    node: str | None = None
    gpu: str | None = None
    incident: str | None = None
    job: str | None = None
    fingerprint: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, r: AuditRecord) -> bool:
        return (
            (self.node is None or r.node == self.node)
            and (self.gpu is None or r.gpu == self.gpu)
            and (self.incident is None or r.incident == self.incident)
            and (self.job is None or r.job == self.job)
            and (self.fingerprint is None or r.fingerprint == self.fingerprint)
            and (self.since is None or r.time >= self.since)
            and (self.until is None or r.time <= self.until)
        )


async def query(js: JetStreamContext, q: AuditQuery) -> list[AuditRecord]:
    return [r async for r in iter_records(js, q.node) if q.matches(r)]


@dataclass(frozen=True)
class ChainReport:
    chain: str
    records: int
    ok: bool
    problem: str = ""


def verify_chains(records: Iterable[AuditRecord]) -> list[ChainReport]:
    """Check every chain: each record's hash, its link to the previous one, and gap-free sequence numbers."""
    chains: dict[str, list[AuditRecord]] = {}
    for r in records:
        chains.setdefault(r.node, []).append(r)
    reports = []
    for chain, recs in sorted(chains.items()):
        problem = ""
        prev_hash, prev_seq = GENESIS_HASH, 0
        for r in recs:
            if not r.verify():
                problem = f"record {r.seq}: hash does not match its content"
            elif r.prev_hash != prev_hash:
                problem = f"record {r.seq}: prev_hash does not link to record {prev_seq}"
            elif r.seq != prev_seq + 1:
                problem = f"record {r.seq}: expected sequence {prev_seq + 1}"
            if problem:
                break
            prev_hash, prev_seq = r.hash, r.seq
        reports.append(ChainReport(chain, len(recs), not problem, problem))
    return reports
