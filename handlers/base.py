"""The handler contract: pure decisions over an event, its history and an injected clock (DESIGN.md §6).

Where it sits: dispatch reads a node's ``History`` from KV, calls ``decide`` of every handler whose
``matches`` accepts the event, publishes the ``Decision`` (if any) to REMEDIATIONS and writes the new
``History`` back with compare-and-set. Handlers never see NATS, Kubernetes, the settings or the wall clock.

A handler module declares itself with a ``HandlerDefinition`` (name, kinds, ``decide`` and the policy type;
the signature is checked when it is made) and keeps ``decide`` a plain function, directly testable with any
policy. Nothing registers at import: ``handlers.build_registry(policies)`` binds every definition to its
policy (``HandlerDefinition.bind``) into a ``HandlerRegistry``, so the policy travels with the registration.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from remediator.contracts import Decision, FaultEvent


@dataclass(frozen=True)
class Sighting:
    """One remembered fault on a node: the facts a later decision may need, nothing more."""

    event_id: str
    kind: str
    code: int | str | None
    gpu: str  # GpuRef.key, or "" for node-wide faults
    at: datetime
    job: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "kind": self.kind, "code": self.code, "gpu": self.gpu,
                "at": self.at.isoformat(), "job": self.job, "detail": self.detail}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Sighting:
        return Sighting(d["event_id"], d["kind"], d["code"], d["gpu"], datetime.fromisoformat(d["at"]),
                        d.get("job", ""), d.get("detail", ""))


@dataclass(frozen=True)
class Incident:
    """An open incident: one per equivalence group. Repeats update it; they never open a second one."""

    incident_id: str
    group: str
    playbook: str
    opened_at: datetime
    updated_at: datetime
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"incident_id": self.incident_id, "group": self.group, "playbook": self.playbook,
                "opened_at": self.opened_at.isoformat(), "updated_at": self.updated_at.isoformat(),
                "count": self.count}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Incident:
        return Incident(d["incident_id"], d["group"], d["playbook"], datetime.fromisoformat(d["opened_at"]),
                        datetime.fromisoformat(d["updated_at"]), int(d.get("count", 1)))


# Bounds of one stored history (bounded state: no input can make a node's document unwritable; NATS refuses
# a message above its max_payload, 1 MiB by default). ``History.bounded`` applies them on every write.
HISTORY_MAX_SIGHTINGS = 1024
HISTORY_MAX_BYTES = 256 * 1024
SIGHTING_FIELD_MAX = 512  # detail, job and a string code of one sighting
_CUT = "…[truncated]"


def _cut(text: str, limit: int = SIGHTING_FIELD_MAX) -> str:
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT


def _json_size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":"), default=str).encode())


@dataclass(frozen=True)
class History:
    """A node's remembered sightings and open incidents, as stored under KV ``node.<node>``.

    ``dropped`` counts the sightings ``bounded`` dropped (oldest first) to keep the document within its
    bounds: the marker that the history is not complete.
    """

    sightings: tuple[Sighting, ...] = ()
    incidents: tuple[Incident, ...] = ()
    dropped: int = 0

    def bounded(self, max_sightings: int = HISTORY_MAX_SIGHTINGS, max_bytes: int = HISTORY_MAX_BYTES) -> History:
        """This history within its bounds: each sighting's detail, job and string code cut to
        ``SIGHTING_FIELD_MAX`` characters with a marker, then the oldest sightings dropped (and counted in
        ``dropped``) until at most ``max_sightings`` remain and the stored JSON is at most ``max_bytes``.
        Open incidents are always kept."""
        kept = [s if (len(s.detail) <= SIGHTING_FIELD_MAX and len(s.job) <= SIGHTING_FIELD_MAX
                      and not (isinstance(s.code, str) and len(s.code) > SIGHTING_FIELD_MAX))
                else replace(s, detail=_cut(s.detail), job=_cut(s.job),
                             code=_cut(s.code) if isinstance(s.code, str) else s.code)
                for s in self.sightings]
        drop = max(0, len(kept) - max_sightings)
        unchanged = kept == list(self.sightings)
        if drop == 0 and unchanged and _json_size(self.to_json()) + 24 <= max_bytes:
            return self  # the common case: one measure of the whole
        sizes = [_json_size(s.to_json()) + 1 for s in kept]
        total = _json_size(replace(self, sightings=()).to_json()) + 24 + sum(sizes[drop:])
        while total > max_bytes and drop < len(kept):
            total -= sizes[drop]
            drop += 1
        if drop == 0 and unchanged:
            return self
        return replace(self, sightings=tuple(kept[drop:]), dropped=self.dropped + drop)

    def open_incident(self, group: str) -> Incident | None:
        return next((i for i in self.incidents if i.group == group), None)

    def remember(self, s: Sighting, now: datetime, keep: timedelta = timedelta(hours=24),
                 limit: int = 512) -> History:
        """Add ``s``, forgetting sightings older than ``keep`` and all but the newest ``limit``."""
        kept = (*(x for x in self.sightings if now - x.at <= keep), s)
        return replace(self, sightings=kept[-limit:])

    def with_incident(self, inc: Incident) -> History:
        others = tuple(i for i in self.incidents if i.group != inc.group)
        return replace(self, incidents=(*others, inc))

    def without_incident(self, group: str) -> History:
        return replace(self, incidents=tuple(i for i in self.incidents if i.group != group))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"sightings": [s.to_json() for s in self.sightings],
                               "incidents": [i.to_json() for i in self.incidents]}
        if self.dropped:
            doc["dropped"] = self.dropped
        return doc

    @staticmethod
    def from_json(d: dict[str, Any]) -> History:
        return History(tuple(Sighting.from_json(x) for x in d.get("sightings", ())),
                       tuple(Incident.from_json(x) for x in d.get("incidents", ())), int(d.get("dropped", 0)))


@dataclass(frozen=True)
class Verdict:
    """What a handler says about one event: maybe a decision, always the new history and a reason.

    ``decision`` is None when nothing is to be done (recorded, grouped into an open incident, ignored);
    ``reason`` then says which, for the audit trail. ``updated_incident`` is set when the event was folded
    into an already open incident.
    """

    decision: Decision | None
    history: History
    reason: str
    updated_incident: str | None = None


P = TypeVar("P")

DecideFn = Callable[[FaultEvent, History, datetime, P], Verdict]
"""``decide(event, history, now, policy) -> Verdict``: pure; ``now`` is the only clock, ``policy`` the only
configuration."""

HistoryKeyFn = Callable[[FaultEvent], str]

_DECIDE_PARAMS = ("event", "history", "now", "policy")


@dataclass(frozen=True)
class HandlerDefinition(Generic[P]):
    """What a handler module declares: its name, the kinds it takes, its pure ``decide`` and the type of the
    policy ``decide`` takes. Declaring registers nothing; ``bind`` pairs it with a policy.

    ``history_key`` keys the history by something other than the node (None: ``node.<node>``), e.g. a job
    for handlers that correlate across nodes. ``matches`` narrows ``kinds`` further (None: every event of
    those kinds). The signature of ``decide`` is checked when the definition is made.
    """

    name: str
    kinds: frozenset[str]
    decide: DecideFn[P]
    policy_type: type[P]
    matches: Callable[[FaultEvent], bool] | None = None
    history_key: HistoryKeyFn | None = None

    def __post_init__(self) -> None:
        params = tuple(inspect.signature(self.decide).parameters)
        if params != _DECIDE_PARAMS:
            raise TypeError(f"handler {self.name!r}: decide must take {_DECIDE_PARAMS}, not {params}")

    def bind(self, policy: P) -> HandlerSpec[P]:
        """The registrable handler: this definition with ``policy``, which every ``decide`` call receives."""
        if not isinstance(policy, self.policy_type):
            raise TypeError(f"handler {self.name!r} takes a {self.policy_type.__name__}, "
                            f"not {type(policy).__name__}")
        return HandlerSpec(self.name, self.kinds, self.decide, self.matches or _every_event, policy,
                           self.history_key)


def _every_event(_event: FaultEvent) -> bool:
    return True


@dataclass(frozen=True)
class HandlerSpec(Generic[P]):
    """A registered handler: its definition bound to the policy it decides under.

    Dispatch calls ``spec.decide(event, history, now, spec.policy)``. ``history_key`` names the KV key of the
    history it decides over; None means the event's node (``node.<node>``), the default for every handler
    whose state is per node.
    """

    name: str
    kinds: frozenset[str]
    decide: DecideFn[P]
    matches: Callable[[FaultEvent], bool]
    policy: P
    history_key: HistoryKeyFn | None = None


@dataclass
class HandlerRegistry:
    """Injectable registry of handlers, built by ``handlers.build_registry`` from the policies (the service
    from its settings, tests and tools with ``handlers.default_registry()``); no registry exists at import."""

    specs: dict[str, HandlerSpec[Any]] = field(default_factory=dict)

    def register(self, spec: HandlerSpec[Any]) -> None:
        if spec.name in self.specs:
            raise ValueError(f"handler {spec.name!r} registered twice")
        self.specs[spec.name] = spec

    def for_event(self, event: FaultEvent) -> list[HandlerSpec[Any]]:
        return [s for s in self.specs.values() if event.kind in s.kinds and s.matches(event)]


def incident_id_for(node: str, group: str, event_id: str) -> str:
    """Deterministic incident id: the same first event on the same group always names the same incident."""
    return "inc-" + hashlib.sha256(f"{node}|{group}|{event_id}".encode()).hexdigest()[:16]
