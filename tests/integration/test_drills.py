"""Every shipped chaos drill passes, and ``remediator drill`` speaks DESIGN.md §10.

Each drill starts its own embedded nats-server, simulated cluster, agents and service replica(s), plays its
timeline (faults plus broken machinery: NATS restarts, Kubernetes API errors, a killed replica, an agent
down, people overriding) and judges its expectations against the cluster, the GPUs and the audit trail.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaos.catalog import drill_paths, get_drill
from chaos.runner import run_drill

DRILLS = [p.stem for p in drill_paths()]


@pytest.mark.drill
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", DRILLS)
async def test_the_drill_passes(name: str) -> None:
    drill = get_drill(name)
    progress: list[str] = []
    report = await run_drill(drill, progress.append)
    failed = [f"{v.what}: {v.detail}" for v in report.expectations if not v.passed]
    assert report.passed, "\n".join(["failed:", *failed, "progress:", *progress[-40:]])
    # every fault of the timeline was followed to rest and judged on its own
    fault_verdicts = [v for v in report.expectations if v.what.startswith("fault ") and " within " in v.what]
    assert len(fault_verdicts) == len(report.results) > 0
    assert all(r.outcome != "pending" and r.rest_at is not None for r in report.results)
    assert any(v.what == "the audit chains verify" for v in report.expectations)
    assert report.seconds < 45, f"{name} took {report.seconds:.1f}s"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", "drill", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_drill_list_json_names_every_shipped_drill() -> None:
    proc = _cli("list", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [d["name"] for d in listed] == DRILLS
    assert all(set(d) == {"name", "description"} and len(d["description"]) > 40 for d in listed)


@pytest.mark.drill
@pytest.mark.timeout(90)
def test_drill_run_json_prints_exactly_the_report() -> None:
    proc = _cli("run", "opt-out-node", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)  # stdout is exactly one JSON document
    assert set(doc) == {"passed", "drills"} and doc["passed"] is True
    (drill,) = doc["drills"]
    assert set(drill) == {"name", "passed", "seconds", "expectations"} and drill["name"] == "opt-out-node"
    assert drill["expectations"] and all(set(e) == {"what", "passed", "detail"} and e["passed"]
                                         for e in drill["expectations"])
    assert "[PASS] opt-out-node" in proc.stderr and "[PASS]" not in proc.stdout  # progress goes to stderr


def test_drill_run_refuses_unknown_names_and_an_empty_selection() -> None:
    unknown = _cli("run", "no-such-drill", timeout=60)
    assert unknown.returncode == 2 and "no drill named 'no-such-drill'" in unknown.stderr
    assert "opt-out-node" in unknown.stderr  # it says which drills exist
    assert unknown.stdout == ""
    nothing = _cli("run", timeout=60)
    assert nothing.returncode == 2 and "--all" in nothing.stderr
