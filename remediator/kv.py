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
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
from nats.errors import MaxPayloadError
from nats.js.errors import APIError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from remediator.errors import Conflict, PermanentError

__all__ = ["DocumentTooLarge", "Documents", "Entry", "LostRace", "json_documents", "leader_view"]

_WRONG_LAST_SEQUENCE = 10071  # JetStream: "wrong last sequence"

T = TypeVar("T")
R = TypeVar("R")


class DocumentTooLarge(PermanentError):
    """A document grew past what one NATS message may carry (the server's ``max_payload``, 1 MB by default)."""


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


# orjson writes the JSON values json.dumps(separators=(",", ":"), default=str) writes, five times faster on a
# run record: keys that are not strings become strings, a datetime goes through str(). Some bytes differ, the
# values read back do not (text outside ASCII as UTF-8 rather than escaped, 2e16 for 2e+16). An integer past
# 64 bits is left to json. Nothing compares these documents' bytes; the audit trail's canonical JSON is not
# this (contracts.AuditRecord.digest).
_ORJSON = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def _dumps(doc: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc, default=str, option=_ORJSON)
    except orjson.JSONEncodeError:
        return json.dumps(doc, separators=(",", ":"), default=str).encode()


class Documents(Generic[T]):
    """Documents of one kind in one bucket: ``decode`` maps the stored JSON (``None`` when absent) to a
    value, ``encode`` maps a value back to JSON.

    ``remember``: keep the newest value this process read or wrote of each key, and start an ``update``
    from it instead of reading the key again, for a few hot documents a replica itself writes most (the
    safety ledger and its handover shards, read and rewritten at every run's end: a shard of thousands of
    handovers is tens of kB to fetch and decode each time), and a ``get`` that fetches the revision it
    remembers returns the value it holds, undecoded. The compare-and-set still names its revision,
    so a value another replica changed since costs a lost race and a fresh read, never a lost update. Values
    are kept as ``decode`` and the update functions made them: nobody may mutate one. Only for a bounded set
    of keys: nothing is ever dropped but on a lost race or a delete.
    """

    def __init__(self, kv: KeyValue, decode: Callable[[dict[str, Any] | None], T],
                 encode: Callable[[T], Mapping[str, Any]], *, max_attempts: int = 25,
                 remember: bool = False) -> None:
        self.kv = kv
        self._last: dict[str, Entry[T]] | None = {} if remember else None
        # the same bucket read through its stream leader (not a direct get any replica answers): fresh
        self._leader = leader_view(kv)
        self._decode = decode
        self._encode = encode
        self.max_attempts = max_attempts
        self._turns: dict[str, _Turn] = {}

    async def get(self, key: str, *, fresh: bool = False) -> Entry[T]:
        """The document under ``key`` and its revision (0 and ``decode(None)`` when there is none); ``fresh``
        asks the stream leader, which has applied every acknowledged write (else any replica answers)."""
        try:
            entry = await (self._leader if fresh else self.kv).get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return Entry(self._decode(None), 0)
        revision = int(entry.revision or 0)
        known = self._last.get(key) if self._last is not None else None
        if known is not None and known.revision == revision:  # one revision of a key is one value: not decoded
            return known  # again (``remember``)
        raw = orjson.loads(entry.value) if entry.value else None
        read = Entry(self._decode(raw), revision)
        self._keep(key, read)
        return read

    def _keep(self, key: str, entry: Entry[T]) -> None:
        """Remember ``entry`` (``remember``), unless a newer revision of ``key`` is remembered already (a
        follower answering late with the value before)."""
        if self._last is not None:
            known = self._last.get(key)
            if known is None or entry.revision >= known.revision:
                self._last[key] = entry

    def _forget(self, key: str) -> None:
        if self._last is not None:
            self._last.pop(key, None)

    async def put(self, key: str, value: T, revision: int) -> int:
        """Write ``value`` if ``key`` is still at ``revision`` (0: create it, failing when it exists); returns
        the new revision. Raises ``LostRace`` when another writer got there first."""
        data = _dumps(self._encode(value))
        try:
            if revision == 0:
                written = int(await self.kv.create(key, data))
            else:
                written = int(await self.kv.update(key, data, last=revision))
        except KeyWrongLastSequenceError as e:
            self._forget(key)
            raise LostRace(f"{key}: changed by another writer since revision {revision}") from e
        except KeyNotFoundError as e:  # create: the leader has the key, the replica nats-py asked has not yet
            self._forget(key)
            raise LostRace(f"{key}: created by another writer (a replica had not seen it yet)") from e
        except MaxPayloadError as e:
            raise DocumentTooLarge(f"{key}: a document of {len(data):,} bytes is over the NATS server's "
                                   "max_payload (1 MB by default); raise max_payload in its configuration") from e
        self._keep(key, Entry(value, written))
        return written

    async def delete(self, key: str, revision: int) -> bool:
        """Delete ``key`` if it is still at ``revision``; False when it moved on (someone else owns it now)."""
        self._forget(key)
        try:
            await self.kv.delete(key, last=revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            return False
        except APIError as e:
            if e.err_code == _WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def update(self, key: str, fn: Callable[[T], tuple[T, R]], *, read: Entry[T] | None = None) -> R:
        """Apply ``fn`` to the current value and store its first result on the revision read, retrying on a
        lost race; returns ``fn``'s second result from the run that won.

        ``read``: the document as the caller just read it (``get``), taken as the first attempt's read, which
        saves a round trip; the compare-and-set still checks its revision, so a stale ``read`` costs a lost race
        and a fresh read, never a lost update. When ``fn`` changes nothing on ``read``, the document is read
        again before the result is believed (nothing is written on a value the server may no longer hold).

        ``fn`` must be pure: it may run several times. When its first result equals the value it was given,
        nothing is written. Raises ``LostRace`` after ``max_attempts`` lost races in a row.

        Updates of one key that overlap in this process are combined (group commit): they queue in arrival
        order, and whoever holds the key's turn applies every queued ``fn`` in that order to one read and
        writes the result once, so a hot document (the safety ledger, which every run's end updates) costs one
        compare-and-set per batch instead of a lost race, a re-read and a re-encode per overlapping writer.
        An ``fn`` that raises gets its exception and leaves the value as the ``fn`` before it made it. Writers
        in other processes are still ordered by the revision, as before.
        """
        slot = _Slot(fn, asyncio.get_running_loop().create_future(), read)
        # a caller cancelled while its slot is in a batch is not there to read an error: mark it read
        slot.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = _Turn()
        turn.queue.append(slot)
        turn.users += 1
        try:
            async with turn.lock:
                if not slot.done.done():
                    batch, turn.queue = turn.queue, []
                    # shielded: a caller cancelled mid-write (a step deadline) does not strand the others
                    await asyncio.shield(asyncio.ensure_future(self._commit(key, batch)))
        except asyncio.CancelledError:
            if slot in turn.queue:  # cancelled before its turn: it never applies
                turn.queue.remove(slot)
            raise
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[key]
        # normally settled by now; unless a cancelled holder's write, still running, took it in its batch
        return await asyncio.shield(slot.done)

    async def _commit(self, key: str, batch: list[_Slot[T]]) -> None:
        """Apply ``batch`` in order to one read of ``key``, write once, and settle every slot."""
        try:
            known = batch[0].read
            if known is None and self._last is not None:  # what this process last read or wrote (``remember``)
                known = self._last.get(key)
            for attempt in range(self.max_attempts):
                given = known is not None and attempt == 0
                current = known if given and known is not None else await self.get(key, fresh=attempt > 0)
                value = current.value
                outcomes: list[tuple[_Slot[T], Any, Exception | None]] = []
                for slot in batch:
                    try:
                        value, result = slot.fn(value)
                    except Exception as e:  # handed to its own caller below
                        outcomes.append((slot, None, e))
                    else:
                        outcomes.append((slot, result, None))
                if given and value == current.value:
                    continue  # unchanged on the caller's read: believe it only on the server's own
                if value != current.value:
                    try:
                        await self.put(key, value, current.revision)
                    except LostRace:
                        if attempt >= 2:  # contended by another process: let the other writers through
                            await asyncio.sleep(min(0.005 * attempt, 0.05))
                        continue
                for slot, result, error in outcomes:
                    if error is not None:
                        slot.done.set_exception(error)
                    else:
                        slot.done.set_result(result)
                return
            raise LostRace(f"{key}: compare-and-set lost {self.max_attempts} times in a row")
        except Exception as e:
            for slot in batch:
                if not slot.done.done():
                    slot.done.set_exception(e)
        except BaseException:
            for slot in batch:
                slot.done.cancel()
            raise


@dataclass
class _Slot(Generic[T]):
    """One queued ``Documents.update``: its function and the future its caller awaits."""

    fn: Callable[[T], tuple[T, Any]]
    done: asyncio.Future[Any]
    read: Entry[T] | None = None


@dataclass
class _Turn:
    """The updates of one key in flight in this process: whose turn it is to write, and who waits."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: list[Any] = field(default_factory=list)
    users: int = 0


def _identity_decode(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    return raw


def _identity_encode(doc: dict[str, Any] | None) -> Mapping[str, Any]:
    return doc or {}


def json_documents(kv: KeyValue, *, max_attempts: int = 25) -> Documents[dict[str, Any] | None]:
    """Plain JSON objects (``None`` when absent), for documents that have no type of their own."""
    return Documents(kv, _identity_decode, _identity_encode, max_attempts=max_attempts)
