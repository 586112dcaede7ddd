"""The drill schema (``chaos.schema``, loaded by ``chaos.catalog``): the shipped drills load, and a bad drill is
refused with an error that names the file and the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from chaos.catalog import DrillError, demo_drill, describe, drill_paths, get_drill, list_drills, load_drill, parse_drill
from chaos.runner import build_faults
from chaos.schema import ActionSpec, FaultSpec

SHIPPED = {
    "alertmanager-replays", "kube-api-flaky", "manual-uncordon-cancels", "nats-outage-during-burst",
    "opt-out-node", "per-gpu-isolation", "per-gpu-isolation-dra", "per-gpu-isolation-device-plugin",
    "service-crash-mid-drain", "xid79-storm-breaker",
    "replica-loss", "nats-server-loss", "hostile-client", "memory-leak-trend",
    "gpu-reset-operands", "reset-blocked-by-operand", "reset-fails", "reboot-without-proof",
}

BASE: dict[str, Any] = {
    "version": 1,
    "name": "tiny",
    "description": "A small drill the schema tests mutate.",
    "cluster": {"nodes": 4, "agents": ["gpu-node-0", "gpu-node-2"]},
    "settings": {"breaker_threshold": 3},
    "timeline": [
        {"at_s": 0, "action": {"type": "block_pdb", "name": "train-2-pdb"}},
        {"at_s": 0.5, "fault": {"name": "xid79", "type": "webhook_xid", "node": "gpu-node-2", "gpu": 1, "code": 79}},
    ],
    "expect": {"faults": {"xid79": {"playbook": "gpu-lost", "outcomes": ["escalated"], "check": ["node_drained"]}}},
}


def _types(union: Any) -> set[str]:
    members = get_args(get_args(union)[0])
    return {get_args(m.model_fields["type"].annotation)[0] for m in members}


def test_every_shipped_drill_loads_under_its_file_name() -> None:
    drills = list_drills()
    assert {d.name for d in drills} == SHIPPED
    assert [p.stem for p in drill_paths()] == sorted(SHIPPED, key=lambda n: f"{n}.yaml")  # by file name
    for d in drills:
        assert describe(d).endswith(".") and "\n" not in describe(d)
        assert set(d.expect.faults) == {e.fault.name for e in d.timeline if e.fault is not None}


def test_the_shipped_drills_and_the_demo_use_every_injector_and_chaos_action() -> None:
    faults = {e.fault.type for d in list_drills() for e in d.timeline if e.fault is not None}
    actions = {e.action.type for d in list_drills() for e in d.timeline if e.action is not None}
    assert faults >= _types(FaultSpec) - {"agent_orphan", "nccl_ranks"}  # those two: the demo exercises them
    assert faults | {e.fault.type for e in demo_drill().timeline if e.fault is not None} == _types(FaultSpec)
    assert actions == _types(ActionSpec)


def test_nodes_fan_one_fault_out_over_several_nodes() -> None:
    doc = copy.deepcopy(BASE)
    doc["timeline"][1]["fault"] = {"name": "storm", "type": "webhook_xid", "nodes": ["gpu-node-1", "gpu-node-3"],
                                   "gpu": 0, "code": 79}
    doc["expect"]["faults"] = {"storm": {"playbook": "gpu-lost", "outcomes": ["escalated", "blocked"]}}
    faults = build_faults(parse_drill(yaml.safe_dump(doc)))
    assert [(f.name, f.node, f.code, f.via) for f in faults["storm"]] == [
        ("storm@gpu-node-1", "gpu-node-1", 79, "webhook"), ("storm@gpu-node-3", "gpu-node-3", 79, "webhook")]


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is _DELETE:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


_DELETE = object()

BAD = [
    pytest.param("description", _DELETE, "description: Field required", id="missing-description"),
    pytest.param("colour", "red", "colour: Extra inputs are not permitted", id="unknown-top-level-key"),
    pytest.param("timeline.1.fault.type", "webhook_xyz", "timeline.1.fault: Input tag 'webhook_xyz'",
                 id="unknown-fault-type"),
    pytest.param("timeline.1.fault.gpu", _DELETE, "timeline.1.fault.webhook_xid.gpu: Field required",
                 id="fault-without-gpu"),
    pytest.param("timeline.1.fault.code", "seventy-nine", "timeline.1.fault.webhook_xid.code: Input should be a "
                 "valid integer", id="code-not-a-number"),
    pytest.param("timeline.1.fault.node", "gpu-node-9", "timeline.1.fault.node: 'gpu-node-9' is not a node of "
                 "this 4-node cluster", id="node-outside-the-cluster"),
    pytest.param("timeline.1.at_s", -1, "timeline.1.at_s: Input should be greater than or equal to 0",
                 id="negative-time"),
    pytest.param("timeline.0.at_s", 2, "timeline.1.at_s: 0.5 comes before the previous entry's 2",
                 id="timeline-out-of-order"),
    pytest.param("timeline.0.fault", {"name": "x", "type": "agent_orphan", "node": "gpu-node-0", "gpu": 1},
                 "timeline.0: a timeline entry is exactly one of fault or action", id="fault-and-action"),
    pytest.param("timeline.0.action", {"type": "kube_api_errors", "status": 404, "count": 1},
                 "timeline.0.action.kube_api_errors.status: Input should be 429, 500, 502, 503 or 504",
                 id="kube-status-not-injectable"),
    pytest.param("timeline.0.action", {"type": "kube_api_errors", "status": 503, "count": 1, "path": "(["},
                 "timeline.0.action.kube_api_errors.path: not a regular expression", id="bad-path-regex"),
    pytest.param("timeline.0.action", {"type": "nats_restart"}, "timeline.0.action.nats_restart.down_s: "
                 "Field required", id="restart-without-duration"),
    pytest.param("timeline.0.action", {"type": "agent_disconnect", "node": "gpu-node-1", "down_s": 2},
                 "timeline.0.action: gpu-node-1 runs no agent to disconnect", id="disconnect-without-agent"),
    pytest.param("timeline.1.fault", {"name": "xid79", "type": "agent_xid", "node": "gpu-node-1", "gpu": 1,
                                      "code": 79},
                 "timeline.1.fault: agent_xid on gpu-node-1, which runs no agent", id="agent-fault-without-agent"),
    pytest.param("settings.colour", "red", "settings: colour: not a setting", id="unknown-setting"),
    pytest.param("settings.breaker_threshold", 0, "settings: breaker_threshold: Input should be greater than or "
                 "equal to 1", id="invalid-setting-value"),
    pytest.param("settings.nats_url", "nats://x:4222", "settings: nats_url: set by the drill harness",
                 id="harness-setting"),
    pytest.param("expect.faults.xid79.playbook", "reboot-it", "expect.faults.xid79: playbook 'reboot-it' is not one "
                 "of", id="unknown-playbook"),
    pytest.param("expect.faults.xid79.outcomes", ["done"], "expect.faults.xid79.outcomes: 'done' is not an "
                 "outcome", id="unknown-outcome"),
    pytest.param("expect.faults.xid79.outcomes", [], "expect.faults.xid79: outcomes: say which outcomes",
                 id="playbook-without-outcomes"),
    pytest.param("expect.faults.xid79.check", ["looks_fine"], "expect.faults.xid79.check: 'looks_fine' is not a "
                 "check", id="unknown-check"),
    pytest.param("expect.faults.ghost", {"playbook": None}, "expect.faults.ghost: no fault of the timeline has "
                 "this name", id="expectation-for-no-fault"),
    pytest.param("expect.faults.xid79", _DELETE, "expect.faults: fault 'xid79' of the timeline has no "
                 "expectation", id="fault-without-expectation"),
    pytest.param("expect.cluster", {"isolated_gpus": ["gpu-node-1:3"]}, "expect.cluster.isolated_gpus.0: String "
                 "should match pattern", id="gpu-not-node-slash-index"),
    pytest.param("expect.audit", [{"what": "guard_verdict", "count": 1, "min": 1}], "expect.audit.0: give count, "
                 "or min/max, not both", id="count-and-min"),
    pytest.param("expect.audit", [{"what": "decided"}], "expect.audit.0.what: Input should be",
                 id="unknown-audit-what"),
    pytest.param("expect.never", {"untouched": ["gpu-node-7"]}, "expect.never.untouched.0: 'gpu-node-7' is not a node",
                 id="untouched-outside-the-cluster"),
    pytest.param("expect.faults.xid79.check", ["job_restarted"], "expect.faults.xid79.check: job_restarted judges "
                 "the job of an nccl_ranks fault", id="job-check-on-a-gpu-fault"),
    pytest.param("timeline.1.fault.kind", "ecc", "timeline.1.fault.webhook_xid.kind: Extra inputs are not permitted",
                 id="kind-is-the-injectors-not-the-files"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_a_bad_drill_is_refused_naming_the_field(path: str, value: Any, message: str) -> None:
    doc = copy.deepcopy(BASE)
    _set(doc, path, value)
    with pytest.raises(DrillError) as err:
        parse_drill(yaml.safe_dump(doc), "drills/tiny.yaml")
    assert str(err.value).startswith("drills/tiny.yaml: ")
    assert message in str(err.value)


def test_the_base_drill_is_valid() -> None:
    drill = parse_drill(yaml.safe_dump(BASE))
    assert drill.cluster.agent_nodes() == ["gpu-node-0", "gpu-node-2"]
    assert drill.settings == {"breaker_threshold": 3}
    assert drill.crashes() == [] and drill.named_nodes() == {"gpu-node-2"}


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("name: [unclosed", "not valid YAML", id="not-yaml"),
    pytest.param("- a\n- list\n", "a drill is a YAML mapping", id="not-a-mapping"),
])
def test_text_that_is_not_a_drill_is_refused(text: str, message: str) -> None:
    with pytest.raises(DrillError, match=message):
        parse_drill(text, "x.yaml")


def test_a_drill_file_is_found_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert get_drill(str(path)).name == "tiny"
    with pytest.raises(DrillError, match="no drill named 'tiny'"):
        get_drill("tiny")


def test_the_name_must_be_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "other-name.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(DrillError, match=r"name: 'tiny' must be the file name without .yaml \('other-name'\)"):
        load_drill(path)
