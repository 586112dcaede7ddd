"""The agent's real PodResources client against the simulated kubelet's gRPC socket: the same messages, the
same refusals a kubelet gives (rate limit, Get disabled, unknown pod), and every failure one line naming the
fix (remediator.adapters.podresources, chaos.sim.podresources_server).

Integration ring: real gRPC over real unix sockets, the simulated cluster's allocation; no NATS.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.kubelet import mirror_pods
from chaos.sim import seed_cluster
from chaos.sim.gpu_node import SimGpuNode
from chaos.sim.podresources_server import PodResourcesServer, PodResourcesServers
from remediator.adapters.podresources import ClaimDevice, PodResourcesClient
from remediator.agent.holders import KubeletHolders, PodUids
from remediator.errors import PermanentError, TemporaryError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kubelet-") as d:
        yield Path(d)


def test_list_get_and_allocatable_answer_from_the_clusters_kubelet(tmp_path: Path, sockets: Path) -> None:
    cluster = seed_cluster(2, gpus_per_pod=4)
    nodes = {n: SimGpuNode(tmp_path / n, name=n, gpus=8) for n in cluster.node_names()}
    mirror_pods(cluster, nodes)
    with PodResourcesServers(cluster, nodes) as servers:
        for n in nodes:
            servers.serve(n, sockets / f"{n}.sock")
        with PodResourcesClient(sockets / "gpu-node-1.sock") as client:
            pods = client.list()
            on_node = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in cluster.pods_on("gpu-node-1")}
            # every active pod of that node (DaemonSet pods too), never another node's, by namespace and name
            assert {(p.namespace, p.name) for p in pods} == on_node
            alloc = cluster.gpu_allocation("gpu-node-1")
            held = {d for p in pods for c in p.containers for dev in c.devices for d in dev.device_ids}
            assert held == {nodes["gpu-node-1"].identity(i).uuid for i in alloc}
            name = alloc[0][0].name
            one = client.get("training", name)
            assert one is not None and one.name == name and one.containers[0].devices
            assert client.get("training", "no-such-pod") is None
            (devices,) = client.allocatable()
            assert list(devices.device_ids) == nodes["gpu-node-1"].device_ids()
        assert servers.servers["gpu-node-1"].calls == 4 and servers.servers["gpu-node-0"].calls == 0


def test_dynamic_resources_cross_the_wire_as_the_cluster_holds_them(sockets: Path) -> None:
    reply: list[dict[str, Any]] = [{"name": "dra-pod", "namespace": "train", "containers": [{
        "name": "main", "devices": [],
        "dynamic_resources": [{"claim_name": "dra-pod-gpu", "claim_namespace": "train", "claim_resources": [
            {"driver_name": "gpu.nvidia.com", "pool_name": "gpu-node-0", "device_name": "gpu-5",
             "cdi_devices": [{"name": "k8s.gpu.nvidia.com/device=gpu-5"}]}]}]}]}]
    server = PodResourcesServer(sockets / "dra.sock", lambda: reply).start()
    try:
        (pod,) = PodResourcesClient(sockets / "dra.sock").list()
        assert pod.containers[0].dynamic == (ClaimDevice("dra-pod-gpu", "train", "gpu.nvidia.com", "gpu-node-0",
                                                         "gpu-5", ("k8s.gpu.nvidia.com/device=gpu-5",)),)
    finally:
        server.stop()


def test_the_kubelets_refusals_are_the_real_ones(sockets: Path) -> None:
    server = PodResourcesServer(sockets / "k.sock", list, get_enabled=False, qps=1.0, burst=2).start()
    try:
        client = PodResourcesClient(sockets / "k.sock")
        with pytest.raises(PermanentError, match=r"Get method disabled.*KubeletPodResourcesGet"):
            client.get("train", "p")
        # the limiter (burst 2, 1 per second here): the client tries a rejected call 3 times, 0.1 s apart
        client.list()
        started = time.monotonic()
        with pytest.raises(TemporaryError, match="rate limit"):
            client.list()
        assert time.monotonic() - started >= 0.2 and server.rejected >= 3
    finally:
        server.stop()


def test_an_absent_or_silent_socket_is_temporary_and_names_the_fix(sockets: Path) -> None:
    with pytest.raises(TemporaryError, match=r"does not exist; mount the kubelet's /var/lib/kubelet/pod-resources"):
        PodResourcesClient(sockets / "absent.sock", timeout_s=1).list()
    stale = sockets / "stale.sock"
    import socket as sk

    s = sk.socket(sk.AF_UNIX)
    s.bind(str(stale))  # bound, never listening: a kubelet that died and left its socket
    try:
        with pytest.raises(TemporaryError, match="does not answer"):
            PodResourcesClient(stale, timeout_s=1).list()
    finally:
        s.close()


def test_a_reply_over_the_receive_bound_is_refused(sockets: Path) -> None:
    big = [{"name": f"pod-{i}", "namespace": "train", "containers": [{"name": "c" * 200}]} for i in range(200)]
    server = PodResourcesServer(sockets / "big.sock", lambda: big).start()
    try:
        with pytest.raises(PermanentError, match="over 4096 bytes"):
            PodResourcesClient(sockets / "big.sock", max_receive_bytes=4096).list()
        assert len(PodResourcesClient(sockets / "big.sock").list()) == 200
    finally:
        server.stop()


def test_a_socket_path_too_long_for_unix_is_refused_by_the_server(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="107-byte limit"):
        PodResourcesServer(Path("/tmp") / ("x" * 110) / "pod-resources.sock", list)


def test_holders_of_a_pod_replaced_under_the_same_name_get_the_new_uid(tmp_path: Path, sockets: Path) -> None:
    cluster = seed_cluster(1, gpus_per_pod=8)
    sim = SimGpuNode(tmp_path / "gpu-node-0", name="gpu-node-0", gpus=8)
    mirror_pods(cluster, {"gpu-node-0": sim})
    with PodResourcesServers(cluster, {"gpu-node-0": sim}) as servers:
        servers.serve("gpu-node-0", sockets / "n.sock")
        view = KubeletHolders(PodResourcesClient(sockets / "n.sock"), lambda: [sim.identity(i) for i in range(8)],
                              uids=PodUids(sim.pod_logs_dir, sim.kubelet_pods_dir))
        found = view.holder_map()
        assert found is not None
        (holder,) = found.of(sim.identity(0))
        assert holder.uid == cluster.gpu_allocation("gpu-node-0")[0][0].uid
        # the node still has the old pod's log directory, but the kubelet no longer runs that UID
        sim.add_pod(holder.name, namespace=holder.namespace, uid="00000000-0000-0000-0000-0000000000aa")
        (sim.kubelet_pods_dir / str(holder.uid)).rmdir()
        again = view.holder_map()
        assert again is not None and again.of(sim.identity(0))[0].uid == "00000000-0000-0000-0000-0000000000aa"


def test_dra_claims_of_the_simulated_cluster_name_their_holders(tmp_path: Path, sockets: Path) -> None:
    cluster = seed_cluster(1, gpu_allocation="dra", gpus_per_pod=2)
    sim = SimGpuNode(tmp_path / "gpu-node-0", name="gpu-node-0", gpus=8)
    mirror_pods(cluster, {"gpu-node-0": sim})
    with PodResourcesServers(cluster, {"gpu-node-0": sim}) as servers:
        servers.serve("gpu-node-0", sockets / "dra.sock")
        pods = PodResourcesClient(sockets / "dra.sock").list()
        claims = [d for p in pods for c in p.containers for d in c.dynamic]
        assert claims and all(d.driver_name == "gpu.nvidia.com" and d.device_name.startswith("gpu-") for d in claims)
        assert not [d for p in pods for c in p.containers for d in c.devices]  # DRA: no device-plugin IDs
        view = KubeletHolders(PodResourcesClient(sockets / "dra.sock"), lambda: [sim.identity(i) for i in range(8)],
                              uids=PodUids(sim.pod_logs_dir, sim.kubelet_pods_dir))
        found = view.holder_map()
    assert found is not None and found.unknown == ()
    alloc = cluster.gpu_allocation("gpu-node-0")
    assert {i: [(h.name, h.uid) for h in found.of(sim.identity(i))] for i in range(8)} == {
        i: [(h.name, h.uid) for h in alloc.get(i, [])] for i in range(8)}


async def test_without_the_pod_log_directories_the_processes_cgroups_give_the_uid(tmp_path: Path,
                                                                                  sockets: Path) -> None:
    from remediator.agent.commands import CommandResponder
    from remediator.agent.state import StateStore
    from remediator.contracts import AgentCommand

    cluster = seed_cluster(1, gpus_per_pod=4)
    sim = SimGpuNode(tmp_path / "gpu-node-0", name="gpu-node-0", gpus=8)
    mirror_pods(cluster, {"gpu-node-0": sim})  # the training pods' processes, each in its pod's cgroup
    with PodResourcesServers(cluster, {"gpu-node-0": sim}) as servers:
        servers.serve("gpu-node-0", sockets / "n.sock")
        view = KubeletHolders(PodResourcesClient(sockets / "n.sock"), lambda: [sim.identity(i) for i in range(8)],
                              uids=PodUids(tmp_path / "no-var-log-pods", sim.kubelet_pods_dir))
        responder = CommandResponder(node="gpu-node-0", gpus=sim, host=sim, pods=sim,
                                     state=StateStore(tmp_path / "agent"), pod_resources=view)
        reply = await responder.handle(AgentCommand(id="s", verb="status"))
    alloc = cluster.gpu_allocation("gpu-node-0")
    assert reply.after["holders_known"] is True and alloc
    for g in reply.after["gpus"]:
        assert [(h["name"], h["uid"]) for h in g["holders"]] == [(h.name, h.uid) for h in alloc.get(g["index"], [])]
