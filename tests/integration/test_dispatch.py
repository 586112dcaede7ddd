"""Dispatch against a real nats-server: events in FAULTS become at most one decision per incident."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from handlers.registry import default_registry
from remediator import bus
from remediator.audit import AuditLog, iter_records, verify_chains
from remediator.contracts import Decision, FaultEvent, GpuRef, Origin
from remediator.dispatch import Dispatcher
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.subjects import REMEDIATIONS_STREAM, STATE_BUCKET, node_key

T0 = datetime(2026, 3, 1, 3, 12, tzinfo=UTC)
UUID = "GPU-0b1e5e5e-0000-4000-8000-000000000001"


def xid(node: str, code: int, eid: str, *, job: str | None = None, gpu: int = 0,
        labels: dict[str, str] | None = None, origin: Origin | None = None) -> FaultEvent:
    return FaultEvent(id=eid, source="agent", node=node, kind="xid", code=code,
                      gpu=GpuRef(index=gpu, uuid=f"{UUID[:-1]}{gpu}", pci_bus_id=f"0000:{0x10 + gpu:02x}:00.0"),
                      observed_at=T0, received_at=T0, origin=origin or Origin(),
                      labels=labels or ({"batch.kubernetes.io/job-name": job} if job else {}),
                      message=f"NVRM: Xid (PCI:0000:{0x10 + gpu:02x}:00): {code}, ...")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def _setup(server: EmbeddedNats, clock: Clock):  # type: ignore[no-untyped-def]
    settings = Settings(nats_url=server.url, nak_delay_s=0.1)
    nc, js = await bus.connect(server.url)
    await bus.provision(js, settings)
    audit = AuditLog(js, "test", clock=clock)
    d = await Dispatcher.create(nc, js, settings, audit, registry=default_registry(), clock=clock)
    return nc, js, d


async def _decisions(js) -> list[Decision]:  # type: ignore[no-untyped-def]
    info = await js.stream_info(REMEDIATIONS_STREAM)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        raw = await js.get_msg(REMEDIATIONS_STREAM, seq)
        out.append(Decision.model_validate_json(raw.data))
    return out


async def test_xid79_three_times_is_one_decision(nats_server: EmbeddedNats) -> None:
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    # Alertmanager HA and retries: the same alert three times (one id) plus a second id for the same fault.
    for eid in ("am|fp1|firing|t0", "am|fp1|firing|t0", "am|fp1|firing|t0", "agent|gpu-node-1|boot|77"):
        await bus.publish_event(js, xid("gpu-node-1", 79, eid))
    for _ in range(100):
        if d.stats.events >= 2:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await runner
    decisions = await _decisions(js)
    assert [x.playbook for x in decisions] == ["gpu-lost"]
    assert decisions[0].node == "gpu-node-1" and decisions[0].reason
    whats = [r.what async for r in iter_records(js, "gpu-node-1")]
    assert whats.count("decision") == 1 and "incident_updated" in whats
    await nc.close()


async def test_xid13_recorded_then_hardware_suspect_after_three_jobs(nats_server: EmbeddedNats) -> None:
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    assert await d.handle(xid("gpu-node-2", 13, "e1", job="train-a")) == []
    clock.now += timedelta(hours=2)
    assert await d.handle(xid("gpu-node-2", 13, "e2", job="train-b")) == []
    clock.now += timedelta(hours=2)
    [decision] = await d.handle(xid("gpu-node-2", 13, "e3", job="train-c"))
    assert decision.playbook == "app-xid-hardware-suspect"
    assert len(decision.evidence) >= 3
    # a fourth job does not open a second incident
    clock.now += timedelta(minutes=10)
    assert await d.handle(xid("gpu-node-2", 13, "e4", job="train-d")) == []
    assert [x.playbook for x in await _decisions(js)] == ["app-xid-hardware-suspect"]
    await nc.close()


async def test_redelivery_after_crash_republishes_the_same_decision(nats_server: EmbeddedNats) -> None:
    """A crash after the history was written but before the decision was published loses nothing."""
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    real_publish = d._publish_decision

    async def crash(decision: Decision, traceparent: str | None = None) -> None:
        raise ConnectionError("process died before the publish")

    d._publish_decision = crash  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await d.handle(xid("gpu-node-3", 48, "e48"))
    assert await _decisions(js) == []  # the history holds the incident, REMEDIATIONS has nothing
    d._publish_decision = real_publish  # type: ignore[method-assign]
    [again] = await d.handle(xid("gpu-node-3", 48, "e48"))  # the redelivery
    assert again.playbook == "gpu-memory-fatal"
    assert [x.incident_id for x in await _decisions(js)] == [again.incident_id]
    await d.handle(xid("gpu-node-3", 48, "e48"))  # once more: JetStream drops the repeat
    assert len(await _decisions(js)) == 1
    # and a plain duplicate of an event that opened nothing stays a duplicate
    assert await d.handle(xid("gpu-node-3", 13, "e13", job="j")) == []
    assert await d.handle(xid("gpu-node-3", 13, "e13", job="j")) == []
    assert d.stats.duplicates == 3  # the redelivered 48, its repeat, the repeated 13
    # the delivery that crashed audited nothing; the redelivery that published audits it, once
    records = [r async for r in iter_records(js, "gpu-node-3") if r.event_id == "e48"]
    assert [r.what for r in records] == ["event_accepted", "decision"]
    assert records[1].incident == again.incident_id
    await nc.close()


async def test_a_redelivery_after_a_failure_between_the_records_writes_each_record_once(
        nats_server: EmbeddedNats) -> None:
    """The decision published and ``event_accepted`` stored, then the ``decision`` record failed (AUDIT
    without a leader): the redelivery writes both again and JetStream keeps one of each."""
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    real = Dispatcher._audit_decision
    failed = False

    async def audit_lost_once(audit: object, decision: Decision) -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise ConnectionError("AUDIT has no leader")
        await real(audit, decision)  # type: ignore[arg-type]

    d._audit_decision = audit_lost_once  # type: ignore[method-assign,assignment]
    with pytest.raises(ConnectionError):
        await d.handle(xid("gpu-node-4", 48, "e48b"))
    [again] = await d.handle(xid("gpu-node-4", 48, "e48b"))  # the redelivery
    await d.handle(xid("gpu-node-4", 48, "e48b"))  # and one more: nothing new
    records = [r async for r in iter_records(js, "gpu-node-4") if r.event_id == "e48b"]
    assert [r.what for r in records] == ["event_accepted", "decision"]
    assert records[1].incident == again.incident_id
    assert [x.incident_id for x in await _decisions(js)] == [again.incident_id]
    # the chain still links: a later record follows the last stored one
    await d.handle(xid("gpu-node-4", 13, "e13b", job="j"))
    chain = [r async for r in iter_records(js, "gpu-node-4")]
    assert all(rep.ok for rep in verify_chains(chain)), [rep.problem for rep in verify_chains(chain)]
    await nc.close()


class LaggingReplica(KeyValue):
    """The bucket as a follower that has applied none of its writes answers direct gets (what a replica
    does right after an election, or under load, on a bucket declared ``allow_direct``); reads through the
    stream leader (``direct=False``) are real."""

    async def _get(self, key: str, revision: int | None = None) -> KeyValue.Entry:
        if self._direct:
            raise KeyNotFoundError
        return await super()._get(key, revision)


async def test_a_redelivery_read_from_a_lagging_replica_still_republishes_its_decision(
        nats_server: EmbeddedNats) -> None:
    """Direct gets answered by a replica behind the leader: the re-read after a lost compare-and-set and the
    stored decision come from the leader, so the redelivered event is a duplicate that re-publishes, not an
    incident that never was."""
    clock = Clock()
    settings = Settings(nats_url=nats_server.url, nak_delay_s=0.1)
    nc, js = await bus.connect(nats_server.url)
    await bus.provision(js, settings)
    real = await js.key_value(STATE_BUCKET)
    lagging = LaggingReplica(name=real._name, stream=real._stream, pre=real._pre, js=js, direct=True)
    d = Dispatcher(nc, js, lagging, settings, AuditLog(js, "test", clock=clock), default_registry(), clock=clock)

    async def crash(decision: Decision, traceparent: str | None = None) -> None:
        raise ConnectionError("process died before the publish")

    real_publish = d._publish_decision
    d._publish_decision = crash  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await d.handle(xid("gpu-node-5", 48, "e48"))
    d._publish_decision = real_publish  # type: ignore[method-assign]
    [again] = await d.handle(xid("gpu-node-5", 48, "e48"))
    assert again.playbook == "gpu-memory-fatal"
    assert [x.incident_id for x in await _decisions(js)] == [again.incident_id]
    assert d.stats.duplicates == 1 and d.stats.by_handler == {"xid": 1}  # decided once: by the one that crashed
    await nc.close()


async def test_malformed_message_is_dead_lettered(nats_server: EmbeddedNats) -> None:
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    await js.publish("faults.api.gpu-node-4", b'{"version": 1, "kind": "xid"}', headers={"Nats-Msg-Id": "bad"})
    sub = await nc.subscribe("deadletter.>")
    msg = await sub.next_msg(timeout=10)
    assert msg.subject == "deadletter.faults.gpu-node-4"
    stop.set()
    await runner
    records = [r async for r in iter_records(js, "gpu-node-4")]
    assert [r.what for r in records] == ["dead_letter"]
    await nc.close()


@pytest.mark.parametrize("code", [79, 48])
async def test_decisions_name_known_playbooks(nats_server: EmbeddedNats, code: int) -> None:
    from remediator.contracts import PLAYBOOK_NAMES

    clock = Clock()
    nc, _js, d = await _setup(nats_server, clock)
    [decision] = await d.handle(xid("gpu-node-5", code, f"e{code}"))
    assert decision.playbook in PLAYBOOK_NAMES
    await nc.close()


async def test_two_replicas_racing_on_one_node_open_one_incident(nats_server: EmbeddedNats) -> None:
    """Different events of one fault handled at once by two replicas: the CAS loser re-decides and folds."""
    clock = Clock()
    nc, js, a = await _setup(nats_server, clock)
    b = await Dispatcher.create(nc, js, Settings(nats_url=nats_server.url), AuditLog(js, "replica-b", clock=clock),
                                registry=default_registry(), clock=clock)
    for i in range(5):
        results = await asyncio.gather(a.handle(xid(f"gpu-node-{i}", 79, f"am-{i}")),
                                       b.handle(xid(f"gpu-node-{i}", 79, f"agent-{i}")))
        assert sum(len(r) for r in results) == 1, results
    assert [x.playbook for x in await _decisions(js)] == ["gpu-lost"] * 5
    await nc.close()


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_every_dispatch_record_carries_the_events_provenance(nats_server: EmbeddedNats) -> None:
    """Fingerprint, job, event id and trace travel as typed fields onto the decision and every record."""
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    origin = Origin(fingerprint="3fa85f6457174562", pod="bert-worker-1", namespace="ml")
    labels = {"training.kubeflow.org/job-name": "bert", "alertname": "GPUXidError"}
    first = xid("gpu-node-6", 79, "alertmanager|3fa85f6457174562|firing|t0", labels=labels, origin=origin)
    [decision] = await d.handle(first, trace_id=TRACE, traceparent=f"00-{TRACE}-00f067aa0ba902b7-01")
    assert decision.origin == origin.model_copy(update={"history_key": "node.gpu-node-6"})
    assert decision.job == "bert"  # resolve_job: the Kubeflow label, since the handler named none
    again = xid("gpu-node-6", 79, "alertmanager|77aa00bb11cc22dd|firing|t1", labels=labels,
                origin=origin.model_copy(update={"fingerprint": "77aa00bb11cc22dd"}))
    assert await d.handle(again, trace_id=TRACE) == []  # folded into the open incident
    everything = [r async for r in iter_records(js, "gpu-node-6")]
    assert {(r.job, r.trace_id, r.gpu) for r in everything} == {("bert", TRACE, f"{UUID[:-1]}0")}
    assert {(r.fingerprint, r.event_id) for r in everything} == {("3fa85f6457174562", first.id),
                                                               ("77aa00bb11cc22dd", again.id)}
    records = [r for r in everything if r.what != "event_ignored"]  # the NCCL handler records the Xid too
    assert [(r.what, r.fingerprint, r.incident) for r in records] == [
        ("event_accepted", "3fa85f6457174562", None), ("decision", "3fa85f6457174562", decision.incident_id),
        ("event_accepted", "77aa00bb11cc22dd", None), ("incident_updated", "77aa00bb11cc22dd", decision.incident_id)]
    stored = await js.get_msg(REMEDIATIONS_STREAM, 1)
    assert stored.headers is not None and stored.headers["traceparent"].split("-")[1] == TRACE
    assert Decision.model_validate_json(stored.data or b"").origin.fingerprint == "3fa85f6457174562"
    await nc.close()


async def test_a_decision_never_takes_the_pod_name_or_scrape_job_as_its_job(nats_server: EmbeddedNats) -> None:
    clock = Clock()
    nc, js, d = await _setup(nats_server, clock)
    ev = xid("gpu-node-7", 79, "e-7", labels={"scrape_job": "dcgm-exporter"}, origin=Origin(pod="trainer-0-abcde"))
    [decision] = await d.handle(ev)
    assert decision.job is None
    assert {r.job async for r in iter_records(js, "gpu-node-7")} == {None}
    await nc.close()


async def test_an_event_dead_lettered_is_audited_with_its_provenance(nats_server: EmbeddedNats) -> None:
    """A handler that can never decide (a permanent error) dead-letters the event; the record says whose."""
    from handlers.base import HandlerRegistry, HandlerSpec, Verdict
    from remediator.errors import PermanentError

    def decide(event: FaultEvent, history: object, now: object, policy: object) -> Verdict:
        raise PermanentError("this handler cannot read the event")

    registry = HandlerRegistry()
    registry.register(HandlerSpec("broken", frozenset({"xid"}), decide, lambda _e: True, None))
    settings = Settings(nats_url=nats_server.url, nak_delay_s=0.1)
    nc, js = await bus.connect(nats_server.url)
    await bus.provision(js, settings)
    d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test"), registry=registry)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    sub = await nc.subscribe("deadletter.>")
    ev = xid("gpu-node-8", 79, "alertmanager|feedface|firing|t0", origin=Origin(fingerprint="feedface"))
    await bus.publish_event(js, ev, traceparent=f"00-{TRACE}-00f067aa0ba902b7-01")
    await sub.next_msg(timeout=10)
    for _ in range(100):
        records = [r async for r in iter_records(js, "gpu-node-8")]
        if records:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await runner
    assert [(r.what, r.event_id, r.fingerprint, r.trace_id) for r in records] == [
        ("dead_letter", ev.id, "feedface", TRACE)]
    await nc.close()


async def test_the_nodes_history_is_read_while_the_pods_owner_is_looked_up(nats_server: EmbeddedNats) -> None:
    """An event naming a pod costs an API request for its owner; the node's history does not wait for it."""
    clock = Clock()
    settings = Settings(nats_url=nats_server.url, nak_delay_s=0.1)
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, settings)
        order: list[str] = []

        async def owner(event: FaultEvent) -> FaultEvent:
            order.append("owner asked")
            await asyncio.sleep(0.2)  # the API server's answer
            order.append("owner answered")
            return event.model_copy(update={"origin": event.origin.model_copy(update={"job": "train-7"})})

        d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test", clock=clock), registry=default_registry(),
                                    clock=clock, origins=owner)
        real_get = d._state.get

        async def get(key: str, *, fresh: bool = False) -> tuple[object, int]:
            order.append(f"read {key}")
            return await real_get(key, fresh=fresh)

        d._state.get = get  # type: ignore[method-assign]
        event = xid("gpu-node-5", 79, "early-read-1", origin=Origin(pod="trainer-0", namespace="ml"))
        (decision,) = await d.handle(event)
        assert order[:3] == ["owner asked", "read node.gpu-node-5", "owner answered"], order
        assert order.count("read node.gpu-node-5") == 1  # the early read is the one the handler decided on
        assert decision.job == "train-7" and decision.origin.pod == "trainer-0"  # decided on the resolved event
    finally:
        await nc.close()


async def test_a_replica_that_loses_the_compare_and_set_decides_again_over_the_winners_history(
        nats_server: EmbeddedNats) -> None:
    """Two replicas on one node's history: the one whose read went stale re-reads, so neither event is lost
    and one incident is opened, not two; the lost race is counted (``bench dispatch``'s ``cas_lost``)."""
    clock = Clock()
    nc, js, a = await _setup(nats_server, clock)
    b = await Dispatcher.create(nc, js, Settings(nats_url=nats_server.url), AuditLog(js, "test-b", clock=clock),
                                registry=default_registry(), clock=clock)
    read = a._state.get
    raced = False

    async def stale_read(key: str, *, fresh: bool = False):  # type: ignore[no-untyped-def]
        nonlocal raced
        got = await read(key, fresh=fresh)
        if not raced:  # the other replica writes the same history between this read and its CAS
            raced = True
            await b.handle(xid("gpu-node-9", 79, "agent|gpu-node-9|boot|1"))
        return got

    a._state.get = stale_read  # type: ignore[method-assign]
    assert await a.handle(xid("gpu-node-9", 79, "agent|gpu-node-9|boot|2")) == []  # folded into b's incident
    assert (a.stats.cas_lost, b.stats.cas_lost) == (1, 0)
    assert [x.playbook for x in await _decisions(js)] == ["gpu-lost"]
    history, _ = await read(node_key("gpu-node-9"))
    assert {s.event_id for s in history.sightings} == {"agent|gpu-node-9|boot|1", "agent|gpu-node-9|boot|2"}
    await nc.close()
