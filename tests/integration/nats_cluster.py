"""Support for tests on the production bus shape: three clustered nats-servers and ``serve`` replicas as
real subprocesses against the simulated Kubernetes API.

Where it sits: beside ``conftest.py`` (whose ``nats_cluster`` fixture is a ``chaos.nats_cluster.NatsCluster``);
used by ``test_nats_cluster.py``, ``test_readiness.py`` and ``test_edges.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from remediator.natsd import free_port

TOKEN = "cluster-test-token"
CLI = [sys.executable, "-m", "remediator.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: fast drains and hold-downs, a token, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATOR_")}
    env.update({"REMEDIATOR_API_TOKENS": TOKEN, "REMEDIATOR_DRAIN_GRACE_PERIOD_S": "0",
                "REMEDIATOR_DRAIN_TIMEOUT_S": "30", "REMEDIATOR_VERIFY_HOLD_DOWN_S": "1",
                "REMEDIATOR_VERIFY_INTERVAL_S": "0.25", "REMEDIATOR_NAK_DELAY_S": "0.5",
                "REMEDIATOR_READINESS_INTERVAL_S": "0.5", "REMEDIATOR_READINESS_TIMEOUT_S": "1"})
    env.update(extra)
    return env


def bus_init(url: str, *args: str, env: dict[str, str] | None = None,
             timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "bus", "init", "--nats", url, *args], env=env or cli_env(), text=True,
                          capture_output=True, timeout=timeout)


@dataclass
class ServeProcess:
    """One ``remediator serve`` subprocess; its stderr goes to a file (read with ``log``)."""

    proc: subprocess.Popen[str]
    port: int
    log_path: Path
    name: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readyz(self) -> tuple[int, dict[str, Any]]:
        try:
            r = httpx.get(f"{self.base}/readyz", timeout=2)
        except httpx.HTTPError:
            return 0, {}
        return r.status_code, (r.json() if r.content else {})

    def wait_ready(self, timeout: float = 60) -> float:
        """Seconds until ``/readyz`` answered 200; fails with the replica's log otherwise."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.readyz()[0] == 200:
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not ready within {timeout}s: {self.readyz()}\n{self.log()[-4000:]}")

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """Killed if still running (a test that failed midway leaves no process for a later test's
        ResourceWarning)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def terminate(self, timeout: float = 60) -> float:
        """SIGTERM, then the seconds until it exited."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"{self.name} ignored SIGTERM for {timeout}s:\n{self.log()[-3000:]}") from None
        return time.monotonic() - t0


def start_serve(tmp: Path, name: str, nats_url: str, kubeconfig: Path, *args: str,
                env: dict[str, str] | None = None) -> ServeProcess:
    port = free_port()
    log_path = tmp / f"{name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*CLI, "serve", "--kubeconfig", str(kubeconfig), "--nats", nats_url, "--http", f"127.0.0.1:{port}",
             *args], env={**(env or cli_env()), "REMEDIATOR_REPLICA_ID": name}, stdout=subprocess.DEVNULL,
            stderr=log, text=True)
    return ServeProcess(proc, port, log_path, name)


def xid_alert(node: str, gpu: int, xid: int, fingerprint: str) -> dict[str, Any]:
    """An Alertmanager (version 4) notification of one dcgm-exporter Xid alert."""
    starts = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    alert = {"status": "firing", "labels": {"alertname": "GPUXidError", "Hostname": node, "gpu": str(gpu),
                                            "device": f"nvidia{gpu}", "xid": str(xid), "severity": "critical"},
             "annotations": {"summary": f"Xid {xid} on GPU {gpu} of {node}"}, "startsAt": starts,
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus:9090/graph",
             "fingerprint": fingerprint}
    return {"version": "4", "groupKey": "{}:{alertname=\"GPUXidError\"}", "truncatedAlerts": 0,
            "status": "firing", "receiver": "gpu-remediator", "groupLabels": {"alertname": "GPUXidError"},
            "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
            "alerts": [alert]}


def post_alert(replica: ServeProcess, payload: dict[str, Any], timeout: float = 5) -> int:
    try:
        return httpx.post(f"{replica.base}/v1/alertmanager", json=payload, timeout=timeout,
                          headers={"Authorization": f"Bearer {TOKEN}"}).status_code
    except httpx.HTTPError:
        return 0
