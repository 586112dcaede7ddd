"""``remediator demo --json`` end to end: every playbook family, through webhooks and through agents."""

from __future__ import annotations

import json
import subprocess
import sys

from remediator.contracts import PLAYBOOK_NAMES

FAULT_KEYS = {"name", "kind", "code", "node", "gpu", "playbook", "actions", "outcome", "passed"}


def test_demo_passes_and_prints_exactly_the_report() -> None:
    proc = subprocess.run([sys.executable, "-m", "remediator.cli", "demo", "--json"], capture_output=True,
                          text=True, timeout=150)
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
    # every playbook family the handlers can choose is exercised except the two that need a reboot path
    exercised = {f["playbook"] for f in faults.values()} - {None}
    assert exercised >= set(PLAYBOOK_NAMES) - {"gpu-reset", "node-reboot", "ecc-correctable-rate"}
    assert {"webhook", "agent"} <= {line.split(" via ")[-1].strip() for line in proc.stderr.splitlines()
                                     if line.startswith("→ inject")}
    assert "audit" not in proc.stdout and "decision" in proc.stderr  # the timelines go to stderr
