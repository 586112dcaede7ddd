"""The ingest HTTP API: Alertmanager webhook and generic events in, ``FaultEvent``s on FAULTS out (DESIGN.md §5).

Where it sits: the front door. ``serve`` runs ``create_app`` under uvicorn next to the dispatcher; every
request is answered only after JetStream acked each event it carried, so a 200 means "persisted".

=====================  =========================================================================
answer                 when
=====================  =========================================================================
200                    every event acked (new or duplicate); body
                       ``{"accepted", "duplicates", "ignored", "ids"}`` (``ids``: the event ids
                       published, new and duplicate, in payload order)
400                    the body is not JSON
401                    ``/v1/*`` without a valid bearer token (``remediator.ingest.auth``)
403                    a token whose scope does not include the endpoint (``SCOPE:TOKEN``)
408                    the body did not arrive within ``http_body_timeout_s``
415                    a body that is not ``Content-Type: application/json``
413                    the body is larger than ``max_body_bytes`` (Content-Length or streamed)
422                    the JSON is not a valid payload; ``field`` names the culprit
                       (``version``, ``alerts[2].fingerprint``, ``alerts[0].labels.node``,
                       ``events[0].origin.fingerprint``: only ingest sets a fingerprint)
503 + Retry-After      the bus is down or did not ack in time; Alertmanager retries 5xx only
=====================  =========================================================================

Order of checks: auth (and scope), then Content-Type, then size, then parsing; every alert is validated
before anything is published, so a 4xx publishes nothing. Alerts with no GPU signal are accepted and
written to the cluster audit chain once
(``event_ignored``); duplicates (JetStream's ``PubAck.duplicate``) are written to the node's chain
(``duplicate_ignored``), bound to the event's provenance (``AuditContext.of_event``: fingerprint, job, GPU,
trace). The ``event_accepted`` record is the dispatcher's, written when it takes the event.

The hot path is one ``model_validate_json`` of the payload (pydantic-core parses and validates in one pass),
one ``FaultEvent`` per alert and one JetStream publish per event, the publishes of one payload in flight
together. Routes take the raw ``Request``: FastAPI's body models would parse the same bytes twice.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import TypeAdapter, ValidationError

from remediator.audit import AuditContext, AuditLog
from remediator.bus import bus_ready, publish_event
from remediator.contracts import AlertmanagerAlert, AlertmanagerPayload, FaultEvent, InboundEvent, utcnow
from remediator.ingest.alerts import AlertError, alert_event_id, alert_to_event
from remediator.ingest.auth import ApiTokens, Scope, TokenRefused
from remediator.settings import Settings
from remediator.telemetry import http_app, new_traceparent

log = logging.getLogger(__name__)

__all__ = ["IngestMetrics", "create_app"]

OnEvent = Callable[[FaultEvent], Awaitable[None] | None]

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_EVENTS_ADAPTER: TypeAdapter[list[InboundEvent]] = TypeAdapter(list[InboundEvent])
_RESULTS = ("accepted", "duplicate", "ignored", "rejected", "unavailable")
_ENDPOINTS = ("alertmanager", "events")
_QUANTILES = (0.5, 0.9, 0.99)
_JSON = "application/json"
# Origin fields no producer on /v1/events may set: whose id space they are.
_NOT_A_PRODUCERS = {
    "fingerprint": "an Alertmanager fingerprint is set by /v1/alertmanager only (its id space is ingest's)",
    "history_key": "the history key is set by dispatch on a decision, never on an event",
}
# Sources and id prefixes of the producers that do not post to /v1/events: claiming them would pre-empt
# (as a duplicate) the real alert or agent event.
_OTHER_PRODUCERS = ("alertmanager", "agent")
INSECURE_NO_AUTH = "disabled (--insecure-no-auth): /v1/* accept requests without a token"
_ERROR_BODY = {"application/json": {"schema": {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"}, "field": {"type": "string"},
    "errors": {"type": "array", "items": {"type": "object"}}}}}}
_ANSWERS = {"type": "object", "properties": {
    "accepted": {"type": "integer"}, "duplicates": {"type": "integer"}, "ignored": {"type": "integer"},
    "ids": {"type": "array", "items": {"type": "string"}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": text, "content": _ERROR_BODY} for code, text in (
        (400, "the body is not JSON"), (401, "no valid bearer token"),
        (403, "the token's scope excludes this endpoint"),
        (408, "the body did not arrive in time"), (413, "the body is over the size limit"),
        (415, "the body is not application/json"), (422, "the JSON is not a valid payload (field names the culprit)"),
        (503, "the bus is unavailable or did not ack; retry after Retry-After"))}


class _Reject(Exception):
    """A request answered before it is processed (401, 400, 413, 422, 503)."""

    def __init__(self, status: int, error: str, *, field: str | None = None, events: int = 1,
                 headers: dict[str, str] | None = None, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.events = events
        self.headers = headers or {}
        self.errors = errors

    def response(self) -> Response:
        body: dict[str, Any] = {"error": self.error}
        if self.field is not None:
            body["field"] = self.field
        if self.errors:
            body["errors"] = self.errors
        return Response(orjson.dumps(body), status_code=self.status, media_type=_JSON, headers=self.headers)


class IngestMetrics:
    """The ingest counters and a latency summary, rendered as Prometheus text (exposition format 0.0.4)."""

    def __init__(self, window: int = 4096) -> None:
        self.events: dict[tuple[str, str], int] = {(e, r): 0 for e in _ENDPOINTS for r in _RESULTS}
        self.requests: dict[tuple[str, int], int] = {}
        self._latency: dict[str, deque[float]] = {e: deque(maxlen=window) for e in _ENDPOINTS}
        self._sum: dict[str, float] = dict.fromkeys(_ENDPOINTS, 0.0)
        self._count: dict[str, int] = dict.fromkeys(_ENDPOINTS, 0)

    def count(self, endpoint: str, result: str, n: int = 1) -> None:
        if n:
            self.events[endpoint, result] = self.events.get((endpoint, result), 0) + n

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
        self._latency[endpoint].append(seconds)
        self._sum[endpoint] += seconds
        self._count[endpoint] += 1

    def render(self) -> bytes:
        out = [
            "# HELP remediator_ingest_events_total Events seen by ingest, by endpoint and result.",
            "# TYPE remediator_ingest_events_total counter",
        ]
        out += [f'remediator_ingest_events_total{{endpoint="{e}",result="{r}"}} {n}'
                for (e, r), n in sorted(self.events.items())]
        out += ["# HELP remediator_ingest_requests_total HTTP requests to /v1/*, by endpoint and status code.",
                "# TYPE remediator_ingest_requests_total counter"]
        out += [f'remediator_ingest_requests_total{{endpoint="{e}",code="{c}"}} {n}'
                for (e, c), n in sorted(self.requests.items())]
        out += ["# HELP remediator_ingest_request_duration_seconds Time to answer a /v1/* request "
                f"(quantiles over the last {self._latency[_ENDPOINTS[0]].maxlen} requests).",
                "# TYPE remediator_ingest_request_duration_seconds summary"]
        for e in _ENDPOINTS:
            window = sorted(self._latency[e])
            for q in _QUANTILES:
                v = window[min(len(window) - 1, int(q * len(window)))] if window else float("nan")
                out.append(f'remediator_ingest_request_duration_seconds{{endpoint="{e}",quantile="{q}"}} {v:.6g}')
            out.append(f'remediator_ingest_request_duration_seconds_sum{{endpoint="{e}"}} {self._sum[e]:.6g}')
            out.append(f'remediator_ingest_request_duration_seconds_count{{endpoint="{e}"}} {self._count[e]}')
        return ("\n".join(out) + "\n").encode()


def _field(loc: Iterable[int | str], prefix: str = "") -> str:
    text = prefix
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def _invalid(e: ValidationError, prefix: str = "") -> _Reject:
    errs = e.errors(include_url=False, include_input=False, include_context=False)
    if any(err["type"] == "json_invalid" for err in errs):
        return _Reject(400, f"body is not valid JSON: {errs[0]['msg']}", field="body")
    listed = [{"field": _field(err["loc"], prefix), "message": err["msg"]} for err in errs[:20]]
    first = listed[0]
    return _Reject(422, f"{first['field']}: {first['message']}", field=first["field"], errors=listed)


class _Ingest:
    """The request handlers of one app; state that outlives a request (metrics, recent ignores) lives here."""

    def __init__(self, settings: Settings, nc: NATS, js: JetStreamContext, audit: AuditLog | None,
                 on_event: OnEvent | None, publish_timeout: float, retry_after_s: int) -> None:
        self.nc = nc
        self.js = js
        self.audit = audit
        self.on_event = on_event
        self.publish_timeout = publish_timeout
        self.retry_after = str(retry_after_s)
        self.max_body = settings.max_body_bytes
        self.body_timeout_s = settings.http_body_timeout_s
        # SHA-256 digests compared with compare_digest against every entry (remediator.ingest.auth)
        self.tokens = ApiTokens.from_settings(settings.api_tokens, settings.api_tokens_file)
        self.metrics = IngestMetrics()
        # Alertmanager re-sends a firing group every repeat_interval: audit an ignored alert once per
        # notification id, not on every repeat (bounded; a restart audits it once more, which is harmless).
        self._ignored_seen: OrderedDict[str, None] = OrderedDict()

    # --- guards ----------------------------------------------------------------------------------

    def _authorize(self, header: bytes | None, scope: Scope) -> None:
        try:
            self.tokens.authorize(header, scope)
        except TokenRefused as e:
            raise _Reject(e.status, e.error, headers={"WWW-Authenticate": e.challenge}) from None

    async def _read(self, request: Request, scope: Scope) -> tuple[bytes, str | None]:
        """Auth (``scope``), then Content-Type, then the size limit, then the body (within
        ``http_body_timeout_s``); returns the body and a valid ``traceparent`` or None.

        One pass over the raw ASGI headers (names are lower case there) instead of four lookups.
        """
        auth = length = traceparent = ctype = None
        for name, value in request.scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"content-length":
                length = value
            elif name == b"traceparent":
                traceparent = value
            elif name == b"content-type":
                ctype = value
        self._authorize(auth, scope)
        if ctype is None or ctype.split(b";", 1)[0].strip().lower() != b"application/json":
            shown = ctype.decode("latin-1")[:80] if ctype is not None else "none"
            raise _Reject(415, f"Content-Type must be application/json (got {shown})", field="Content-Type")
        if length is not None:
            if not length.isdigit():
                raise _Reject(400, "Content-Length is not a number", field="Content-Length")
            if int(length) > self.max_body:
                raise _Reject(413, f"body of {int(length)} bytes is over the limit of {self.max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        receive = request.receive
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        # One deadline for the whole body: asyncio.timeout arms one timer handle where wait_for started a task
        # per receive (6.5 % of the ingest server's samples under `bench ingest`, in one py-spy profile).
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # http.disconnect: nobody is left to answer
                        raise _Reject(400, "client disconnected before sending the whole body")
                    chunk = message.get("body", b"")
                    if chunk:
                        size += len(chunk)
                        if size > self.max_body:
                            raise _Reject(413, f"body is over the limit of {self.max_body} bytes")
                        chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _Reject(408, f"the body did not arrive within {self.body_timeout_s:g} s",
                          headers={"Connection": "close"}) from None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        tp = traceparent.decode("latin-1") if traceparent is not None else None
        # a request without a (valid) trace starts one: the audit records it causes all carry its id
        return body, tp if tp is not None and _TRACEPARENT.fullmatch(tp) else new_traceparent()

    # --- endpoints -------------------------------------------------------------------------------

    async def alertmanager(self, request: Request) -> Response:
        """Alertmanager webhook payload version 4; one event per GPU alert, answered once persisted."""
        start = time.perf_counter()
        try:
            body, traceparent = await self._read(request, "alertmanager")
            try:
                payload = AlertmanagerPayload.model_validate_json(body)
            except ValidationError as e:
                raise _invalid(e) from None
            received = utcnow()
            events: list[FaultEvent] = []
            ignored: list[AlertmanagerAlert] = []
            for i, alert in enumerate(payload.alerts):
                try:
                    event = alert_to_event(alert, received)
                except AlertError as e:
                    raise _Reject(422, f"alerts[{i}].{e}", field=f"alerts[{i}].{e.field}",
                                  events=len(payload.alerts)) from None
                if event is None:
                    ignored.append(alert)
                else:
                    events.append(event)
            if payload.truncatedAlerts:
                log.warning("alertmanager truncated %d alerts of group %s", payload.truncatedAlerts,
                            payload.groupKey)
            response = await self._publish("alertmanager", traceparent, events, ignored)
        except _Reject as r:
            self.metrics.count("alertmanager", "rejected" if r.status < 500 else "unavailable", r.events)
            response = r.response()
        self.metrics.observe("alertmanager", response.status_code, time.perf_counter() - start)
        return response

    async def events(self, request: Request) -> Response:
        """A JSON list of ``FaultEvent``s (one object is taken as a list of one); same answers."""
        start = time.perf_counter()
        try:
            body, traceparent = await self._read(request, "events")
            try:
                raw = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise _Reject(400, f"body is not valid JSON: {e}", field="body") from None
            if isinstance(raw, dict):
                raw = [raw]
            try:
                inbound = _EVENTS_ADAPTER.validate_python(raw)
            except ValidationError as e:
                raise _invalid(e, prefix="events") from None
            received = utcnow()
            events: list[FaultEvent] = []
            for i, item in enumerate(inbound):
                if item.source in _OTHER_PRODUCERS:
                    raise _Reject(422, f"events[{i}].source: {item.source!r} is not a source /v1/events may claim "
                                       f"(its events come from {item.source} itself); use api or chaos",
                                  field=f"events[{i}].source", events=len(inbound))
                claimed = next((p for p in _OTHER_PRODUCERS if item.id.startswith(f"{p}|")), None)
                if claimed is not None:
                    raise _Reject(422, f"events[{i}].id: ids starting {claimed}| are {claimed}'s id space",
                                  field=f"events[{i}].id", events=len(inbound))
                for owned in _NOT_A_PRODUCERS:
                    if (item.origin or {}).get(owned) is not None:
                        field = f"events[{i}].origin.{owned}"
                        raise _Reject(422, f"{field}: {_NOT_A_PRODUCERS[owned]}", field=field,
                                      events=len(inbound))
                try:
                    events.append(item.to_event(received))
                except ValidationError as e:
                    inner = {"GpuRef": "gpu.", "Origin": "origin."}.get(e.title, "")
                    err = e.errors(include_url=False)[0]
                    field = _field(err["loc"], f"events[{i}].{inner}".rstrip("."))
                    raise _Reject(422, f"{field}: {err['msg']}", field=field, events=len(inbound)) from None
            response = await self._publish("events", traceparent, events, [])
        except _Reject as r:
            self.metrics.count("events", "rejected" if r.status < 500 else "unavailable", r.events)
            response = r.response()
        self.metrics.observe("events", response.status_code, time.perf_counter() - start)
        return response

    # --- publishing ------------------------------------------------------------------------------

    async def _publish(self, endpoint: str, traceparent: str | None, events: list[FaultEvent],
                       ignored: list[AlertmanagerAlert]) -> Response:
        if events and not self.nc.is_connected:
            raise _Reject(503, "the bus is unavailable (not connected to NATS)", events=len(events),
                          headers={"Retry-After": self.retry_after})
        acks: list[PubAck | BaseException]
        if len(events) == 1:
            try:
                acks = [await publish_event(self.js, events[0], timeout=self.publish_timeout,
                                            traceparent=traceparent)]
            except asyncio.CancelledError:
                raise
            except Exception as e:
                acks = [e]
        else:
            acks = list(await asyncio.gather(
                *(publish_event(self.js, ev, timeout=self.publish_timeout, traceparent=traceparent)
                  for ev in events), return_exceptions=True))
        failures = [a for a in acks if isinstance(a, BaseException)]
        for f in failures:
            if isinstance(f, asyncio.CancelledError):
                raise f
        if failures:
            log.warning("%s: %d of %d events not acked by JetStream: %r", endpoint, len(failures), len(events),
                        failures[0])
            raise _Reject(503, f"the bus did not acknowledge {len(failures)} of {len(events)} events: "
                               f"{type(failures[0]).__name__} {failures[0]}".rstrip(),
                          events=len(events), headers={"Retry-After": self.retry_after})
        duplicates: list[FaultEvent] = []
        fresh: list[FaultEvent] = []
        for ev, ack in zip(events, acks, strict=True):
            (duplicates if isinstance(ack, PubAck) and ack.duplicate else fresh).append(ev)
        accepted = len(fresh)
        self.metrics.count(endpoint, "accepted", accepted)
        self.metrics.count(endpoint, "duplicate", len(duplicates))
        self.metrics.count(endpoint, "ignored", len(ignored))
        if self.audit is not None and (duplicates or ignored):
            await self._audit(duplicates, ignored, traceparent.split("-")[1] if traceparent else None)
        if self.on_event is not None:
            for ev in fresh:
                try:
                    result = self.on_event(ev)
                    if inspect.isawaitable(result):
                        await result
                except Exception:  # the event is persisted; a failing observer must not turn that into a 5xx
                    log.exception("on_event failed for %s", ev.id)
        body = {"accepted": accepted, "duplicates": len(duplicates), "ignored": len(ignored),
                "ids": [ev.id for ev in events]}
        return Response(orjson.dumps(body), media_type=_JSON)

    async def _audit(self, duplicates: list[FaultEvent], ignored: list[AlertmanagerAlert],
                     trace_id: str | None) -> None:
        """Audit duplicates and ignored alerts; a failure is logged, never turned into a 5xx.

        The events themselves are persisted at this point; answering 503 would only make Alertmanager
        re-send what we already have.
        """
        assert self.audit is not None
        audit = self.audit
        writes: list[Awaitable[Any]] = []
        for ev in duplicates:
            writes.append(audit.bind(AuditContext.of_event(ev, trace_id)).append(
                "duplicate_ignored", f"{ev.id} is already on FAULTS (JetStream duplicate window)"))
        for alert in ignored:
            event_id = alert_event_id(alert.fingerprint, alert.status, alert.startsAt)
            if event_id in self._ignored_seen:
                continue
            self._ignored_seen[event_id] = None
            if len(self._ignored_seen) > 8192:
                self._ignored_seen.popitem(last=False)
            name = alert.labels.get("alertname", "?")
            writes.append(audit.append(
                None, "event_ignored", f"alert {name} carries no GPU fault signal", event_id=event_id,
                fingerprint=alert.fingerprint, trace_id=trace_id,
                after={"alertname": name, "status": alert.status}))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
            if isinstance(r, BaseException):
                log.warning("ingest audit record not written: %r", r)


def create_app(*, settings: Settings, nc: NATS, js: JetStreamContext, audit: AuditLog | None = None,
               on_event: OnEvent | None = None, publish_timeout: float = 5.0, retry_after_s: int = 5,
               service_metrics: Callable[[], bytes] | None = None,
               readiness: Callable[[], dict[str, object]] | None = None) -> FastAPI:
    """The ingest API over an open NATS connection.

    ``service_metrics`` renders the rest of the replica's Prometheus series (``remediator.metrics``),
    served on ``/metrics`` after the ingest's own.
    ``audit`` receives ``duplicate_ignored`` and ``event_ignored`` records (none when None);
    ``on_event(event)`` (sync or async) is called for each newly accepted event after its ack.
    ``publish_timeout`` bounds the wait for JetStream's ack of each event before answering 503.
    ``readiness`` (``remediator.readiness.Readiness.report``) answers ``/readyz``; without it ``/readyz``
    probes the bus alone.
    The app needs no lifespan: the caller owns the connection.
    """
    ingest = _Ingest(settings, nc, js, audit, on_event, publish_timeout, retry_after_s)
    app = http_app(title="gpu-remediator ingest", version="1",
                   description="Alertmanager webhook and generic fault events onto NATS JetStream.")
    app.state.ingest = ingest
    app.state.metrics = ingest.metrics

    def body_of(schema: str) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {_JSON: {"schema": {
            "$ref": f"#/components/schemas/{schema}"}}}}, "security": [{"bearer": []}]}

    answers = {200: {"description": "every event acked (new or duplicate)",
                     "content": {_JSON: {"schema": _ANSWERS}}}, **_ERRORS}
    app.add_api_route("/v1/alertmanager", ingest.alertmanager, methods=["POST"], response_class=Response,
                      summary="Alertmanager webhook (payload version 4)", responses=answers,
                      openapi_extra=body_of("AlertmanagerPayload"))
    app.add_api_route("/v1/events", ingest.events, methods=["POST"], response_class=Response,
                      summary="A list of FaultEvents from any producer", responses=answers,
                      openapi_extra=body_of("InboundEvents"))

    def openapi() -> dict[str, Any]:
        """FastAPI's document plus what the raw-``Request`` routes cannot tell it: the request bodies'
        schemas and the bearer scheme."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            ref = "#/components/schemas/{model}"
            for name, adapter in (("AlertmanagerPayload", TypeAdapter(AlertmanagerPayload)),
                                  ("InboundEvents", _EVENTS_ADAPTER)):
                schema = adapter.json_schema(ref_template=ref)
                schemas.update(schema.pop("$defs", {}))
                schemas[name] = schema
            doc["components"]["securitySchemes"] = {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "REMEDIATOR_API_TOKENS / api_tokens_file: TOKEN or SCOPE:TOKEN (alertmanager, "
                               "events, auditor, admin)"}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", response_class=Response)
    async def healthz() -> Response:
        """The process is alive (says nothing about the bus)."""
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @app.get("/readyz", response_class=Response)
    async def readyz() -> Response:
        """200 only while every readiness condition holds (the bus, the durable consumers, the Kubernetes
        API; ``remediator.readiness``); else 503 with a JSON body naming each condition and what is wrong."""
        if readiness is not None:
            report = readiness()
            if not ingest.tokens:  # said at every start and here, for as long as it is so
                report = {**report, "auth": INSECURE_NO_AUTH}
            body = orjson.dumps(report)
            if report.get("ready"):
                return Response(body, media_type=_JSON)
            return Response(body, status_code=503, media_type=_JSON, headers={"Retry-After": str(retry_after_s)})
        extra = {"auth": INSECURE_NO_AUTH} if not ingest.tokens else {}
        if await bus_ready(nc, js):
            return Response(orjson.dumps({"ready": True, **extra}), media_type=_JSON)
        return Response(orjson.dumps({"ready": False, **extra}), status_code=503, media_type=_JSON,
                        headers={"Retry-After": str(retry_after_s)})

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text exposition of the ingest counters and latency summary."""
        body = ingest.metrics.render() + (service_metrics() if service_metrics is not None else b"")
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
