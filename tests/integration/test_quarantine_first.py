"""Quarantine first: a run's ``taint`` and ``cordon`` are one PATCH from the rate limiter's priority lane.

Against the simulated Kubernetes API over real HTTP (the official client), and for the executor a real
nats-server: the node ends tainted and cordoned after one node PATCH carrying both, with the
``resourceVersion`` precondition (a concurrent writer makes it re-read and re-decide), while each step keeps
its own record and audit trail; and a quarantine queued behind a backlog of drains' requests is sent first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.sim import ClusterState, KubeApiServer, seed_cluster
from remediator.adapters.kube import CORDONED_BY_US_ANNOTATION, KubeAdapter
from remediator.natsd import EmbeddedNats

from .executor_support import decision, rig

TAINT_KEY = "gpu-remediator/quarantine"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster() -> ClusterState:
    return seed_cluster(nodes=4)


@pytest.fixture
def kube(cluster: ClusterState, tmp_path: Path) -> Iterator[KubeAdapter]:
    with KubeApiServer(cluster) as srv:
        adapter = KubeAdapter(str(srv.write_kubeconfig(tmp_path / "kubeconfig")), taint_key=TAINT_KEY,
                              retry_budget_s=10.0, backoff_base_s=0.05, backoff_max_s=0.5)
        yield adapter
        adapter.close()


def test_quarantine_taints_and_cordons_in_one_patch(kube: KubeAdapter, cluster: ClusterState) -> None:
    taint, cordon = kube.quarantine("gpu-node-1", TAINT_KEY, "gpu-lost")
    assert taint.changed and cordon.changed
    assert cluster.count("patch", "nodes") == 1 and cluster.count("get", "nodes") == 1
    node = cluster.node("gpu-node-1")
    assert node["spec"]["unschedulable"] is True
    assert [(t["key"], t["value"], t["effect"]) for t in node["spec"]["taints"]] == [
        (TAINT_KEY, "gpu-lost", "NoSchedule")]
    assert CORDONED_BY_US_ANNOTATION in node["metadata"]["annotations"]
    assert taint.before["unschedulable"] is False and cordon.after["unschedulable"] is True
    assert kube.limiter.taken()["quarantine"] == 2  # the read and the PATCH, both in the priority lane
    # idempotent: nothing left to do, no PATCH
    again = kube.quarantine("gpu-node-1", TAINT_KEY, "gpu-lost")
    assert not again[0].changed and not again[1].changed
    assert cluster.count("patch", "nodes") == 1


def test_quarantine_leaves_someone_elses_cordon_and_adds_only_the_taint(kube: KubeAdapter,
                                                                         cluster: ClusterState) -> None:
    cluster.patch("nodes", "gpu-node-2", {"spec": {"unschedulable": True}})
    taint, cordon = kube.quarantine("gpu-node-2", TAINT_KEY, "gpu-lost")
    assert taint.changed and not cordon.changed
    assert "already cordoned" in cordon.detail
    assert CORDONED_BY_US_ANNOTATION not in (cluster.node("gpu-node-2")["metadata"].get("annotations") or {})


def test_a_concurrent_writer_makes_the_quarantine_reread(kube: KubeAdapter, cluster: ClusterState) -> None:
    cluster.add_latency(1.0, method="PATCH", path="/api/v1/nodes/gpu-node-0$", count=1)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(kube.quarantine("gpu-node-0", TAINT_KEY, "gpu-lost")))
    worker.start()
    deadline = time.monotonic() + 5
    while cluster.count("patch", "nodes") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.patch("nodes", "gpu-node-0", {"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}})
    worker.join(timeout=10)
    (taint, cordon), = result
    assert taint.changed and cordon.changed
    assert cluster.count("patch", "nodes") == 2  # the first lost on resourceVersion, the second won
    keys = [t["key"] for t in cluster.node("gpu-node-0")["spec"]["taints"]]
    assert keys == ["other", TAINT_KEY]


def test_a_quarantine_is_sent_before_a_backlog_of_drain_requests(cluster: ClusterState, tmp_path: Path) -> None:
    with KubeApiServer(cluster) as srv:
        kube = KubeAdapter(str(srv.write_kubeconfig(tmp_path / "kubeconfig")), taint_key=TAINT_KEY, qps=20, burst=1)
        try:
            kube.get_node("gpu-node-3")  # the burst is spent
            sent: list[str] = []
            lock = threading.Lock()

            def drain_read(i: int) -> None:
                kube.pods_on_node(f"gpu-node-{i % 3}")
                with lock:
                    sent.append("bulk")

            def quarantine() -> None:
                kube.quarantine("gpu-node-3", TAINT_KEY, "gpu-lost")
                with lock:
                    sent.append("quarantine")

            from remediator.adapters.ratelimit import lane

            def in_bulk(i: int) -> None:
                with lane("bulk"):
                    drain_read(i)

            backlog = [threading.Thread(target=in_bulk, args=(i,)) for i in range(12)]
            for t in backlog:
                t.start()
            deadline = time.monotonic() + 5
            while kube.limiter.queued()["bulk"] < 8 and time.monotonic() < deadline:
                time.sleep(0.005)
            q = threading.Thread(target=quarantine)
            q.start()
            for t in [*backlog, q]:
                t.join(timeout=20)
            # the quarantine's two requests jumped the queue: it finished while most of the backlog waited
            assert sent.index("quarantine") <= 12 - 8 + 1, sent
        finally:
            kube.close()


async def test_the_executor_takes_taint_and_cordon_in_one_request(nats_server: EmbeddedNats,
                                                                  tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        result = await r.executor.execute(d)
        assert result.outcome == "escalated"
        assert result.done() == ["taint", "cordon", "drain", "escalate"]
        node = r.sim.node("gpu-node-2")
        assert node["spec"]["unschedulable"] is True
        assert any(t["key"] == r.settings.taint_key for t in node["spec"]["taints"])
        # one PATCH quarantined the node: the first node PATCH of the run carries both
        assert r.kube.limiter.taken()["quarantine"] == 2
        whats = await r.whats("gpu-node-2", d.incident_id)
        assert whats.count("step_started") == 4 and whats.count("step_succeeded") == 4
        records = {a.name: a for a in result.actions}
        assert records["taint"].status == records["cordon"].status == "succeeded"
        # what the run leaves is known from the two step records, as before
        finished = [rec for rec in await r.audit_records("gpu-node-2") if rec.what == "playbook_finished"]
        assert finished[-1].after["left"]["ours"] == ["taint", "cordon"]


async def test_a_step_that_timed_out_waiting_for_the_rate_limit_does_not_act_afterwards(
        cluster: ClusterState, tmp_path: Path) -> None:
    """The escalate step of the 750-node storm at the default limit: its requests waited behind the other
    runs' drains longer than its timeout; ``asyncio.wait_for`` recorded it failed while the adapter's thread
    went on and posted the escalation anyway. With the step's deadline on its requests they are never sent."""
    import asyncio

    from remediator.adapters.kube import ESCALATED_ANNOTATION, AsyncKube
    from remediator.adapters.ratelimit import deadline

    with KubeApiServer(cluster) as srv:
        port = AsyncKube(KubeAdapter(str(srv.write_kubeconfig(tmp_path / "kubeconfig")), taint_key=TAINT_KEY,
                                     qps=2, burst=1))
        try:
            port.sync.get_node("gpu-node-0")  # the burst is spent: each request now waits 0.5 s
            with pytest.raises(TimeoutError), deadline(time.monotonic() + 0.3):
                await asyncio.wait_for(port.escalate("gpu-node-0", "gpu lost", "inc-1"), timeout=0.3)
            await asyncio.sleep(2.0)  # long enough for an orphaned call to have gone through the limiter
            assert ESCALATED_ANNOTATION not in (cluster.node("gpu-node-0")["metadata"].get("annotations") or {})
            assert cluster.count("patch", "nodes") == 0 and cluster.count("create", "events") == 0
        finally:
            port.close()


async def test_the_quarantine_request_does_not_wait_for_its_step_started_records(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two ``step_started`` records are appended while the PATCH is in flight, not before it: with every
    ``step_started`` append held, the PATCH still reaches the API server; the chain keeps its order (both
    started records before either succeeded one) once they are let go."""
    import asyncio

    from remediator.audit import AuditLog

    async with rig(nats_server.url, tmp_path) as r:
        held = asyncio.Event()
        original = AuditLog.append

        async def append(self: AuditLog, node: str | None, what: Any, *args: Any, **kw: Any) -> Any:
            if what == "step_started":
                await held.wait()
            return await original(self, node, what, *args, **kw)

        monkeypatch.setattr(AuditLog, "append", append)
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        run = asyncio.create_task(r.executor.execute(d))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while r.sim.count("patch", "nodes") == 0:
            assert not run.done(), run.result()
            assert loop.time() < deadline, "the quarantine PATCH waited for its step_started records"
            await asyncio.sleep(0.01)
        assert r.sim.node("gpu-node-2")["spec"]["unschedulable"] is True  # quarantined, records still held
        assert "step_started" not in await r.whats("gpu-node-2", d.incident_id)
        held.set()
        result = await run
        assert result.done() == ["taint", "cordon", "drain", "escalate"]
        steps = [(rec.what, rec.after.get("step")) for rec in await r.audit_records("gpu-node-2")
                 if rec.incident == d.incident_id and rec.what.startswith("step_")][:4]
        assert steps == [("step_started", "taint"), ("step_started", "cordon"), ("step_succeeded", "taint"),
                         ("step_succeeded", "cordon")]


async def test_step_started_records_refused_by_the_bus_leave_the_quarantine_and_its_outcome_stored(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quarantine does not wait for its ``step_started`` records, so it lands where they fail; the run
    record then keeps what the PATCH changed (``changed_by_us``) before their error is raised, and the
    redelivery goes on from there and leaves the node's taint and cordon known as ours."""
    import asyncio

    import nats.errors

    from remediator.audit import AuditLog
    from remediator.run import RunLog

    async with rig(nats_server.url, tmp_path) as r:
        original = AuditLog.append
        refused: list[str] = []

        async def append(self: AuditLog, node: str | None, what: Any, *args: Any, **kw: Any) -> Any:
            if what == "step_started" and not refused:
                refused.append(what)
                await asyncio.sleep(0.2)  # the PATCH is answered meanwhile
                raise nats.errors.TimeoutError
            return await original(self, node, what, *args, **kw)

        monkeypatch.setattr(AuditLog, "append", append)
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        with pytest.raises(nats.errors.TimeoutError):
            await r.executor.execute(d)
        node = r.sim.node("gpu-node-2")
        assert node["spec"]["unschedulable"] is True
        assert any(t["key"] == r.settings.taint_key for t in node["spec"]["taints"])
        run, _ = await RunLog(await r.js.key_value("remediator-state")).get(d.incident_id)
        assert run is not None
        for key in ("taint", "cordon"):
            assert run.records[key].status == "succeeded" and run.records[key].after["changed_by_us"] is True
        result = await r.executor.execute(d)  # the redelivery
        assert result.done() == ["taint", "cordon", "drain", "escalate"]
        finished = [rec for rec in await r.audit_records("gpu-node-2") if rec.what == "playbook_finished"]
        assert finished[-1].after["left"]["ours"] == ["taint", "cordon"]
