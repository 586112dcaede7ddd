"""``remediator demo --json --data-dir DIR`` end to end: every playbook family, through webhooks and through
agents, and an audit trail that ``remediator audit list --data-dir DIR`` reads back afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remediator.contracts import PLAYBOOK_NAMES

pytestmark = pytest.mark.drill

FAULT_KEYS = {"name", "kind", "code", "node", "gpu", "playbook", "actions", "outcome", "passed"}


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    store = tmp_path_factory.mktemp("demo") / "store"
    return _cli("demo", "--json", "--data-dir", str(store), timeout=150), store


@pytest.mark.timeout(180)
def test_demo_passes_and_prints_exactly_the_report(demo_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, _ = demo_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)  # stdout is exactly one JSON document
    assert set(report) == {"passed", "faults"} and report["passed"] is True
    faults = {f["name"]: f for f in report["faults"]}
    assert all(set(f) == FAULT_KEYS and f["passed"] for f in faults.values())
    # the minimum: Xid 79 sent three times, a single Xid 13, Xid 48
    assert faults["xid79-gpu-lost"]["kind"] == "xid" and faults["xid79-gpu-lost"]["code"] == 79
    assert faults["xid79-gpu-lost"]["actions"][:3] == ["taint", "cordon", "drain"]
    assert faults["xid13-single"]["playbook"] is None and faults["xid13-single"]["outcome"] == "recorded"
    assert faults["xid48-dbe"]["playbook"] == "gpu-memory-fatal"
    # every playbook family the handlers can choose is exercised, except those the demo's faults cannot reach:
    # the reboot path, a correctable-ECC rate, and a memory trend (its PyTorchJobs serve the NCCL faults; the
    # memory-leak-trend drill runs memory-leak-growth)
    exercised = {f["playbook"] for f in faults.values()} - {None}
    assert exercised >= set(PLAYBOOK_NAMES) - {"gpu-reset", "node-reboot", "ecc-correctable-rate",
                                               "memory-leak-growth"}
    assert {"webhook", "agent"} <= {line.split(" via ")[-1].strip() for line in proc.stderr.splitlines()
                                     if line.startswith("→ inject")}
    assert "audit" not in proc.stdout and "decision" in proc.stderr  # the timelines go to stderr


def _audit(store: Path, *args: str) -> list[dict[str, Any]]:
    proc = _cli("audit", "list", "--data-dir", str(store), "--json", *args, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records: list[dict[str, Any]] = json.loads(proc.stdout)
    return records


@pytest.mark.timeout(300)
def test_the_demo_store_keeps_the_xid79_incident_for_audit_list(
        demo_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, store = demo_run  # whether or not every fault passed, the store holds what happened
    assert (store / "jetstream").is_dir()
    # the Xid 79 alert's incident, found the way a reviewer would: its event, then its fingerprint
    accepted = [r for r in _audit(store, "--node", "gpu-node-2")
                if r["what"] == "event_accepted" and r["why"].startswith("xid 79 ")]
    assert len(accepted) == 1, accepted  # three notifications, one event
    fingerprint = accepted[0]["fingerprint"]
    assert fingerprint
    records = _audit(store, "--fingerprint", fingerprint)
    whats = [r["what"] for r in records]
    assert "event_accepted" in whats and whats[-1] == "playbook_finished", whats
    incidents = {r["incident"] for r in records if r["incident"] is not None}
    assert len(incidents) == 1
    (incident,) = incidents
    chain = {(r["node"], r["seq"]) for r in records}
    assert {(r["node"], r["seq"]) for r in _audit(store, "--incident", incident)} <= chain
    assert all(r["fingerprint"] == fingerprint and r["trace_id"] for r in records), [
        (r["what"], r["fingerprint"], r["trace_id"]) for r in records]
    # a second demo into the same store is refused: it would start on the first one's state
    again = _cli("demo", "--data-dir", str(store), timeout=60)
    assert again.returncode == 2 and "already holds a JetStream store" in again.stderr
