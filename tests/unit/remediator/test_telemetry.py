"""Tracing: spans continue the trace of a NATS header map, are captured by a test exporter, and reach an
OTLP/HTTP collector when an endpoint is configured."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from remediator import telemetry

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
HEADERS = {"Nats-Msg-Id": "decision|inc-1", "traceparent": f"00-{TRACE}-{PARENT}-01"}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    mem = InMemorySpanExporter()
    telemetry.setup(span_exporter=mem)
    yield mem
    telemetry.shutdown()


def test_a_span_continues_the_trace_of_the_headers_and_children_nest(exporter: InMemorySpanExporter) -> None:
    with telemetry.span("executor.run", HEADERS, attributes={"incident": "inc-1"}) as run:
        assert telemetry.trace_id_of(run) == TRACE
        with telemetry.span("executor.step", attributes={"step": "drain"}) as step:
            assert telemetry.trace_id_of(step) == TRACE
        next_hop = telemetry.traceparent_of(run)
    assert next_hop is not None and next_hop.split("-")[1] == TRACE
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"executor.run", "executor.step"}
    run_span, step_span = spans["executor.run"], spans["executor.step"]
    assert run_span.parent is not None and f"{run_span.parent.span_id:016x}" == PARENT
    assert step_span.parent is not None and step_span.parent.span_id == run_span.context.span_id
    assert step_span.attributes == {"step": "drain"}


def test_headers_without_a_traceparent_start_a_new_trace(exporter: InMemorySpanExporter) -> None:
    with telemetry.span("dispatch", {"Nats-Msg-Id": "x"}) as sp:
        tid = telemetry.trace_id_of(sp)
    assert tid is not None and tid != TRACE and len(tid) == 32
    (finished,) = exporter.get_finished_spans()
    assert finished.parent is None


def test_an_exception_is_recorded_on_the_span_and_re_raised(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), telemetry.span("executor.step", HEADERS):
        raise RuntimeError("drain timed out")
    (finished,) = exporter.get_finished_spans()
    assert not finished.status.is_ok
    assert [e.name for e in finished.events] == ["exception"]


def test_without_a_destination_a_span_still_carries_the_trace_with_a_span_id_of_its_own() -> None:
    """``setup()`` with no exporter: nothing would read a recorded span, so none is built, yet each hop still
    continues the trace, names itself as the next hop's parent, and keeps the parent's sampled flag."""
    telemetry.setup()
    with telemetry.span("dispatch", HEADERS) as sp:
        assert not sp.is_recording()
        assert telemetry.trace_id_of(sp) == TRACE
        with telemetry.span("step drain") as child:
            assert telemetry.trace_id_of(child) == TRACE
            inner = telemetry.traceparent_of(child)
        hop = telemetry.traceparent_of(sp)
    assert hop is not None and inner is not None
    version, trace_id, parent, flags = hop.split("-")
    assert (version, trace_id, flags) == ("00", TRACE, "01") and parent not in (PARENT, "0" * 16)
    assert inner.split("-")[2] not in (parent, PARENT)
    unsampled = {"traceparent": f"00-{TRACE}-{PARENT}-00"}
    with telemetry.span("dispatch", unsampled) as sp:
        assert (telemetry.traceparent_of(sp) or "").endswith("-00")
    with telemetry.span("dispatch", {"Nats-Msg-Id": "x"}) as sp:
        fresh = telemetry.trace_id_of(sp)
        assert fresh is not None and fresh != TRACE and (telemetry.traceparent_of(sp) or "").endswith("-01")
    with pytest.raises(RuntimeError), telemetry.span("executor.step", HEADERS):
        raise RuntimeError("drain timed out")
    assert telemetry.trace_id_of(trace.get_current_span()) is None  # the context is restored after each


@pytest.mark.parametrize(("endpoint", "url"), [
    ("http://otel-collector:4318", "http://otel-collector:4318/v1/traces"),
    ("http://otel-collector:4318/", "http://otel-collector:4318/v1/traces"),
    ("https://collector.example/otlp/v1/traces", "https://collector.example/otlp/v1/traces"),
], ids=["bare", "slash", "path"])
def test_otlp_traces_url(endpoint: str, url: str) -> None:
    assert telemetry.otlp_traces_url(endpoint) == url


def test_otlp_endpoint_that_is_not_a_url_is_refused() -> None:
    with pytest.raises(ValueError, match="not a URL"):
        telemetry.otlp_traces_url("otel-collector")


def test_spans_are_exported_to_an_otlp_http_collector() -> None:
    received: list[tuple[str, str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = telemetry.setup(otlp_endpoint=f"http://127.0.0.1:{server.server_port}")
        with telemetry.span("dispatch", HEADERS):
            pass
        assert provider.force_flush(10_000)
    finally:
        telemetry.shutdown()
        server.shutdown()
        server.server_close()
    assert received, "no OTLP request reached the collector"
    path, content_type, body = received[0]
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [(s.name, s.trace_id.hex()) for s in spans] == [("dispatch", TRACE)]


def test_importing_the_module_installs_nothing() -> None:
    code = ("import remediator.telemetry\nfrom opentelemetry import trace\n"
            "print(type(trace.get_tracer_provider()).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "ProxyTracerProvider"


def test_the_tracer_is_made_once_and_records_once_a_provider_is_installed() -> None:
    """``tracer()`` is cached; one taken before ``setup`` (the proxy) still records after it."""
    code = ("from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
            "from remediator import telemetry\n"
            "early = telemetry.tracer()\n"
            "mem = InMemorySpanExporter()\n"
            "telemetry.setup(span_exporter=mem)\n"
            "with telemetry.span('after-setup'):\n"
            "    pass\n"
            "print(telemetry.tracer() is early, [s.name for s in mem.get_finished_spans()])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "True ['after-setup']"
