"""The audit trail: one hash-chained record per fact, on the AUDIT stream (DESIGN.md §8).

Where it sits: at the side of the whole flow. Ingest (duplicates), dispatch (event accepted, decision,
incident updated), the executor (guard verdicts, steps, escalations) and operators (approvals, breaker
resets) all call ``AuditLog.append``; ``remediator audit list/show/verify/export`` read it back.

Chains are per subject (``audit.<node>``, ``audit._cluster``). Each append carries
``Nats-Expected-Last-Subject-Sequence``, so two replicas appending to the same chain cannot fork or
reorder it: the loser re-reads the chain head and re-links its record.

Proof of what the trail holds: every record is signed by its writer's key (``signer``: the public nkey,
``sig``: its ed25519 signature of the record's ``hash``, which covers ``signer``), and each chain's head is
anchored by a signed ``AuditCheckpoint`` on ``auditcp.<node>`` (stream ``AUDITCP``, apart from AUDIT so
that purging one leaves the other) at most every ``checkpoint_every`` records or ``checkpoint_interval_s``
seconds, whichever comes first (and at ``flush``). ``verify_chains`` checks records and checkpoints against
a ``TrustSet``: a forged record (unsigned, bad or unknown signature), a rewritten one (its hash differs
from a checkpoint's, or its signature fails), a removed tail (the chain ends before its last checkpoint), a
purged chain (checkpoints, no records), a purged stream (AUDIT or AUDITCP emptied while the other still
says what there was) and a removed head (the chain starts after record 1 while the stream never dropped a
message by its limits). Retention is not tampering: a chain whose oldest records aged out is verified from
its oldest retained record on, against every retained checkpoint.

A message on an audit subject that is not a valid record (``AuditGarbage``) is reported by verify and
skipped by every reader (``iter_records``, ``query``) and by the appender's head loading, so it stops
neither ``audit list/show/export`` nor the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NotRequired, TypedDict

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError

from remediator.bus import LEADER_WAIT_S, MSG_ID_HEADER
from remediator.contracts import (
    GENESIS_HASH,
    AuditCheckpoint,
    AuditRecord,
    AuditWhat,
    Decision,
    FaultEvent,
    resolve_job,
    utcnow,
)
from remediator.errors import Conflict, TemporaryError
from remediator.settings import Settings
from remediator.signing import Signer, TrustSet, canonical, signed_fields, verify
from remediator.subjects import (
    AUDIT_CHECKPOINT_STREAM,
    AUDIT_CHECKPOINT_WILDCARD,
    AUDIT_STREAM,
    AUDIT_WILDCARD,
    CLUSTER_TOKEN,
    audit_checkpoint_subject,
    audit_subject,
    node_from_token,
)

log = logging.getLogger(__name__)

_WRONG_LAST_SEQUENCE = (10071, 10164)
_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
FLUSH_CONCURRENCY = 64  # checkpoints in flight at once when ``AuditLog.flush`` anchors every head


class AuditAppendError(Conflict):
    """The chain head kept moving under us; the caller's message is redelivered and tries again."""


@dataclass
class _Head:
    stream_seq: int  # stream sequence of the chain's last record (0: empty chain)
    chain_seq: int
    hash: str


class AuditLog:
    """Appends records to the per-node chains; safe to share between tasks of one process.

    ``signer`` signs every record and checkpoint (None: unsigned, which ``verify`` reports wherever a trust
    set is given); ``checkpoint_every``/``checkpoint_interval_s`` bound how many records and seconds a
    chain's head may go without a signed checkpoint (0: no checkpoints). ``flush`` anchors every head now.
    """

    def __init__(self, js: JetStreamContext, actor: str, clock: Callable[[], datetime] = utcnow,
                 max_attempts: int = 20, observers: Iterable[Callable[[AuditRecord], None]] = (),
                 signer: Signer | None = None, checkpoint_every: int = 100,
                 checkpoint_interval_s: float = 60.0) -> None:
        self._js = js
        self._observers = tuple(observers)
        self.actor = actor
        self.signer = signer
        self._clock = clock
        self._max_attempts = max_attempts
        self._heads: dict[str, _Head] = {}
        self._direct = True  # chain heads read by direct get (``_last_msg``) until the stream answers none
        self._locks: dict[str, asyncio.Lock] = {}
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self._unanchored: dict[str, tuple[AuditRecord, int, float]] = {}  # head, records since, first at
        self._timers: dict[str, asyncio.Task[None]] = {}
        self.checkpoints_written = 0
        self.appended = 0  # records stored
        self.relinked = 0  # appends refused because another writer had appended first, then re-linked
        self._checkpoint_warned = False

    @classmethod
    def for_replica(cls, js: JetStreamContext, settings: Settings, actor: str, signer: Signer, *,
                    clock: Callable[[], datetime] = utcnow,
                    observers: Iterable[Callable[[AuditRecord], None]] = ()) -> AuditLog:
        """The log a service replica writes with: every record signed by ``signer``, each chain checkpointed as
        ``settings`` say. ``serve`` makes its log here and so do the benchmarks, so the cost they measure per
        event and per incident is a replica's."""
        return cls(js, actor, clock=clock, observers=observers, signer=signer,
                   checkpoint_every=settings.audit_checkpoint_records,
                   checkpoint_interval_s=settings.audit_checkpoint_interval_s)

    async def _last_msg(self, subject: str, *, direct: bool) -> Any:
        """The chain's last message; a read, so a timeout (AUDIT without a leader: nobody answers the
        request) is asked again until ``LEADER_WAIT_S`` has passed, as publishes wait out an election.

        ``direct``: a direct get, which any replica of the stream answers, raw (the leader's answer is JSON
        with the message in base64, its headers parsed by the ``email`` package: about three times the CPU);
        a follower's may be a record behind, which only costs the append a refused publish and a read from
        the leader. A stream declared before AUDIT allowed direct gets has nobody answering them: the leader
        is asked, from then on."""
        deadline = asyncio.get_running_loop().time() + LEADER_WAIT_S
        while True:
            try:
                return await self._js.get_last_msg(AUDIT_STREAM, subject, direct=direct and self._direct)
            except nats.errors.NoRespondersError:
                if not (direct and self._direct):
                    raise
                self._direct = False
                log.info("audit: %s answers no direct gets; reading chain heads from its leader (`remediator "
                         "bus init` allows them)", AUDIT_STREAM)
            except nats.errors.TimeoutError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                log.info("audit: no answer for the head of %s; asking again", subject)

    async def _load_head(self, subject: str, *, direct: bool = True) -> _Head:
        try:
            raw = await self._last_msg(subject, direct=direct)
        except NotFoundError:
            return _Head(0, 0, GENESIS_HASH)
        assert raw.data is not None and raw.seq is not None
        entry = parse_entry(subject, raw.seq, raw.data)
        if isinstance(entry, AuditRecord):
            return _Head(raw.seq, entry.seq, entry.hash)
        # Not a record on our chain (garbage): link to the last valid record, append after the garbage.
        log.warning("audit: %s", entry.problem)
        last: AuditRecord | None = None
        async for item in iter_entries(self._js, node_from_token(subject.split(".", 1)[1])):
            if isinstance(item, AuditRecord):
                last = item
        return _Head(raw.seq, last.seq, last.hash) if last else _Head(raw.seq, 0, GENESIS_HASH)

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
        once: str | None = None,
    ) -> AuditRecord:
        """Append one record to ``node``'s chain (the cluster chain when ``node`` is None) and return it.

        ``once`` names the record for JetStream's duplicate window (``Nats-Msg-Id: audit|<once>``): a
        redelivered handler that writes it again, not knowing whether its first attempt's append was stored,
        stores it at most once (within the streams' ``duplicate_window_s``, 20 min by default). A dropped
        repeat leaves the chain as it was and is returned unstored."""
        subject = audit_subject(node)
        lock = self._locks.setdefault(subject, asyncio.Lock())
        async with lock:
            for attempt in range(self._max_attempts):
                # the head this process wrote last; else any replica's (a direct get); after two refused
                # appends, the leader's, which has every acknowledged record
                head = self._heads.get(subject) or await self._load_head(subject, direct=attempt < 2)
                fields: dict[str, Any] = {
                    "version": 1, "seq": head.chain_seq + 1, "time": self._clock().isoformat(),
                    "incident": incident, "node": node or "_cluster", "gpu": gpu,
                    "actor": actor or self.actor, "what": what, "why": why,
                    "before": dict(before or {}), "after": dict(after or {}), "trace_id": trace_id,
                    "event_id": event_id, "job": job, "fingerprint": fingerprint,
                    "prev_hash": head.hash,
                }
                if self.signer is not None:
                    fields["signer"] = self.signer.public_key
                # Round-trip through the model so the digest covers exactly what is serialised; the record is
                # that model with its hash and signature set (the digest covers neither), its free-form
                # ``before``/``after`` as serialised, as a reader parses them.
                model = AuditRecord.model_validate({**fields, "hash": ""})
                draft = model.model_dump(mode="json")
                digest = AuditRecord.digest(draft)
                sig = self.signer.sign(digest.encode()) if self.signer is not None else None
                record = model.model_copy(update={"hash": digest, "sig": sig, "before": draft["before"],
                                                  "after": draft["after"]})
                headers = {_EXPECTED_LAST_SUBJECT_SEQ: str(head.stream_seq)}
                if once is not None:
                    headers[MSG_ID_HEADER] = f"audit|{once}"
                try:
                    ack = await self._js.publish(
                        subject, record.model_dump_json(exclude_none=False).encode(), stream=AUDIT_STREAM,
                        headers=headers,
                    )
                except APIError as err:
                    if err.err_code in _WRONG_LAST_SEQUENCE:
                        self._heads.pop(subject, None)  # another writer appended: re-read and re-link
                        self.relinked += 1
                        continue
                    raise
                if ack.duplicate:  # stored by an earlier attempt: this copy was not, the head is unknown
                    self._heads.pop(subject, None)
                    return record
                self._heads[subject] = _Head(ack.seq, record.seq, record.hash)
                self.appended += 1
                due = self._note_unanchored(subject, record)
                for observe in self._observers:  # metrics: cheap, synchronous, never fail the append
                    try:
                        observe(record)
                    except Exception:
                        log.exception("audit observer failed")
                if due:
                    await self._checkpoint(subject)
                return record
            raise AuditAppendError(f"could not append to {subject} after {self._max_attempts} attempts")

    # --- checkpoints -------------------------------------------------------------------------------

    def _note_unanchored(self, subject: str, record: AuditRecord) -> bool:
        """Remember ``record`` as the chain's unanchored head; True when a checkpoint is due now."""
        if self.signer is None or self.checkpoint_every <= 0:
            return False
        now = time.monotonic()
        _, count, first = self._unanchored.get(subject, (record, 0, now))
        self._unanchored[subject] = (record, count + 1, first)
        if count + 1 >= self.checkpoint_every or now - first >= self.checkpoint_interval_s:
            return True
        if subject not in self._timers and self.checkpoint_interval_s > 0:
            with contextlib.suppress(RuntimeError):  # no running loop: the next append or flush anchors it
                self._timers[subject] = asyncio.get_running_loop().create_task(
                    self._checkpoint_later(subject), name=f"audit-checkpoint-{subject}")
        return False

    async def _checkpoint_later(self, subject: str) -> None:
        try:
            await asyncio.sleep(self.checkpoint_interval_s)
            self._timers.pop(subject, None)
            async with self._locks.setdefault(subject, asyncio.Lock()):
                await self._checkpoint(subject)
        finally:
            if self._timers.get(subject) is asyncio.current_task():
                self._timers.pop(subject, None)

    async def _checkpoint(self, subject: str) -> None:
        """Write the signed checkpoint of ``subject``'s unanchored head (a failure is logged and retried at
        the next append: the record itself is written)."""
        pending = self._unanchored.get(subject)
        if pending is None or self.signer is None:
            return
        head = pending[0]
        # Through the model from strings, as a reader parses it, so both serialise the times alike.
        draft = AuditCheckpoint.model_validate({
            "chain": head.node, "seq": head.seq, "hash": head.hash, "head_time": head.time.isoformat(),
            "at": self._clock().isoformat(), "signer": self.signer.public_key, "sig": ""})
        # signed as serialised: the digest covers exactly the JSON that verify re-reads
        cp = AuditCheckpoint.model_validate(self.signer.sign_document(draft.model_dump(mode="json")))
        try:
            await self._js.publish(audit_checkpoint_subject(None if head.node == CLUSTER_TOKEN else head.node),
                                   cp.model_dump_json().encode(), stream=AUDIT_CHECKPOINT_STREAM)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stream may not be provisioned yet (`remediator bus init`)
            if not self._checkpoint_warned:
                log.warning("audit checkpoint of %s not written (%s: %s); is %s declared "
                            "(`remediator bus init`)?", subject, type(e).__name__, e, AUDIT_CHECKPOINT_STREAM)
                self._checkpoint_warned = True
            return
        if self._unanchored.get(subject, (None,))[0] is head:
            del self._unanchored[subject]
            timer = self._timers.pop(subject, None)
            if timer is not None and timer is not asyncio.current_task():
                timer.cancel()
        self.checkpoints_written += 1

    @property
    def unanchored_chains(self) -> int:
        """How many chains have records written since their last checkpoint (``flush`` would anchor them)."""
        return len(self._unanchored)

    async def flush(self, concurrency: int = FLUSH_CONCURRENCY) -> None:
        """Anchor every chain head written since its last checkpoint (the service calls it at stop, within
        its shutdown bound), ``concurrency`` chains at a time: checkpoints of different chains are
        independent publishes, and a replica that wrote to thousands of chains within one checkpoint
        interval has thousands to write (ARCHITECTURE.md, "Checkpoints at fleet scale")."""
        for timer in list(self._timers.values()):
            timer.cancel()
        self._timers.clear()
        gate = asyncio.Semaphore(concurrency)

        async def anchor(subject: str) -> None:
            async with gate, self._locks.setdefault(subject, asyncio.Lock()):
                await self._checkpoint(subject)

        await asyncio.gather(*(anchor(subject) for subject in list(self._unanchored)))

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
                     after: Mapping[str, Any] | None = None, actor: str | None = None,
                     once: str | None = None) -> AuditRecord:
        c = self.context
        return await self.log.append(c.node, what, why, incident=c.incident, gpu=c.gpu, before=before, after=after,
                                     event_id=c.event_id, job=c.job, fingerprint=c.fingerprint,
                                     trace_id=c.trace_id, actor=actor, once=once)


# --- reading, querying, verifying --------------------------------------------------------------------


@dataclass(frozen=True)
class AuditGarbage:
    """A message on an audit (or checkpoint) subject that is not a valid record (checkpoint)."""

    subject: str
    stream_seq: int
    error: str

    @property
    def chain(self) -> str:
        token = self.subject.split(".", 1)[1] if "." in self.subject else self.subject
        return node_from_token(token)

    @property
    def problem(self) -> str:
        return f"message {self.stream_seq} on {self.subject} is not an audit record ({self.error})"


_MAX_GARBAGE_ERROR = 160


def parse_entry(subject: str, stream_seq: int, data: bytes | None) -> AuditRecord | AuditGarbage:
    """The record in one message of an audit subject, or what is wrong with it (never raises)."""
    try:
        return AuditRecord.model_validate_json(data or b"")
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return AuditGarbage(subject, stream_seq, (f"{where}: " if where else "") + first["msg"][:_MAX_GARBAGE_ERROR])


def parse_checkpoint(subject: str, stream_seq: int, data: bytes | None) -> AuditCheckpoint | AuditGarbage:
    try:
        return AuditCheckpoint.model_validate_json(data or b"")
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        return AuditGarbage(subject, stream_seq, f"not a checkpoint: {first['msg'][:_MAX_GARBAGE_ERROR]}")


STALLED_FETCHES = 5  # fetch timeouts in a row, with messages still pending, before a read gives up


async def _iter_stream(js: JetStreamContext, stream: str, subject: str, batch: int,
                       fetch_timeout: float) -> AsyncIterator[tuple[str, int, bytes]]:
    """(subject, stream sequence, data) of every message of ``stream`` on ``subject``, in stream order,
    through an ephemeral consumer that acks nothing.

    A fetch that times out ends the read only when the consumer has nothing pending: on a cluster that is
    electing a new leader (a server just lost) a fetch can time out with records still to come, and a reader
    that stopped there would show a chain shorter than it is. After ``STALLED_FETCHES`` such timeouts in a row
    it raises a ``TemporaryError`` naming the stream, never a silently short read."""
    info = await js.stream_info(stream)
    last = info.state.last_seq
    if info.state.messages == 0:
        return
    cfg = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0)
    psub = await js.pull_subscribe(subject, stream=stream, config=cfg)
    stalled = 0
    try:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=fetch_timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                pending = (await psub.consumer_info()).num_pending
                if not pending:
                    return
                stalled += 1
                if stalled >= STALLED_FETCHES:
                    raise TemporaryError(f"reading {stream}: {pending} message(s) on {subject} still pending after "
                                         f"{stalled} fetches of {fetch_timeout:g}s; the bus is unavailable for now, "
                                         "try again") from None
                continue
            stalled = 0
            for m in msgs:
                seq = m.metadata.sequence.stream
                yield m.subject, seq, m.data
                if seq >= last or m.metadata.num_pending == 0:
                    return
    finally:
        await psub.unsubscribe()


async def iter_entries(js: JetStreamContext, node: str | None = None, batch: int = 256,
                       fetch_timeout: float = 2.0) -> AsyncIterator[AuditRecord | AuditGarbage]:
    """Every message of one node's chain (``node``), or of all chains, in stream order: records, and
    ``AuditGarbage`` for what is not one."""
    subject = audit_subject(node) if node else AUDIT_WILDCARD
    async for subj, seq, data in _iter_stream(js, AUDIT_STREAM, subject, batch, fetch_timeout):
        yield parse_entry(subj, seq, data)


async def iter_records(js: JetStreamContext, node: str | None = None, batch: int = 256,
                       fetch_timeout: float = 2.0) -> AsyncIterator[AuditRecord]:
    """Every record of one node's chain (``node``), or of all chains, in stream order; a message that is
    not a record is skipped (and logged): ``verify`` is where it is reported."""
    async for entry in iter_entries(js, node, batch, fetch_timeout):
        if isinstance(entry, AuditRecord):
            yield entry
        else:
            log.warning("audit: skipped %s", entry.problem)


async def iter_checkpoints(js: JetStreamContext, node: str | None = None, batch: int = 256,
                           fetch_timeout: float = 2.0) -> AsyncIterator[AuditCheckpoint | AuditGarbage]:
    """Every checkpoint of one chain (or all), oldest first; garbage on a checkpoint subject as such."""
    subject = audit_checkpoint_subject(node) if node else AUDIT_CHECKPOINT_WILDCARD
    async for subj, seq, data in _iter_stream(js, AUDIT_CHECKPOINT_STREAM, subject, batch, fetch_timeout):
        yield parse_checkpoint(subj, seq, data)


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
    """One chain's verdict. ``problem`` names the first broken link; ``first_seq``/``last_seq`` the retained
    records, ``checkpoints`` the trusted checkpoints seen, ``anchored_seq`` the newest one's record."""

    chain: str
    records: int
    ok: bool
    problem: str = ""
    first_seq: int = 0
    last_seq: int = 0
    checkpoints: int = 0
    anchored_seq: int = 0
    garbage: int = 0


@dataclass(frozen=True)
class StreamFacts:
    """What the two streams say about themselves (``stream_facts``): a purge leaves ``last_seq`` behind.

    ``checkpoint_stream`` is False when AUDITCP does not exist; ``first_seq`` is AUDIT's first retained
    sequence (1: nothing ever left the stream's start); ``max_age_s`` its age limit (0: none)."""

    messages: int
    first_seq: int
    last_seq: int
    max_age_s: float
    max_bytes: int
    checkpoint_stream: bool
    checkpoint_messages: int
    checkpoint_last_seq: int


async def stream_facts(js: JetStreamContext) -> StreamFacts:
    info = await js.stream_info(AUDIT_STREAM)
    try:
        cp = await js.stream_info(AUDIT_CHECKPOINT_STREAM)
        cp_exists, cp_msgs, cp_last = True, cp.state.messages, cp.state.last_seq
    except NotFoundError:
        cp_exists, cp_msgs, cp_last = False, 0, 0
    return StreamFacts(info.state.messages, info.state.first_seq, info.state.last_seq,
                       float(info.config.max_age or 0), int(info.config.max_bytes or -1),
                       cp_exists, cp_msgs, cp_last)


def _record_problem(r: AuditRecord, trust: TrustSet | None) -> str:
    """What is wrong with one record on its own (its hash, its signature), or ''."""
    if not r.verify():
        return f"record {r.seq}: hash does not match its content (rewritten)"
    if r.signer is None or r.sig is None:
        return f"record {r.seq}: unsigned (forged or written without a signing key)" if trust is not None else ""
    if trust is not None and r.signer not in trust:
        return f"record {r.seq}: signed by {r.signer}, a key not in the trust set (forged)"
    if not verify(r.signer, r.hash.encode(), r.sig):
        return f"record {r.seq}: bad signature (forged or rewritten)"
    return ""


def _checkpoint_ok(cp: AuditCheckpoint, trust: TrustSet | None) -> bool:
    if trust is not None and cp.signer not in trust:
        return False
    return verify(cp.signer, canonical(signed_fields(cp.model_dump(mode="json"))), cp.sig)


def verify_chains(records: Iterable[AuditRecord | AuditGarbage],
                  checkpoints: Iterable[AuditCheckpoint | AuditGarbage] = (), *, trust: TrustSet | None = None,
                  facts: StreamFacts | None = None, now: datetime | None = None) -> list[ChainReport]:
    """Check every chain: each record's hash and signature (against ``trust``; None: signatures are checked
    against their own signer only, unsigned records pass), its link to the previous one, gap-free sequence
    numbers, and every trusted checkpoint (the chain must reach and match it). ``facts`` (``stream_facts``)
    adds the checks of a purged stream and a removed head; ``now`` and ``facts.max_age_s`` tell a chain
    that aged out from a purged one. Garbage is reported on its chain. Reports are sorted by chain; a
    ``(streams)`` report says what is wrong with the streams as a whole."""
    chains: dict[str, list[AuditRecord]] = {}
    garbage: dict[str, list[AuditGarbage]] = {}
    for r in records:
        if isinstance(r, AuditGarbage):
            garbage.setdefault(r.chain, []).append(r)
        else:
            chains.setdefault(r.node, []).append(r)
    anchors: dict[str, list[AuditCheckpoint]] = {}
    bad_checkpoints: dict[str, list[str]] = {}
    for cp in checkpoints:
        if isinstance(cp, AuditGarbage):
            bad_checkpoints.setdefault(cp.chain, []).append(f"checkpoint {cp.problem}")
        elif _checkpoint_ok(cp, trust):
            anchors.setdefault(cp.chain, []).append(cp)
        else:
            bad_checkpoints.setdefault(cp.chain, []).append(
                f"checkpoint of record {cp.seq} at {cp.at.isoformat()} is not signed by a trusted key")
    horizon = None
    if facts is not None and facts.max_age_s > 0 and now is not None:
        horizon = now.timestamp() - facts.max_age_s
    reports = []
    for chain in sorted({*chains, *garbage, *anchors, *bad_checkpoints}):
        recs = chains.get(chain, [])
        cps = sorted(anchors.get(chain, []), key=lambda c: c.seq)
        problem = ""
        if garbage.get(chain):
            problem = garbage[chain][0].problem
        prev: AuditRecord | None = None
        for r in recs:
            if problem:
                break
            problem = _record_problem(r, trust)
            if problem:
                break
            if prev is None:
                if r.seq == 1 and r.prev_hash != GENESIS_HASH:
                    problem = "record 1: prev_hash is not the genesis hash"
                elif r.seq > 1 and facts is not None and facts.first_seq <= 1 and facts.max_bytes < 0 \
                        and not _aged(r, horizon):
                    problem = (f"records 1..{r.seq - 1} removed: the chain starts at record {r.seq} but the "
                               "stream never dropped a message by its limits")
            elif r.prev_hash != prev.hash:
                problem = f"record {r.seq}: prev_hash does not link to record {prev.seq}"
            elif r.seq != prev.seq + 1:
                problem = f"record {r.seq}: expected sequence {prev.seq + 1} (records removed)"
            prev = r
        first, last = (recs[0].seq, recs[-1].seq) if recs else (0, 0)
        by_seq = {r.seq: r for r in recs}
        if not problem:
            for cp in cps:
                if cp.seq > last:
                    if not recs:
                        if not _aged_time(cp.head_time, horizon):
                            problem = (f"chain purged: the checkpoint of {cp.at.isoformat()} anchors record "
                                       f"{cp.seq}, no record is retained")
                    else:
                        problem = (f"tail removed: the checkpoint of {cp.at.isoformat()} anchors record {cp.seq}, "
                                   f"the chain ends at record {last}")
                    break
                rec = by_seq.get(cp.seq)
                if rec is not None and rec.hash != cp.hash:
                    problem = (f"record {cp.seq}: rewritten (the checkpoint of {cp.at.isoformat()} anchors hash "
                               f"{cp.hash[:12]}…, the record has {rec.hash[:12]}…)")
                    break
        if not problem and bad_checkpoints.get(chain):
            problem = bad_checkpoints[chain][0]
        reports.append(ChainReport(chain, len(recs), not problem, problem, first, last, len(cps),
                                   cps[-1].seq if cps else 0, len(garbage.get(chain, []))))
    if facts is not None:
        stream_problem = ""
        if facts.last_seq > 0 and facts.messages == 0 and anchors and not all(
                _aged_time(c.head_time, horizon) for cs in anchors.values() for c in cs):
            stream_problem = f"AUDIT purged: {facts.last_seq} messages were written, none is retained"
        elif not facts.checkpoint_stream and facts.messages > 0:
            stream_problem = ("no checkpoint stream AUDITCP: deleted, or never declared (`remediator bus init`); "
                              "a removed tail or purged chain cannot be detected without it")
        elif facts.checkpoint_last_seq > 0 and facts.checkpoint_messages == 0:
            stream_problem = (f"AUDITCP purged: {facts.checkpoint_last_seq} checkpoints were written, none is "
                              "retained")
        if stream_problem:
            reports.append(ChainReport("(streams)", 0, False, stream_problem))
    return reports


def _aged(r: AuditRecord, horizon: float | None) -> bool:
    return _aged_time(r.time, horizon)


def _aged_time(t: datetime, horizon: float | None) -> bool:
    """Whether something written at ``t`` is past the retention horizon (so its loss is no tampering)."""
    return horizon is not None and t.timestamp() < horizon


async def verify_trail(js: JetStreamContext, trust: TrustSet | None = None, *,
                       now: datetime | None = None) -> list[ChainReport]:
    """``verify_chains`` over everything the bus holds: every audit message, every checkpoint and the two
    streams' facts (what ``remediator audit verify`` and the audit API's chain status report)."""
    facts = await stream_facts(js)
    entries = [e async for e in iter_entries(js)]
    cps: list[AuditCheckpoint | AuditGarbage] = []
    if facts.checkpoint_stream:
        cps = [c async for c in iter_checkpoints(js)]
    return verify_chains(entries, cps, trust=trust, facts=facts, now=now or utcnow())
