"""Support of the audit API and view tests: a demo's store, read back by the CLI, then served by
``remediator audit serve --data-dir DIR --http 127.0.0.1:P`` in a subprocess (a real nats-server on the
store, a real uvicorn), as a duty manager would run it after an incident."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

AUDITOR_TOKEN = "auditor-token-for-tests"
ADMIN_TOKEN = "admin-token-for-tests"
EVENTS_TOKEN = "events-token-for-tests"
TOKENS = f"auditor:{AUDITOR_TOKEN},admin:{ADMIN_TOKEN},events:{EVENTS_TOKEN}"


def cli(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DemoStore:
    """A store the demo left, what the demo reported, and the CLI's reading of it (before it is served)."""

    path: Path
    report: dict[str, Any]
    records: list[dict[str, Any]]  # `audit list --json`: every record, in stream order
    xid79: dict[str, Any]  # the demo's Xid 79 fault
    xid79_incident: str
    xid79_show: list[dict[str, Any]]  # `audit show <id> --json`


def run_demo(store: Path) -> DemoStore:
    proc = cli("demo", "--json", "--data-dir", str(store), timeout=170)
    # the review needs the demo's store and its Xid 79 incident; the demo's own test judges every fault
    assert proc.returncode in (0, 1) and proc.stdout.strip(), proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    xid79 = next((f for f in report["faults"] if f["kind"] == "xid" and f["code"] == 79), None)
    assert xid79 is not None and xid79["passed"], proc.stderr[-4000:]
    listed = cli("audit", "list", "--data-dir", str(store), "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)
    incident = next(r["incident"] for r in records if r["incident"] and r["node"] == xid79["node"]
                    and r["what"] == "decision")
    shown = cli("audit", "show", incident, "--data-dir", str(store), "--json", timeout=60)
    assert shown.returncode == 0, shown.stderr
    return DemoStore(store, report, records, xid79, incident, json.loads(shown.stdout))


@dataclass
class Served:
    base: str
    nats_url: str
    proc: subprocess.Popen[str]


@contextlib.contextmanager
def audit_serve(store: Path, *, tokens: str | None = TOKENS) -> Iterator[Served]:
    """``remediator audit serve --data-dir store`` until the block ends; the URL it serves and the bus it
    reads (printed on its standard error)."""
    port = free_port()
    env = {**os.environ, "REMEDIATOR_API_TOKENS": tokens or ""}
    args = [sys.executable, "-m", "remediator.cli", "audit", "serve", "--data-dir", str(store),
            "--http", f"127.0.0.1:{port}"] + ([] if tokens else ["--insecure-no-auth"])
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        assert proc.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if "audit API and view on" in line or not line:
                break
        m = re.search(r"reading (nats://\S+)\)", line)
        assert m, f"audit serve did not start: {line!r} (rc={proc.poll()})"
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield Served(base, m.group(1), proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        # SIGTERM stops the embedded nats-server it opened on the store too (none left holding the store)
        assert not servers_on(store), f"audit serve left nats-server running on {store}: {servers_on(store)}"


def servers_on(store: Path) -> list[int]:
    """PIDs of the nats-server processes whose command line names ``store`` (Linux /proc)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nats-server") and any(str(store).encode() in a for a in argv):
            pids.append(int(cmdline.parent.name))
    return pids
