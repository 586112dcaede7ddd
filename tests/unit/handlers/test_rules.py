"""Operator rules (``handlers.rules``): the file format, validation with line numbers, added signatures,
overrides on decisions (named in evidence and reason), what user rules can never do, and reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers import default_registry
from handlers.base import History
from handlers.rules import EMPTY, RulesError, RulesSource, load_rules, parse_rules
from handlers.signatures import LineScanner
from remediator.contracts import Origin
from tests.unit.handlers.helpers import T0, ev

RULES = """\
version: 1
signatures:
  - name: ib-port-down
    pattern: 'mlx5_(?P<hca>\\d+): Port (?P<port>\\d+) link down'
    kind: nccl_error
    code: "ib_port_{port}_down"
    fields: [hca, port]
overrides:
  - name: xid31-research-app-only
    match: {kind: xid, code: 31, namespace: research}
    application_only: true
  - name: pool-b-quiet
    match: {kind: xid, node_pool: pool-b}
    suppress: true
  - name: xid13-to-reset
    match: {kind: xid, code: 13}
    playbook: gpu-reset
"""


def _decision(kind: str, code: int, **kw: object):  # type: ignore[no-untyped-def]
    """A real decision from the built-in handlers for one event."""
    event = ev(kind, code, **kw)  # type: ignore[arg-type]
    registry = default_registry()
    for spec in registry.for_event(event):
        verdict = spec.decide(event, History(), T0, spec.policy)
        if verdict.decision is not None:
            return event, verdict.decision
    raise AssertionError(f"no decision for {kind} {code}")


def test_the_example_file_loads() -> None:
    rules = parse_rules(RULES, "rules.yaml")
    assert [s.name for s in rules.signatures] == ["ib-port-down"]
    assert [o.name for o in rules.overrides] == ["xid31-research-app-only", "pool-b-quiet", "xid13-to-reset"]
    assert rules.signatures[0].line == 3 and rules.overrides[2].line == 15
    assert rules.signatures[0].anchor == "link down"  # the longest literal of the pattern


@pytest.mark.parametrize(("text", "line", "words"), [
    ("signatures:\n  - name: x\n    pattern: '(unclosed'\n    kind: xid\n", 3, "not a regular expression"),
    ("signatures:\n  - name: x\n    pattern: 'foo bar baz'\n    kind: banana\n", 4, "kind 'banana'"),
    ("overrides:\n  - name: r\n    match: {kind: xid}\n    playbook: reboot-the-world\n", 4, "unknown playbook"),
    ("overrides:\n  - name: r\n    match: {kind: xid}\n    dry_run: false\n    playbook: gpu-reset\n", 4,
     "cannot change safety guards"),
    ("overrides:\n  - name: r\n    match: {kind: xid}\n    guards: []\n    suppress: true\n", 4,
     "cannot change safety guards"),
    ("overrides:\n  - name: r\n    match: {kind: xid}\n    suppress: true\n    playbook: gpu-reset\n", 2,
     "exactly one action"),
    ("overrides:\n  - name: r\n    match: {}\n    suppress: true\n", 3, "empty match"),
    ("overrides:\n  - name: r\n    match: {colour: red}\n    suppress: true\n", 3, "unknown key 'colour'"),
    ("signatures:\n  - name: a\n    pattern: 'x\\d+'\n    kind: xid\n", 3, "give `contains`"),
    ("signatures:\n  - name: a\n    pattern: 'abc def'\n    kind: xid\n  - name: a\n    pattern: 'ghi jkl'\n"
     "    kind: xid\n", 5, "used twice"),
    ("version: 2\n", 1, "version must be 1"),
    ("signatures: [\n", 2, "not YAML"),
])
def test_errors_name_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(RulesError) as info:
        parse_rules(text, "rules.yaml")
    assert f"rules.yaml:{line}:" in str(info.value) and words in str(info.value), str(info.value)


def test_added_signature_sees_lines_no_builtin_family_recognises() -> None:
    rules = parse_rules(RULES)
    text = "kernel: mlx5_3: Port 1 link down\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    found = list(LineScanner(rules=rules).scan_text(text))
    assert [(n, s.kind, s.code) for n, s in found] == [(1, "nccl_error", "ib_port_1_down"), (2, "xid", 79)]
    assert found[0][1].detail["hca"] == "3" and found[0][1].detail["rule"] == "ib-port-down"
    assert next(iter(LineScanner().scan_text(text)))[0] == 2  # without the rules the first line is noise
    # an added signature never replaces a built-in one
    clash = parse_rules("signatures:\n  - name: mine\n    pattern: 'fallen off the bus'\n    kind: ecc\n")
    assert [s.kind for _, s in LineScanner(rules=clash).scan_text(text)] == ["xid"]


DECISION_RULES = """\
overrides:
  - name: research-app-only
    match: {kind: xid, code: 79, namespace: research}
    application_only: true
  - name: pool-b-quiet
    match: {kind: xid, node_pool: pool-b}
    suppress: true
  - name: xid79-to-reboot
    match: {kind: xid, code: 79}
    playbook: node-reboot
"""


def test_overrides_route_and_name_themselves_in_evidence_and_reason() -> None:
    rules = parse_rules(DECISION_RULES)
    event, decision = _decision("xid", 79)
    assert decision.playbook == "gpu-lost"
    applied = rules.apply(decision, event)
    assert applied.decision is not None and applied.decision.playbook == "node-reboot"
    ev_over = applied.decision.evidence[-1]
    assert ev_over.kind == "operator_override" and ev_over.code == "xid79-to-reboot"
    assert "line 8" in ev_over.detail and "operator rule xid79-to-reboot" in applied.decision.reason
    assert applied.decision.evidence[:-1] == decision.evidence  # the handler's own evidence is kept


def test_application_only_and_suppress_drop_the_decision_with_the_rule_named() -> None:
    rules = parse_rules(DECISION_RULES)
    event, decision = _decision("xid", 79, origin=Origin(namespace="research", pod="p"))
    applied = rules.apply(decision, event)
    assert applied.decision is None and "research-app-only" in applied.reason and "application-only" in applied.reason
    other_ns, decision2 = _decision("xid", 79, origin=Origin(namespace="prod", pod="p"))
    assert rules.apply(decision2, other_ns).decision.playbook == "node-reboot"  # type: ignore[union-attr]
    pool, decision3 = _decision("xid", 79, labels={"cloud.google.com/gke-nodepool": "pool-b"})
    out = rules.apply(decision3, pool)
    assert out.decision is None and "pool-b-quiet" in out.reason and "suppressed" in out.reason


def test_classify_applies_only_the_overrides_that_need_no_event() -> None:
    rules = parse_rules(RULES)
    (_, sig13), = LineScanner().scan_text("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception")
    routed, ov = rules.apply_to_signal(sig13)
    assert routed is not None and routed.playbook == "gpu-reset" and ov is not None and ov.name == "xid13-to-reset"
    (_, sig31), = LineScanner().scan_text("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, Ch 00000008")
    assert rules.apply_to_signal(sig31) == (sig31, None)  # its override needs a namespace


def test_source_reloads_on_change_and_keeps_the_last_good_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    source = RulesSource(path)
    assert source.current() is EMPTY
    source.load()
    assert len(source.current().overrides) == 3 and not source.reload_if_changed()
    path.write_text(RULES + "  - name: extra\n    match: {kind: ecc}\n    suppress: true\n")
    assert source.reload_if_changed() and len(source.current().overrides) == 4
    path.write_text("overrides:\n  - name: broken\n    match: {kind: xid}\n    dry_run: false\n")
    assert not source.reload_if_changed()
    assert source.last_error is not None and "rules.yaml:4:" in source.last_error
    assert len(source.current().overrides) == 4  # the rules in force stay
    assert RulesSource(None).current() is EMPTY and not RulesSource(None).reload_if_changed()


def test_load_rules_names_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "missing.yaml")
