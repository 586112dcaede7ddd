"""Attempts: the recent remediations of each node, which the ``cooldown`` guard counts.

Where it sits: in ``remediator.safety``, read by the executor when it gathers a guard snapshot and written
by ``safety.gate`` once a run passed its guards for real (not shadow). One document per node,
``attempts.<node>`` in ``remediator-state``, updated by compare-and-set (``remediator.kv``); attempts older
than the window are dropped on the next write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.js.kv import KeyValue

from remediator.kv import Documents, Entry
from remediator.subjects import attempts_key

__all__ = ["Attempt", "AttemptLog"]


@dataclass(frozen=True)
class Attempt:
    """One earlier remediation: which incident, on which node and GPU (``""``: node-wide), when."""

    incident: str
    node: str
    gpu: str
    at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"incident": self.incident, "node": self.node, "gpu": self.gpu, "at": self.at.isoformat()}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Attempt:
        return Attempt(str(d["incident"]), str(d["node"]), str(d.get("gpu", "")), datetime.fromisoformat(d["at"]))


def _decode(raw: dict[str, Any] | None) -> tuple[Attempt, ...]:
    return tuple(Attempt.from_json(a) for a in (raw or {}).get("attempts", []))


def _encode(attempts: tuple[Attempt, ...]) -> dict[str, Any]:
    return {"attempts": [a.to_json() for a in attempts]}


def with_attempt(attempts: tuple[Attempt, ...], new: Attempt, window_s: float) -> tuple[Attempt, ...]:
    """``attempts`` with ``new`` added (once per incident) and those older than ``window_s`` before it gone."""
    if any(a.incident == new.incident for a in attempts):
        return attempts
    since = new.at.timestamp() - window_s
    return (*(a for a in attempts if a.at.timestamp() > since), new)


class AttemptLog:
    """The attempts documents of the state bucket."""

    def __init__(self, kv: KeyValue, *, max_attempts: int = 20) -> None:
        self._docs = Documents(kv, _decode, _encode, max_attempts=max_attempts)

    async def recent(self, node: str) -> tuple[Attempt, ...]:
        return (await self.read(node)).value

    async def read(self, node: str) -> Entry[tuple[Attempt, ...]]:
        """The node's attempts and the revision they were read at (hand it to ``record``)."""
        return await self._docs.get(attempts_key(node))

    async def record(self, attempt: Attempt, window_s: float, *,
                     read: Entry[tuple[Attempt, ...]] | None = None) -> None:
        """Add ``attempt`` to its node's document (idempotent per incident); ``read``: the document as the
        caller read it, which saves the update its own read (``kv.Documents.update``)."""
        await self._docs.update(attempts_key(attempt.node),
                                lambda cur: (with_attempt(cur, attempt, window_s), None), read=read)
