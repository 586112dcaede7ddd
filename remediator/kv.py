"""Compare-and-set over JetStream KV: the one way the project reads and writes a KV document.

Where it sits: under everything that keeps state in the ``remediator-state`` and ``remediator-locks`` buckets
(DESIGN.md §4): the handler histories (``remediator.state``), the executor's run records, the safety ledger,
attempts, approvals (``remediator.safety``, ``remediator.cli.operator``) and the node lock
(``remediator.safety.lock``). Keys are built in ``remediator.subjects``; nothing here knows what a document
means.

A document is JSON, decoded into a value by the ``decode`` of its ``Documents`` (absent keys decode
``None``) and encoded by ``encode``. Every write names the revision it read (0: the key must not exist), so
losing a race to another writer is ``LostRace`` (an ``errors.Conflict``), never a silent overwrite.
``update(key, fn)`` is the usual shape: read, apply the pure ``fn``, write on the revision read, and on a
lost race read and apply ``fn`` again, up to ``max_attempts`` times before raising ``LostRace``.

Reads are direct gets (the buckets are declared ``allow_direct``), which any replica answers, so a follower
that has not applied the last write yet answers with the value before it (or none): stale. A write on a
stale revision is refused by the stream leader, and the re-read after a lost race asks the leader
(``get(key, fresh=True)``), so a lagging follower (as after an election) costs one round trip, not the
``max_attempts`` budget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.js.errors import APIError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from remediator.errors import Conflict

__all__ = ["Documents", "Entry", "LostRace", "json_documents", "leader_view"]

_WRONG_LAST_SEQUENCE = 10071  # JetStream: "wrong last sequence"

T = TypeVar("T")
R = TypeVar("R")


class LostRace(Conflict):
    """Another writer changed the key since it was read (or created it first); re-read and decide again."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A decoded document and the revision it was read at (0: the key does not exist)."""

    value: T
    revision: int


def leader_view(kv: KeyValue) -> KeyValue:
    """The same bucket, read through its stream leader instead of a direct get any replica answers: what
    was acknowledged is there (a follower may not have applied it yet)."""
    return KeyValue(name=kv._name, stream=kv._stream, pre=kv._pre, js=kv._js, direct=False)


def _dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


class Documents(Generic[T]):
    """Documents of one kind in one bucket: ``decode`` maps the stored JSON (``None`` when absent) to a
    value, ``encode`` maps a value back to JSON."""

    def __init__(self, kv: KeyValue, decode: Callable[[dict[str, Any] | None], T],
                 encode: Callable[[T], Mapping[str, Any]], *, max_attempts: int = 25) -> None:
        self.kv = kv
        # the same bucket read through its stream leader (not a direct get any replica answers): fresh
        self._leader = leader_view(kv)
        self._decode = decode
        self._encode = encode
        self.max_attempts = max_attempts

    async def get(self, key: str, *, fresh: bool = False) -> Entry[T]:
        """The document under ``key`` and its revision (0 and ``decode(None)`` when there is none); ``fresh``
        asks the stream leader, which has applied every acknowledged write (else any replica answers)."""
        try:
            entry = await (self._leader if fresh else self.kv).get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return Entry(self._decode(None), 0)
        raw = json.loads(entry.value) if entry.value else None
        return Entry(self._decode(raw), int(entry.revision or 0))

    async def put(self, key: str, value: T, revision: int) -> int:
        """Write ``value`` if ``key`` is still at ``revision`` (0: create it, failing when it exists); returns
        the new revision. Raises ``LostRace`` when another writer got there first."""
        data = _dumps(self._encode(value))
        try:
            if revision == 0:
                return int(await self.kv.create(key, data))
            return int(await self.kv.update(key, data, last=revision))
        except KeyWrongLastSequenceError as e:
            raise LostRace(f"{key}: changed by another writer since revision {revision}") from e
        except KeyNotFoundError as e:  # create: the leader has the key, the replica nats-py asked has not yet
            raise LostRace(f"{key}: created by another writer (a replica had not seen it yet)") from e

    async def delete(self, key: str, revision: int) -> bool:
        """Delete ``key`` if it is still at ``revision``; False when it moved on (someone else owns it now)."""
        try:
            await self.kv.delete(key, last=revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            return False
        except APIError as e:
            if e.err_code == _WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def update(self, key: str, fn: Callable[[T], tuple[T, R]]) -> R:
        """Apply ``fn`` to the current value and store its first result on the revision read, retrying on a
        lost race; returns ``fn``'s second result from the run that won.

        ``fn`` must be pure: it may run several times. When its first result equals the value it was given,
        nothing is written. Raises ``LostRace`` after ``max_attempts`` lost races in a row.
        """
        for attempt in range(self.max_attempts):
            current = await self.get(key, fresh=attempt > 0)
            new, result = fn(current.value)
            if new == current.value:
                return result
            try:
                await self.put(key, new, current.revision)
            except LostRace:
                if attempt >= 2:  # contended: let the other writers through
                    await asyncio.sleep(min(0.005 * attempt, 0.05))
                continue
            return result
        raise LostRace(f"{key}: compare-and-set lost {self.max_attempts} times in a row")


def _identity_decode(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    return raw


def _identity_encode(doc: dict[str, Any] | None) -> Mapping[str, Any]:
    return doc or {}


def json_documents(kv: KeyValue, *, max_attempts: int = 25) -> Documents[dict[str, Any] | None]:
    """Plain JSON objects (``None`` when absent), for documents that have no type of their own."""
    return Documents(kv, _identity_decode, _identity_encode, max_attempts=max_attempts)
