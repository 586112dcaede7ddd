"""``remediator classify --explain``: for each signal the rule, the span it matched, and why the action and
playbook follow (catalog row, family rule, operator override); the DESIGN §10 keys are unchanged."""

# ruff: noqa: E501

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from handlers.rules import parse_rules
from handlers.signatures import classify_line
from handlers.signatures.explain import explain
from remediator.cli import main
from remediator.cli.classify import ROW_KEYS

XID79 = "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:07:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
THERMAL = ("`ERROR [1514002:1514004] [[Health]] Detected a WARNING in health system Thermal: 'Detected clocks event due to "
           "thermal violation in GPU 2. Verify that the cooling on this machine is functional, including external, "
           "thermal material interface, fans, and any other components.`")
RULES = """\
signatures:
  - name: ib-port-down
    pattern: 'mlx5_(?P<hca>\\d+): Port (?P<port>\\d+) link down'
    kind: nccl_error
    code: ib_port_down
overrides:
  - name: thermal-to-reset
    match: {kind: thermal}
    playbook: gpu-reset
  - name: no-79
    match: {kind: xid, code: 79}
    suppress: true
"""


def test_an_xid_is_explained_by_its_catalog_row_and_span() -> None:
    sig = classify_line(XID79)
    assert sig is not None
    e = explain(XID79, sig)
    assert e["rule"] == "builtin:kernel" and e["matched"] == "Xid (PCI:0000:07:00): 79"
    start, end = e["span"]
    assert e["message"][start:end] == e["matched"]
    assert any("catalog row 79" in b and "RESTART_BM" in b and "gpu-lost" in b for b in e["because"])


def test_cli_explain_keeps_the_design_keys_and_adds_one(tmp_path: Path) -> None:
    log = tmp_path / "in.log"
    log.write_text("\n".join([XID79, THERMAL, "kernel: mlx5_3: Port 1 link down"]) + "\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    plain = CliRunner().invoke(main, ["classify", "--json", str(log)])
    rows = [json.loads(x) for x in plain.output.splitlines()]
    assert [tuple(r) for r in rows] == [ROW_KEYS, ROW_KEYS]
    out = CliRunner().invoke(main, ["classify", "--json", "--explain", "--rules", str(rules), str(log)])
    assert out.exit_code == 0, out.output
    got = [json.loads(x) for x in out.output.splitlines()]
    assert [tuple(r) for r in got] == [(*ROW_KEYS, "explain")] * 3
    by_line = {r["line"]: r for r in got}
    assert by_line[1]["explain"]["override"]["name"] == "no-79"  # suppressed: shown only under --explain
    assert by_line[2]["playbook"] == "gpu-reset" and "thermal-to-reset" in " ".join(by_line[2]["explain"]["because"])
    assert by_line[3]["explain"]["rule"] == "operator:ib-port-down" and by_line[3]["explain"]["rule_line"] == 2
    assert by_line[3]["explain"]["matched"] == "mlx5_3: Port 1 link down"
    without = CliRunner().invoke(main, ["classify", "--json", "--rules", str(rules), str(log)])
    assert [json.loads(x)["line"] for x in without.output.splitlines()] == [2, 3]  # line 1 suppressed


def test_cli_refuses_an_invalid_rules_file_naming_the_line(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("overrides:\n  - name: r\n    match: {kind: xid}\n    dry_run: false\n")
    out = CliRunner().invoke(main, ["classify", "--rules", str(rules), "/dev/null"])
    assert out.exit_code == 2 and f"{rules}:4:" in out.output and "safety guards" in out.output


def test_explain_names_the_operator_rule_line() -> None:
    rules = parse_rules(RULES)
    sig = classify_line(THERMAL)
    assert sig is not None
    routed, ov = rules.apply_to_signal(sig)
    assert routed is not None and ov is not None
    e = explain(THERMAL, routed, rules, ov, sig.playbook)
    assert e["override"] == {"name": "thermal-to-reset", "line": 7, "action": "playbook gpu-reset"}
