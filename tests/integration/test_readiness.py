"""Honest readiness: ``/readyz`` of a real ``serve`` names what is wrong — the Kubernetes API, a deleted
durable consumer, the bus — with a 503, a metric and a log line, and is 200 again once it is back.

The seconds from each loss to the 503, and back, are printed for the report (no timed assertion: the
deadlines are expectations).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from chaos.sim import KubeApiServer, seed_cluster
from remediator import bus, subjects
from remediator.natsd import EmbeddedNats, free_port

from .nats_cluster import ServeProcess, bus_init, post_alert, start_serve, xid_alert


def _until(replica: ServeProcess, status: int, timeout: float = 30) -> tuple[float, dict[str, object]]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got, body = replica.readyz()
        if got == status:
            return time.monotonic() - t0, body
        time.sleep(0.1)
    raise AssertionError(f"/readyz not {status} within {timeout}s: {replica.readyz()}\n{replica.log()[-3000:]}")


def _gauge(replica: ServeProcess, condition: str) -> str:
    text = httpx.get(f"{replica.base}/metrics", timeout=5).text
    line = next(line for line in text.splitlines() if line.startswith(f'remediator_ready{{condition="{condition}"}}'))
    return line.rsplit(" ", 1)[1]


async def _delete_consumer(url: str) -> None:
    nc, js = await bus.connect(url, name="test-delete")
    try:
        await js.delete_consumer(subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER)
    finally:
        await nc.close()


def test_readyz_names_the_kubernetes_api_a_deleted_consumer_and_the_bus(nats_server: EmbeddedNats,
                                                                          tmp_path: Path) -> None:
    assert bus_init(nats_server.url).returncode == 0
    cluster = seed_cluster(nodes=2)
    kube = KubeApiServer(cluster, port=free_port()).start()
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    replica = start_serve(tmp_path, "ready-0", nats_server.url, kubeconfig)
    try:
        replica.wait_ready()
        assert _gauge(replica, "kubernetes") == "1"

        kube.stop()  # the Kubernetes API goes away
        took, body = _until(replica, 503)
        conditions = body["conditions"]
        assert isinstance(conditions, dict)
        assert conditions["kubernetes"]["ok"] is False and conditions["bus"]["ok"] is True, body
        assert _gauge(replica, "kubernetes") == "0"
        print(f"\nKubernetes API stopped: /readyz 503 after {took:.1f}s: {conditions['kubernetes']['detail']}")
        kube.start()
        back, _ = _until(replica, 200)
        print(f"Kubernetes API back: /readyz 200 after {back:.1f}s")
        assert "not ready: kubernetes" in replica.log() and "ready: kubernetes is back" in replica.log()

        asyncio.run(_delete_consumer(nats_server.url))  # remediation would stop silently
        took, body = _until(replica, 503)
        detail = body["conditions"]["consumers"]["detail"]  # type: ignore[index]
        assert "FAULTS/dispatch" in detail and "remediator bus init" in detail, body
        print(f"dispatch consumer deleted: /readyz 503 after {took:.1f}s: {detail}")
        assert bus_init(nats_server.url).returncode == 0
        _until(replica, 200)
        # and the re-created consumer is consumed again: an Xid 79 is acted on
        assert post_alert(replica, xid_alert("gpu-node-1", 0, 79, "fp-after-recreate")) == 200
        t0 = time.monotonic()
        while not cluster.is_cordoned("gpu-node-1"):
            assert time.monotonic() - t0 < 60, replica.log()[-3000:]
            time.sleep(0.2)
        print(f"after bus init re-created it, an Xid 79 cordoned its node in {time.monotonic() - t0:.1f}s")
        # /metrics shows the client rate limit per lane: the quarantine PATCH went in the first (its read: the cache)
        metrics = httpx.get(f"{replica.base}/metrics", timeout=5).text
        for lane in ("quarantine", "read", "bulk"):
            assert f'remediator_kube_requests_queued{{lane="{lane}"}} ' in metrics, metrics
        sent = next(line for line in metrics.splitlines()
                    if line.startswith('remediator_kube_requests_total{lane="quarantine"}'))
        assert float(sent.rsplit(" ", 1)[1]) >= 1, metrics

        nats_server.stop()  # the bus goes away
        took, body = _until(replica, 503)
        assert body["conditions"]["bus"]["ok"] is False, body  # type: ignore[index]
        print(f"nats-server stopped: /readyz 503 after {took:.1f}s")
        stopped = replica.terminate()
        print(f"serve stopped {stopped:.1f}s after SIGTERM with NATS down")
        assert replica.proc.returncode == 0, replica.log()[-3000:]
    finally:
        replica.terminate()
        kube.stop()
