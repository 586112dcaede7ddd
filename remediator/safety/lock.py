"""The node lock: one running playbook per node across replicas (KV ``remediator-locks``, ``node.<node>``).

Where it sits: in ``remediator.safety``, the first rail the executor passes for a decision and the one it
holds until the run ends. ``take`` creates the key if absent (waiting up to a bound while another run
holds it); the ``Lease`` it returns is renewed by ``keep`` (the bucket's TTL expires a lease whose replica
died, so a redelivery elsewhere can resume the run) and deleted by ``release`` on the revision it last
wrote, so a lease that was taken over is never released by its old holder. A refusal is ``LockHeld``,
naming the holder; the executor turns it into an audited ``lock`` guard verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import nats.errors
from nats.js.kv import KeyValue

from remediator.errors import TemporaryError
from remediator.kv import LostRace, json_documents
from remediator.subjects import node_key

log = logging.getLogger(__name__)

__all__ = ["Lease", "LockHeld", "LockLost", "NodeLocks"]

Heartbeat = Callable[[], Awaitable[None]]


class LockHeld(TemporaryError):
    """Another run holds the node lock; ``holder`` names it (``<replica>|<incident>|<nonce>``)."""

    def __init__(self, message: str, *, holder: str, delay: float | None = None) -> None:
        super().__init__(message, delay=delay)
        self.holder = holder


class LockLost(TemporaryError):
    """The node lock expired or was taken while the run was going on: stop and let redelivery resume."""


@dataclass
class Lease:
    """A held node lock: who holds it and the revision it was last written at."""

    node: str
    owner: str
    incident: str
    revision: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> str:
        return node_key(self.node)


class NodeLocks:
    """The locks bucket. ``clock`` stamps each lease with the time it was written."""

    def __init__(self, kv: KeyValue, clock: Callable[[], datetime]) -> None:
        self._docs = json_documents(kv)
        self._clock = clock

    def _body(self, owner: str, incident: str) -> dict[str, Any]:
        return {"owner": owner, "incident": incident, "at": self._clock().isoformat()}

    async def try_take(self, node: str, owner: str, incident: str) -> Lease | str:
        """The lease when ``node`` was free, else who holds it ("?" when unknown)."""
        try:
            rev = await self._docs.put(node_key(node), self._body(owner, incident), 0)
        except LostRace:
            held = await self._docs.get(node_key(node), fresh=True)  # the leader: a replica may lag the holder
            if held.revision == 0:  # released in between: free again
                return await self.try_take(node, owner, incident)
            return str((held.value or {}).get("owner", "?"))
        return Lease(node, owner, incident, rev)

    async def take(self, node: str, owner: str, incident: str, *, wait_s: float, retry_s: float,
                   heartbeat: Heartbeat | None = None, poll_s: float = 0.5) -> Lease:
        """Take ``node``'s lock, polling every ``poll_s`` for up to ``wait_s`` while another run holds it
        (``heartbeat`` between polls keeps the caller's message in progress); raises ``LockHeld`` (retry
        after ``retry_s``) when it is still held."""
        waited = 0.0
        while True:
            got = await self.try_take(node, owner, incident)
            if isinstance(got, Lease):
                return got
            if waited >= wait_s:
                raise LockHeld(f"{node} is locked by {got}", holder=got, delay=retry_s)
            if heartbeat is not None:
                await heartbeat()
            await asyncio.sleep(poll_s)
            waited += poll_s

    async def renew(self, lease: Lease) -> bool:
        """Write the lease again on its revision (restarting the bucket's TTL); False, and ``lease.lost`` set,
        when it was taken over or expired."""
        try:
            lease.revision = await self._docs.put(lease.key, self._body(lease.owner, lease.incident), lease.revision)
        except LostRace:
            lease.lost.set()
            return False
        return True

    async def keep(self, lease: Lease, every_s: float, heartbeat: Heartbeat | None = None) -> None:
        """Renew ``lease`` every ``every_s`` until cancelled or lost; a bus hiccup is retried on the next
        beat."""
        while True:
            await asyncio.sleep(every_s)
            try:
                if not await self.renew(lease):
                    return
            except nats.errors.Error as e:
                log.warning("renewing the lock of %s failed: %s", lease.node, e)
            if heartbeat is not None:
                await heartbeat()

    async def release(self, lease: Lease) -> None:
        """Delete the lease if it is still ours; nothing when it moved on or the bus is gone (the TTL
        expires it)."""
        with contextlib.suppress(nats.errors.Error):
            await self._docs.delete(lease.key, lease.revision)
