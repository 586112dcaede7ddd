"""Client of the kubelet's PodResources gRPC API (``v1.PodResourcesLister``) on its unix socket.

Where it sits: an adapter under the node agent. The agent's holder view (``remediator.agent.holders``) asks
it which containers the kubelet's device manager (``devices``) and DRA (``dynamic_resources``) gave which
device, and joins that with NVML's GPUs; the service then evicts exactly those pods. It is the only module
of the service path that talks to the kubelet's socket (the simulated kubelet serves the same API:
``chaos.sim.podresources_server``). Messages: ``remediator.adapters.podresources_api``.

What the kubelet API gives, and what it does not: ``List`` names each active pod by namespace and name only
(no UID), each container by name, and per container the device plugin's device IDs by resource name and the
DRA devices by driver, pool and device name (with their CDI device names). ``Get`` (one pod) needs the
kubelet's ``KubeletPodResourcesGet`` feature gate; without it the kubelet answers "PodResources API Get
method disabled", and for a pod it does not run "pod <name> in namespace <ns> not found" (both as UNKNOWN).

Bounds: every call has a deadline (``timeout_s``, 5 s by default) and a reply is at most
``max_receive_bytes`` (16 MiB, the kubelet client's own ``DefaultPodResourcesMaxSize``). Errors are the
project's vocabulary, each one line naming the fix: an absent, refused or silent socket and the kubelet's rate
limit ("rejected by rate limit", RESOURCE_EXHAUSTED) are ``TemporaryError``s; a socket path over the unix
limit, a reply over the size bound and an unimplemented method are ``PermanentError``s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediator.adapters import podresources_api as api
from remediator.errors import PermanentError, TemporaryError

__all__ = [
    "DEFAULT_MAX_RECEIVE_BYTES",
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT_S",
    "MAX_UNIX_PATH_BYTES",
    "ClaimDevice",
    "ContainerAllocation",
    "DeviceIds",
    "PodAllocation",
    "PodResourcesClient",
    "check_socket_path",
    "from_message",
    "load_grpc",
]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_RECEIVE_BYTES = 16 * 1024 * 1024
RATE_LIMIT_TRIES = 3
# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL
MAX_UNIX_PATH_BYTES = 107
_FIX = ("mount the kubelet's /var/lib/kubelet/pod-resources into the agent (the chart does) or pass "
        "--pod-resources SOCKET")


@dataclass(frozen=True, slots=True)
class DeviceIds:
    """A device plugin's devices given to a container: ``ContainerDevices``."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One DRA device given to a container through a claim: ``DynamicResource`` and ``ClaimResource``."""

    claim_name: str
    claim_namespace: str
    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """``ContainerResources``: what one container holds."""

    name: str
    devices: tuple[DeviceIds, ...] = ()
    dynamic: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """``PodResources``: one pod, by namespace and name (the API gives no UID)."""

    namespace: str
    name: str
    containers: tuple[ContainerAllocation, ...] = ()


def from_message(pod: Any) -> PodAllocation:
    """A ``v1.PodResources`` message as a ``PodAllocation``."""
    return PodAllocation(
        namespace=pod.namespace, name=pod.name,
        containers=tuple(
            ContainerAllocation(
                name=c.name,
                devices=tuple(DeviceIds(d.resource_name, tuple(d.device_ids)) for d in c.devices),
                dynamic=tuple(ClaimDevice(dr.claim_name, dr.claim_namespace, cr.driver_name, cr.pool_name,
                                          cr.device_name, tuple(x.name for x in cr.cdi_devices))
                              for dr in c.dynamic_resources for cr in dr.claim_resources))
            for c in pod.containers))


def check_socket_path(path: str | os.PathLike[str]) -> str:
    """``path`` as text, or a ``PermanentError`` when it cannot be a unix socket address (too long)."""
    text = os.fspath(path)
    size = len(os.fsencode(text))
    if size > MAX_UNIX_PATH_BYTES:
        raise PermanentError(f"pod-resources socket path {text} is {size} bytes, over the {MAX_UNIX_PATH_BYTES}-"
                             "byte limit of a unix socket address; use a shorter directory")
    return text


def load_grpc() -> Any:
    """The ``grpc`` module, imported on first use (about 18 MB resident: an agent without a socket, and every
    module that only names these types, never pays for it). gRPC's C core logs connection events (a kubelet
    restarting: "Got goaway") on stderr at INFO unless told otherwise; an operator's GRPC_VERBOSITY wins."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import grpc

    return grpc


class PodResourcesClient:
    """Blocking client of one kubelet's PodResources socket; thread-safe (one channel, opened on first use).

    ::

        client = PodResourcesClient("/var/lib/kubelet/pod-resources/kubelet.sock")
        for pod in client.list(): ...
        client.close()
    """

    def __init__(self, socket_path: str | os.PathLike[str] = DEFAULT_SOCKET, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES) -> None:
        self.socket_path = check_socket_path(Path(socket_path).absolute())
        self.timeout_s = timeout_s
        self.max_receive_bytes = max_receive_bytes
        self._lock = threading.Lock()
        self._channel: Any = None
        self._calls: dict[str, Any] = {}

    # --- calls ---------------------------------------------------------------------------------------

    def list(self) -> tuple[PodAllocation, ...]:
        """Every active pod on the node with what its containers hold (``List``)."""
        reply = self._call("List", api.message("ListPodResourcesRequest")())
        return tuple(from_message(p) for p in reply.pod_resources)

    def get(self, namespace: str, name: str) -> PodAllocation | None:
        """One pod (``Get``); None when the kubelet does not know it."""
        request = api.message("GetPodResourcesRequest")(pod_name=name, pod_namespace=namespace)
        try:
            reply = self._call("Get", request, not_found_ok=True)
        except _NotFound:
            return None
        return from_message(reply.pod_resources)

    def allocatable(self) -> tuple[DeviceIds, ...]:
        """Every device the kubelet's device manager may hand out (``GetAllocatableResources``)."""
        reply = self._call("GetAllocatableResources", api.message("AllocatableResourcesRequest")())
        return tuple(DeviceIds(d.resource_name, tuple(d.device_ids)) for d in reply.devices)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._calls = self._channel, None, {}
        if channel is not None:
            channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------------------------------

    def _stub(self, rpc: str) -> Any:
        with self._lock:
            if self._channel is None:
                self._channel = load_grpc().insecure_channel(f"unix:{self.socket_path}", options=[
                    ("grpc.max_receive_message_length", self.max_receive_bytes),
                    ("grpc.max_send_message_length", 64 * 1024),
                    ("grpc.enable_http_proxy", 0),
                    # a kubelet that restarts re-creates its socket: find it within 2 s, not gRPC's 120 s
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.min_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ])
            call = self._calls.get(rpc)
            if call is None:
                req, resp = api.METHODS[rpc]
                call = self._channel.unary_unary(
                    api.method_path(rpc), request_serializer=api.message(req).SerializeToString,
                    response_deserializer=api.message(resp).FromString)
                self._calls[rpc] = call
            return call

    def _call(self, rpc: str, request: Any, *, not_found_ok: bool = False) -> Any:
        """One call; a call the kubelet's rate limit rejected is tried again, at most ``RATE_LIMIT_TRIES``
        times in all, 0.1 s apart (its bucket refills 100 tokens a second)."""
        for attempt in range(1, RATE_LIMIT_TRIES + 1):
            try:
                return self._stub(rpc)(request, timeout=self.timeout_s)
            except load_grpc().RpcError as e:
                error = self._error(rpc, e, not_found_ok)
                if attempt == RATE_LIMIT_TRIES or not isinstance(error, _RateLimited):
                    raise error from None
            time.sleep(0.1)
        raise AssertionError("unreachable")

    def _error(self, rpc: str, e: Any, not_found_ok: bool) -> Exception:
        grpc = load_grpc()
        code = e.code() if hasattr(e, "code") else None
        details = (e.details() if hasattr(e, "details") else "") or ""
        where = f"kubelet pod-resources socket {self.socket_path}"
        # the kubelet answers both of these as plain errors (UNKNOWN), by their text
        if not_found_ok and code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN) \
                and details.endswith("not found"):
            return _NotFound()
        if code == grpc.StatusCode.UNKNOWN and "Get method disabled" in details:
            return PermanentError(f"{where}: {details.strip()[:160]} (enable the kubelet feature gate "
                                  "KubeletPodResourcesGet, or use List)")
        if code == grpc.StatusCode.UNAVAILABLE:
            if not os.path.exists(self.socket_path):
                return TemporaryError(f"{where} does not exist; {_FIX}")
            return TemporaryError(f"{where} does not answer ({_last_error(details)}); is the kubelet up?")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return TemporaryError(f"{where}: {rpc} got no answer within {self.timeout_s:g}s; is the kubelet up?")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            if "rate limit" in details:
                return _RateLimited(f"{where}: {rpc} rejected by the kubelet's rate limit; retry later", delay=1.0)
            return PermanentError(f"{where}: the {rpc} reply is over {self.max_receive_bytes} bytes "
                                  f"({details.strip()[:160]}); raise the agent's pod-resources receive limit")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            gate = " (enable the kubelet feature gate KubeletPodResourcesGet, or use List)" if rpc == "Get" else ""
            return PermanentError(f"{where}: the kubelet does not implement {rpc}{gate}")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return PermanentError(f"{where}: {rpc} refused ({details.strip()[:160]}); {_FIX}")
        name = code.name if code is not None else type(e).__name__
        return TemporaryError(f"{where}: {rpc} failed: {name}: {details.strip()[:200]}")


class _NotFound(Exception):
    """``Get`` of a pod the kubelet does not know."""


class _RateLimited(TemporaryError):
    """The kubelet's limiter said no (RESOURCE_EXHAUSTED "rejected by rate limit")."""


def _last_error(details: str) -> str:
    """gRPC's connect failure in a few words: its last error, without the repeated address."""
    text = details.strip()
    if "last error:" in text:
        text = text.split("last error:", 1)[1].strip()
    return text.split(": addr:")[0][:160]


def device_ids(pods: Iterable[PodAllocation]) -> set[str]:
    """Every device-plugin device ID in ``pods`` (for ``agent --check``)."""
    return {i for p in pods for c in p.containers for d in c.devices for i in d.device_ids}
