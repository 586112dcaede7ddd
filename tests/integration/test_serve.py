"""``remediator serve`` as an operator runs it: a subprocess against the simulator, stopped by SIGTERM."""

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


def test_serve_runs_until_sigterm(tmp_path: Path) -> None:
    with KubeApiServer(seed_cluster(nodes=2)) as kube, EmbeddedNats() as nats_server:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        port = free_port()
        env = {**os.environ, "REMEDIATOR_API_TOKENS": "t0k3n"}
        # serve only verifies a bus it did not start: the operator provisions it first
        subprocess.run([sys.executable, "-m", "remediator.cli", "bus", "init", "--nats", nats_server.url],
                       env=env, check=True, capture_output=True, timeout=60)
        proc = subprocess.Popen(
            [sys.executable, "-m", "remediator.cli", "serve", "--kubeconfig", str(kubeconfig),
             "--nats", nats_server.url, "--http", f"127.0.0.1:{port}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(proc, base, timeout_s=30)
            assert httpx.get(f"{base}/healthz").status_code == 200
            assert httpx.post(f"{base}/v1/events", json=[]).status_code == 401  # a token is configured
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
        assert "serving on" in err
