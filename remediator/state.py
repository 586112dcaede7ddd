"""Handler state in KV: a node's (or a job's) ``History`` under ``node.<node>`` / ``job.<ns>.<job>``, written
only by compare-and-set.

Where it sits: between dispatch (which reads the history, lets a handler decide, and writes the new
history back) and the executor (which closes an incident when its playbook ends), over the one
compare-and-set helper ``remediator.kv``. Losing a race means re-read and re-decide, never overwrite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nats.js.kv import KeyValue

from handlers.base import History
from remediator.kv import Documents, LostRace

T = TypeVar("T")


class StateConflict(LostRace):
    """Too many concurrent writers on one key; the message is redelivered and decided again."""


def _decode(raw: dict[str, Any] | None) -> History:
    return History.from_json(raw) if raw else History()


def _encode(history: History) -> dict[str, Any]:
    # Every write is bounded (count and bytes, oldest sightings dropped with a marker), so no input can make
    # a node's history too large for the bus to store.
    return history.bounded().to_json()


class StateStore:
    """The handler histories of the state bucket."""

    def __init__(self, kv: KeyValue, max_attempts: int = 25) -> None:
        self._docs = Documents(kv, _decode, _encode, max_attempts=max_attempts)

    async def get(self, key: str, *, fresh: bool = False) -> tuple[History, int]:
        """The history under ``key`` and its revision (0: no such key yet); ``fresh``: as the stream leader
        has it (after a lost compare-and-set; see ``remediator.kv``)."""
        entry = await self._docs.get(key, fresh=fresh)
        return entry.value, entry.revision

    async def compare_and_set(self, key: str, new: History, revision: int) -> bool:
        """Store ``new`` if ``key`` is still at ``revision`` (0: absent); False when another writer won."""
        try:
            await self._docs.put(key, new, revision)
        except LostRace:
            return False
        return True

    async def update(self, key: str, fn: Callable[[History], tuple[History, T]]) -> T:
        """Apply ``fn`` to the current history and store its result by CAS, retrying on a lost race.

        ``fn`` must be pure: it may run several times. Its second result is returned from the winning run;
        ``StateConflict`` after too many lost races in a row.
        """
        try:
            return await self._docs.update(key, fn)
        except LostRace as e:
            raise StateConflict(str(e)) from e

    async def close_incident(self, key: str, group: str) -> None:
        """Forget the open incident of ``group``: its playbook has ended (done, failed or cancelled)."""
        await self.update(key, lambda h: (h.without_incident(group), None))
