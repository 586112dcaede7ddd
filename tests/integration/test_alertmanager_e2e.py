"""End to end with a real Prometheus Alertmanager: alert → webhook → NATS → Xid handler → drain in the simulator.

Alertmanager (the Debian package) runs on a free port with clustering off and a webhook receiver that points
at the service; the alert is created through its v2 API, exactly as Prometheus would post it.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from chaos.sim import KubeApiServer, seed_cluster
from remediator import bus
from remediator.natsd import EmbeddedNats, free_port
from remediator.service import Service
from remediator.settings import Settings

TOKEN = "e2e-secret-token"


def _alertmanager_binary() -> str:
    for name in ("prometheus-alertmanager", "alertmanager"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("Prometheus Alertmanager is not installed (apt-get install prometheus-alertmanager); "
                "the end-to-end test needs the real one")


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real Alertmanager whose webhook receiver points at a port the service will listen on."""
    binary = _alertmanager_binary()
    webhook_port = free_port()
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    log = (tmp_path / "alertmanager.log").open("wb")
    config.write_text(f"""
route:
  receiver: remediator
  group_by: [alertname, Hostname, gpu]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: remediator
    webhook_configs:
      - url: http://127.0.0.1:{webhook_port}/v1/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials: {TOKEN}}}
""")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"alertmanager exited: {(tmp_path / 'alertmanager.log').read_text()}")
        time.sleep(0.1)
    else:
        proc.kill()
        proc.wait()
        log.close()
        pytest.fail("alertmanager did not become ready")
    yield f"http://127.0.0.1:{port}", webhook_port
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exporter", ["with-node-name", "without-node-name", "static-scrape"])
async def test_xid79_alert_ends_with_node_tainted_and_drained(alertmanager: tuple[str, int], tmp_path: Path,
                                                              exporter: str) -> None:
    """``without-node-name``: dcgm-exporter run without ``NODE_NAME`` calls its host by its pod's hostname, and
    the ServiceMonitor names that pod in ``pod``/``namespace``; dispatch places the alert on the pod's node.
    ``static-scrape``: the same exporter scraped with no Kubernetes labels: only ``instance``, its pod's IP and
    port, says which pod it is (dispatch finds it with the field selector ``status.podIP``)."""
    am_url, webhook_port = alertmanager
    state = seed_cluster(nodes=4)
    node = "gpu-node-2"
    host = {"Hostname": node, "instance": "10.0.0.9:9400"}
    if exporter != "with-node-name":
        exporter_pod = next(p for p in state.pods_on(node)
                            if p["metadata"]["name"].startswith("nvidia-dcgm-exporter"))
        pod = exporter_pod["metadata"]
        host = {"Hostname": pod["name"], "pod": pod["name"], "namespace": pod["namespace"],
                "instance": f"{exporter_pod['status']['podIP']}:9400"}
        if exporter == "static-scrape":
            del host["pod"], host["namespace"]
    training_before = [p for p in state.pods_on(node) if p["metadata"]["namespace"] not in
                       ("gpu-operator", "gpu-remediator")]
    assert training_before, "the simulator must seed a training pod on every node"
    with KubeApiServer(state) as kube, EmbeddedNats() as nats_server:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        settings = Settings(nats_url=nats_server.url, http=f"127.0.0.1:{webhook_port}", api_tokens=TOKEN,
                            kubeconfig=str(kubeconfig), drain_timeout_s=30, drain_grace_period_s=0)
        await bus.provision_at(nats_server.url, settings)  # serve verifies a bus it did not start
        async with Service(settings):
            alert = [{
                "labels": {"alertname": "GPUXidError", **host, "gpu": "1", "xid": "79",
                           "UUID": "GPU-11111111-2222-3333-4444-555555555555", "pci_bus_id": "00000000:3B:00.0",
                           "severity": "critical"},
                "annotations": {"summary": "Xid 79: GPU has fallen off the bus"},
                "startsAt": datetime.now(UTC).isoformat(),
            }]
            async with httpx.AsyncClient() as client:
                r = await client.post(f"{am_url}/api/v2/alerts", json=alert)
                assert r.status_code == 200, r.text
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                n = state.node(node)
                taints = {t["key"] for t in (n["spec"].get("taints") or [])}
                left = [p for p in state.pods_on(node) if p["metadata"]["uid"] in
                        {q["metadata"]["uid"] for q in training_before}]
                if settings.taint_key in taints and n["spec"].get("unschedulable") and not left:
                    break
                await asyncio.sleep(0.25)
            else:
                names = [p["metadata"]["name"] for p in left]
                pytest.fail(f"node not remediated in time: taints={taints} left={names}")
            daemonset_pods = [p for p in state.pods_on(node) if p["metadata"]["namespace"] in
                              ("gpu-operator", "gpu-remediator")]
            assert daemonset_pods, "drain must leave DaemonSet pods alone"
            others = [state.node(f"gpu-node-{i}") for i in (0, 1, 3)]
            assert not any(o["spec"].get("unschedulable") for o in others), "only the failing node is touched"
            async with httpx.AsyncClient() as client:
                for _ in range(50):  # the escalate step and the run's end follow the drain
                    metrics = (await client.get(f"http://127.0.0.1:{webhook_port}/metrics")).text
                    if "remediator_playbook_runs_total" in metrics:
                        break
                    await asyncio.sleep(0.2)
            assert 'remediator_decisions_total{playbook="gpu-lost"} 1' in metrics
            assert 'remediator_steps_total{step="drain",result="succeeded"} 1' in metrics
            assert 'remediator_playbook_runs_total{playbook="gpu-lost",outcome="escalated"} 1' in metrics
            assert "remediator_decision_to_first_action_seconds_count 1" in metrics


async def test_one_trace_from_webhook_to_the_audit_trail(tmp_path: Path) -> None:
    """A webhook without a traceparent starts a trace; dispatch continues it into the audit records."""
    from remediator.audit import iter_records

    state = seed_cluster(nodes=2)
    with KubeApiServer(state) as kube, EmbeddedNats() as nats_server:
        settings = Settings(nats_url=nats_server.url, http=f"127.0.0.1:{free_port()}",
                            kubeconfig=str(kube.write_kubeconfig(tmp_path / "kubeconfig")), drain_grace_period_s=0)
        await bus.provision_at(nats_server.url, settings)  # serve verifies a bus it did not start
        async with Service(settings) as service, httpx.AsyncClient() as client:
            trace = "0af7651916cd43dd8448eb211c80319c"
            payload = {"version": "4", "status": "firing", "alerts": [{
                "status": "firing", "fingerprint": "f00d", "startsAt": "2026-11-30T03:12:00Z",
                "labels": {"alertname": "GPUXidError", "Hostname": "gpu-node-1", "gpu": "0", "xid": "13"}}]}
            r = await client.post(f"{service.http_url}/v1/alertmanager", json=payload,
                                  headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
            assert r.status_code == 200, r.text
            assert service.js is not None
            for _ in range(100):
                records = [x async for x in iter_records(service.js, "gpu-node-1")]
                if any(x.what == "event_ignored" for x in records):
                    break
                await asyncio.sleep(0.1)
            assert {x.trace_id for x in records} == {trace}
