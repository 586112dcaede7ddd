"""The ingest API against a real nats-server: persisted before 200, dedup, outages, bad input, auth, limits."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from remediator import bus, subjects, telemetry
from remediator.audit import AuditLog, iter_records
from remediator.audit_api.reader import AuditReader
from remediator.audit_api.routes import create_audit_app
from remediator.contracts import AuditRecord, FaultEvent
from remediator.ingest.app import create_app
from remediator.natsd import EmbeddedNats, free_port
from remediator.settings import Settings

pytestmark = pytest.mark.timeout(60)

NODE = "gpu-node-1"
SUBJECT = subjects.faults_subject("alertmanager", NODE)
TOKEN = "s3cret-token"
STARTS = "2024-05-01T03:12:00.123456789Z"  # Go's RFC3339Nano, as Alertmanager sends it


def gpu_alert(fp: str = "3fa85f6457174562", *, status: str = "firing", node: dict[str, str] | None = None,
              xid: str = "79", **labels: str) -> dict[str, Any]:
    """A dcgm-exporter Xid alert as Alertmanager forwards it."""
    return {
        "status": status,
        "labels": {"alertname": "GPUXidError", "severity": "critical", "gpu": "0", "device": "nvidia0",
                   "UUID": "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6", "pci_bus_id": "00000000:3B:00.0",
                   "modelName": "NVIDIA H100 80GB HBM3", "err_code": xid, "err_msg": "GPU has fallen off the bus",
                   "instance": "10.0.3.7:9400", "job": "dcgm-exporter",
                   **({"Hostname": NODE} if node is None else node), **labels},
        "annotations": {"summary": f"Xid {xid} on GPU 0", "description": "DCGM_FI_DEV_XID_ERRORS is non-zero"},
        "startsAt": STARTS,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS\u0026g0.tab=1",
        "fingerprint": fp,
    }


def plain_alert(fp: str = "9d1e7a0b5c3f2e11") -> dict[str, Any]:
    """An alert with no GPU signal (Alertmanager's Watchdog)."""
    return {"status": "firing", "labels": {"alertname": "Watchdog", "severity": "none"},
            "annotations": {"summary": "the alerting pipeline works"}, "startsAt": STARTS,
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": fp}


def payload(*alerts: dict[str, Any], **over: Any) -> dict[str, Any]:
    body = {"receiver": "gpu-remediator", "status": "firing", "alerts": list(alerts),
            "groupLabels": {"alertname": "GPUXidError"}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "version": "4",
            "groupKey": '{}/{severity="critical"}:{alertname="GPUXidError"}', "truncatedAlerts": 0,
            "notification_reason": "new", "some_future_field": {"x": 1}}
    body.update(over)
    return body


class Ingest:
    """One app over a provisioned bus, with an ASGI client and helpers to read the streams back."""

    def __init__(self, server: EmbeddedNats, nc: bus.NATS, js: bus.JetStreamContext, settings: Settings,
                 app_kw: dict[str, Any]) -> None:
        self.server, self.nc, self.js, self.settings = server, nc, js, settings
        self.audit = AuditLog(js, actor="test-ingest")
        self.seen: list[FaultEvent] = []
        self.app = create_app(settings=settings, nc=nc, js=js, audit=self.audit, on_event=self.seen.append,
                              **app_kw)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://ingest",
                                        headers={"Content-Type": "application/json"})  # as Alertmanager sends

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"} if self.settings.tokens else {}

    async def post(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {**self.auth(), "Content-Type": "application/json", **kw.pop("headers", {})}
        return await self.client.post(path, content=content, headers=headers, **kw)

    async def stored(self) -> list[tuple[str, dict[str, str], FaultEvent]]:
        info = await self.js.stream_info(subjects.FAULTS_STREAM)
        out = []
        if info.state.messages:
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                m = await self.js.get_msg(subjects.FAULTS_STREAM, seq)
                out.append((m.subject or "", dict(m.headers or {}), FaultEvent.model_validate_json(m.data or b"")))
        return out

    async def audit_records(self, node: str | None) -> list[AuditRecord]:
        """The records of ``node``'s chain (the cluster chain for None)."""
        chain = node or subjects.CLUSTER_TOKEN
        return [r async for r in iter_records(self.js) if r.node == chain]


MakeIngest = Callable[..., Awaitable[Ingest]]


@pytest.fixture
async def make_ingest(nats_server: EmbeddedNats) -> AsyncIterator[MakeIngest]:
    made: list[Ingest] = []

    async def make(**kw: Any) -> Ingest:
        app_kw = {k: kw.pop(k) for k in ("publish_timeout",) if k in kw}
        settings = Settings(**kw)
        nc, js = await bus.connect(nats_server.url, name="test-ingest", reconnect_time_wait=0.2)
        await bus.provision(js, settings)
        made.append(Ingest(nats_server, nc, js, settings, app_kw))
        return made[-1]

    yield make
    for ing in made:
        await ing.client.aclose()
        await ing.nc.close()


# --- the happy path, through a real uvicorn socket ---------------------------------------------------


@contextlib.asynccontextmanager
async def uvicorn_server(app: Any) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="off"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        assert not task.done() and time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_webhook_answers_200_only_once_the_event_is_on_faults(make_ingest: MakeIngest) -> None:
    ing = await make_ingest(api_tokens=TOKEN)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with uvicorn_server(ing.app) as url, httpx.AsyncClient(
            base_url=url, headers={"Content-Type": "application/json"}) as client:
        r = await client.post("/v1/alertmanager", json=payload(gpu_alert()),
                              headers={**ing.auth(), "traceparent": tp})
        # read back at once, no polling: a 200 means JetStream already holds the event
        last = await ing.js.get_last_msg(subjects.FAULTS_STREAM, SUBJECT)
    assert r.status_code == 200, r.text
    expected_id = "alertmanager|3fa85f6457174562|firing|2024-05-01T03:12:00.123456Z"
    assert r.json() == {"accepted": 1, "duplicates": 0, "ignored": 0, "ids": [expected_id]}
    assert last.headers is not None
    assert last.headers["Nats-Msg-Id"] == expected_id and last.headers["traceparent"] == tp
    ev = FaultEvent.model_validate_json(last.data or b"")
    assert ev.id == expected_id and ev.source == "alertmanager" and ev.node == NODE
    assert ev.kind == "xid" and ev.code == 79 and not ev.is_healthy
    assert ev.gpu is not None and ev.gpu.index == 0 and ev.gpu.pci_bus_id == "0000:3b:00.0"
    assert ev.gpu.uuid == "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6"
    assert ev.labels["instance"] == "10.0.3.7:9400"  # kept as a label, never used as the node
    assert ev.message.startswith("Xid 79 on GPU 0")
    assert ing.seen == [ev]


async def test_a_request_opens_no_trace_of_fastapis_own(make_ingest: MakeIngest) -> None:
    """With a tracer provider installed (as ``serve`` installs one), FastAPI's own instrumentation would record
    a server span per request and spans around its internals; the request's trace is ingest's (the
    ``traceparent`` it forwards), so none are recorded, on the ingest app and the audit app alike."""
    exporter = InMemorySpanExporter()
    telemetry.setup(span_exporter=exporter)
    try:
        # what the exporter would see of FastAPI's own: a bare app records spans for one request
        plain = FastAPI()
        plain.add_api_route("/ping", lambda: {"ok": True})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=plain), base_url="http://plain") as c:
            assert (await c.get("/ping")).status_code == 200
        native = "telemetry" in inspect.signature(FastAPI.__init__).parameters
        assert bool(exporter.get_finished_spans()) == native
        exporter.clear()

        ing = await make_ingest(api_tokens=TOKEN)
        r = await ing.post("/v1/alertmanager", payload(gpu_alert()))
        assert r.status_code == 200, r.text
        assert (await ing.client.get("/healthz")).status_code == 200
        audit_app = create_audit_app(AuditReader(ing.js, refresh_s=0.0), Settings(api_tokens=""))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=audit_app), base_url="http://audit") as c:
            assert (await c.get("/healthz")).status_code == 200
        assert [s.name for s in exporter.get_finished_spans()] == []
    finally:
        telemetry.shutdown()


async def test_the_same_alert_three_times_is_one_event(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    answers = [(await ing.post("/v1/alertmanager", payload(gpu_alert()))).json() for _ in range(3)]
    assert [(a["accepted"], a["duplicates"]) for a in answers] == [(1, 0), (0, 1), (0, 1)]
    assert len(await ing.stored()) == 1
    dups = await ing.audit_records(NODE)
    assert [r.what for r in dups] == ["duplicate_ignored", "duplicate_ignored"]
    assert dups[0].fingerprint == "3fa85f6457174562" and dups[0].event_id == answers[0]["ids"][0]
    metrics = (await ing.client.get("/metrics")).text
    assert 'remediator_ingest_events_total{endpoint="alertmanager",result="accepted"} 1' in metrics
    assert 'remediator_ingest_events_total{endpoint="alertmanager",result="duplicate"} 2' in metrics
    assert len(ing.seen) == 1


async def test_resolved_is_a_separate_healthy_event(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    await ing.post("/v1/alertmanager", payload(gpu_alert()))
    resolved = gpu_alert(status="resolved")
    resolved["endsAt"] = "2024-05-01T03:20:00Z"
    r = await ing.post("/v1/alertmanager", payload(resolved, status="resolved"))
    assert r.status_code == 200 and r.json()["accepted"] == 1
    _, _, ev = (await ing.stored())[-1]
    assert ev.id.startswith("alertmanager|3fa85f6457174562|resolved|") and ev.is_healthy and not ev.is_fatal
    assert ev.observed_at.isoformat() == "2024-05-01T03:20:00+00:00"


async def test_a_payload_publishes_all_its_gpu_alerts_and_ignores_the_rest(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    alerts = [gpu_alert(f"{i:016x}", gpu=str(i), device=f"nvidia{i}") for i in range(5)] + [plain_alert()]
    r = await ing.post("/v1/alertmanager", payload(*alerts))
    assert r.status_code == 200
    assert r.json()["accepted"] == 5 and r.json()["ignored"] == 1
    assert sorted(ev.gpu.index for _, _, ev in await ing.stored() if ev.gpu) == [0, 1, 2, 3, 4]
    (ignored,) = await ing.audit_records(None)
    assert ignored.what == "event_ignored" and ignored.fingerprint == "9d1e7a0b5c3f2e11"
    assert ignored.node == subjects.CLUSTER_TOKEN
    # Alertmanager's repeat of the same notification is not audited a second time
    r = await ing.post("/v1/alertmanager", payload(plain_alert()))
    assert r.json() == {"accepted": 0, "duplicates": 0, "ignored": 1, "ids": []}
    assert len(await ing.audit_records(None)) == 1


# --- outages ----------------------------------------------------------------------------------------


async def test_bus_down_is_503_and_the_retry_after_restart_loses_nothing(make_ingest: MakeIngest) -> None:
    ing = await make_ingest(publish_timeout=1.0)
    before = await ing.post("/v1/alertmanager", payload(gpu_alert("00000000000000aa")))
    assert before.status_code == 200

    await asyncio.to_thread(ing.server.stop)
    down = await ing.post("/v1/alertmanager", payload(gpu_alert("00000000000000bb")))
    assert down.status_code == 503 and down.headers["Retry-After"].isdigit()
    assert "bus" in down.json()["error"]
    assert (await ing.client.get("/readyz")).status_code == 503
    assert (await ing.client.get("/healthz")).status_code == 200

    await asyncio.to_thread(ing.server.start)  # same port, same store
    deadline = time.monotonic() + 15
    while (await ing.client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, "ingest did not become ready after the restart"
        await asyncio.sleep(0.1)
    retry = await ing.post("/v1/alertmanager", payload(gpu_alert("00000000000000bb")))
    assert retry.status_code == 200 and retry.json()["accepted"] + retry.json()["duplicates"] == 1
    fps = sorted(ev.id.split("|")[1] for _, _, ev in await ing.stored())
    assert fps == ["00000000000000aa", "00000000000000bb"]
    metrics = (await ing.client.get("/metrics")).text
    assert 'remediator_ingest_events_total{endpoint="alertmanager",result="unavailable"} 1' in metrics


async def test_no_stream_to_ack_is_503(make_ingest: MakeIngest) -> None:
    ing = await make_ingest(publish_timeout=1.0)
    await ing.js.delete_stream(subjects.FAULTS_STREAM)
    r = await ing.post("/v1/alertmanager", payload(gpu_alert()))
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert (await ing.client.get("/readyz")).status_code == 503


# --- bad input: a 4xx names the field and publishes nothing -------------------------------------------


def _without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


MALFORMED = [
    pytest.param(b'{"version": "4", "alerts": [', 400, "body", id="bad-json"),
    pytest.param(payload(gpu_alert(), version="3"), 422, "version", id="version-3"),
    pytest.param(payload(gpu_alert(), _without(gpu_alert("00000000000000cc"), "fingerprint")), 422,
                 "alerts[1].fingerprint", id="missing-fingerprint"),
    pytest.param(payload(gpu_alert(), gpu_alert("00000000000000dd", node={})), 422, "alerts[1].labels.node",
                 id="no-node-only-instance"),
    pytest.param(payload(gpu_alert(node={"node": "GPU_Node_1"})), 422, "alerts[0].labels.node",
                 id="node-not-rfc1123"),
    pytest.param(payload(gpu_alert(status="burning")), 422, "alerts[0].status", id="bad-status"),
    pytest.param(_without(payload(gpu_alert()), "alerts"), 422, "alerts", id="no-alerts"),
    pytest.param(b"[1, 2]", 422, "body", id="not-an-object"),
]


@pytest.mark.parametrize(("body", "status", "field"), MALFORMED)
async def test_malformed_payloads_name_the_field_and_publish_nothing(
        make_ingest: MakeIngest, body: Any, status: int, field: str) -> None:
    ing = await make_ingest()
    r = await ing.post("/v1/alertmanager", body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and field in r.json()["error"]
    assert await ing.stored() == []
    metrics = (await ing.client.get("/metrics")).text
    assert f'remediator_ingest_requests_total{{endpoint="alertmanager",code="{status}"}} 1' in metrics


# --- auth and limits ----------------------------------------------------------------------------------


async def test_bearer_tokens_guard_v1_but_not_the_probes(make_ingest: MakeIngest) -> None:
    ing = await make_ingest(api_tokens=f"{TOKEN}, second-token")
    body = json.dumps(payload(gpu_alert())).encode()
    none = await ing.client.post("/v1/alertmanager", content=body)
    assert none.status_code == 401 and none.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await ing.client.post("/v1/alertmanager", content=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
    basic = await ing.client.post("/v1/events", content=b"[]", headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert await ing.stored() == []
    ok = await ing.client.post("/v1/alertmanager", content=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    ok2 = await ing.client.post("/v1/alertmanager", content=body, headers={"Authorization": "bearer second-token"})
    assert ok2.status_code == 200 and ok2.json()["duplicates"] == 1
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await ing.client.get(path)).status_code == 200, path
    # auth runs before parsing: garbage without a token is 401, not 400
    assert (await ing.client.post("/v1/alertmanager", content=b"{garbage")).status_code == 401


async def test_oversized_bodies_are_413_declared_or_streamed(make_ingest: MakeIngest) -> None:
    ing = await make_ingest(max_body_bytes=4096)
    big = payload(*[gpu_alert(f"{i:016x}") for i in range(20)])
    r = await ing.post("/v1/alertmanager", big)
    assert r.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked transfer encoding
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]

    r = await ing.client.post("/v1/alertmanager", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert await ing.stored() == []
    assert (await ing.post("/v1/alertmanager", payload(gpu_alert()))).status_code == 200


# --- /v1/events ---------------------------------------------------------------------------------------


def api_event(n: int, **over: Any) -> dict[str, Any]:
    ev = {"id": f"scheduler|job-17|{n}", "source": "api", "node": "gpu-node-2", "kind": "nccl_timeout",
          "code": "watchdog_timeout", "gpu": {"index": 3, "pci_bus_id": "0000:5E:00.0"},
          "observed_at": "2024-05-01T03:12:00Z", "labels": {"job": "job-17", "rank": "3"},
          "producer_specific": "tolerated"}
    ev.update(over)
    return ev


async def test_events_endpoint_publishes_a_list(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    r = await ing.post("/v1/events", [api_event(1), api_event(2)])
    assert r.status_code == 200 and r.json()["accepted"] == 2
    r = await ing.post("/v1/events", api_event(1))  # one object is a list of one
    assert r.json()["duplicates"] == 1
    stored = await ing.stored()
    assert [s for s, _, _ in stored] == ["faults.api.gpu-node-2"] * 2
    assert stored[0][2].gpu is not None and stored[0][2].gpu.pci_bus_id == "0000:5e:00.0"


@pytest.mark.parametrize(("events", "field"), [
    pytest.param([api_event(1), api_event(2, node="Bad_Node")], "events[1].node", id="bad-node"),
    pytest.param([api_event(1, kind="meltdown")], "events[0].kind", id="bad-kind"),
    pytest.param([api_event(1, kind="xid", code="seventy-nine")], "events[0]", id="xid-needs-int-code"),
    pytest.param([api_event(1, gpu={"index": 0, "pci_bus_id": "zz"})], "events[0].gpu.pci_bus_id", id="bad-pci"),
    pytest.param([_without(api_event(1), "id")], "events[0].id", id="no-id"),
])
async def test_events_endpoint_rejects_bad_events_whole(make_ingest: MakeIngest, events: list[Any],
                                                        field: str) -> None:
    ing = await make_ingest()
    r = await ing.post("/v1/events", events)
    assert r.status_code == 422, r.text
    assert r.json()["field"].startswith(field)
    assert await ing.stored() == []


async def test_events_endpoint_carries_a_producers_origin(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    origin = {"pod": "trainer-3", "namespace": "ml", "pod_uid": "0c8f9b1e-6a0e-4c5f-9d8e-1f2a3b4c5d6e",
              "container": "pytorch", "job": "job-17", "a_future_field": "tolerated"}
    r = await ing.post("/v1/events", [api_event(1, origin=origin)])
    assert r.status_code == 200, r.text
    (_, _, ev), = await ing.stored()
    assert ev.origin.model_dump(exclude_none=True) == {k: v for k, v in origin.items() if k != "a_future_field"}


@pytest.mark.parametrize("owned", ["fingerprint", "history_key"])
async def test_events_endpoint_refuses_an_origin_a_producer_may_not_claim(make_ingest: MakeIngest,
                                                                           owned: str) -> None:
    ing = await make_ingest()
    r = await ing.post("/v1/events", [api_event(1), api_event(2, origin={"pod": "p", owned: "3fa85f6457174562"})])
    assert r.status_code == 422, r.text
    assert r.json()["field"] == f"events[1].origin.{owned}"
    assert await ing.stored() == []


async def test_events_endpoint_names_an_origin_field_that_is_invalid(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    r = await ing.post("/v1/events", [api_event(1, origin={"namespace": "n" * 64})])
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "events[0].origin.namespace"


async def test_a_duplicate_alert_is_audited_with_the_events_origin(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    alert = gpu_alert(exported_pod="trainer-0", exported_namespace="ml")
    alert["labels"]["training.kubeflow.org/job-name"] = "bert"
    for _ in range(2):
        await ing.post("/v1/alertmanager", payload(alert))
    (dup,) = await ing.audit_records(NODE)
    assert (dup.what, dup.fingerprint, dup.job, dup.gpu) == (
        "duplicate_ignored", "3fa85f6457174562", "bert", "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6")


async def test_metrics_exposition(make_ingest: MakeIngest) -> None:
    ing = await make_ingest()
    await ing.post("/v1/alertmanager", payload(gpu_alert()))
    await ing.post("/v1/alertmanager", b"nope")
    r = await ing.client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "# TYPE remediator_ingest_events_total counter" in text
    assert 'remediator_ingest_events_total{endpoint="alertmanager",result="rejected"} 1' in text
    assert 'remediator_ingest_requests_total{endpoint="alertmanager",code="400"} 1' in text
    assert 'remediator_ingest_request_duration_seconds_count{endpoint="alertmanager"} 2' in text
    assert 'remediator_ingest_request_duration_seconds{endpoint="alertmanager",quantile="0.99"}' in text


# --- the benchmark, as a smoke test: every 200 it counted is an event on FAULTS ------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_bench_ingest_smoke() -> None:
    from chaos.bench.ingest import run

    r = await run(concurrency=4, seconds=0.5, rounds=1, paced_rate=100, paced_seconds=1.0)
    for key in ("raw_publish_per_s", "floor_alerts_per_s", "ingest_alerts_per_s", "ratio"):
        assert isinstance(r[key], float) and r[key] > 0, (key, r)
    assert set(r["paced"]) >= {"rate", "p50_ms", "p99_ms", "errors"}
    assert r["paced"]["errors"] == 0 and r["errors"] == {"raw": 0, "floor": 0, "ingest": 0}
    assert r["ingest_acked"] == r["ingest_persisted"] > 0
