"""Routing of the two consumers on faststream's in-memory broker (``TestNatsBroker``).

What each subscriber binds (stream, subjects, durable, pull and ack settings), which per-message entry point
a delivery reaches, and that faststream itself settles nothing. Ack, nak delays, redelivery and dead-lettering
are not emulated in memory; tests/integration/test_consumers.py runs them against a real nats-server.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest
from faststream import AckPolicy
from faststream.nats import NatsBroker, TestNatsBroker
from faststream.nats.subscriber.usecases import ConcurrentPullStreamSubscriber, PullStreamSubscriber
from faststream.nats.testing import PatchedMessage
from nats.aio.msg import Msg

from handlers import default_registry
from playbooks.catalog import PlaybookCatalog
from remediator import consumers
from remediator.contracts import Decision, FaultEvent
from remediator.dispatch import Dispatcher
from remediator.executor import Executor
from remediator.run import RunResult
from remediator.settings import Settings

T0 = datetime(2026, 3, 1, 3, 12, tzinfo=UTC)
EVENT = FaultEvent(id="agent|gpu-node-1|boot|1", source="agent", node="gpu-node-1", kind="xid", code=79,
                   observed_at=T0, received_at=T0, message="NVRM: Xid (PCI:0000:10:00): 79, ...")
DECISION = Decision(incident_id="inc-1", handler="xid", playbook="gpu-lost", node="gpu-node-1", group="xid:0",
                    reason="Xid 79", event_id=EVENT.id, kind="xid", code=79, decided_at=T0)


@dataclass
class Recorder:
    """A ``MessageConsumer`` that only records what reached it (and settles nothing)."""

    seen: list[Msg] = field(default_factory=list)
    fail: bool = False

    async def on_message(self, msg: Msg) -> None:
        self.seen.append(msg)
        if self.fail:
            raise RuntimeError("handler failed")


@dataclass
class Wired:
    broker: NatsBroker
    dispatch: Recorder
    execute: Recorder
    dispatch_sub: Any
    execute_sub: Any


def wire(concurrency: int = 4) -> Wired:
    broker = consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    d, x = Recorder(), Recorder()
    dsub = consumers.declare_dispatch(broker, d)
    xsub = consumers.declare_executor(broker, x, concurrency=concurrency)
    return Wired(broker, d, x, dsub, xsub)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """(verb, subject) of every ack/nak/term on the in-memory messages."""
    calls: list[tuple[str, str]] = []

    def recorder(verb: str) -> Any:
        async def settle(self: Msg, *args: Any, **kwargs: Any) -> None:
            calls.append((verb, self.subject))
        return settle

    for verb in ("ack", "nak", "term", "in_progress"):
        monkeypatch.setattr(PatchedMessage, verb, recorder(verb))
    yield calls


# --- what is declared ------------------------------------------------------------------------------


def test_dispatch_binds_the_provisioned_durable_on_faults_with_manual_ack() -> None:
    sub = wire().dispatch_sub
    assert isinstance(sub, PullStreamSubscriber) and not isinstance(sub, ConcurrentPullStreamSubscriber)
    assert (sub.stream.name, sub.stream.declare) == ("FAULTS", False)
    assert sub.subject.template == "faults.>"
    assert sub.extra_options["durable"] == "dispatch" and sub.extra_options["stream"] == "FAULTS"
    assert (sub.pull_sub.batch_size, sub.pull_sub.timeout, sub.pull_sub.batch) == (128, 0.5, False)
    assert sub.ack_policy is AckPolicy.MANUAL


def test_executor_binds_the_provisioned_durable_on_remediations_with_bounded_workers() -> None:
    sub = wire(concurrency=7).execute_sub
    assert isinstance(sub, ConcurrentPullStreamSubscriber)
    assert sub.max_workers == 7
    assert (sub.stream.name, sub.stream.declare) == ("REMEDIATIONS", False)
    assert sub.subject.template == "remediation.>"
    assert sub.extra_options["durable"] == "executor" and sub.extra_options["stream"] == "REMEDIATIONS"
    assert (sub.pull_sub.batch_size, sub.pull_sub.batch) == (1, False)
    assert sub.ack_policy is AckPolicy.MANUAL


def test_one_executor_worker_is_a_plain_sequential_pull() -> None:
    sub = wire(concurrency=1).execute_sub
    assert isinstance(sub, PullStreamSubscriber) and not isinstance(sub, ConcurrentPullStreamSubscriber)


# --- where a delivery goes -------------------------------------------------------------------------


@pytest.mark.parametrize(("subject", "stream", "reaches"), [
    ("faults.agent.gpu-node-1", "FAULTS", "dispatch"),
    ("faults.alertmanager.gpu-node-2_example_com", "FAULTS", "dispatch"),
    ("remediation.gpu-node-1", "REMEDIATIONS", "execute"),
    ("faults.agent.gpu-node-1", "REMEDIATIONS", None),
    ("remediation.gpu-node-1", "FAULTS", None),
    ("audit.gpu-node-1", "AUDIT", None),
    ("deadletter.faults.gpu-node-1", "DEADLETTER", None),
], ids=["agent-fault", "alert-fault", "decision", "fault-wrong-stream", "decision-wrong-stream", "audit",
        "dead-letter"])
async def test_a_delivery_reaches_one_entry_point(settled: list[tuple[str, str]], subject: str, stream: str,
                                                  reaches: str | None) -> None:
    w = wire()
    body = b'{"not": "decoded by faststream"'  # malformed on purpose: the entry point parses, not faststream
    async with TestNatsBroker(w.broker) as br:
        await br.publish(body, subject, stream=stream, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16
                                                                + "-01"})
    got = {"dispatch": w.dispatch.seen, "execute": w.execute.seen}
    for name, seen in got.items():
        if name == reaches:
            [msg] = seen
            assert isinstance(msg, Msg)  # the raw delivery, not faststream's message
            assert (msg.subject, msg.data) == (subject, body)
            assert msg.headers and msg.headers["traceparent"].startswith("00-1111")
        else:
            assert seen == [], name
    assert settled == []  # AckPolicy.MANUAL: faststream acked, nakked and rejected nothing


async def test_a_raising_entry_point_is_not_rejected_by_faststream(settled: list[tuple[str, str]]) -> None:
    w = wire()
    w.dispatch.fail = True
    async with TestNatsBroker(w.broker) as br:
        with pytest.raises(RuntimeError, match="handler failed"):
            await br.publish(b"{}", "faults.agent.gpu-node-1", stream="FAULTS")
    assert len(w.dispatch.seen) == 1
    assert settled == []  # REJECT_ON_ERROR, the default, would have terminated it here


# --- the real entry points -------------------------------------------------------------------------


def _dispatcher(settings: Settings) -> tuple[Dispatcher, AsyncMock]:
    js = AsyncMock()
    return Dispatcher(AsyncMock(), js, AsyncMock(), settings, AsyncMock(), default_registry()), js


async def test_a_fault_runs_dispatcher_handle_then_acks(settled: list[tuple[str, str]]) -> None:
    d, _js = _dispatcher(Settings())
    handled: list[FaultEvent] = []

    async def handle(event: FaultEvent, trace_id: str | None = None, traceparent: str | None = None) -> list[Any]:
        handled.append(event)
        return []

    d.handle = handle  # type: ignore[method-assign]
    broker = consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    consumers.declare_dispatch(broker, d)
    async with TestNatsBroker(broker) as br:
        await br.publish(EVENT.model_dump_json().encode(), "faults.agent.gpu-node-1", stream="FAULTS")
    assert handled == [EVENT]
    assert settled == [("ack", "faults.agent.gpu-node-1")]


async def test_a_malformed_fault_goes_from_the_dispatcher_to_the_dead_letter(settled: list[tuple[str, str]]) -> None:
    d, js = _dispatcher(Settings())
    broker = consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    consumers.declare_dispatch(broker, d)
    async with TestNatsBroker(broker) as br:
        await br.publish(b'{"version": 1}', "faults.api.gpu-node-4", stream="FAULTS")
    assert js.publish.await_args is not None
    assert js.publish.await_args.args[0] == "deadletter.faults.gpu-node-4"
    assert settled == [("term", "faults.api.gpu-node-4")] and d.stats.dead_lettered == 1


async def test_a_decision_runs_executor_execute_then_acks(settled: list[tuple[str, str]]) -> None:
    ex = Executor(AsyncMock(), AsyncMock(), Settings(), AsyncMock(), AsyncMock(), PlaybookCatalog.load(),
                  AsyncMock())
    executed: list[tuple[Decision, str]] = []

    async def execute(decision: Decision, msg: Msg | None = None) -> None:
        assert msg is not None
        executed.append((decision, msg.subject))

    ex.execute = execute  # type: ignore[method-assign,assignment]
    broker = consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    consumers.declare_executor(broker, ex, concurrency=2)
    try:
        async with TestNatsBroker(broker) as br:
            await br.publish(DECISION.model_dump_json().encode(), "remediation.gpu-node-1", stream="REMEDIATIONS")
    finally:
        ex.close()
    assert executed == [(DECISION, "remediation.gpu-node-1")]
    assert settled == [("ack", "remediation.gpu-node-1")]


# --- per-node order --------------------------------------------------------------------------------


async def test_node_order_runs_one_node_in_arrival_order_and_nodes_together() -> None:
    order = consumers.NodeOrder()
    rng = random.Random(7)
    ran: list[tuple[str, int]] = []
    running: set[str] = set()
    overlap = 0

    async def work(node: str, i: int) -> None:
        nonlocal overlap
        async with order.hold(node):
            assert node not in running  # one at a time per node
            running.add(node)
            overlap = max(overlap, len(running))
            await asyncio.sleep(rng.random() / 200)
            ran.append((node, i))
            running.discard(node)

    arrivals = [(f"gpu-node-{rng.randrange(4)}", i) for i in range(60)]
    await asyncio.gather(*(work(n, i) for n, i in arrivals))
    for node in {n for n, _ in arrivals}:
        assert [i for n, i in ran if n == node] == [i for n, i in arrivals if n == node]
    assert overlap > 1  # different nodes ran at the same time
    assert len(order) == 0  # no lock is kept for a node nobody waits on


async def test_dispatch_hands_over_one_nodes_deliveries_in_fetch_order() -> None:
    """faststream's pull loop starts one ``consume`` task per fetched message, in fetch order; nothing before
    the handler's node lock may suspend (a thread hop, I/O), or one node's messages overtake each other."""
    rng = random.Random(3)
    entered: list[bytes] = []

    class Slow:
        async def on_message(self, msg: Msg) -> None:
            entered.append(msg.data)
            await asyncio.sleep(rng.random() / 500)  # later messages of the node must wait, not overtake

    broker = consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    sub = consumers.declare_dispatch(broker, Slow())
    fetched = [Msg(None, subject=f"faults.agent.gpu-node-{rng.randrange(3)}",  # type: ignore[arg-type]
                   data=str(i).encode(), headers={}) for i in range(300)]
    async with TestNatsBroker(broker):
        await asyncio.gather(*(sub.consume(m) for m in fetched))  # what the pull loop does with a batch
    for node in {m.subject for m in fetched}:
        by_node = [m.data for m in fetched if m.subject == node]
        assert [d for d in entered if d in set(by_node)] == by_node, node


@pytest.mark.parametrize(("subject", "token"), [
    ("faults.agent.gpu-node-1", "gpu-node-1"),
    ("faults.alertmanager.gpu-node-2_example_com", "gpu-node-2_example_com"),
    ("remediation.gpu-node-3", "gpu-node-3"),
], ids=["agent", "dotted-node", "remediation"])
def test_the_node_is_the_last_subject_token(subject: str, token: str) -> None:
    assert consumers.node_token_of(subject) == token



async def test_an_idle_fetch_times_out_as_the_nats_error_faststream_expects() -> None:
    """faststream's pull loop retries on ``nats.errors.TimeoutError`` only; nats-py can raise the built-in one."""
    import nats.errors
    from nats.js.client import JetStreamContext

    from remediator.consumers import translate_fetch_timeouts

    async def idle(self: object, *args: object) -> list[object]:
        raise TimeoutError

    async def nats_idle(self: object, *args: object) -> list[object]:
        raise nats.errors.TimeoutError

    async def some(self: object, *args: object) -> list[object]:
        return ["m"]

    with pytest.raises(nats.errors.TimeoutError):
        await translate_fetch_timeouts(idle)(None, 1, 0.1)
    with pytest.raises(nats.errors.TimeoutError):
        await translate_fetch_timeouts(nats_idle)(None, 1, 0.1)
    assert await translate_fetch_timeouts(some)(None, 1, 0.1) == ["m"]
    consumers.consumer_broker("nats://127.0.0.1:4222", name="routing-test")
    assert getattr(JetStreamContext.PullSubscription.fetch, "_remediator_translated", False)
    translated = JetStreamContext.PullSubscription.fetch
    consumers.install_fetch_timeout_translation()
    assert JetStreamContext.PullSubscription.fetch is translated  # idempotent: never wrapped twice


def test_the_fetch_patch_happens_where_the_consumer_is_built_not_at_import() -> None:
    """Old main patched nats-py when ``remediator.consumers`` was imported (any importer, e.g. a CLI verb)."""
    import subprocess
    import sys

    code = ("import nats.js.client as c; import remediator.consumers as rc; "
            "f = c.JetStreamContext.PullSubscription.fetch; "
            "assert not getattr(f, '_remediator_translated', False), 'patched at import'; "
            "rc.consumer_broker('nats://127.0.0.1:4222', name='t'); "
            "assert c.JetStreamContext.PullSubscription.fetch._remediator_translated")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_executor_keeps_a_bounded_window_of_recent_results_and_counts_them_all() -> None:
    """A replica that runs for months does not grow with every run it finished."""
    ex = Executor(AsyncMock(), AsyncMock(), Settings(), AsyncMock(), MagicMock(), PlaybookCatalog.load(),
                  AsyncMock(), keep_results=3)

    async def run(d: Decision, msg: Msg | None, audit: object) -> RunResult:
        return RunResult(d.incident_id, d.node, d.playbook, "completed")

    ex._execute = run  # type: ignore[method-assign,assignment]
    for i in range(5):
        await ex.execute(DECISION.model_copy(update={"incident_id": f"inc-{i}"}))
    assert [r.incident for r in ex.results] == ["inc-2", "inc-3", "inc-4"] and ex.finished == 5
