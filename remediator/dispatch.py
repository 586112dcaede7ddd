"""Dispatch: FAULTS → handlers → REMEDIATIONS, with each node's history kept in KV by compare-and-set.

Where it sits: after ingest and the node agents (which publish ``FaultEvent``s on ``faults.<source>.<node>``)
and before the executor (which consumes ``Decision``s on ``remediation.<node>``). ``on_message`` handles the
deliveries of the durable pull consumer ``dispatch`` on FAULTS, subscribed on faststream by
``remediator.consumers``.

Per message: parse the event → drop it if its id is already in the history (a replay older than the
JetStream duplicate window) → audit ``event_accepted`` → for each matching handler, ``decide`` over the
history (pure, injected clock) inside a CAS update → store the decision under ``decision.<incident>`` →
publish it with ``Nats-Msg-Id: decision|<incident>`` → audit the verdict → ack. A crash anywhere in between
redelivers the message; the history then already holds the event, and an incident this event opened has its
decision re-published under the same id, which JetStream drops if it already arrived. So every decision is
published at least once and acted on at most once.

Messages of one node are handled in order; different nodes run concurrently (``remediator.consumers`` says how).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from handlers.base import REGISTRY, HandlerRegistry, HandlerSpec, Verdict, incident_id_for
from remediator import consumers
from remediator.audit import AuditLog
from remediator.bus import PermanentError, dead_letter_publisher, settle
from remediator.contracts import Decision, FaultEvent, utcnow
from remediator.settings import Settings
from remediator.state import StateConflict, StateStore
from remediator.subjects import (
    STATE_BUCKET,
    node_from_token,
    node_key,
    remediation_subject,
)
from remediator.telemetry import span, trace_id_of, traceparent_of

log = logging.getLogger(__name__)

DISPATCH_DURABLE = "dispatch"


def history_key(spec: HandlerSpec, event: FaultEvent) -> str:
    """KV key of the history a handler decides over: the event's node unless the handler says otherwise."""
    keyfn: Callable[[FaultEvent], str] | None = getattr(spec, "history_key", None)
    return keyfn(event) if keyfn is not None else node_key(event.node)


def decision_key(incident_id: str) -> str:
    return f"decision.{incident_id}"


def job_of(event: FaultEvent) -> str | None:
    labels = event.labels
    return (labels.get("job") or labels.get("training.kubeflow.org/job-name") or labels.get("job-name")
            or labels.get("job_name") or None)


@dataclass
class DispatchStats:
    events: int = 0
    duplicates: int = 0
    decisions: int = 0
    updated: int = 0
    no_action: int = 0
    dead_lettered: int = 0
    by_handler: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """Runs the handlers over FAULTS. ``handle`` is the whole per-event logic; ``on_message`` one delivery;
    ``run`` consumes until stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, state_kv: KeyValue, settings: Settings, audit: AuditLog,
                 registry: HandlerRegistry = REGISTRY, clock: Callable[[], datetime] = utcnow,
                 batch: int = 128) -> None:
        self._nc = nc
        self._js = js
        self._kv = state_kv
        self._state = StateStore(state_kv)
        self._settings = settings
        self._audit = audit
        self._registry = registry
        self._clock = clock
        self._batch = batch
        self.stats = DispatchStats()
        self._dead_letter = dead_letter_publisher(js, on_dead_letter=self._audit_dead_letter)

    @classmethod
    async def create(cls, nc: NATS, js: JetStreamContext, settings: Settings, audit: AuditLog,
                     **kw: object) -> Dispatcher:
        kv = await js.key_value(STATE_BUCKET)
        return cls(nc, js, kv, settings, audit, **kw)  # type: ignore[arg-type]

    # --- one event ----------------------------------------------------------------------------------

    async def handle(self, event: FaultEvent, trace_id: str | None = None,
                     traceparent: str | None = None) -> list[Decision]:
        """Decide on one event; returns the decisions published (re-published ones included)."""
        self.stats.events += 1
        specs = self._registry.for_event(event)
        audit = functools.partial(self._audit.append, trace_id=trace_id, event_id=event.id)
        gpu_key = event.gpu.key if event.gpu else None
        published: list[Decision] = []
        accepted = False
        duplicate_for = 0
        for spec in specs:
            key = history_key(spec, event)
            verdict = await self._decide(spec, key, event)
            if verdict is None:  # seen before: a redelivery, or a replay past the duplicate window
                duplicate_for += 1
                published += await self._republish_opened(key, event)
                continue
            if not accepted:
                accepted = True
                await audit(event.node, "event_accepted", f"{event.kind} {event.code} from {event.source}",
                            gpu=gpu_key, job=job_of(event), fingerprint=event.labels.get("fingerprint"),
                            after={"message": event.message[:500]})
            self.stats.by_handler[spec.name] = self.stats.by_handler.get(spec.name, 0) + 1
            decision = verdict.decision
            if decision is not None:
                self.stats.decisions += 1
                await self._publish_decision(decision, traceparent)
                published.append(decision)
                await audit(decision.node, "decision", decision.reason, incident=decision.incident_id,
                            gpu=decision.gpu.key if decision.gpu else None, job=decision.job,
                            after={"playbook": decision.playbook, "group": decision.group,
                                   "handler": decision.handler,
                                   "evidence": [e.model_dump(mode="json") for e in decision.evidence]})
            elif verdict.updated_incident is not None:
                self.stats.updated += 1
                await audit(event.node, "incident_updated", verdict.reason, incident=verdict.updated_incident,
                            gpu=gpu_key, job=job_of(event))
            else:
                self.stats.no_action += 1
                await audit(event.node, "event_ignored", verdict.reason, gpu=gpu_key, job=job_of(event))
        if not specs:
            await audit(event.node, "event_ignored", f"no handler for kind {event.kind}")
        elif duplicate_for == len(specs):
            self.stats.duplicates += 1
            if not published:
                await audit(event.node, "duplicate_ignored", "event id already in the node's history")
        return published

    async def _decide(self, spec: HandlerSpec, key: str, event: FaultEvent) -> Verdict | None:
        """The handler's verdict, with the history written back by compare-and-set (None: a duplicate).

        A decision is stored under ``decision.<incident>`` *before* the history that says it was made, so a
        crash between the two leaves something to re-publish on redelivery. Losing the CAS race means
        re-reading and deciding again, never overwriting.
        """
        for _attempt in range(25):
            history, revision = await self._state.get(key)
            if any(s.event_id == event.id for s in history.sightings):
                return None
            verdict = spec.decide(event, history, self._clock())
            if verdict.decision is not None:
                await self._store_decision(verdict.decision)
            if verdict.history == history or await self._state.compare_and_set(key, verdict.history, revision):
                return verdict
        raise StateConflict(f"{key}: compare-and-set lost 25 times in a row")

    async def _store_decision(self, decision: Decision) -> None:
        await self._kv.put(decision_key(decision.incident_id), decision.model_dump_json().encode())

    async def _publish_decision(self, decision: Decision, traceparent: str | None = None) -> None:
        headers = {"Nats-Msg-Id": f"decision|{decision.incident_id}"}
        if traceparent:
            headers["traceparent"] = traceparent
        await self._js.publish(remediation_subject(decision.node), decision.model_dump_json().encode(),
                               headers=headers)

    async def _republish_opened(self, key: str, event: FaultEvent) -> list[Decision]:
        """A redelivered event: re-publish the decisions of incidents it opened (JetStream drops repeats)."""
        history, _ = await self._state.get(key)
        out = []
        for inc in history.incidents:
            node = event.node
            if inc.incident_id != incident_id_for(node, inc.group, event.id):
                continue
            try:
                entry = await self._kv.get(decision_key(inc.incident_id))
            except KeyNotFoundError:
                continue
            assert entry.value is not None
            decision = Decision.model_validate_json(entry.value)
            await self._publish_decision(decision)
            out.append(decision)
        return out

    # --- one delivery -------------------------------------------------------------------------------

    async def on_message(self, msg: Msg) -> None:
        """Handle one FAULTS delivery and settle it (``bus.settle``): the entry point of the ``dispatch``
        subscriber (``remediator.consumers``), which calls it for one node's messages in order."""
        error: BaseException | None = None
        try:
            try:
                event = FaultEvent.model_validate_json(msg.data)
            except ValidationError as exc:
                raise PermanentError(f"not a FaultEvent v1: {exc.errors()[0]['msg']}") from exc
            with span("dispatch", msg.headers) as sp:
                await self.handle(event, trace_id=trace_id_of(sp), traceparent=traceparent_of(sp))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # mapped to ack/nak/term by settle, the one place that decides
            log.warning("dispatch of %s failed: %s", msg.subject, exc)
            error = exc
        outcome = await settle(msg, error, max_deliver=self._settings.max_deliver,
                               nak_delay=self._settings.nak_delay_s, dead_letter=self._dead_letter)
        if outcome == "term":
            self.stats.dead_lettered += 1

    async def _audit_dead_letter(self, msg: Msg, reason: str, subject: str) -> None:
        node = node_from_token(msg.subject.rsplit(".", 1)[-1])
        await self._audit.append(node, "dead_letter", reason, after={"subject": msg.subject, "moved_to": subject})

    async def run(self, stop: asyncio.Event) -> None:
        """Consume FAULTS until ``stop`` is set: the ``dispatch`` subscriber alone, on a faststream broker with
        its own connection to the servers of ``nc`` (the service runs it on one broker with the executor's)."""
        broker = consumers.broker_like(self._nc, "dispatch")
        consumers.declare_dispatch(broker, self, batch=self._batch)
        await consumers.run_until(broker, self._js, (consumers.DISPATCH,), stop)


__all__ = ["DISPATCH_DURABLE", "DispatchStats", "Dispatcher", "history_key"]
