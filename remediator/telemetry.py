"""Tracing: one W3C trace from the webhook through NATS headers to every audit record (DESIGN.md §9).

Where it sits: at the edges of each hop. Ingest takes the request's ``traceparent`` (or starts a trace) and
sends it as a NATS header with the event; dispatch continues it in a ``dispatch`` span and forwards it on the
remediation message; the executor continues it from that message's headers, with a span for the run and one
per step. Each hop stamps the trace id on the audit records it writes, so ``remediator audit list`` links
every fact to the request that caused it.

The one way to continue a trace is ``span(name, headers)``: a context manager that extracts the W3C
context from a NATS (or HTTP) header map, opens a child span as the current span and yields it;
``trace_id_of(span)`` is the id audit records carry, ``traceparent_of(span)`` the header for the next hop.

``setup`` installs the OpenTelemetry SDK tracer provider (once per process; the composition root calls it,
nothing happens at import) and says where finished spans go: an OTLP/HTTP collector (the ``otlp_endpoint``
setting, batched by a ``BatchSpanProcessor``; unset: no export) and, for tests, any ``SpanExporter`` such as
the SDK's ``InMemorySpanExporter``. Without ``setup``, or with no destination, spans are non-recording but
still carry the trace they continue, each with a span id of its own, which is all the audit trail needs.

``http_app`` makes every FastAPI app of the service. FastAPI (0.142 and later) instruments an app by itself
once a tracer provider is installed: a server span per request, spans around its dependencies, endpoint
and serialization, HTTP metrics and logs. The trace of a request is this module's (ingest continues the
request's ``traceparent`` or starts one), so that instrumentation is off: it would start a second trace,
unlinked to the audit trail, for every request that came without a ``traceparent``, and it cost the
ingest endpoint a measured share of its throughput (ARCHITECTURE.md, "The ingest's share of the floor").
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

__all__ = ["NATIVE_HTTP_TELEMETRY_OFF", "TRACEPARENT", "flush", "http_app", "new_traceparent", "otlp_traces_url",
           "setup", "shutdown", "span", "trace_id_of", "traceparent_of", "tracer"]

TRACEPARENT = "traceparent"
_propagator = TraceContextTextMapPropagator()


class _Destinations(SpanProcessor):
    """The provider's one span processor: fans finished spans out to the processors ``setup`` chose last.

    The global tracer provider can be set once per process; where its spans go can change (a test swaps in
    an in-memory exporter and takes it out again), so the provider holds this and ``setup`` swaps its members.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: tuple[SpanProcessor, ...] = ()

    def replace(self, members: Sequence[SpanProcessor]) -> None:
        with self._lock:
            old, self._members = self._members, tuple(members)
        for p in old:
            p.shutdown()  # flushes what is queued

    @property
    def active(self) -> bool:
        """Whether a finished span goes anywhere (an exporter is configured)."""
        return bool(self._members)

    def on_start(self, span: SdkSpan, parent_context: otel_context.Context | None = None) -> None:
        for p in self._members:
            p.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for p in self._members:
            p.on_end(span)

    def shutdown(self) -> None:
        self.replace(())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._members)


_provider: TracerProvider | None = None
_destinations = _Destinations()
_setup_lock = threading.Lock()


# FastAPI's own telemetry settings (``FastAPI(telemetry=...)``): every part of it off.
NATIVE_HTTP_TELEMETRY_OFF: dict[str, bool] = {"tracing": False, "metrics": False, "logs": False,
                                              "operation_spans": False}


def http_app(**options: Any) -> FastAPI:
    """``FastAPI(**options)`` with FastAPI's own instrumentation off (see the module docstring); on a FastAPI
    older than that instrumentation there is nothing to turn off. FastAPI is imported here, not at the top:
    the node agent uses this module and serves no HTTP."""
    from fastapi import FastAPI

    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        options["telemetry"] = dict(NATIVE_HTTP_TELEMETRY_OFF)
    return FastAPI(**options)


def new_traceparent() -> str:
    """A fresh W3C ``traceparent`` (sampled) for a request that arrived without one: two random ids, no SDK
    on the ingest hot path; the hops after it continue the trace through real spans."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for ``endpoint``: ``/v1/traces`` is added to a bare collector address
    (``http://otel-collector:4318``), as the ``OTEL_EXPORTER_OTLP_ENDPOINT`` convention does; a URL with a
    path is taken as it is."""
    url = endpoint.strip()
    if not urlsplit(url).scheme:
        raise ValueError(f"OTLP endpoint {endpoint!r} is not a URL (expected http://HOST:4318)")
    return url if urlsplit(url).path.strip("/") else url.rstrip("/") + "/v1/traces"


def setup(service_name: str = "gpu-remediator", *, otlp_endpoint: str | None = None,
          span_exporter: SpanExporter | None = None) -> TracerProvider:
    """Install the SDK tracer provider (first call) and send finished spans to the given destinations.

    ``otlp_endpoint``: an OTLP/HTTP collector (``otlp_traces_url``), exported in batches in the background.
    ``span_exporter``: any exporter, called synchronously as each span ends (tests pass an
    ``InMemorySpanExporter`` and read ``get_finished_spans()``). Each call replaces the destinations of the
    previous one, whose queued spans are flushed first; ``setup()`` with neither exports nothing, and then
    ``span`` records nothing either: its spans carry the trace (ids, flags) and are not built by the SDK.
    ``service_name`` names the process in the first call's resource.
    """
    global _provider
    with _setup_lock:
        if _provider is None:
            from opentelemetry.sdk.resources import Resource

            provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
            provider.add_span_processor(_destinations)
            trace.set_tracer_provider(provider)
            _provider = provider
        members: list[SpanProcessor] = []
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            members.append(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_traces_url(otlp_endpoint))))
            log.info("exporting trace spans to %s", otlp_traces_url(otlp_endpoint))
        if span_exporter is not None:
            members.append(SimpleSpanProcessor(span_exporter))
        _destinations.replace(members)
        return _provider


def shutdown() -> None:
    """Flush and drop the span destinations (the provider stays: spans are still recorded)."""
    _destinations.shutdown()


def flush(timeout_s: float = 5.0) -> bool:
    """Export what the destinations hold queued (a service calls it as it stops); True when all went out."""
    return _destinations.force_flush(int(timeout_s * 1000))


@functools.cache
def tracer() -> trace.Tracer:
    """The service's tracer, made once: ``trace.get_tracer`` builds a new one on every call (12 µs here, a
    quarter of a span's cost). Made before ``setup`` it is OpenTelemetry's proxy, which takes the SDK's
    tracer once a provider is installed."""
    return trace.get_tracer("gpu-remediator")


@contextmanager
def span(name: str, headers: Mapping[str, str] | None = None,
         attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Span]:
    """A span named ``name`` that continues the trace of ``headers`` (a NATS or HTTP header map carrying
    ``traceparent``), as the current span while the block runs; spans opened inside it are its children.

    ``headers`` None or without a valid ``traceparent``: the current span's trace, else a new trace. An
    exception leaving the block is re-raised, and recorded on the span where spans go somewhere (``setup``).
    """
    ctx = _propagator.extract(carrier=dict(headers), context=otel_context.get_current()) if headers else None
    if not _destinations.active:  # nothing would see a recorded span: carry the trace, record nothing
        with _context_span(ctx) as s:
            yield s
        return
    with tracer().start_as_current_span(name, context=ctx, attributes=dict(attributes or {})) as s:
        yield s


@contextmanager
def _context_span(ctx: otel_context.Context | None) -> Iterator[Span]:
    """A span that is its trace's context alone: the parent's trace id and flags (a new trace, sampled, when
    there is no parent) and a span id of its own, so the next hop's ``traceparent`` names this hop as the SDK's
    would. Nothing is recorded: it costs a third of an SDK span, which with no exporter only ends unread."""
    parent = trace.get_current_span(ctx).get_span_context()
    if parent.is_valid:
        sc = SpanContext(parent.trace_id, _span_id(), False, parent.trace_flags, parent.trace_state)
    else:
        sc = SpanContext(_trace_id(), _span_id(), False, TraceFlags(TraceFlags.SAMPLED))
    s = NonRecordingSpan(sc)
    token = otel_context.attach(trace.set_span_in_context(s, ctx))
    try:
        yield s
    finally:
        otel_context.detach(token)


def _span_id() -> int:
    return random.getrandbits(64) or 1  # as the SDK's RandomIdGenerator; 0 is the invalid id


def _trace_id() -> int:
    return random.getrandbits(128) or 1


def trace_id_of(s: Span) -> str | None:
    """The span's trace id as 32 lower-case hex digits (what audit records carry), None for an invalid span."""
    sc = s.get_span_context()
    return f"{sc.trace_id:032x}" if sc.is_valid else None


def traceparent_of(s: Span) -> str | None:
    """The W3C ``traceparent`` header value that continues ``s`` on the next hop."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(s))
    return carrier.get(TRACEPARENT)
