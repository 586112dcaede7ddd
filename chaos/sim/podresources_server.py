"""The simulated kubelets' PodResources gRPC API: ``v1.PodResourcesLister`` on one unix socket per node.

Where it sits: beside the simulated cluster (``chaos.sim``), in the process that holds it (``remediator sim``,
a drill's world, the demo). Each node's socket answers from the cluster's kubelet of that node
(``ClusterState.pods_on`` and ``ClusterState.pod_resources``: the device manager's allocation, and the DRA
allocation where the cluster allocates claims) with the same messages a real kubelet sends
(``remediator.adapters.podresources_api``), so the node agent's real client (``remediator.adapters.
podresources``) reads it as it reads ``/var/lib/kubelet/pod-resources/kubelet.sock``.

As the kubelet (``pkg/kubelet/apis/podresources``) does, and no kinder:

- ``List`` names every active pod bound to the node (running or terminating, not finished), each of its
  containers, and only namespace and name: no UID (the cluster's extra ``uid`` key is dropped);
- ``Get`` answers "pod <name> in namespace <ns> not found" for a pod the node does not run, and "PodResources
  API Get method disabled" while the ``KubeletPodResourcesGet`` gate is off (``get_enabled=False``), both as
  UNKNOWN;
- ``GetAllocatableResources`` lists the node's GPUs as the device plugin registered them (their UUIDs);
- a token bucket (100 per second, burst 10, the kubelet's defaults) rejects calls over the limit with
  RESOURCE_EXHAUSTED "rejected by rate limit".

Cheap enough for the demo's 8 nodes: grpc is loaded on the first ``start`` (importing this module costs
nothing), one gRPC server per socket (a unix socket's server cannot tell which path
a call came in on), all on one small shared thread pool. Socket paths over the 107-byte limit of a unix socket
address are refused with the fix named (``remediator.adapters.podresources.check_socket_path``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format

from chaos.sim.resources import GPU_RESOURCE, Obj, is_terminal
from remediator.adapters import podresources_api as api
from remediator.adapters.podresources import check_socket_path, load_grpc

__all__ = ["KUBELET_BURST", "KUBELET_QPS", "SOCKET_NAME", "PodResourcesServer", "PodResourcesServers",
           "node_pod_resources"]

log = logging.getLogger(__name__)

SOCKET_NAME = "pod-resources.sock"
KUBELET_QPS = 100.0    # pkg/kubelet/apis/podresources: DefaultQPS
KUBELET_BURST = 10     # DefaultBurstTokens


class _Cluster(Protocol):
    def pods_on(self, node: str) -> list[Obj]: ...

    def pod_resources(self, node: str) -> list[Obj]: ...


class _Devices(Protocol):
    def device_ids(self) -> list[str]: ...


def node_pod_resources(cluster: _Cluster, node: str) -> list[dict[str, Any]]:
    """``node``'s ``List`` reply as proto-JSON: every active pod with every container, the allocation merged
    in by container name (``devices``, ``dynamic_resources`` exactly as the cluster's kubelet holds them)."""
    held = {(p["namespace"], p["name"]): p for p in cluster.pod_resources(node)}
    out: list[dict[str, Any]] = []
    for pod in cluster.pods_on(node):
        if is_terminal(pod):
            continue
        meta = pod["metadata"]
        alloc = {c.get("name", ""): c for c in held.get((meta["namespace"], meta["name"]), {}).get("containers", [])}
        containers = []
        for c in pod.get("spec", {}).get("containers", []):
            given = alloc.get(c["name"], {})
            entry: dict[str, Any] = {"name": c["name"]}
            for key in ("devices", "dynamic_resources"):
                if given.get(key):
                    entry[key] = given[key]
            containers.append(entry)
        out.append({"name": meta["name"], "namespace": meta["namespace"], "containers": containers})
    return out


class _Bucket:
    """The kubelet's limiter: ``rate`` tokens per second, at most ``burst`` saved."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self.tokens, self.at = float(burst), clock()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1.0:
                return False
            self.tokens -= 1.0
            return True


class PodResourcesServer:
    """One node's ``v1.PodResourcesLister`` on ``socket_path``; ``pods()`` gives the ``List`` reply as
    proto-JSON and ``devices()`` the device plugin's device IDs."""

    def __init__(self, socket_path: Path | str, pods: Callable[[], Sequence[Mapping[str, Any]]],
                 devices: Callable[[], Sequence[str]] = list, *, executor: ThreadPoolExecutor | None = None,
                 qps: float = KUBELET_QPS, burst: int = KUBELET_BURST, get_enabled: bool = True) -> None:
        self.socket_path = Path(check_socket_path(Path(socket_path).absolute()))
        self.pods = pods
        self.devices = devices
        self.get_enabled = get_enabled
        self.calls = 0
        self.rejected = 0
        self._bucket = _Bucket(qps, burst)
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=2, thread_name_prefix="pod-resources")
        self._server: Any = None

    # --- the three methods ---------------------------------------------------------------------------

    def _limited(self, context: Any) -> None:
        self.calls += 1
        if not self._bucket.take():
            self.rejected += 1
            context.abort(load_grpc().StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def _list(self, request: Any, context: Any) -> Any:
        self._limited(context)
        return json_format.ParseDict({"pod_resources": list(self.pods())}, api.message("ListPodResourcesResponse")())

    def _get(self, request: Any, context: Any) -> Any:
        self._limited(context)
        if not self.get_enabled:
            context.abort(load_grpc().StatusCode.UNKNOWN, "PodResources API Get method disabled")
        for pod in self.pods():
            if pod["name"] == request.pod_name and pod["namespace"] == request.pod_namespace:
                return json_format.ParseDict({"pod_resources": pod}, api.message("GetPodResourcesResponse")())
        context.abort(load_grpc().StatusCode.UNKNOWN,
                      f"pod {request.pod_name} in namespace {request.pod_namespace} not found")

    def _allocatable(self, request: Any, context: Any) -> Any:
        self._limited(context)
        ids = list(self.devices())
        devices = [{"resource_name": GPU_RESOURCE, "device_ids": ids}] if ids else []
        return json_format.ParseDict({"devices": devices}, api.message("AllocatableResourcesResponse")())

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> PodResourcesServer:
        """Bind the socket (replacing a stale one) and serve."""
        grpc = load_grpc()
        handlers = {}
        for rpc, fn in (("List", self._list), ("Get", self._get), ("GetAllocatableResources", self._allocatable)):
            req, resp = api.METHODS[rpc]
            handlers[rpc] = grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=api.message(req).FromString,
                response_serializer=api.message(resp).SerializeToString)
        server = grpc.server(self._executor, handlers=[grpc.method_handlers_generic_handler(api.SERVICE, handlers)],
                             options=[("grpc.max_receive_message_length", 64 * 1024)])
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as e:
            raise OSError(f"cannot serve the pod-resources socket {self.socket_path}: {e}") from e
        server.start()
        os.chmod(self.socket_path, 0o600)  # the kubelet's socket is root's; ours is the simulator user's
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)


class PodResourcesServers:
    """Every simulated node's socket, served from ``cluster`` on one shared pool; ``gpu_nodes`` give the
    device plugin's device IDs (the simulated GPUs' UUIDs).

    ::

        servers = PodResourcesServers(cluster, gpu_nodes)
        servers.serve("gpu-node-0", root / "gpu-node-0" / SOCKET_NAME)
        ...
        servers.stop()
    """

    def __init__(self, cluster: _Cluster, gpu_nodes: Mapping[str, _Devices] | None = None, *,
                 workers: int = 4) -> None:
        self.cluster = cluster
        self.gpu_nodes = gpu_nodes or {}
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod-resources")
        self.servers: dict[str, PodResourcesServer] = {}

    def serve(self, node: str, socket_path: Path | str, **options: Any) -> PodResourcesServer:
        gpu = self.gpu_nodes.get(node)
        server = PodResourcesServer(socket_path, lambda: node_pod_resources(self.cluster, node),
                                    gpu.device_ids if gpu is not None else list, executor=self.executor, **options)
        self.servers[node] = server.start()
        return server

    def socket(self, node: str) -> Path:
        return self.servers[node].socket_path

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> PodResourcesServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
