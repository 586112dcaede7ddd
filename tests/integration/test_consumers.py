"""The faststream consumers against a real nats-server: nak and redelivery, dead-lettering on the last
delivery, per-node order inside a batch, the executor's concurrency bound, and binding without creating.

The entry points' work is replaced by recorders; what is under test is the path from the durable consumer
through faststream's pull subscriber to ``on_message`` and ``bus.settle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

import handlers  # noqa: F401 - registers the handler families
from handlers import default_registry
from playbooks.catalog import PlaybookCatalog
from remediator import bus
from remediator.audit import AuditLog, iter_records
from remediator.consumers import MissingConsumer
from remediator.contracts import Decision, FaultEvent
from remediator.dispatch import Dispatcher
from remediator.executor import Executor
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.subjects import FAULTS_STREAM, REMEDIATIONS_STREAM, remediation_subject

T0 = datetime(2026, 3, 1, 3, 12, tzinfo=UTC)


def event(node: str, eid: str) -> FaultEvent:
    return FaultEvent(id=eid, source="agent", node=node, kind="xid", code=79, observed_at=T0, received_at=T0,
                      message="NVRM: Xid (PCI:0000:10:00): 79, ...")


def decision(node: str, incident: str) -> Decision:
    return Decision(incident_id=incident, handler="xid", playbook="gpu-lost", node=node, group="xid:0",
                    reason="Xid 79", event_id=f"ev-{incident}", kind="xid", code=79, decided_at=T0)


@contextlib.asynccontextmanager
async def bus_of(server: EmbeddedNats, **overrides: Any) -> AsyncIterator[tuple[NATS, JetStreamContext, Settings]]:
    settings = Settings(nats_url=server.url, **overrides)
    nc, js = await bus.connect(server.url)
    await bus.provision(js, settings)
    try:
        yield nc, js, settings
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def running(runner: Any) -> AsyncIterator[None]:
    """``runner.run(stop)`` in a task for the block; stopped (and awaited) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def spy_deliveries(runner: Any) -> list[int]:
    """Wrap ``runner.on_message`` to record each delivery's ``num_delivered`` before it runs."""
    seen: list[int] = []
    real = runner.on_message

    async def on_message(msg: Msg) -> None:
        seen.append(msg.metadata.num_delivered)
        await real(msg)

    runner.on_message = on_message
    return seen


async def until(check: Any, timeout: float = 20.0) -> None:  # noqa: ASYNC109 - a test helper's deadline
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_failing_dispatch_is_nakked_redelivered_then_dead_lettered(nats_server: EmbeddedNats) -> None:
    async with bus_of(nats_server, max_deliver=3, nak_delay_s=0.1) as (nc, js, settings):
        d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test"), registry=default_registry())

        async def handle(ev: FaultEvent, trace_id: str | None = None, traceparent: str | None = None) -> list[Any]:
            raise RuntimeError("handler bug")

        d.handle = handle  # type: ignore[method-assign]
        deliveries = spy_deliveries(d)
        dead = await nc.subscribe("deadletter.>")
        await bus.publish_event(js, event("gpu-node-7", "e-fails"))
        async with running(d):
            msg = await dead.next_msg(timeout=20)
        assert deliveries == [1, 2, 3]  # nakked twice (not terminated on the first exception), then the last
        assert msg.subject == "deadletter.faults.gpu-node-7"
        assert msg.headers is not None
        assert msg.headers[bus.DEAD_LETTER_REASON_HEADER] == "unexpected error on delivery 3/3: handler bug"
        assert bus.INCIDENT_HEADER not in msg.headers  # an event that failed before any decision has none
        assert d.stats.dead_lettered == 1
        info = await js.consumer_info(FAULTS_STREAM, bus.DISPATCH_CONSUMER)
        assert (info.num_ack_pending, info.num_pending) == (0, 0)  # terminated after the copy, nothing left
        assert [r.what async for r in iter_records(js, "gpu-node-7")] == ["dead_letter"]


async def test_a_temporary_executor_error_waits_its_delay_then_dead_letters(nats_server: EmbeddedNats) -> None:
    async with bus_of(nats_server, max_deliver=2, nak_delay_s=0.1) as (nc, js, settings):
        ex = Executor(nc, js, settings, None, AuditLog(js, "test"), PlaybookCatalog.load(), None)  # type: ignore[arg-type]
        at: list[float] = []

        async def execute(d: Decision, msg: Msg | None = None) -> Any:
            at.append(time.monotonic())
            raise bus.TemporaryError("node lock held elsewhere", delay=0.5)

        ex.execute = execute  # type: ignore[method-assign]
        deliveries = spy_deliveries(ex)
        dead = await nc.subscribe("deadletter.>")
        d = decision("gpu-node-8", "inc-temp")
        await js.publish(remediation_subject(d.node), d.model_dump_json().encode())
        try:
            async with running(ex):
                msg = await dead.next_msg(timeout=20)
        finally:
            ex.close()
        assert deliveries == [1, 2]
        assert at[1] - at[0] >= 0.45  # the TemporaryError's own delay, not the consumer's 0.1 s
        assert msg.subject == "deadletter.remediations.gpu-node-8"
        assert msg.headers is not None and msg.headers[bus.INCIDENT_HEADER] == "inc-temp"  # whose run it ended
        assert (await js.stream_info(REMEDIATIONS_STREAM)).state.messages == 0  # work queue: terminated


async def test_one_nodes_faults_run_in_order_while_nodes_run_together(nats_server: EmbeddedNats) -> None:
    async with bus_of(nats_server) as (nc, js, settings):
        d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test"), registry=default_registry())
        rng = random.Random(11)
        ran: list[tuple[str, str]] = []
        busy: set[str] = set()
        overlap = 0

        async def handle(ev: FaultEvent, trace_id: str | None = None, traceparent: str | None = None) -> list[Any]:
            nonlocal overlap
            assert ev.node not in busy
            busy.add(ev.node)
            overlap = max(overlap, len(busy))
            await asyncio.sleep(rng.random() / 50)  # later messages of a node would overtake without the lock
            ran.append((ev.node, ev.id))
            busy.discard(ev.node)
            return []

        d.handle = handle  # type: ignore[method-assign]
        published = [(f"gpu-node-{rng.randrange(5)}", f"e{i:03d}") for i in range(80)]
        for node, eid in published:  # all stored before the subscriber starts: they arrive in one or two batches
            await bus.publish_event(js, event(node, eid))
        async with running(d):
            await until(lambda: len(ran) == len(published))
        for node in {n for n, _ in published}:
            assert [e for n, e in ran if n == node] == [e for n, e in published if n == node], node
        assert overlap > 1
        info = await js.consumer_info(FAULTS_STREAM, bus.DISPATCH_CONSUMER)
        assert (info.num_ack_pending, info.num_redelivered) == (0, 0)


async def test_the_executor_runs_at_most_its_concurrency(nats_server: EmbeddedNats) -> None:
    async with bus_of(nats_server, executor_concurrency=2) as (nc, js, settings):
        ex = Executor(nc, js, settings, None, AuditLog(js, "test"), PlaybookCatalog.load(), None)  # type: ignore[arg-type]
        done: list[str] = []
        now = 0
        most = 0

        async def execute(d: Decision, msg: Msg | None = None) -> Any:
            nonlocal now, most
            now += 1
            most = max(most, now)
            await asyncio.sleep(0.2)
            now -= 1
            done.append(d.node)

        ex.execute = execute  # type: ignore[method-assign]
        for i in range(6):
            d = decision(f"gpu-node-{i}", f"inc-{i}")
            await js.publish(remediation_subject(d.node), d.model_dump_json().encode())
        try:
            async with running(ex):
                await until(lambda: len(done) == 6)
        finally:
            ex.close()  # after the runner stopped, which waits for running handlers to settle
        assert most == 2
        assert sorted(done) == [f"gpu-node-{i}" for i in range(6)]
        assert (await js.stream_info(REMEDIATIONS_STREAM)).state.messages == 0  # all acked (work queue)


async def test_a_missing_durable_is_reported_not_created(nats_server: EmbeddedNats) -> None:
    async with bus_of(nats_server) as (nc, js, settings):
        await js.delete_consumer(FAULTS_STREAM, bus.DISPATCH_CONSUMER)
        d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test"), registry=default_registry())
        with pytest.raises(MissingConsumer, match=r"FAULTS/dispatch .*remediator bus init"):
            await d.run(asyncio.Event())
        with pytest.raises(NotFoundError):
            await js.consumer_info(FAULTS_STREAM, bus.DISPATCH_CONSUMER)
