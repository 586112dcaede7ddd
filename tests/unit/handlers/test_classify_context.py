"""``remediator classify --rules FILE`` with the overrides that match on where an event came from.

``--node``, ``--namespace`` and ``--pool`` (or the namespace a kubelet pod-log path names) give ``classify`` the
context dispatch reads from a ``FaultEvent``; the same override then decides the same way offline and online.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from handlers.rules import EventContext, parse_rules
from handlers.signatures import LineScanner
from remediator.cli.classify import classify, input_context
from remediator.contracts import FaultEvent, Origin

RULES = """\
version: 1
overrides:
  - name: xid31-research-app-only
    match: {kind: xid, code: 31, namespace: research}
    application_only: true
  - name: pool-b-quiet
    match: {kind: xid, code: 13, node_pool: pool-b}
    suppress: true
  - name: node7-thermal-reset
    match: {kind: xid, code: 79, node: "gpu-node-7*"}
    playbook: node-reboot
"""
LOG = "\n".join([
    "[  100.000001] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, Ch 00000008, intr 10000000",
    "[  100.000002] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception",
    "[  100.000003] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
]) + "\n"


def _run(tmp_path: Path, *args: str, name: str = "kern.log") -> list[dict[str, object]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    log = tmp_path / name
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(LOG)
    out = CliRunner().invoke(classify, ["--json", "--rules", str(rules), *args, str(log)])
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_without_context_only_kind_and_code_overrides_apply(tmp_path: Path) -> None:
    rows = _run(tmp_path)
    assert [r["xid"] for r in rows] == [31, 13, 79]  # every override here needs a namespace, pool or node
    assert "node-reboot" not in {r["playbook"] for r in rows}


def test_namespace_pool_and_node_flags_let_their_overrides_act(tmp_path: Path) -> None:
    base = {r["xid"]: r["playbook"] for r in _run(tmp_path)}
    rows = _run(tmp_path, "--namespace", "research")
    assert [r["xid"] for r in rows] == [13, 79]  # Xid 31 is the job's own fault in research
    rows = _run(tmp_path, "--pool", "pool-b")
    assert [r["xid"] for r in rows] == [31, 79]  # Xid 13 suppressed on pool-b
    rows = _run(tmp_path, "--node", "gpu-node-7a")
    assert {r["xid"]: r["playbook"] for r in rows} == {**base, 79: "node-reboot"}
    rows = _run(tmp_path, "--node", "gpu-node-1", "--namespace", "prod", "--pool", "pool-a")
    assert {r["xid"]: r["playbook"] for r in rows} == base


def test_a_kubelet_pod_log_path_names_the_namespace(tmp_path: Path) -> None:
    path = "pods/research_train-0_0b9c1a2e-1111-2222-3333-444455556666/trainer/0.log"
    assert [r["xid"] for r in _run(tmp_path, name=path)] == [13, 79]
    assert [r["xid"] for r in _run(tmp_path, "--namespace", "prod", name=path)] == [31, 13, 79]  # the flag wins
    assert input_context("kern.log", None, None, None) is None
    assert input_context("-", None, None, "p") == EventContext(node_pool="p")


def test_explain_names_the_override_that_dropped_a_signal(tmp_path: Path) -> None:
    rows = _run(tmp_path, "--explain", "--namespace", "research")
    dropped = [r for r in rows if r["xid"] == 31]
    assert dropped and "xid31-research-app-only" in json.dumps(dropped[0]["explain"])


def test_the_context_decides_as_dispatch_does_for_the_same_event() -> None:
    rules = parse_rules(RULES)
    (_, sig), = LineScanner().scan_text("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, Ch 00000008")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    event = FaultEvent(id="e1", source="agent", node="gpu-node-2", kind="xid", code=31, observed_at=now,
                       received_at=now, origin=Origin(namespace="research", pod="train-0"),
                       labels={"node_pool": "pool-a"})
    online = rules.override_for("xid", 31, event)
    offline = rules.apply_to_signal(sig, EventContext(node="gpu-node-2", namespace="research", node_pool="pool-a"))
    assert online is not None and offline == (None, online)
    assert EventContext.of(event) == EventContext(source="agent", node="gpu-node-2", namespace="research",
                                                  node_pool="pool-a", labels={"node_pool": "pool-a"})
