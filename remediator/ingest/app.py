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
401                    ``/v1/*`` without a valid bearer token while tokens are configured
413                    the body is larger than ``max_body_bytes`` (Content-Length or streamed)
422                    the JSON is not a valid payload; ``field`` names the culprit
                       (``version``, ``alerts[2].fingerprint``, ``alerts[0].labels.node``,
                       ``events[0].origin.fingerprint``: only ingest sets a fingerprint)
503 + Retry-After      the bus is down or did not ack in time; Alertmanager retries 5xx only
=====================  =========================================================================

Order of checks: auth, then size, then parsing; every alert is validated before anything is published, so a
4xx publishes nothing. Alerts with no GPU signal are accepted and written to the cluster audit chain once
(``event_ignored``); duplicates (JetStream's ``PubAck.duplicate``) are written to the node's chain
(``duplicate_ignored``), bound to the event's provenance (``AuditContext.of_event``: fingerprint, job, GPU,
trace). The ``event_accepted`` record is the dispatcher's, written when it takes the event.

The hot path is one ``model_validate_json`` of the payload (pydantic-core parses and validates in one pass),
one ``FaultEvent`` per alert and one JetStream publish per event, the publishes of one payload in flight
together. Routes take the raw ``Request``: FastAPI's body models would parse the same bytes twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck
from pydantic import TypeAdapter, ValidationError

from remediator.audit import AuditContext, AuditLog
from remediator.bus import bus_ready, publish_event
from remediator.contracts import AlertmanagerAlert, AlertmanagerPayload, FaultEvent, InboundEvent, utcnow
from remediator.ingest.alerts import AlertError, alert_event_id, alert_to_event
from remediator.settings import Settings
from remediator.telemetry import new_traceparent

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
        # Tokens compared as SHA-256 digests: equal lengths, so compare_digest leaks nothing about them.
        self.token_digests = [hashlib.sha256(t.encode()).digest() for t in sorted(settings.tokens)]
        self.metrics = IngestMetrics()
        # Alertmanager re-sends a firing group every repeat_interval: audit an ignored alert once per
        # notification id, not on every repeat (bounded; a restart audits it once more, which is harmless).
        self._ignored_seen: OrderedDict[str, None] = OrderedDict()

    # --- guards ----------------------------------------------------------------------------------

    def _authorize(self, header: bytes | None) -> None:
        if not self.token_digests:
            return
        scheme, _, token = (header or b"").partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise _Reject(401, "a bearer token is required",
                          headers={"WWW-Authenticate": 'Bearer realm="remediator"'})
        given = hashlib.sha256(token).digest()
        ok = False
        for digest in self.token_digests:  # no early exit: the time taken does not say which token matched
            ok |= hmac.compare_digest(given, digest)
        if not ok:
            raise _Reject(401, "invalid bearer token",
                          headers={"WWW-Authenticate": 'Bearer realm="remediator", error="invalid_token"'})

    async def _read(self, request: Request) -> tuple[bytes, str | None]:
        """Auth, then the size limit, then the body; returns the body and a valid ``traceparent`` or None.

        One pass over the raw ASGI headers (names are lower case there) instead of three lookups.
        """
        auth = length = traceparent = None
        for name, value in request.scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"content-length":
                length = value
            elif name == b"traceparent":
                traceparent = value
        self._authorize(auth)
        if length is not None:
            if not length.isdigit():
                raise _Reject(400, "Content-Length is not a number", field="Content-Length")
            if int(length) > self.max_body:
                raise _Reject(413, f"body of {int(length)} bytes is over the limit of {self.max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        receive = request.receive
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
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        tp = traceparent.decode("latin-1") if traceparent is not None else None
        # a request without a (valid) trace starts one: the audit records it causes all carry its id
        return body, tp if tp is not None and _TRACEPARENT.fullmatch(tp) else new_traceparent()

    # --- endpoints -------------------------------------------------------------------------------

    async def alertmanager(self, request: Request) -> Response:
        """Alertmanager webhook payload version 4; one event per GPU alert, answered once persisted."""
        start = time.perf_counter()
        try:
            body, traceparent = await self._read(request)
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
            body, traceparent = await self._read(request)
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
    app = FastAPI(title="gpu-remediator ingest", version="1",
                  description="Alertmanager webhook and generic fault events onto NATS JetStream.")
    app.state.ingest = ingest
    app.state.metrics = ingest.metrics

    app.add_api_route("/v1/alertmanager", ingest.alertmanager, methods=["POST"], response_class=Response,
                      summary="Alertmanager webhook (payload version 4)")
    app.add_api_route("/v1/events", ingest.events, methods=["POST"], response_class=Response,
                      summary="A list of FaultEvents from any producer")

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
            body = orjson.dumps(report)
            if report.get("ready"):
                return Response(body, media_type=_JSON)
            return Response(body, status_code=503, media_type=_JSON, headers={"Retry-After": str(retry_after_s)})
        if await bus_ready(nc, js):
            return Response(b'{"ready":true}', media_type=_JSON)
        return Response(b'{"ready":false}', status_code=503, media_type=_JSON,
                        headers={"Retry-After": str(retry_after_s)})

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text exposition of the ingest counters and latency summary."""
        body = ingest.metrics.render() + (service_metrics() if service_metrics is not None else b"")
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
