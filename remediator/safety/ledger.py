"""The safety ledger: blast-radius budget reservations and the circuit breaker, shared by every replica.

Where it sits: in ``remediator.safety``, one document ``safety.ledger`` in ``remediator-state``. ``safety.gate``
reads it into the guard snapshot (reserved nodes count as out of service; the breaker's recent quarantines)
and commits what a verdict implies (a reservation and a quarantine count, or a trip) by compare-and-set,
re-evaluating the guards when another replica changed it first. The executor releases a run's reservation
when the run ends, however it ends (``finish``), and records a target it left out of service as handed over;
``remediator.reconciler`` settles handovers and stray reservations against the cluster; ``remediator budget
release`` drops one by hand; ``remediator breaker reset`` closes the breaker. Every write goes through
``remediator.kv``; every removal is idempotent (removing what is gone changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from nats.js.kv import KeyValue

from remediator.contracts import Decision
from remediator.kv import Documents
from remediator.subjects import LEDGER_KEY

__all__ = ["BreakerState", "Ledger", "LedgerStore", "reservation_key"]


@dataclass(frozen=True)
class BreakerState:
    """The circuit breaker, shared by all replicas through KV. ``quarantines``: (incident, time) pairs."""

    open: bool = False
    tripped_at: datetime | None = None
    reason: str = ""
    quarantines: tuple[tuple[str, datetime], ...] = ()

    def recent(self, now: datetime, window_s: float, exclude: str = "") -> list[tuple[str, datetime]]:
        since = now - timedelta(seconds=window_s)
        return [(i, t) for i, t in self.quarantines if t > since and i != exclude]

    def with_quarantine(self, incident: str, now: datetime, window_s: float) -> BreakerState:
        if any(i == incident for i, _ in self.quarantines):
            return self
        kept = tuple(self.recent(now, window_s))
        return replace(self, quarantines=(*kept, (incident, now)))

    def tripped(self, now: datetime, reason: str) -> BreakerState:
        return replace(self, open=True, tripped_at=now, reason=reason)

    def reset(self) -> BreakerState:
        return BreakerState()

    def to_json(self) -> dict[str, Any]:
        return {"open": self.open, "tripped_at": self.tripped_at.isoformat() if self.tripped_at else None,
                "reason": self.reason, "quarantines": [[i, t.isoformat()] for i, t in self.quarantines]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> BreakerState:
        at = d.get("tripped_at")
        return BreakerState(bool(d.get("open")), datetime.fromisoformat(at) if at else None, str(d.get("reason", "")),
                            tuple((str(i), datetime.fromisoformat(t)) for i, t in d.get("quarantines", [])))


def reservation_key(decision: Decision) -> str:
    """A reservation is per target: ``<node>|<gpu key>`` (``<node>|`` for node-wide playbooks)."""
    return f"{decision.node}|{decision.gpu.key if decision.gpu else ''}"


@dataclass(frozen=True)
class Ledger:
    """The breaker, the reservations of running playbooks, and the targets handed over to a person.

    ``reservations``: reservation key -> ``{"incident", "node", "pool", "kind": "node"|"gpu", "finished",
    "at"}``: held from the guards until the run ends, however it ends (``finished``). ``handovers``: the same
    key -> ``{"incident", "node", "gpu", "pool", "kind", "outcome", "left", "at"}`` for runs that ended
    leaving their target out of service (escalated, dead-lettered): counted by the budget like a reservation
    (the cluster view it also reads may be seconds old) until the reconciler settles them, when the cluster
    shows the target repaired or gone, or an operator releases them (``remediator budget release``).
    """

    breaker: BreakerState = field(default_factory=BreakerState)
    reservations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    handovers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"breaker": self.breaker.to_json(), "reservations": {k: dict(v) for k, v in self.reservations.items()},
                "handovers": {k: dict(v) for k, v in self.handovers.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Ledger:
        return Ledger(BreakerState.from_json(d.get("breaker", {})), dict(d.get("reservations", {})),
                      dict(d.get("handovers", {})))

    def holds(self, decision: Decision) -> bool:
        """Whether the decision's incident holds the reservation of its target."""
        mine = self.reservations.get(reservation_key(decision))
        return mine is not None and mine.get("incident") == decision.incident_id

    def reserved(self, decision: Decision, pool: str, kind: str, now: datetime) -> Ledger:
        """This ledger with a reservation of ``decision``'s target in ``pool``."""
        res = dict(self.reservations)
        res[reservation_key(decision)] = {"incident": decision.incident_id, "node": decision.node, "pool": pool,
                                          "kind": kind, "finished": False, "at": now.isoformat()}
        return replace(self, reservations=res)

    def settled(self, decision: Decision, *, released: bool) -> Ledger:
        """At the end of ``decision``'s run: its reservation dropped (capacity came back) or marked finished
        (the target stays out, and counts, until it is returned). Another incident's reservation stays."""
        key = reservation_key(decision)
        if not self.holds(decision):
            return self
        res = dict(self.reservations)
        if released:
            del res[key]
        else:
            res[key] = {**res[key], "finished": True}
        return replace(self, reservations=res)

    def finished(self, decision: Decision, handover: Mapping[str, Any] | None) -> Ledger:
        """At the end of ``decision``'s run, whatever its outcome: its reservation released, and its target
        recorded as handed over (``handover``) or, when nothing of ours is left out, no longer handed over."""
        key = reservation_key(decision)
        res = dict(self.reservations)
        if self.holds(decision):
            del res[key]
        hand = dict(self.handovers)
        if handover is not None:
            hand[key] = dict(handover)
        elif (hand.get(key) or {}).get("incident") == decision.incident_id:
            del hand[key]
        return replace(self, reservations=res, handovers=hand)

    def without_reservation(self, key: str, incident: str | None = None) -> Ledger:
        """This ledger without the reservation ``key`` (only if it is ``incident``'s, when given)."""
        cur = self.reservations.get(key)
        if cur is None or (incident is not None and cur.get("incident") != incident):
            return self
        return replace(self, reservations={k: v for k, v in self.reservations.items() if k != key})

    def without_handover(self, key: str, incident: str | None = None) -> Ledger:
        """This ledger without the handover ``key`` (only if it is ``incident``'s, when given)."""
        cur = self.handovers.get(key)
        if cur is None or (incident is not None and cur.get("incident") != incident):
            return self
        return replace(self, handovers={k: v for k, v in self.handovers.items() if k != key})


def _decode(raw: dict[str, Any] | None) -> Ledger:
    return Ledger.from_json(raw or {})


def _encode(ledger: Ledger) -> dict[str, Any]:
    return ledger.to_json()


class LedgerStore:
    """The ledger document of the state bucket."""

    def __init__(self, kv: KeyValue, *, max_attempts: int = 50) -> None:
        self.docs = Documents(kv, _decode, _encode, max_attempts=max_attempts)

    async def read(self) -> Ledger:
        return (await self.docs.get(LEDGER_KEY)).value

    async def settle(self, decision: Decision, *, released: bool) -> None:
        """Settle ``decision``'s reservation at the end of its run (see ``Ledger.settled``)."""
        await self.docs.update(LEDGER_KEY, lambda led: (led.settled(decision, released=released), None))

    async def finish(self, decision: Decision, handover: Mapping[str, Any] | None) -> None:
        """End ``decision``'s run in the ledger (see ``Ledger.finished``): the reservation is released."""
        await self.docs.update(LEDGER_KEY, lambda led: (led.finished(decision, handover), None))

    async def release(self, key: str, incident: str | None = None) -> Mapping[str, Any] | None:
        """Drop the reservation ``key`` (only ``incident``'s, when given); returns it, None when there was
        none (already released: idempotent, so two replicas or two operators releasing one are harmless)."""
        def drop(led: Ledger) -> tuple[Ledger, Mapping[str, Any] | None]:
            cur = led.reservations.get(key)
            new = led.without_reservation(key, incident)
            return new, (cur if new is not led else None)
        return await self.docs.update(LEDGER_KEY, drop)

    async def settle_handover(self, key: str, incident: str | None = None) -> Mapping[str, Any] | None:
        """Drop the handover ``key`` (only ``incident``'s, when given); returns it, None when already gone."""
        def drop(led: Ledger) -> tuple[Ledger, Mapping[str, Any] | None]:
            cur = led.handovers.get(key)
            new = led.without_handover(key, incident)
            return new, (cur if new is not led else None)
        return await self.docs.update(LEDGER_KEY, drop)

    async def reset_breaker(self) -> BreakerState:
        """Close the breaker (its quarantine count starts over), keeping the reservations; returns the
        breaker as it was."""
        return await self.docs.update(LEDGER_KEY,
                                      lambda led: (replace(led, breaker=BreakerState()), led.breaker))
