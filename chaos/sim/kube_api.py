"""The simulated Kubernetes API server: plain HTTP/1.1 + JSON over a ``ClusterState``.

Where it sits: chaos/sim, between the simulated cluster (``cluster.ClusterState``) and anything that
speaks Kubernetes: the service's kube adapter (official ``kubernetes`` client), ``kubectl`` in tests and
drills, benchmarks. ``remediator sim`` runs one in the foreground; drills and tests start one in a
background thread with ``KubeApiServer(state).start()`` and hand out ``write_kubeconfig(path)``.

What it speaks: ``/version``; legacy discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``,
``/apis/<group>/<version>``; clients asking for aggregated discovery get the legacy documents and fall
back, as they do against older servers); ``/openapi/v2`` answers 404 and ``/openapi/v3`` is a stub
that only tells kubectl the server validates fields itself (so ``kubectl create/apply -f`` work without
schemas); resource paths for every type in ``resources.RESOURCES`` with
get, list (selectors, ``limit``/``continue``), watch (chunked, ``resourceVersion``, ``timeoutSeconds``,
410 past the kept history), create, update (409 on a stale ``resourceVersion``), patch (JSON merge,
strategic merge, JSON patch), delete and deletecollection (``propagationPolicy``, ``preconditions``,
``gracePeriodSeconds`` from the query or the DeleteOptions body), the ``status`` subresources and
``pods/<name>/eviction`` (policy/v1: 409 when ``deleteOptions.preconditions`` name another pod, 429 when
a PodDisruptionBudget refuses). Errors are ``Status`` objects. A request whose ``Accept`` asks for
``as=Table`` (what ``kubectl get`` sends) gets a ``meta.k8s.io/v1`` Table with kubectl's usual columns
(``kube_tables``).

Performance: a ``ThreadingHTTPServer`` (one thread per connection) with HTTP/1.1 keep-alive, Nagle off,
and each response written in one ``send`` with its ``Content-Length``; list responses splice objects'
cached JSON. Every request is counted (``ClusterState.request_counts``) and passes through the chaos
hooks (``inject_error``/``add_latency``) before it is served.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from chaos.sim.cluster import ClusterState
from chaos.sim.kube_select import FieldSelector, LabelSelector, SelectorError
from chaos.sim.kube_tables import human_duration, table
from chaos.sim.resources import (
    BY_PLURAL,
    KUBERNETES_VERSION,
    RESOURCES,
    ApiError,
    ListResult,
    ResourceType,
    WatchEvent,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_JSON = "application/json"
_GROUP_ORDER = ("apps", "batch", "policy", "coordination.k8s.io", "resource.k8s.io", "kubeflow.org")
_STATUS_VERBS = ["get", "patch", "update"]


@dataclass(frozen=True)
class _Route:
    verb: str
    resource: str
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None


@dataclass
class _Response:
    code: int
    body: bytes
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _error_response(err: ApiError) -> _Response:
    headers: tuple[tuple[str, str], ...] = ()
    if err.retry_after is not None:
        headers = (("Retry-After", str(err.retry_after)),)
    return _Response(err.code, _dumps(err.status()), headers=headers)


# --- routing ---------------------------------------------------------------------------------------

_BY_GVP: dict[tuple[str, str, str], ResourceType] = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCES}
_GROUP_VERSIONS: dict[str, list[str]] = {}
for _rt in RESOURCES:
    if _rt.version not in _GROUP_VERSIONS.setdefault(_rt.group, []):
        _GROUP_VERSIONS[_rt.group].append(_rt.version)


def route(method: str, path: str, query: dict[str, str]) -> _Route:
    """Map a request to ``(verb, resource, type, namespace, name, subresource)``; 404/405 ``ApiError``."""
    segs = [s for s in path.split("/") if s]
    if not segs or segs[0] not in ("api", "apis"):
        return _Route("get", path)
    if segs[0] == "api":
        if len(segs) == 1:
            return _Route("get", "/api")
        group, version, rest = "", segs[1], segs[2:]
    else:
        if len(segs) <= 2:
            return _Route("get", path)
        group, version, rest = segs[1], segs[2], segs[3:]
    if version not in _GROUP_VERSIONS.get(group, []):
        raise ApiError(404, "the server could not find the requested resource")
    if not rest:
        return _Route("get", path)
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and (group, version, rest[2]) in _BY_GVP:
        namespace, rest = rest[1], rest[2:]
    rt = _BY_GVP.get((group, version, rest[0]))
    if rt is None or len(rest) > 3:
        raise ApiError(404, "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if (namespace is not None) != rt.namespaced and not (namespace is None and name is None):
        raise ApiError(404, "the server could not find the requested resource")
    if sub is not None and sub not in rt.subresources:
        raise ApiError(404, "the server could not find the requested resource")
    resource = f"{rt.plural}/{sub}" if sub else rt.plural
    if method == "GET":
        verb = "get" if name is not None else "watch" if query.get("watch") in ("1", "true") else "list"
    elif method == "POST":
        verb = "create"
        if (name is None) == (sub == "eviction"):
            raise ApiError(405, f"the server does not allow this method on the requested resource ({method})",
                           reason="MethodNotAllowed")
    elif method in ("PUT", "PATCH") and name is not None and sub != "eviction":
        verb = "update" if method == "PUT" else "patch"
    elif method == "DELETE" and sub is None:
        verb = "delete" if name is not None else "deletecollection"
    else:
        raise ApiError(405, f"the server does not allow this method on the requested resource ({method})",
                       reason="MethodNotAllowed")
    if verb in ("create", "deletecollection") and rt.namespaced and namespace is None and sub is None:
        raise ApiError(405, f"the server does not allow this method on the requested resource ({method})",
                       reason="MethodNotAllowed")
    return _Route(verb, resource, rt, namespace, name, sub)


# --- discovery -------------------------------------------------------------------------------------


def _version_doc() -> Obj:
    major, minor, _ = KUBERNETES_VERSION.lstrip("v").split(".")
    return {"major": major, "minor": minor, "gitVersion": KUBERNETES_VERSION,
            "gitCommit": "59526cd4867447956156ae3a602fcbac10a2c335", "gitTreeState": "clean",
            "buildDate": "2025-04-22T16:02:27Z", "goVersion": "go1.23.6", "compiler": "gc",
            "platform": "linux/amd64"}


def _resource_list(group: str, version: str) -> Obj:
    resources: list[Obj] = []
    for rt in RESOURCES:
        if rt.group != group or rt.version != version:
            continue
        entry: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                      "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            if sub == "eviction":
                resources.append({"name": f"{rt.plural}/eviction", "singularName": "", "namespaced": True,
                                  "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            else:
                resources.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                  "kind": rt.kind, "verbs": list(_STATUS_VERBS)})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _group_doc(group: str) -> Obj:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in _GROUP_VERSIONS[group]]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _openapi_v3(path: str) -> Obj | None:
    """A stub OpenAPI v3: the index, and per group-version only each resource's PATCH operation with its
    GVK and the ``fieldValidation`` parameter. That is all kubectl's field-validation probe reads, so
    ``kubectl create/apply -f`` validate on the server (which accepts the parameter and ignores it)
    instead of downloading schemas this simulator does not have. ``/openapi/v2`` stays 404."""
    segs = [s for s in path.split("/") if s][2:]
    gvs = sorted({(rt.group, rt.version) for rt in RESOURCES})
    if not segs:
        return {"paths": {(f"apis/{g}/{v}" if g else f"api/{v}"): {
            "serverRelativeURL": f"/openapi/v3/{f'apis/{g}/{v}' if g else f'api/{v}'}?hash=sim"} for g, v in gvs}}
    group, version = ("", segs[1]) if segs[0] == "api" and len(segs) == 2 else \
        (segs[1], segs[2]) if segs[0] == "apis" and len(segs) == 3 else ("?", "?")
    if (group, version) not in gvs:
        return None
    paths: Obj = {}
    for rt in RESOURCES:
        if (rt.group, rt.version) != (group, version):
            continue
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        paths[f"{prefix}{scope}/{rt.plural}/{{name}}"] = {"patch": {
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (gpu-remediator simulator)",
                                         "version": KUBERNETES_VERSION},
            "paths": paths, "components": {"schemas": {}}}


def _discovery(path: str, server_address: str) -> Obj | None:
    segs = [s for s in path.split("/") if s]
    if path == "/version":
        return _version_doc()
    if segs[:2] == ["openapi", "v3"]:
        return _openapi_v3(path)
    if segs == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}
    if segs == ["api", "v1"]:
        return _resource_list("", "v1")
    if segs == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_doc(g) for g in _GROUP_ORDER]}
    if len(segs) == 2 and segs[0] == "apis" and segs[1] in _GROUP_VERSIONS and segs[1]:
        return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(segs[1])}
    if len(segs) == 3 and segs[0] == "apis" and segs[2] in _GROUP_VERSIONS.get(segs[1], []):
        return _resource_list(segs[1], segs[2])
    return None


def _list_body(rt: ResourceType, result: ListResult) -> bytes:
    meta: Obj = {"resourceVersion": result.resource_version}
    if result.continue_token:
        meta["continue"] = result.continue_token
        if result.remaining is not None:
            meta["remainingItemCount"] = result.remaining
    head = _dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta})[:-1]
    return head + b',"items":[' + b",".join(e.raw() for e in result.entries) + b"]}"


# --- the HTTP layer --------------------------------------------------------------------------------


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024
    allow_reuse_address = True
    app: KubeApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request (kubectl exiting, a killed replica) is normal here, not news;
        anything else is still printed, as the standard library does."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 300  # idle keep-alive connections are closed after this long
    server: _HttpServer
    server_version = "gpu-remediator-kube-sim"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.server.app._track(self.connection, True)

    def finish(self) -> None:
        self.server.app._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        app = self.server.app
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if path == TOKEN_REVIEWS_PATH:
            app.state.record_request(self.command.lower(), "tokenreviews")
            self._send(_token_review(app.state, self.command, body))
            return
        try:
            r = route(self.command, path, query)
        except ApiError as err:
            app.state.record_request(self.command.lower(), path)
            self._send(_error_response(err))
            return
        app.state.record_request(r.verb, r.resource)
        latency, injected = app.state.take_faults(self.command, path)
        if latency > 0:
            time.sleep(latency)
        if injected is not None:
            self._send(_error_response(injected))
            return
        try:
            if r.verb == "watch":
                self._watch(r, query)
                return
            response = app.serve(r, query, body, self.headers.get("Content-Type", ""),
                                 self.headers.get("Accept", ""))
        except ApiError as err:
            response = _error_response(err)
        except Exception as exc:  # a bug in the simulator must not kill the connection silently
            log.exception("kube-sim: %s %s failed", self.command, self.path)
            response = _error_response(ApiError(500, f"simulator error: {exc!r}"))
        self._send(response)

    def _send(self, response: _Response) -> None:
        phrase = HTTPStatus(response.code).phrase if response.code in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {response.code} {phrase}", f"Content-Type: {response.content_type}",
                 f"Content-Length: {len(response.body)}", "Cache-Control: no-cache, private",
                 f"Date: {self.date_time_string()}"]
        lines.extend(f"{k}: {v}" for k, v in response.headers)
        if self.close_connection:
            lines.append("Connection: close")
        try:
            self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)
        except OSError:
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _watch(self, r: _Route, query: dict[str, str]) -> None:
        app = self.server.app
        assert r.rt is not None
        rt = r.rt
        try:
            ls = LabelSelector.parse(query.get("labelSelector"))
            fs = FieldSelector.parse(rt.plural, query.get("fieldSelector"))
        except SelectorError as exc:
            self._send(_error_response(ApiError(400, str(exc))))
            return
        rv_param = query.get("resourceVersion") or ""
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        initial: ListResult | None = None
        if rv_param in ("", "0"):
            try:
                initial = app.state.api_list(rt, r.namespace, label_selector=query.get("labelSelector"),
                                             field_selector=query.get("fieldSelector"))
            except ApiError as err:
                self._send(_error_response(err))
                return
            rv = int(initial.resource_version)
        else:
            try:
                rv = int(rv_param)
            except ValueError:
                self._send(_error_response(ApiError(400, f"invalid resourceVersion {rv_param!r}")))
                return
        head = ["HTTP/1.1 200 OK", f"Content-Type: {_JSON}", "Transfer-Encoding: chunked",
                "Cache-Control: no-cache, private", f"Date: {self.date_time_string()}"]

        def matches(obj: Obj) -> bool:
            return ls.matches(obj["metadata"].get("labels")) and fs.matches(obj)

        try:
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if initial is not None:
                for e in initial.entries:
                    self._chunk(b'{"type":"ADDED","object":' + e.raw() + b"}\n")
            while not app.stopping and time.monotonic() < deadline:
                try:
                    events = app.state.events_since(rv)
                except ApiError as err:
                    self._chunk(_dumps({"type": "ERROR", "object": err.status()}) + b"\n")
                    break
                for ev in events:
                    rv = ev.rv
                    etype = _watch_type(ev, rt, r.namespace, matches)
                    if etype is not None:
                        self._chunk(_dumps({"type": etype, "object": ev.obj}) + b"\n")
                app.state.wait_changed(rv, min(1.0, max(0.0, deadline - time.monotonic())))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True


def _watch_type(ev: WatchEvent, rt: ResourceType, namespace: str | None,
                matches: Callable[[Obj], bool]) -> str | None:
    """What a watcher with these filters sees of ``ev``: the event type, or None."""
    if ev.plural != rt.plural or (namespace is not None and ev.namespace != namespace):
        return None
    before = ev.prev is not None and matches(ev.prev)
    if ev.type == "DELETED":
        return "DELETED" if before else None
    now = matches(ev.obj)
    if ev.type == "ADDED":
        return "ADDED" if now else None
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


def _token_review(state: ClusterState, method: str, body: bytes) -> _Response:
    """``POST tokenreviews``: the review of a bound ServiceAccount token (``chaos.sim.tokens``)."""
    from chaos.sim.tokens import tokens_of

    if method != "POST":
        return _error_response(ApiError(405, f"the server does not allow this method on the requested resource "
                                             f"({method})", reason="MethodNotAllowed"))
    try:
        answer = tokens_of(state).review(_decode(body))
    except (ValueError, ApiError) as e:
        return _error_response(ApiError(400, f"TokenReview is invalid: {e}", reason="BadRequest"))
    return _Response(201, _dumps(answer))


def _dry_run(query: dict[str, str], body: Any) -> bool:
    if query.get("dryRun") == "All":
        return True
    if not isinstance(body, dict):
        return False
    options = body.get("deleteOptions") if body.get("kind") == "Eviction" else None
    return "All" in (body.get("dryRun") or []) or (isinstance(options, dict) and "All" in (options.get("dryRun") or []))


def _grace_period(query: dict[str, str], opts: Obj) -> int | None:
    """``gracePeriodSeconds`` from the query (what the client sends first) or the DeleteOptions body."""
    raw = query.get("gracePeriodSeconds")
    value: Any = raw if raw not in (None, "") else opts.get("gracePeriodSeconds")
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, f"gracePeriodSeconds must be an integer, not {value!r}") from exc


def _decode(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"couldn't decode the request body as JSON: {exc}") from exc


class KubeApiServer:
    """An HTTP Kubernetes API over ``state``, served from a background thread.

    ``port=0`` takes a free port; ``url`` tells which. Use as a context manager, or ``start()``/``stop()``.
    """

    def __init__(self, state: ClusterState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        self._host = host
        self._port = port
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the simulated API server is not started")
        return int(self._httpd.server_address[1])

    @property
    def host(self) -> str:
        return self._host

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{self._host}:{self.port}"

    def start(self) -> KubeApiServer:
        """Bind and serve in a daemon thread; returns self."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HttpServer((self._host, self._port), _Handler)
        httpd.app = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"kube-sim-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: close the listener, end watches and drop open keep-alive connections."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        self.state.wake_watchers()
        httpd.shutdown()
        httpd.server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path, *, context: str = "gpu-sim", namespace: str = "default",
                         token: str = "sim-token") -> Path:
        """Write a kubeconfig for this server (cluster, a user with a dummy bearer token, the current
        context) to ``path`` and return the path."""
        out = Path(path)
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": f"{context}-admin", "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": f"{context}-admin",
                                                       "namespace": namespace}}],
            "current-context": context,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        return out

    # --- serving ----------------------------------------------------------------------------------

    def serve(self, r: _Route, query: dict[str, str], body: bytes, content_type: str, accept: str) -> _Response:
        """Answer one routed request (everything but watch)."""
        if r.rt is None:
            return self._serve_nonresource(r.resource)
        rt, ns, name = r.rt, r.namespace, r.name
        st = self.state
        wants_table = "as=Table" in accept
        if r.verb == "get":
            assert name is not None
            entry = st.api_get(rt, ns or "", name)
            if wants_table:
                return _Response(200, _dumps(table(rt, [entry.obj], st.now(), resource_version=
                                                   entry.obj["metadata"].get("resourceVersion", ""),
                                                   include_object=query.get("includeObject", "Metadata"))))
            return _Response(200, entry.raw())
        if r.verb == "list":
            limit = int(query.get("limit") or 0)
            result = st.api_list(rt, ns, label_selector=query.get("labelSelector"),
                                 field_selector=query.get("fieldSelector"), limit=limit,
                                 continue_token=query.get("continue") or None)
            if wants_table:
                return _Response(200, _dumps(table(rt, [e.obj for e in result.entries], st.now(),
                                                   resource_version=result.resource_version,
                                                   continue_token=result.continue_token,
                                                   include_object=query.get("includeObject", "Metadata"))))
            return _Response(200, _list_body(rt, result))
        if r.verb == "create" and r.sub == "eviction":
            assert name is not None and ns is not None
            payload = _decode(body)
            st.api_evict(ns, name, payload, dry_run=_dry_run(query, payload))
            return _Response(201, _dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                          "status": "Success", "code": 201}))
        if r.verb == "create":
            payload = _decode(body)
            return _Response(201, _dumps(st.api_create(rt, ns, payload, dry_run=_dry_run(query, payload))))
        if r.verb == "update":
            assert name is not None
            payload = _decode(body)
            return _Response(200, _dumps(st.api_replace(rt, ns, name, payload, subresource=r.sub,
                                                        dry_run=_dry_run(query, payload))))
        if r.verb == "patch":
            assert name is not None
            return _Response(200, _dumps(st.api_patch(rt, ns, name, body, content_type, subresource=r.sub,
                                                      dry_run=query.get("dryRun") == "All")))
        payload = _decode(body)
        opts = payload if isinstance(payload, dict) else {}
        propagation = query.get("propagationPolicy") or opts.get("propagationPolicy")
        if r.verb == "delete":
            assert name is not None
            pre = opts.get("preconditions") or {}
            return _Response(200, _dumps(st.api_delete(rt, ns, name, propagation=propagation,
                                                       precondition_uid=pre.get("uid"),
                                                       precondition_rv=pre.get("resourceVersion"),
                                                       grace_period=_grace_period(query, opts),
                                                       dry_run=_dry_run(query, opts))))
        deleted = st.api_delete_collection(rt, ns, label_selector=query.get("labelSelector"),
                                           field_selector=query.get("fieldSelector"), propagation=propagation,
                                           grace_period=_grace_period(query, opts), dry_run=_dry_run(query, opts))
        return _Response(200, _dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                                      "metadata": {"resourceVersion": str(st.resource_version)},
                                      "items": deleted}))

    def _serve_nonresource(self, path: str) -> _Response:
        if path in ("/healthz", "/livez", "/readyz"):
            return _Response(200, b"ok", "text/plain; charset=utf-8")
        doc = _discovery(path, f"{self._host}:{self.port}")
        if doc is None:
            raise ApiError(404, "the server could not find the requested resource")
        return _Response(200, _dumps(doc))


__all__ = ["BY_PLURAL", "KubeApiServer", "human_duration", "route", "table"]
