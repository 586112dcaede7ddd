"""The bus against a real nats-server: provisioning, publishing with dedup, and settle's ack/nak/term."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NoStreamResponseError

from remediator import bus, subjects
from remediator.contracts import FaultEvent, GpuRef
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2024, 5, 1, 3, 12, tzinfo=UTC)


def event(n: int = 0, node: str = "gpu-node-1") -> FaultEvent:
    return FaultEvent(id=f"agent|{node}|boot|{n}", source="agent", node=node, gpu=GpuRef(index=0), kind="xid",
                      code=79, is_fatal=True, observed_at=T0, received_at=T0)


@pytest.fixture
def settings() -> Settings:
    return Settings(max_deliver=3, nak_delay_s=0.2, duplicate_window_s=1200, lock_ttl_s=30,
                    audit_max_age_days=90)


@pytest.fixture
async def conn(nats_server: EmbeddedNats) -> AsyncIterator[tuple[bus.NATS, bus.JetStreamContext]]:
    nc, js = await bus.connect(nats_server.url, name="test-bus")
    yield nc, js
    await nc.close()


async def test_provision_is_idempotent_and_declares_section_4(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    first = await bus.provision(js, settings)
    assert len(first) == 9 and all(line.startswith("created") for line in first)  # 5 streams, 2 buckets, 2 consumers
    assert await bus.provision(js, settings) == []  # the second run changes nothing

    faults = (await js.stream_info(subjects.FAULTS_STREAM)).config
    assert faults.subjects == [subjects.FAULTS_WILDCARD]
    assert faults.storage == api.StorageType.FILE
    assert faults.duplicate_window is not None and faults.duplicate_window >= 600
    rem = (await js.stream_info(subjects.REMEDIATIONS_STREAM)).config
    assert rem.retention == api.RetentionPolicy.WORK_QUEUE and rem.duplicate_window == 1200
    audit = (await js.stream_info(subjects.AUDIT_STREAM)).config
    assert audit.retention == api.RetentionPolicy.LIMITS and audit.max_age == 90 * 86_400
    assert audit.allow_direct  # the appenders read chain heads by direct get (remediator.audit)
    dl = (await js.stream_info(subjects.DEAD_LETTER_STREAM)).config
    assert dl.subjects == [subjects.DEAD_LETTER_WILDCARD]

    state = await js.key_value(subjects.STATE_BUCKET)
    assert (await state.status()).history == 5
    locks = await js.key_value(subjects.LOCKS_BUCKET)
    assert (await locks.status()).ttl == 30

    for stream, name, ack_wait in ((subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER, 60),
                                   (subjects.REMEDIATIONS_STREAM, bus.EXECUTOR_CONSUMER, 60)):
        c = (await js.consumer_info(stream, name)).config
        assert c.durable_name == name
        assert c.ack_policy == api.AckPolicy.EXPLICIT
        assert c.max_deliver == settings.max_deliver
        assert c.ack_wait == ack_wait
        assert c.max_ack_pending is not None and 0 < c.max_ack_pending <= 1024


async def test_provision_updates_a_stream_that_drifted(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await js.add_stream(name=subjects.FAULTS_STREAM, subjects=[subjects.FAULTS_WILDCARD],
                        storage=api.StorageType.FILE, duplicate_window=120)
    done = await bus.provision(js, settings)
    assert any(line.startswith("updated stream FAULTS") and "duplicate_window 120s -> 1200s" in line
               for line in done), done
    assert (await js.stream_info(subjects.FAULTS_STREAM)).config.duplicate_window == 1200
    # a consumer an operator tuned is kept and its drift reported; --reset-consumers applies the declaration
    await js.add_consumer(subjects.FAULTS_STREAM, durable_name=bus.DISPATCH_CONSUMER,
                          ack_policy=api.AckPolicy.EXPLICIT, max_deliver=9, ack_wait=30,
                          max_ack_pending=256, deliver_policy=api.DeliverPolicy.ALL)
    (drift,) = await bus.provision(js, settings)
    assert drift.startswith("drift: consumer FAULTS/dispatch kept") and "ack_wait 30s -> 60s" in drift, drift
    assert (await js.consumer_info(subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER)).config.ack_wait == 30
    done = await bus.provision(js, settings, reset_consumers=True)
    assert done == [f"updated consumer FAULTS/dispatch: ack_wait 30s -> 60s; max_deliver 9 -> {settings.max_deliver}"]
    # and a lock bucket whose TTL drifted from settings.lock_ttl_s
    locks = settings.model_copy(update={"lock_ttl_s": 90})
    (line,) = await bus.provision(js, locks)
    assert line == "updated KV bucket remediator-locks: max_age 30s -> 90s"
    assert (await (await js.key_value(subjects.LOCKS_BUCKET)).status()).ttl == 90


async def test_provision_allows_direct_gets_on_an_audit_stream_declared_without_them(conn: tuple,
                                                                                     settings: Settings) -> None:
    _nc, js = conn
    await js.add_stream(name=subjects.AUDIT_STREAM, subjects=[subjects.AUDIT_WILDCARD], storage=api.StorageType.FILE,
                        duplicate_window=1200, max_age=90 * 86_400, max_bytes=settings.audit_max_bytes)
    done = await bus.provision(js, settings)
    assert any(line.startswith("updated stream AUDIT") and "allow_direct False -> True" in line for line in done), done
    assert (await js.stream_info(subjects.AUDIT_STREAM)).config.allow_direct


async def test_publish_event_dedups_on_event_id_and_carries_traceparent(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    first = await bus.publish_event(js, event(1), traceparent=tp)
    again = await bus.publish_event(js, event(1))
    assert not first.duplicate and again.duplicate and again.seq == first.seq
    stored = await js.get_msg(subjects.FAULTS_STREAM, first.seq)
    assert stored.subject == "faults.agent.gpu-node-1"
    assert stored.headers is not None
    assert stored.headers["Nats-Msg-Id"] == event(1).id and stored.headers["traceparent"] == tp
    assert FaultEvent.model_validate_json(stored.data or b"") == event(1)
    assert (await js.stream_info(subjects.FAULTS_STREAM)).state.messages == 1


async def test_publish_to_a_dotted_node_uses_the_token_form(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    ack = await bus.publish_event(js, event(2, node="gpu-7.rack-3.example"))
    assert (await js.get_msg(subjects.FAULTS_STREAM, ack.seq)).subject == "faults.agent.gpu-7_rack-3_example"


async def _pull_one(js: bus.JetStreamContext, wait: float = 5.0) -> Msg:
    psub = await js.pull_subscribe_bind(bus.DISPATCH_CONSUMER, stream=subjects.FAULTS_STREAM)
    try:
        (msg,) = await psub.fetch(1, timeout=wait)
    finally:
        await psub.unsubscribe()
    return msg


async def _dead_letters(js: bus.JetStreamContext) -> list[Msg]:
    info = await js.stream_info(subjects.DEAD_LETTER_STREAM)
    return [await js.get_msg(subjects.DEAD_LETTER_STREAM, seq)  # type: ignore[misc]
            for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages]


async def test_settle_acks_naks_with_delay_then_dead_letters_on_the_last_delivery(
        conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    await bus.publish_event(js, event(3))
    dead_letter = bus.dead_letter_publisher(js)

    msg = await _pull_one(js)
    assert msg.metadata.num_delivered == 1
    t = time.monotonic()
    assert await bus.settle(msg, bus.TemporaryError("kube 503", delay=0.5), max_deliver=3, nak_delay=0.1,
                            dead_letter=dead_letter) == "nak"
    msg = await _pull_one(js)
    assert msg.metadata.num_delivered == 2
    assert time.monotonic() - t >= 0.45  # the TemporaryError's own delay, not the default 0.1 s

    t = time.monotonic()
    assert await bus.settle(msg, RuntimeError("bug"), max_deliver=3, nak_delay=0.3,
                            dead_letter=dead_letter) == "nak"
    msg = await _pull_one(js)
    assert msg.metadata.num_delivered == 3
    assert time.monotonic() - t >= 0.25  # unexpected errors take the configured delay

    assert await bus.settle(msg, bus.TemporaryError("still 503"), max_deliver=3, nak_delay=0.1,
                            dead_letter=dead_letter) == "term"
    (dead,) = await _dead_letters(js)
    assert dead.subject == "deadletter.faults.gpu-node-1"
    assert dead.headers is not None
    assert "temporary error on delivery 3/3: still 503" in dead.headers[bus.DEAD_LETTER_REASON_HEADER]
    assert dead.headers[bus.ORIGINAL_SUBJECT_HEADER] == "faults.agent.gpu-node-1"
    assert FaultEvent.model_validate_json(dead.data or b"") == event(3)
    # terminated: the consumer has nothing left to deliver
    with pytest.raises(TimeoutError):
        await _pull_one(js, wait=0.8)


async def test_settle_permanent_error_dead_letters_at_once_and_success_acks(
        conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    await bus.publish_event(js, event(4))
    await bus.publish_event(js, event(5))
    seen: list[tuple[str, str]] = []

    async def audit(msg: Msg, reason: str, subject: str) -> None:
        seen.append((reason, subject))

    dead_letter = bus.dead_letter_publisher(js, on_dead_letter=audit)
    msg = await _pull_one(js)
    assert await bus.settle(msg, bus.PermanentError("no such playbook"), max_deliver=3, nak_delay=0.1,
                            dead_letter=dead_letter) == "term"
    assert seen == [("permanent error: no such playbook", "deadletter.faults.gpu-node-1")]
    msg = await _pull_one(js)
    assert await bus.settle(msg, None, max_deliver=3, nak_delay=0.1, dead_letter=dead_letter) == "ack"
    deadline = time.monotonic() + 5  # an ack is a fire-and-forget publish: wait for the server to apply it
    while (info := await js.consumer_info(subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER)).num_ack_pending:
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.05)
    assert info.num_pending == 0
    assert len(await _dead_letters(js)) == 1


async def test_settle_naks_when_the_dead_letter_cannot_be_written(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    await bus.publish_event(js, event(6))

    async def broken(msg: Msg, reason: str) -> None:
        raise ConnectionError("DEADLETTER unavailable")

    msg = await _pull_one(js)
    assert await bus.settle(msg, bus.PermanentError("x"), max_deliver=3, nak_delay=0.1,
                            dead_letter=broken) == "nak"
    assert (await _pull_one(js)).metadata.num_delivered == 2  # not lost


async def test_settle_never_swallows_cancellation(conn: tuple, settings: Settings) -> None:
    _nc, js = conn
    await bus.provision(js, settings)
    await bus.publish_event(js, event(7))
    msg = await _pull_one(js)
    with pytest.raises(asyncio.CancelledError):
        await bus.settle(msg, asyncio.CancelledError(), max_deliver=3, nak_delay=30,
                         dead_letter=bus.dead_letter_publisher(js))
    # nakked without delay: redelivered at once rather than after ack_wait or nak_delay
    assert (await _pull_one(js, wait=2)).metadata.num_delivered == 2


async def test_bus_ready_follows_the_server(nats_server: EmbeddedNats, settings: Settings) -> None:
    nc, js = await bus.connect(nats_server.url, reconnect_time_wait=0.2)
    try:
        assert not await bus.bus_ready(nc, js)  # connected, but FAULTS is not provisioned
        await bus.provision(js, settings)
        assert await bus.bus_ready(nc, js)
        await asyncio.to_thread(nats_server.stop)
        assert not await bus.bus_ready(nc, js, timeout=0.5)
        await asyncio.to_thread(nats_server.start)
        deadline = time.monotonic() + 10
        while not await bus.bus_ready(nc, js, timeout=0.5):
            assert time.monotonic() < deadline, "did not reconnect within 10 s"
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


def test_bus_init_command_is_idempotent_and_prints_json(nats_server: EmbeddedNats) -> None:
    import json

    from click.testing import CliRunner

    from remediator.cli.bus import bus as bus_group

    runner = CliRunner()
    first = runner.invoke(bus_group, ["init", "--nats", nats_server.url, "--json"])
    assert first.exit_code == 0, first.output
    assert len(json.loads(first.stdout)) == 9
    again = runner.invoke(bus_group, ["init", "--json"], env={"REMEDIATOR_NATS_URL": nats_server.url})
    assert again.exit_code == 0 and json.loads(again.stdout) == []
    missing = runner.invoke(bus_group, ["init"], env={"REMEDIATOR_NATS_URL": ""})
    assert missing.exit_code == 2 and "REMEDIATOR_NATS_URL" in missing.output


async def test_a_service_publish_waits_out_a_missing_leader_and_a_probe_does_not(nats_server: EmbeddedNats,
                                                                                 settings: Settings) -> None:
    """No responders (no stream leader listens yet, as during an election) is retried until the leader
    answers within ``leader_wait_s``, then raised; ``verify_capture`` asks once."""
    nc, js = await bus.connect(nats_server.url, name="test-wait", leader_wait_s=5.0)
    try:
        assert isinstance(js, bus.LeaderWaitingJetStream)
        start = time.monotonic()
        assert await bus.verify_capture(js, "faults.agent.gpu-node-1", subjects.FAULTS_STREAM) is not None
        assert time.monotonic() - start < 2  # a probe: one question, no waiting

        async def leader_elected_later() -> None:
            await asyncio.sleep(1.0)
            await bus.provision(js, settings)

        provisioning = asyncio.create_task(leader_elected_later())
        ack = await bus.publish_event(js, event(7))  # sent before FAULTS exists, stored once it does
        await provisioning
        assert ack.stream == subjects.FAULTS_STREAM and not ack.duplicate and js.elections_waited == 1
        assert (await js.stream_info(subjects.FAULTS_STREAM)).state.messages == 1

        impatient = bus.LeaderWaitingJetStream(nc, timeout=1.0, leader_wait_s=0.5)
        start = time.monotonic()
        with pytest.raises(NoStreamResponseError):
            await impatient.publish("nobody.listens.here", b"x")
        assert 0.4 <= time.monotonic() - start < 3
        plain = nc.jetstream()
        with pytest.raises(NoStreamResponseError):  # what the service got before: at once
            await plain.publish("nobody.listens.here", b"x")
    finally:
        await nc.close()
