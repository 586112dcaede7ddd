"""Handler state in KV: a node's ``History`` under ``node.<node>``, written only by compare-and-set.

Where it sits: between dispatch (which reads the history, lets a handler decide, and writes the new
history back) and the executor (which closes an incident when its playbook ends). Losing a CAS race means
re-read and re-decide, never overwrite.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from handlers.base import History
from remediator.errors import Conflict

T = TypeVar("T")


class StateConflict(Conflict):
    """Too many concurrent writers on one key; the message is redelivered and decided again."""


class StateStore:
    def __init__(self, kv: KeyValue, max_attempts: int = 25) -> None:
        self._kv = kv
        self._max_attempts = max_attempts

    async def get(self, key: str) -> tuple[History, int]:
        """The history under ``key`` and its revision (0: no such key yet)."""
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return History(), 0
        if not entry.value:
            return History(), int(entry.revision or 0)
        return History.from_json(json.loads(entry.value)), int(entry.revision or 0)

    async def compare_and_set(self, key: str, new: History, revision: int) -> bool:
        """Store ``new`` if ``key`` is still at ``revision`` (0: absent); False when another writer won."""
        data = json.dumps(new.to_json(), separators=(",", ":")).encode()
        try:
            if revision == 0:
                await self._kv.create(key, data)
            else:
                await self._kv.update(key, data, last=revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def update(self, key: str, fn: Callable[[History], tuple[History, T]]) -> T:
        """Apply ``fn`` to the current history and store its result by CAS, retrying on a lost race.

        ``fn`` must be pure: it may run several times. Its second result is returned from the winning run.
        """
        for _attempt in range(self._max_attempts):
            history, revision = await self.get(key)
            new, result = fn(history)
            if new == history or await self.compare_and_set(key, new, revision):
                return result
        raise StateConflict(f"{key}: compare-and-set lost {self._max_attempts} times in a row")

    async def close_incident(self, key: str, group: str) -> None:
        """Forget the open incident of ``group``: its playbook has ended (done, failed or cancelled)."""
        await self.update(key, lambda h: (h.without_incident(group), None))
