"""Tracing: one W3C trace from the webhook through NATS headers to every audit record (DESIGN.md §9).

Where it sits: at the edges of each hop. Ingest starts a span per request and sends its ``traceparent`` as a
NATS header with the event; dispatch and the executor continue that trace and stamp its id on the audit
records they write, so ``remediator audit list`` links each fact to the request that caused it.

The OpenTelemetry SDK is configured once per process by ``setup_tracing``; without an exporter the spans are
still created (their ids are what the audit trail needs) and simply not shipped anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
_propagator = TraceContextTextMapPropagator()
_configured = False


def new_traceparent() -> str:
    """A fresh W3C ``traceparent`` (sampled) for a request that arrived without one: two random ids, no SDK
    on the ingest hot path; the hops after it continue the trace through real spans."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def setup_tracing(service_name: str = "gpu-remediator") -> None:
    """Install an SDK tracer provider once (exporters come from the standard OTEL_* variables, if any)."""
    global _configured
    if _configured:
        return
    from opentelemetry.sdk.resources import Resource

    trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": service_name})))
    _configured = True


def tracer() -> trace.Tracer:
    return trace.get_tracer("gpu-remediator")


@contextmanager
def span(name: str, headers: Mapping[str, str] | None = None) -> Iterator[Span]:
    """A span that continues the trace of ``headers`` (a NATS or HTTP header map) when it carries one."""
    ctx = _propagator.extract(carrier=dict(headers or {}))
    with tracer().start_as_current_span(name, context=ctx) as s:
        yield s


def trace_id_of(s: Span) -> str | None:
    sc = s.get_span_context()
    return f"{sc.trace_id:032x}" if sc.is_valid else None


def traceparent_of(s: Span) -> str | None:
    """The W3C ``traceparent`` header value that continues ``s`` on the next hop."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(s))
    return carrier.get(TRACEPARENT)
