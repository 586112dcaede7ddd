"""Provenance end to end (issue 8): one Xid 79 alert with a fingerprint and a ``traceparent``, through the
service on the simulated cluster, leaves an incident whose every audit record carries that fingerprint and
that trace, the trace's spans run from dispatch through the executor's steps, and ``remediator audit list
--fingerprint`` returns the whole incident."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chaos.sim import KubeApiServer, seed_cluster
from remediator import bus, telemetry
from remediator.audit import iter_records
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats, free_port
from remediator.service import Service
from remediator.settings import Settings

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
FP = "7f3ac2d1e9b04a55"
NODE = "gpu-node-1"


def xid79_payload() -> dict[str, object]:
    return {"version": "4", "status": "firing", "receiver": "gpu-remediator", "alerts": [{
        "status": "firing", "fingerprint": FP, "startsAt": "2026-11-30T03:12:00Z",
        "labels": {"alertname": "GPUXidError", "Hostname": NODE, "gpu": "0", "xid": "79",
                   "UUID": "GPU-11111111-2222-3333-4444-555555555555", "job": "dcgm-exporter"},
        "annotations": {"summary": "Xid 79: GPU has fallen off the bus"}}]}


@pytest.mark.timeout(120)
async def test_one_alert_one_fingerprint_one_trace_through_the_whole_incident(tmp_path: Path) -> None:
    state = seed_cluster(nodes=2)
    spans = InMemorySpanExporter()
    with KubeApiServer(state) as kube, EmbeddedNats() as nats_server:
        settings = Settings(nats_url=nats_server.url, http=f"127.0.0.1:{free_port()}",
                            kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
                            drain_grace_period_s=0, drain_timeout_s=30)
        await bus.provision_at(nats_server.url, settings)  # serve verifies a bus it did not start
        async with Service(settings) as service, httpx.AsyncClient() as client:
            telemetry.setup(span_exporter=spans)  # after the service's own setup, which sets no destination
            try:
                r = await client.post(f"{service.http_url}/v1/alertmanager", json=xid79_payload(),
                                      headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
                assert r.status_code == 200, r.text
                (event_id,) = r.json()["ids"]
                assert service.js is not None
                records: list[AuditRecord] = []
                for _ in range(300):
                    records = [x async for x in iter_records(service.js)]  # every chain
                    if any(x.what == "playbook_finished" for x in records):
                        break
                    await asyncio.sleep(0.2)
                else:
                    pytest.fail(f"the incident did not finish: {[x.what for x in records]}")
            finally:
                telemetry.shutdown()
            (incident,) = {x.incident for x in records if x.what == "decision"}
            assert incident is not None
            trail = [x for x in records if x.incident == incident or x.event_id == event_id]
            whats = [x.what for x in trail]
            assert whats[0] == "event_accepted" and whats[-1] == "playbook_finished"
            assert {"decision", "guard_verdict", "step_started", "step_succeeded"} <= set(whats)
            off = [(x.what, x.fingerprint, x.trace_id) for x in trail if (x.fingerprint, x.trace_id) != (FP, TRACE)]
            assert off == [], "records of the incident without its fingerprint or trace"
            assert {x.event_id for x in trail} == {event_id}

            out = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "remediator.cli", "audit", "list", "--nats", nats_server.url,
                 "--fingerprint", FP, "--json"],
                capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            listed = [AuditRecord.model_validate(x) for x in json.loads(out.stdout)]
            assert [x.hash for x in listed] == [x.hash for x in trail]

    traced = [s for s in spans.get_finished_spans() if s.context is not None
              and f"{s.context.trace_id:032x}" == TRACE]
    names = [s.name for s in traced]
    assert "dispatch" in names and "executor.run" in names
    assert len(traced) >= 2 + whats.count("step_started"), names  # dispatch, the run, one per step
