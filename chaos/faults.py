"""Faults of a drill and what came of them: the types every other module of the drill harness shares.

Where it sits: the bottom of the drill harness (``chaos.runner`` builds ``Fault``s from a drill file, the
injectors of ``chaos.injectors`` make them happen in the ``chaos.world.World``, ``chaos.follow`` fills a
``FaultResult`` from the audit trail and ``chaos.checks`` judges it). Nothing here starts anything.

A fault's kind and code are not typed by whoever writes the drill: its ``Injector`` declares the
``FaultEvent`` kind and code it produces (``WebhookXid(79)`` produces ``xid``/79, ``AgentEcc(dbe=2)``
produces ``ecc``/``dbe_volatile``), and a ``Fault`` reads them from there, so an expectation, the
report and the audit matching all agree by construction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from remediator.contracts import AuditRecord, Kind

if TYPE_CHECKING:
    from chaos.world import World

Progress = Callable[[str], None]
Via = Literal["webhook", "agent"]


class Injector(ABC):
    """How one fault is made to happen, and the ``FaultEvent`` it makes the system see.

    ``type`` is the name a drill file uses (``type: webhook_xid``); ``via`` the way the event reaches the
    service (an Alertmanager webhook or a node agent); ``kind`` and ``code`` the event's kind and code.
    """

    type: ClassVar[str]
    via: ClassVar[Via]
    kind: ClassVar[Kind]

    @property
    @abstractmethod
    def code(self) -> int | str:
        """The ``FaultEvent.code`` the injected fault produces."""

    @property
    def job(self) -> str | None:
        """The job whose events the fault produces, for faults found by job rather than by GPU (NCCL)."""
        return None

    @abstractmethod
    async def __call__(self, world: World, fault: Fault) -> None:
        """Make the fault happen in ``world``; webhook injectors add the event ids ingest answered to
        ``fault.event_ids``."""


Check = Callable[["World", "Fault"], list[str]]


def _no_check(world: World, fault: Fault) -> list[str]:
    return []


@dataclass
class Fault:
    """One injected fault and what must come of it: ``playbook`` None means only recorded, no remediation."""

    name: str
    node: str
    gpu: int | None
    injector: Injector
    playbook: str | None
    outcomes: tuple[str, ...] = ()  # acceptable playbook outcomes
    check: Check = _no_check
    event_ids: list[str] = field(default_factory=list)

    @property
    def via(self) -> Via:
        return self.injector.via

    @property
    def kind(self) -> str:
        return self.injector.kind

    @property
    def code(self) -> int | str:
        return self.injector.code

    @property
    def job(self) -> str | None:
        return self.injector.job


@dataclass
class FaultResult:
    """What the audit trail says came of one fault, and what is wrong with it (``problems``)."""

    fault: Fault
    incident: str | None = None
    playbook: str | None = None
    outcome: str = "pending"
    actions: list[str] = field(default_factory=list)
    timeline: list[AuditRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    injected_at: datetime | None = None
    rest_at: datetime | None = None  # time of the audit record with which the fault came to rest

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def rest_s(self) -> float | None:
        """Seconds from injection to rest, by the audit trail's clock."""
        if self.injected_at is None or self.rest_at is None:
            return None
        return max(0.0, (self.rest_at - self.injected_at).total_seconds())

    def to_json(self) -> dict[str, Any]:
        f = self.fault
        # exactly the fault document of DESIGN.md §10; problems and the timeline go to stderr
        return {"name": f.name, "kind": f.kind, "code": f.code, "node": f.node, "gpu": f.gpu,
                "playbook": self.playbook, "actions": self.actions, "outcome": self.outcome, "passed": self.passed}
