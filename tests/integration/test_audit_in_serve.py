"""``remediator serve`` mounts the read-only audit API and view beside ingest, behind the auditor scope."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from chaos.sim import KubeApiServer, seed_cluster
from remediator.natsd import EmbeddedNats, free_port
from tests.integration.serve_support import wait_ready


def test_serve_mounts_the_audit_api_and_view(tmp_path: Path) -> None:
    with KubeApiServer(seed_cluster(nodes=2)) as kube, EmbeddedNats() as nats_server:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        port = free_port()
        env = {**os.environ, "REMEDIATOR_API_TOKENS": "auditor:aud-t0k3n"}
        subprocess.run([sys.executable, "-m", "remediator.cli", "bus", "init", "--nats", nats_server.url],
                       env=env, check=True, capture_output=True, timeout=60)
        proc = subprocess.Popen(
            [sys.executable, "-m", "remediator.cli", "serve", "--kubeconfig", str(kubeconfig),
             "--nats", nats_server.url, "--http", f"127.0.0.1:{port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(proc, base, timeout_s=30)
            auth = {"Authorization": "Bearer aud-t0k3n"}
            assert httpx.get(f"{base}/v1/audit/incidents").status_code == 401
            body = httpx.get(f"{base}/v1/audit/incidents", headers=auth).json()
            assert body == {"incidents": [], "total": 0, "next_cursor": None}  # a fresh bus: nothing audited
            assert httpx.get(f"{base}/v1/audit/chains", headers=auth).json()["ok"] is True
            assert httpx.post(f"{base}/v1/audit/incidents", headers=auth).status_code == 405
            page = httpx.get(f"{base}/audit/", cookies={"remediator_audit_token": "aud-t0k3n"})
            assert page.status_code == 200 and "<h1>Incidents</h1>" in page.text
            assert "/v1/audit/incidents" in httpx.get(f"{base}/openapi.json").json()["paths"]
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
