"""Dispatch: FAULTS → handlers → REMEDIATIONS, with each node's history kept in KV by compare-and-set.

Where it sits: after ingest and the node agents (which publish ``FaultEvent``s on ``faults.<source>.<node>``)
and before the executor (which consumes ``Decision``s on ``remediation.<node>``). ``on_message`` handles the
deliveries of the durable pull consumer ``dispatch`` on FAULTS, subscribed on faststream by
``remediator.consumers``.

Per message: parse the event → drop it if its id is already in the history (a replay older than the
JetStream duplicate window) → audit ``event_accepted`` → for each matching handler, ``decide`` over the
history (pure, injected clock) inside a CAS update → store the decision under ``decision.<incident>`` →
publish it with ``Nats-Msg-Id: decision|<incident>`` and the trace's ``traceparent`` → audit the verdict → ack.
A crash anywhere in between redelivers the message; the history then already holds the event, and an
incident this event opened has its decision re-published under the same id, which JetStream drops if it
already arrived. So every decision is published at least once and acted on at most once.

Provenance is data: each decision carries the event's ``origin`` plus the ``history_key`` it was decided
over, and its ``job`` from ``contracts.resolve_job`` when the handler named none. Every record written here
goes through one ``IncidentAudit`` bound to the event (``AuditContext.of_event``: node, GPU, event id, job,
alert fingerprint, trace id), re-bound to the incident once a verdict names one, so the records of an
incident agree on all of them by construction.

A message with the header ``Remediator-Report: command-refusals`` is not an event but a node agent's signed
report of the commands it refused (``remediator.identity.reports``): verified against the node's announced
key (KV ``agentkey.<node>``) and audited as ``command_refused`` records, or refused as ``event_ignored``.

Messages of one node are handled in order; different nodes run concurrently (``remediator.consumers`` says how).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from handlers.base import HandlerRegistry, HandlerSpec, History, Verdict, incident_id_for
from handlers.rules import RuleSet
from remediator import consumers
from remediator.adapters.agent import AgentKeys
from remediator.audit import AuditContext, AuditLog, IncidentAudit, decision_after
from remediator.bus import PermanentError, dead_letter_publisher, settle
from remediator.contracts import Decision, FaultEvent, resolve_job, utcnow
from remediator.identity import reports
from remediator.kv import leader_view
from remediator.settings import Settings
from remediator.signing import verify_document
from remediator.state import StateConflict, StateStore
from remediator.subjects import (
    STATE_BUCKET,
    decision_key,
    faults_subject,
    node_from_token,
    node_key,
    remediation_subject,
)
from remediator.telemetry import span, trace_id_of, traceparent_of

log = logging.getLogger(__name__)

DISPATCH_DURABLE = "dispatch"


def history_key(spec: HandlerSpec[Any], event: FaultEvent) -> str:
    """KV key of the history a handler decides over: the event's node unless the handler says otherwise."""
    keyfn: Callable[[FaultEvent], str] | None = getattr(spec, "history_key", None)
    return keyfn(event) if keyfn is not None else node_key(event.node)


def _drop(read: asyncio.Future[Any]) -> None:
    """Let a read nobody will use go: cancelled while in flight, its error (if it failed) taken."""
    if not read.done():
        read.cancel()
    elif not read.cancelled():
        read.exception()


def with_provenance(decision: Decision, event: FaultEvent, key: str) -> Decision:
    """``decision`` carrying ``event``'s origin and the history key it was decided over, and the event's
    job (``resolve_job``) when the handler named none."""
    origin = event.origin.model_copy(update={"history_key": key})
    job = decision.job or resolve_job(event.origin, event.labels)
    return decision.model_copy(update={"origin": origin, "job": job})


@dataclass
class DispatchStats:
    events: int = 0
    duplicates: int = 0
    decisions: int = 0
    updated: int = 0
    no_action: int = 0
    dead_lettered: int = 0
    cas_lost: int = 0  # compare-and-sets of a history another writer won (re-read, decided again)
    by_handler: dict[str, int] = field(default_factory=dict)


def subject_mismatch(subject: str, event: FaultEvent) -> str | None:
    """Why an agent event is refused, or None: it arrived on ``faults.agent.<node>`` (or says it is from an
    agent) and its body names another source or node than that subject, which is its publisher's."""
    parts = subject.split(".")
    from_agent_subject = len(parts) == 3 and parts[0] == "faults" and parts[1] == "agent"
    if not from_agent_subject and event.source != "agent":
        return None
    if subject == faults_subject(event.source, event.node):
        return None
    return (f"{event.source} event for node {event.node} arrived on {subject}: an agent speaks only for "
            "its own node")


class Dispatcher:
    """Runs the handlers over FAULTS. ``handle`` is the whole per-event logic; ``on_message`` one delivery;
    ``run`` consumes until stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, state_kv: KeyValue, settings: Settings, audit: AuditLog,
                 registry: HandlerRegistry, clock: Callable[[], datetime] = utcnow, batch: int = 128,
                 origins: Callable[[FaultEvent], Awaitable[FaultEvent]] | None = None,
                 rules: Callable[[], RuleSet] | None = None) -> None:
        self._nc = nc
        self._js = js
        self._kv = state_kv
        self._leader_kv = leader_view(state_kv)
        self._state = StateStore(state_kv)
        self._settings = settings
        self._audit = audit
        self._registry = registry
        self._origins = origins  # fills origin.job from the pod's owner (remediator.owners), when given
        self._rules = rules  # operator overrides in force (handlers.rules.RulesSource.current), when given
        self._clock = clock
        self._batch = batch
        self.stats = DispatchStats()
        self._dead_letter = dead_letter_publisher(js, on_dead_letter=self._audit_dead_letter)
        self._agent_keys: AgentKeys | None = None  # the agents' announced keys, for their refusal reports

    @classmethod
    async def create(cls, nc: NATS, js: JetStreamContext, settings: Settings, audit: AuditLog,
                     registry: HandlerRegistry, **kw: Any) -> Dispatcher:
        kv = await js.key_value(STATE_BUCKET)
        return cls(nc, js, kv, settings, audit, registry, **kw)

    # --- one event ----------------------------------------------------------------------------------

    async def handle(self, event: FaultEvent, trace_id: str | None = None,
                     traceparent: str | None = None) -> list[Decision]:
        """Decide on one event; returns the decisions published (re-published ones included).

        ``trace_id`` is stamped on every audit record, ``traceparent`` sent with every decision published.
        """
        self.stats.events += 1
        early: dict[str, asyncio.Future[tuple[History, int]]] = {}
        if self._origins is not None and event.origin.pod and not event.origin.job:
            # Who owns the pod is an API request; the node's history does not depend on it: read both at once.
            # (A handler keyed by something else, the job's NCCL history, waits for the owner as before.)
            key = node_key(event.node)
            early[key] = asyncio.ensure_future(self._state.get(key))
            try:
                event = await self._origins(event)
            except BaseException:
                _drop(early[key])
                raise
        elif self._origins is not None:
            event = await self._origins(event)
        specs = self._registry.for_event(event)
        audit = self._audit.bind(AuditContext.of_event(event, trace_id))
        published: list[Decision] = []
        accepted = False

        async def accept() -> None:  # once per event, before the first record of what it caused
            nonlocal accepted
            if not accepted:
                accepted = True
                await audit.append("event_accepted", f"{event.kind} {event.code} from {event.source}",
                                   after={"message": event.message[:500]}, once=f"accepted|{event.id}")

        duplicate_for = 0
        for spec in specs:
            key = history_key(spec, event)
            verdict = await self._decide(spec, key, event, early.pop(key, None))
            if verdict is None:  # seen before: a redelivery, or a replay past the duplicate window
                duplicate_for += 1
                for decision, recent in await self._republish_opened(key, event, traceparent):
                    published.append(decision)
                    if recent:  # the delivery that decided may have failed before its records: write them
                        await accept()  # again; JetStream keeps the first of each (``once``)
                        await self._audit_decision(audit, decision)
                continue
            self.stats.by_handler[spec.name] = self.stats.by_handler.get(spec.name, 0) + 1
            await self._record(audit, verdict, traceparent, published, accept)
        for unused in early.values():  # no handler read the node's history: let the read go
            _drop(unused)
        if not specs:
            await audit.append("event_ignored", f"no handler for kind {event.kind}")
        elif duplicate_for == len(specs):
            self.stats.duplicates += 1
            if not published:
                await audit.append("duplicate_ignored", "event id already in the node's history")
        return published

    async def _record(self, audit: IncidentAudit, verdict: Verdict, traceparent: str | None,
                      published: list[Decision], accept: Callable[[], Awaitable[None]]) -> None:
        """Publish the verdict's decision, if any, and audit the verdict on the incident it names.

        The decision is published before anything about it is audited, and its records are named for
        JetStream's duplicate window (``once``): a redelivery re-publishes and re-audits, and whatever the
        failed delivery had stored already is kept once."""
        decision = verdict.decision
        if decision is not None:
            self.stats.decisions += 1
            await self._publish_decision(decision, traceparent)
            published.append(decision)
            await accept()
            await self._audit_decision(audit, decision)
        elif verdict.updated_incident is not None:
            await accept()
            self.stats.updated += 1
            await audit.for_incident(verdict.updated_incident).append("incident_updated", verdict.reason)
        else:
            await accept()
            self.stats.no_action += 1
            await audit.append("event_ignored", verdict.reason)

    @staticmethod
    async def _audit_decision(audit: IncidentAudit, decision: Decision) -> None:
        on = audit.for_incident(decision.incident_id, gpu=decision.gpu.key if decision.gpu else None,
                                job=decision.job)
        await on.append("decision", decision.reason, after=decision_after(decision),
                        once=f"decision|{decision.incident_id}")

    async def _decide(self, spec: HandlerSpec[Any], key: str, event: FaultEvent,
                      read: Awaitable[tuple[History, int]] | None = None) -> Verdict | None:
        """The handler's verdict, with the history written back by compare-and-set (None: a duplicate).

        A decision is stored under ``decision.<incident>`` *before* the history that says it was made, so a
        crash between the two leaves something to re-publish on redelivery. Losing the CAS race means
        re-reading and deciding again, never overwriting. ``read``: the history's read, already in flight.
        """
        for attempt in range(25):
            history, revision = await (read if read is not None and attempt == 0
                                       else self._state.get(key, fresh=attempt > 0))
            if any(s.event_id == event.id for s in history.sightings):
                return None
            verdict = spec.decide(event, history, self._clock(), spec.policy)
            if verdict.decision is not None:
                verdict = replace(verdict, decision=with_provenance(verdict.decision, event, key))
                assert verdict.decision is not None
                if self._rules is not None:  # operator overrides: routed (named in evidence) or dropped
                    applied = self._rules().apply(verdict.decision, event)
                    if applied.decision is None:
                        verdict = replace(verdict, decision=None, reason=applied.reason)
                    else:
                        verdict = replace(verdict, decision=applied.decision)
            if verdict.decision is not None:
                await self._store_decision(verdict.decision)
            if verdict.history == history or await self._state.compare_and_set(key, verdict.history, revision):
                return verdict
            self.stats.cas_lost += 1
        raise StateConflict(f"{key}: compare-and-set lost 25 times in a row")

    async def _store_decision(self, decision: Decision) -> None:
        await self._kv.put(decision_key(decision.incident_id), decision.model_dump_json().encode())

    async def _publish_decision(self, decision: Decision, traceparent: str | None = None) -> None:
        headers = {"Nats-Msg-Id": f"decision|{decision.incident_id}"}
        if traceparent:
            headers["traceparent"] = traceparent
        await self._js.publish(remediation_subject(decision.node), decision.model_dump_json().encode(),
                               headers=headers)

    async def _republish_opened(self, key: str, event: FaultEvent,
                                traceparent: str | None) -> list[tuple[Decision, bool]]:
        """A redelivered event: re-publish the decisions of incidents it opened (JetStream drops repeats),
        each with whether it was decided within the duplicate window (so its records may be written again:
        JetStream still knows which were stored). The stored decision is read from the bucket's leader: a
        replica that has not applied it yet would make the incident look like it never was."""
        history, _ = await self._state.get(key, fresh=True)
        out = []
        for inc in history.incidents:
            node = event.node
            if inc.incident_id != incident_id_for(node, inc.group, event.id):
                continue
            try:
                entry = await self._leader_kv.get(decision_key(inc.incident_id))
            except KeyNotFoundError:
                continue
            assert entry.value is not None
            decision = Decision.model_validate_json(entry.value)
            await self._publish_decision(decision, traceparent)
            # past the window JetStream forgets, and a replay must not audit an old decision twice; a margin
            # for the clocks of the replica that decided and this one
            age = (self._clock() - decision.decided_at).total_seconds()
            out.append((decision, age < self._settings.duplicate_window_s - 60))
        return out

    # --- one delivery -------------------------------------------------------------------------------
    # An agent's NATS identity may publish on faults.agent.<its node> only (remediator.identity.roles), so
    # the subject names the publisher; the body must name the same source and node (subject_mismatch).

    async def on_message(self, msg: Msg) -> None:
        """Handle one FAULTS delivery and settle it (``bus.settle``): the entry point of the ``dispatch``
        subscriber (``remediator.consumers``), which calls it for one node's messages in order."""
        error: BaseException | None = None
        try:
            if (msg.headers or {}).get(reports.REPORT_HEADER) == reports.REFUSALS_KIND:
                await self._record_refusals(msg)  # an agent's refusal report, not an event
            else:
                await self._on_event(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # mapped to ack/nak/term by settle, the one place that decides
            log.warning("dispatch of %s failed: %s", msg.subject, exc)
            error = exc
        outcome = await settle(msg, error, max_deliver=self._settings.max_deliver,
                               nak_delay=self._settings.nak_delay_s, dead_letter=self._dead_letter)
        if outcome == "term":
            self.stats.dead_lettered += 1

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = FaultEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            raise PermanentError(f"not a FaultEvent v1: {exc.errors()[0]['msg']}") from exc
        with span("dispatch", msg.headers) as sp:
            refusal = subject_mismatch(msg.subject, event)
            if refusal is not None:  # audited and acked: a redelivery would say the same
                await self._audit.bind(AuditContext.of_event(event, trace_id_of(sp))).append(
                    "event_ignored", refusal, after={"subject": msg.subject, "refused": "subject_mismatch"})
            else:
                await self.handle(event, trace_id=trace_id_of(sp), traceparent=traceparent_of(sp))

    async def _record_refusals(self, msg: Msg) -> None:
        """Audit an agent's refusal report (``remediator.identity.reports``): one ``command_refused`` record
        per reason on the node's chain when the report arrived on ``faults.agent.<its node>`` and that node's
        announced agent key signed it; otherwise one ``event_ignored`` record (``after.refused``:
        ``subject_mismatch``, ``unverified_report`` or ``malformed_report``). Reading the key may fail
        (the bus is away): the delivery is then retried like any other."""
        parts = msg.subject.split(".")
        node = node_from_token(parts[-1])
        if self._agent_keys is None:
            self._agent_keys = AgentKeys(self._nc, cache_s=self._settings.agent_key_cache_s)
        try:
            if len(parts) != 3 or parts[:2] != ["faults", "agent"]:
                raise reports.ReportRefused("subject_mismatch", f"a refusal report on {msg.subject}: only an "
                                                                "agent's own faults.agent.<node> carries one")
            report = reports.verify(msg.data, await self._agent_keys.key(node, fresh=True), verify_document)
            if report.node != node:
                raise reports.ReportRefused("subject_mismatch", f"refusal report for node {report.node} on "
                                                                f"{msg.subject}: an agent speaks only for its own node")
        except reports.ReportRefused as e:
            await self._audit.append(node, "event_ignored", str(e), after={"subject": msg.subject, "refused": e.code})
            return
        for reason, r in sorted(report.refusals.items()):
            await self._audit.append(
                node, "command_refused",
                f"the agent on {node} refused {r.count} command(s): {reason} (last: {r.last_verb or '?'} "
                f"{r.last_id[:120]}: {r.last_detail[:200]})",
                after={"refused": reason, "count": r.count, "last_verb": r.last_verb, "last_command_id": r.last_id,
                       "last_detail": r.last_detail, "since": report.since.isoformat(),
                       "until": report.until.isoformat(), "report": report.id, "signer": report.signer})

    async def _audit_dead_letter(self, msg: Msg, reason: str, subject: str) -> None:
        """Audit a FAULTS message moved to the dead letters: with the event's provenance and trace when the
        message is an event at all, else on the node its subject names."""
        after = {"subject": msg.subject, "moved_to": subject}
        try:
            event = FaultEvent.model_validate_json(msg.data)
        except ValidationError:
            node = node_from_token(msg.subject.rsplit(".", 1)[-1])
            await self._audit.append(node, "dead_letter", reason, after=after)
            return
        with span("dispatch.dead_letter", msg.headers) as sp:
            await self._audit.bind(AuditContext.of_event(event, trace_id_of(sp))).append(
                "dead_letter", reason, after=after)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume FAULTS until ``stop`` is set: the ``dispatch`` subscriber alone, on a faststream broker with
        its own connection to the servers of ``nc`` (the service runs it on one broker with the executor's)."""
        broker = consumers.broker_like(self._nc, "dispatch")
        consumers.declare_dispatch(broker, self, batch=self._batch)
        await consumers.run_until(broker, self._js, (consumers.DISPATCH,), stop)


__all__ = ["DISPATCH_DURABLE", "DispatchStats", "Dispatcher", "history_key", "with_provenance"]
