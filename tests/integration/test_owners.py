"""Owner resolution against the simulated API server: ranks' pods named by their PyTorchJob through the
Kubernetes adapter's job discovery, so the NCCL handler correlates them across nodes; DaemonSet pods are
no job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.sim import KubeApiServer, seed_cluster
from handlers import default_registry
from handlers.nccl import history_key
from remediator import bus
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.audit import AuditLog
from remediator.contracts import Origin
from remediator.dispatch import Dispatcher
from remediator.natsd import EmbeddedNats
from remediator.owners import OwnerResolver
from remediator.settings import Settings
from tests.unit.handlers.helpers import ev

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[AsyncKube]:
    cluster = seed_cluster(nodes=2)
    with KubeApiServer(cluster) as server:
        port = AsyncKube(KubeAdapter(str(server.write_kubeconfig(tmp_path / "kubeconfig")), retry_budget_s=5.0),
                         max_workers=2)
        try:
            yield port
        finally:
            port.close()


async def test_ranks_on_two_nodes_meet_in_their_jobs_history(kube: AsyncKube) -> None:
    resolve = OwnerResolver(kube)
    master = await resolve(ev("nccl_timeout", "watchdog_timeout", node="gpu-node-0",
                              origin=Origin(pod="pytorch-0-master-0", namespace="training")))
    worker = await resolve(ev("nccl_timeout", "watchdog_timeout", node="gpu-node-1",
                              origin=Origin(pod="pytorch-0-worker-0", namespace="training")))
    assert master.origin.job == worker.origin.job == "pytorch-0"
    assert history_key(master) == history_key(worker) == "job.training.pytorch-0"


async def test_a_daemonset_pod_and_a_pod_elsewhere_are_no_job(kube: AsyncKube) -> None:
    resolve = OwnerResolver(kube)
    pods = await kube.pods_on_node("gpu-node-0")
    daemon = next(p for p in pods if p["daemonset"])
    origin = Origin(pod=daemon["name"], namespace=daemon["namespace"])
    e = await resolve(ev("xid", 13, node="gpu-node-0", origin=origin))
    assert e.origin.job is None and e.origin.pod == daemon["name"]  # an agent's event keeps the pod it saw
    alert = ev("xid", 79, node="gpu-node-0", origin=origin).model_copy(update={"source": "alertmanager"})
    assert (await resolve(alert)).origin.pod is None  # an alert naming it: the exporter's own, no workload
    e = await resolve(ev("xid", 13, node="gpu-node-0", origin=Origin(pod="pytorch-0-worker-0", namespace="training")))
    assert e.origin.job is None  # that pod runs on gpu-node-1, not where the fault was seen


async def test_dispatch_names_the_job_of_the_ranks_pods_before_the_handlers_decide(
        kube: AsyncKube, nats_server: EmbeddedNats) -> None:
    """Agents name only the pod a log line came from; with the service's owner resolver the two ranks of
    PyTorchJob ``pytorch-0`` on two nodes are one job's timeout, decided once and named by that job."""
    settings = Settings(nats_url=nats_server.url)
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, settings)
        d = await Dispatcher.create(nc, js, settings, AuditLog(js, "test"), registry=default_registry(),
                                    origins=OwnerResolver(kube))
        ranks = [ev("nccl_timeout", "watchdog_timeout", node=node, event_id=f"rank-{rank}",
                    origin=Origin(pod=pod, namespace="training"), labels={"rank": str(rank), "seq": "1580"})
                 for rank, (node, pod) in enumerate((("gpu-node-0", "pytorch-0-master-0"),
                                                     ("gpu-node-1", "pytorch-0-worker-0")))]
        assert await d.handle(ranks[0]) == []
        [decision] = await d.handle(ranks[1])
        assert decision.playbook == "nccl-timeout-no-suspect" and decision.job == "pytorch-0"
        assert decision.origin.job == "pytorch-0" and decision.origin.history_key == "job.training.pytorch-0"
    finally:
        await nc.drain()
