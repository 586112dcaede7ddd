"""``remediator drill run NAME|FILE --kubeconfig FILE`` against a cluster reached only over its HTTP API: the
simulator runs as its own process (``remediator sim``), the drill sees it exactly as it would see a real
cluster (kubeconfig, Kubernetes API), and the nodes are confirmed for drills with the real ``kubectl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

NODES = [f"gpu-node-{i}" for i in range(8)]
USER_DRILL = """\
version: 1
name: my-xid79
description: An Xid 79 on gpu-node-1 quarantines and drains it; every other node is left alone.
timeline:
  - at_s: 0
    fault: {name: lost, type: webhook_xid, node: gpu-node-1, gpu: 5, code: 79}
expect:
  deadline_s: 30
  faults:
    lost: {playbook: gpu-lost, outcomes: [escalated], actions: [taint, cordon, drain, escalate], check: [node_drained]}
  cluster: {tainted: [gpu-node-1], cordoned: [gpu-node-1], drained: [gpu-node-1]}
  audit:
    - {what: escalated, fault: lost, count: 1}
  never: {untouched: others, max_nodes_out: 1, no_second_remediation: true, no_step_repeated: true}
"""


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not installed: this test confirms nodes with a real kubectl")
    return subprocess.run([binary, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def served_sim(tmp_path: Path) -> Iterator[Path]:
    """``remediator sim --nodes 8`` as its own process; its kubeconfig."""
    kubeconfig = tmp_path / "sim.kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "remediator.cli", "sim", "--nodes", "8", "--kubeconfig-out",
                             str(kubeconfig)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (kubeconfig.exists() and _kubectl(kubeconfig, "get", "nodes").returncode == 0):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "remediator sim did not serve within 60 s"
            time.sleep(0.2)
        yield kubeconfig
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _node(kubeconfig: Path, name: str) -> dict[str, object]:
    got = _kubectl(kubeconfig, "get", "node", name, "-o", "json")
    assert got.returncode == 0, got.stderr
    node: dict[str, object] = json.loads(got.stdout)
    return node


def test_a_drill_runs_against_a_cluster_reached_only_through_its_api(served_sim: Path, tmp_path: Path) -> None:
    kubeconfig = served_sim
    # not confirmed: refused before anything is touched, naming the command that confirms
    refused = _cli("drill", "run", "opt-out-node", "--kubeconfig", str(kubeconfig))
    assert refused.returncode == 2, refused.stderr
    assert "kubectl label node" in refused.stderr and "gpu-remediator.io/drills=allowed" in refused.stderr
    assert "Traceback" not in refused.stderr
    # a drill that needs the simulator's internals is refused, each reason in one line
    internal = _cli("drill", "run", "per-gpu-isolation", "--kubeconfig", str(kubeconfig))
    assert internal.returncode == 2 and "reads the simulator" in internal.stderr, internal.stderr

    labelled = _kubectl(kubeconfig, "label", "node", *NODES, "gpu-remediator.io/drills=allowed")
    assert labelled.returncode == 0, labelled.stderr

    shipped = _cli("drill", "run", "opt-out-node", "--kubeconfig", str(kubeconfig), "--json")
    assert shipped.returncode == 0, shipped.stderr
    doc = json.loads(shipped.stdout)
    assert doc["passed"] is True
    verdicts = {v["what"]: v for d in doc["drills"] for v in d["expectations"]}
    assert any(w.startswith("fault xid79-control: gpu-lost → escalated") for w in verdicts)
    assert any(w.startswith("never: gpu-node-4") and v["passed"] for w, v in verdicts.items())

    # what the drill did is undone on its nodes: the remediated node is back, the opt-out label is gone
    for name in ("gpu-node-4", "gpu-node-6"):
        node = _node(kubeconfig, name)
        spec, meta = node.get("spec", {}), node.get("metadata", {})
        assert isinstance(spec, dict) and isinstance(meta, dict)
        assert not spec.get("unschedulable"), name
        assert not [t for t in spec.get("taints") or [] if t["key"].startswith("gpu-remediator")], name
        assert "gpu-remediator.io/opt-out" not in (meta.get("labels") or {}), name

    # a user-written drill file, by path
    path = tmp_path / "my-xid79.yaml"
    path.write_text(USER_DRILL)
    mine = _cli("drill", "run", str(path), "--kubeconfig", str(kubeconfig), "--json")
    assert mine.returncode == 0, mine.stderr
    (report,) = json.loads(mine.stdout)["drills"]
    assert report["name"] == "my-xid79" and report["passed"] is True
    assert all(v["passed"] for v in report["expectations"])
