"""Service replicas that can die like a process: the service under test, as a drill's world runs it.

Where it sits: under ``chaos.world`` (which starts replicas on the world's bus) and ``chaos.actions``
(whose ``kill_service`` crashes one). A ``Replica`` is one ``remediator.service.Service`` with its own
Kubernetes API endpoint and, when the drill may crash it, its own TCP path to the bus (``TcpRelay``).
Every asyncio task started while a replica is being started is tagged with it, so ``crash`` can cancel
exactly that replica's tasks (its NATS client's included) without yielding to the event loop in between:
nothing it had buffered reaches the bus, its node locks are not released and its messages are not nakked.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from chaos.sim import KubeApiServer
from remediator.service import Service

_REPLICA: contextvars.ContextVar[Replica | None] = contextvars.ContextVar("chaos_replica", default=None)


def install_task_tags(loop: asyncio.AbstractEventLoop) -> Any:
    """Make every task remember the replica it was started for (the context variable ``_REPLICA`` at the
    time it was created), so that ``crash`` can cancel exactly that replica's tasks, its NATS
    client's included. Returns the previous factory, which ``restore_task_tags`` puts back."""
    previous = loop.get_task_factory()

    def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = (previous(lp, coro, **kwargs) if previous is not None
                                     else asyncio.Task(coro, loop=lp, **kwargs))
        ctx = kwargs.get("context")
        replica = ctx.get(_REPLICA) if ctx is not None else _REPLICA.get()
        if replica is not None and isinstance(task, asyncio.Task):
            replica.tasks.add(task)
        return task

    loop.set_task_factory(factory)
    return previous


def restore_task_tags(loop: asyncio.AbstractEventLoop, previous: Any) -> None:
    """Put back the task factory ``install_task_tags`` replaced."""
    loop.set_task_factory(previous)


@contextlib.contextmanager
def starting(replica: Replica) -> Iterator[None]:
    """Tag every task created inside this block (and the tasks those create) as ``replica``'s."""
    token = _REPLICA.set(replica)
    try:
        yield
    finally:
        _REPLICA.reset(token)


class TcpRelay:
    """A TCP relay from a loopback port to ``host:port`` (the replica's way to the bus).

    ``cut()`` drops every relayed connection at once and refuses new ones, as the network does when the
    process on one end dies: nothing the replica still had buffered reaches the server.
    """

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:  # the server is down (nats_restart): the client sees a dropped connection
            writer.transport.abort()
            return
        if self._cut:  # cut while connecting
            writer.transport.abort()
            up_writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._writers |= pair
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for w in pair:
                w.transport.abort()
                self._writers.discard(w)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()  # one side gone: so is the other

    def cut(self) -> None:
        """Synchronously: stop accepting, and reset every relayed connection."""
        self._cut = True
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            await self._server.wait_closed()


@dataclass
class Replica:
    """One service replica with its own Kubernetes API endpoint and, when crashable, its own path to NATS."""

    index: int
    service: Service
    kube: KubeApiServer
    relay: TcpRelay | None = None
    tasks: weakref.WeakSet[asyncio.Task[Any]] = field(default_factory=weakref.WeakSet)
    alive: bool = True

    @property
    def actor(self) -> str:
        return self.service.settings.replica_id



async def crash(replica: Replica) -> None:
    """The replica's process dies mid-flight.

    Without yielding to the event loop (so none of its coroutines runs in between): its Kubernetes API
    endpoint goes away, its connections to NATS are reset, its HTTP listener closes. Then every task it
    started is cancelled — no graceful drain: nothing it buffered reaches the bus, its node locks are not
    released and its messages are not nakked, so recovery takes what it takes after a real crash (the lock
    TTL, the consumer's ack wait).
    """
    if replica.relay is None:
        raise RuntimeError("a replica can only crash in a crashable world (environment(crashable=True))")
    replica.kube.stop()
    replica.relay.cut()
    http = getattr(replica.service, "_http", None)  # a process that dies closes its listening sockets
    for srv in getattr(http, "servers", None) or []:
        srv.close()
    replica.alive = False
    for _ in range(20):
        live = [t for t in list(replica.tasks) if not t.done()]
        if not live:
            break
        for t in live:
            t.cancel()
        await asyncio.wait(live, timeout=0.5)
    if replica.service.kube is not None:  # its Kubernetes worker threads die with it
        replica.service.kube.close()


async def stop(replica: Replica) -> None:
    """Stop a replica gracefully (if still alive) and release its endpoint and relay."""
    if replica.alive:
        replica.alive = False
        await replica.service.stop()
        if replica.service.executor is not None:
            replica.service.executor.close()
    replica.kube.stop()
    if replica.relay is not None:
        await replica.relay.close()
