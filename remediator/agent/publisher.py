"""The agent's connection to NATS and its publishing path: publish now, or spool and replay later.

Where it sits: the last stage of every agent watcher, and the transport of the command responder.
``BusLink`` keeps one nats-py connection (``remediator.bus.connect``): the agent starts and keeps working
while NATS is unreachable, retrying the first connection forever, after which nats-py reconnects on its
own. ``Publisher.submit`` publishes a batch to ``faults.agent.<node>`` with ``Nats-Msg-Id`` = event id when
the connection is up and the spool is empty, and otherwise appends it to the spool; ``Publisher.replay``
drains the spool in order once the connection is back. Order is kept: while anything is spooled, new
events go behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError

from remediator.agent.spool import Spool
from remediator.bus import Credentials, connect, publish_event
from remediator.contracts import FaultEvent

log = logging.getLogger(__name__)

OnConnect = Callable[[NATS], Awaitable[None]]

# Failures that mean "the bus is not there right now": spool and retry.
_UNAVAILABLE: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError, OSError)


class BusLink:
    """One NATS connection for the agent, established in the background and kept up."""

    def __init__(self, url: str, *, name: str, reconnect_wait_s: float = 0.5, connect_retry_s: float = 1.0,
                 connect_timeout_s: float = 2.0, credentials: Credentials | None = None) -> None:
        self.url = url
        self.credentials = credentials  # this node's agent identity (its .creds file); None: anonymous
        self.name = name
        self.reconnect_wait_s = reconnect_wait_s
        self.connect_retry_s = connect_retry_s
        self.connect_timeout_s = connect_timeout_s
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.changed = asyncio.Event()  # set whenever the connection comes (back) up
        self.up = asyncio.Event()
        self._on_connect: list[OnConnect] = []
        self._closing = False
        self.disconnects = 0

    def on_connect(self, callback: OnConnect) -> None:
        """Run ``callback(nc)`` once the first connection is made (subscriptions survive reconnects)."""
        self._on_connect.append(callback)

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def run(self) -> None:
        """Connect, retrying forever; then stay until cancelled."""
        logged = False
        while self.nc is None:
            try:
                nc, js = await connect(
                    self.url, name=self.name, credentials=self.credentials, reconnect_time_wait=self.reconnect_wait_s,
                    connect_timeout=self.connect_timeout_s, error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                    closed_cb=self._on_closed)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not logged:
                    log.warning("NATS at %s unreachable (%s); spooling events and retrying every %gs",
                                self.url, e, self.connect_retry_s)
                    logged = True
                await asyncio.sleep(self.connect_retry_s)
                continue
            self.nc, self.js = nc, js
            log.info("connected to NATS at %s", self.url)
            for callback in self._on_connect:
                await callback(nc)
            self.up.set()
            self.changed.set()
        await asyncio.Event().wait()

    async def _on_error(self, e: Exception) -> None:
        log.debug("nats: %s", e)

    async def _on_disconnected(self) -> None:
        self.up.clear()
        if self._closing:
            return
        self.disconnects += 1
        log.warning("disconnected from NATS; spooling events until it is back")

    async def _on_reconnected(self) -> None:
        log.info("reconnected to NATS")
        self.up.set()
        self.changed.set()

    async def _on_closed(self) -> None:
        self.up.clear()

    async def close(self) -> None:
        self._closing = True
        nc, self.nc = self.nc, None
        self.up.clear()
        if nc is None or nc.is_closed:
            return
        # Bounded, without waiting on cancellation: closing a client whose server is gone can wait on a
        # dead socket, and nats-py swallows some cancellations.
        if nc.is_connected:
            await _bounded(nc.drain(), 5.0, "draining the NATS connection")
        if not nc.is_closed:
            await _bounded(nc.close(), 5.0, "closing the NATS connection")


async def _bounded(coro: Coroutine[Any, Any, Any], seconds: float, what: str) -> None:
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        log.warning("%s did not finish within %gs", what, seconds)
        return
    if not task.cancelled() and task.exception() is not None:
        log.debug("%s: %r", what, task.exception())


class Publisher:
    """``EventSink`` over a ``BusLink`` and a ``Spool``."""

    def __init__(self, link: BusLink, spool: Spool, *, publish_timeout_s: float = 2.0,
                 replay_batch: int = 256, retry_s: float = 1.0) -> None:
        self.link = link
        self.spool = spool
        self.publish_timeout_s = publish_timeout_s
        self.replay_batch = replay_batch
        self.retry_s = retry_s
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.published = 0
        self.duplicates = 0
        self.rejected = 0
        self.spooled = 0
        self._last_pause = ""

    def stats(self) -> dict[str, int]:
        return {"published": self.published, "duplicates": self.duplicates, "rejected": self.rejected,
                "spooled": self.spooled, **{f"spool_{k}": v for k, v in self.spool.stats().items()}}

    async def submit(self, events: Sequence[FaultEvent]) -> None:
        """Publish ``events`` in order, or spool what could not be published; ``SpoolFull`` if neither."""
        if not events:
            return
        async with self._lock:
            if self.spool.pending or not self.link.connected:
                self._spool(events)
                return
            for i, event in enumerate(events):
                try:
                    await self._publish(event)
                except _UNAVAILABLE as e:
                    log.warning("publishing %s failed (%s); spooling it and %d later event(s)", event.id,
                                e or type(e).__name__, len(events) - i - 1)
                    self._spool(events[i:])
                    return

    def _spool(self, events: Sequence[FaultEvent]) -> None:
        self.spool.append(events)  # raises SpoolFull: the caller keeps the batch
        self.spooled += len(events)
        self._wake.set()

    async def _publish(self, event: FaultEvent) -> None:
        js = self.link.js
        if js is None or not self.link.connected:
            raise nats.errors.ConnectionClosedError
        try:
            ack = await publish_event(js, event, timeout=self.publish_timeout_s)
        except APIError as e:
            if e.code is not None and 400 <= e.code < 500 and e.code not in (404, 408, 429):
                # the server refuses this message for good (e.g. too large): retrying cannot help
                self.rejected += 1
                log.error("JetStream refused event %s for good (%s); dropping it", event.id, e)
                return
            raise
        if ack.duplicate:
            self.duplicates += 1
        else:
            self.published += 1

    async def replay(self) -> None:
        """Forever: when connected and the spool holds events, publish them oldest first."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.retry_s)
            self._wake.clear()
            if self.link.changed.is_set():
                self.link.changed.clear()
            while self.spool.pending and self.link.connected:
                if not await self._replay_batch():
                    break

    async def _replay_batch(self) -> bool:
        async with self._lock:
            batch = self.spool.peek(self.replay_batch)
            done, offset = 0, 0
            try:
                for event, end in batch:
                    await self._publish(event)
                    done, offset = done + 1, end
            except _UNAVAILABLE as e:
                reason = str(e) or type(e).__name__
                if reason != self._last_pause:  # once per reason, not once a second
                    log.warning("spool replay paused (%d waiting): %s", self.spool.pending - done, reason)
                    self._last_pause = reason
                return False
            finally:
                if done:
                    self.spool.advance(offset, count=done)
            if done and not self.spool.pending:
                log.info("spool replayed; publishing directly again")
                self._last_pause = ""
            return bool(batch)
