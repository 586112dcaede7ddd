"""The safety ledger: blast-radius budget reservations and the circuit breaker, shared by every replica.

Where it sits: in ``remediator.safety``, one document ``safety.ledger`` in ``remediator-state`` (the breaker
and the reservations: bounded by the runs in flight) and the handovers spread over ``HANDOVER_SHARDS``
documents ``safety.handovers.<00-0f>`` (``subjects.handover_shard_key``), since they are bounded only by
the targets left out of service: in one document they passed NATS's 1 MB message limit at about 4,000. ``safety.gate``
reads it into the guard snapshot (reserved nodes count as out of service; the breaker's recent quarantines)
and commits what a verdict implies (a reservation and a quarantine count, or a trip) by compare-and-set,
re-evaluating the guards when another replica changed it first. The executor releases a run's reservation
when the run ends, however it ends (``finish``), and records a target it left out of service as handed over;
``remediator.reconciler`` settles handovers and stray reservations against the cluster; ``remediator budget
release`` drops one by hand; ``remediator breaker reset`` closes the breaker. Every write goes through
``remediator.kv``; every removal is idempotent (removing what is gone changes nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, TypeVar

from nats.js.kv import KeyValue

from remediator.contracts import Decision
from remediator.kv import Documents, LostRace
from remediator.subjects import HANDOVER_SHARD_KEYS, LEDGER_KEY, handover_shard_key

__all__ = ["BreakerState", "Ledger", "LedgerStore", "reservation_key"]

R = TypeVar("R")


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
    # Handovers still inside the ledger document, written before they moved to their shards: read, counted
    # and settled like the rest (they are in ``handovers`` too), never added to. Empty on a new bus.
    inline: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The ledger document: breaker, reservations and the inline handovers (the sharded ones are not
        part of it; ``LedgerStore`` writes them)."""
        return {"breaker": self.breaker.to_json(), "reservations": {k: dict(v) for k, v in self.reservations.items()},
                "handovers": {k: dict(v) for k, v in self.inline.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Ledger:
        inline = dict(d.get("handovers", {}))
        return Ledger(BreakerState.from_json(d.get("breaker", {})), dict(d.get("reservations", {})), inline,
                      inline)

    def with_sharded(self, sharded: Mapping[str, Mapping[str, Any]]) -> Ledger:
        """This ledger document with the handovers of the shards added to its view (``handovers``)."""
        return replace(self, handovers={**self.inline, **sharded} if self.inline else sharded)

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
        """This ledger without the handover ``key`` (only if it is ``incident``'s, when given): the one in the
        document (``inline``) when there is one, and out of the view with it."""
        cur = self.inline.get(key, self.handovers.get(key))
        if cur is None or (incident is not None and cur.get("incident") != incident):
            return self
        return replace(self, inline={k: v for k, v in self.inline.items() if k != key},
                       handovers={k: v for k, v in self.handovers.items() if k != key})


def _decode(raw: dict[str, Any] | None) -> Ledger:
    return Ledger.from_json(raw or {})


def _encode(ledger: Ledger) -> dict[str, Any]:
    return ledger.to_json()


def _decode_shard(raw: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return dict(raw or {})


def _encode_shard(shard: dict[str, dict[str, Any]]) -> Mapping[str, Any]:
    return shard


class LedgerStore:
    """The ledger document and the handover shards of the state bucket."""

    def __init__(self, kv: KeyValue, *, max_attempts: int = 50) -> None:
        # Every run's end rewrites the ledger and its target's shard: each update starts from what this replica
        # last read or wrote of it (``remember``), not from a fetch and a decode of a shard that may hold
        # thousands of handovers. The guards' reads (``read``, ``update``) still ask the bucket.
        self.docs = Documents(kv, _decode, _encode, max_attempts=max_attempts, remember=True)
        self.shards = Documents(kv, _decode_shard, _encode_shard, max_attempts=max_attempts, remember=True)
        self._union: tuple[tuple[int, ...], Mapping[str, Mapping[str, Any]]] | None = None

    async def _sharded(self, *, fresh: bool = False) -> Mapping[str, Mapping[str, Any]]:
        """Every sharded handover, the shards read at once; while no shard changed, the view built last time
        (a shard's revision names its value: ``Documents`` keeps it, and this its union)."""
        entries = await asyncio.gather(*(self.shards.get(k, fresh=fresh) for k in HANDOVER_SHARD_KEYS))
        revisions = tuple(e.revision for e in entries)
        if self._union is None or self._union[0] != revisions:
            self._union = revisions, MappingProxyType({key: h for e in entries for key, h in e.value.items()})
        return self._union[1]

    async def read(self) -> Ledger:
        """The ledger with every handover, inline and sharded."""
        doc = (await self.docs.get(LEDGER_KEY)).value
        return doc.with_sharded(await self._sharded())

    async def update(self, fn: Callable[[Ledger], tuple[Ledger, R]]) -> R:
        """``fn`` over the whole ledger (handovers included), its result stored by compare-and-set on the
        ledger document; ``fn`` must leave the handovers as they are (the gate's decisions do).

        The document is read before the shards, so a handover that a run's end wrote before releasing its
        reservation is seen, or the release came after the read and the write loses the race: a target is
        never counted by neither."""
        for attempt in range(self.docs.max_attempts):
            current = await self.docs.get(LEDGER_KEY, fresh=attempt > 0)
            whole = current.value.with_sharded(await self._sharded(fresh=attempt > 0))
            new, result = fn(whole)
            if new == whole:
                return result
            try:
                await self.docs.put(LEDGER_KEY, new, current.revision)
            except LostRace:
                await asyncio.sleep(min(0.005 * attempt, 0.05))
                continue
            return result
        raise LostRace(f"{LEDGER_KEY}: compare-and-set lost {self.docs.max_attempts} times in a row")

    async def settle(self, decision: Decision, *, released: bool) -> None:
        """Settle ``decision``'s reservation at the end of its run (see ``Ledger.settled``)."""
        await self.docs.update(LEDGER_KEY, lambda led: (led.settled(decision, released=released), None))

    async def finish(self, decision: Decision, handover: Mapping[str, Any] | None) -> None:
        """End ``decision``'s run (see ``Ledger.finished``): its target's handover written to (or, when it
        left nothing out, its own removed from) the target's shard first, then its reservation released."""
        key = reservation_key(decision)

        def shard(doc: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], None]:
            if handover is not None:
                return ({**doc, key: dict(handover)} if doc.get(key) != handover else doc), None
            if (doc.get(key) or {}).get("incident") == decision.incident_id:
                return {k: v for k, v in doc.items() if k != key}, None
            return doc, None

        await self.shards.update(handover_shard_key(key), shard)

        def release(led: Ledger) -> tuple[Ledger, None]:
            new = led.without_reservation(key, decision.incident_id)
            return new.without_handover(key, decision.incident_id), None

        await self.docs.update(LEDGER_KEY, release)

    async def release(self, key: str, incident: str | None = None) -> Mapping[str, Any] | None:
        """Drop the reservation ``key`` (only ``incident``'s, when given); returns it, None when there was
        none (already released: idempotent, so two replicas or two operators releasing one are harmless)."""
        def drop(led: Ledger) -> tuple[Ledger, Mapping[str, Any] | None]:
            cur = led.reservations.get(key)
            new = led.without_reservation(key, incident)
            return new, (cur if new is not led else None)
        return await self.docs.update(LEDGER_KEY, drop)

    async def settle_handover(self, key: str, incident: str | None = None) -> Mapping[str, Any] | None:
        """Drop the handover ``key`` (only ``incident``'s, when given) from its shard and, if it is one, from
        the document; returns it, None when already gone."""
        def drop(doc: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], Mapping[str, Any] | None]:
            cur = doc.get(key)
            if cur is None or (incident is not None and cur.get("incident") != incident):
                return doc, None
            return {k: v for k, v in doc.items() if k != key}, cur

        def drop_inline(led: Ledger) -> tuple[Ledger, Mapping[str, Any] | None]:
            new = led.without_handover(key, incident)
            return new, (led.inline.get(key) if new is not led else None)

        sharded = await self.shards.update(handover_shard_key(key), drop)
        inline = await self.docs.update(LEDGER_KEY, drop_inline)
        return sharded or inline

    async def reset_breaker(self) -> BreakerState:
        """Close the breaker (its quarantine count starts over), keeping the reservations; returns the
        breaker as it was."""
        return await self.docs.update(LEDGER_KEY,
                                      lambda led: (replace(led, breaker=BreakerState()), led.breaker))

