"""Faults of a drill take their kind and code from their injector, and the demo is a drill file.

``chaos.injectors`` declares, per injector, the ``FaultEvent`` kind and code the fault produces; a drill file
(``chaos/drills/*.yaml``, ``chaos/demo.yaml``) never types them. The demo's faults, once a Python list typed
by hand, are the drill ``chaos/demo.yaml``, which ``drill run --all`` does not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

import chaos
from chaos.catalog import DEMO_DRILL, demo_drill, drill_paths, list_drills
from chaos.checks import CHECKS
from chaos.injectors import INJECTORS, AgentEcc, AgentOrphan, AgentXid, AlertReplay, NcclRanks, WebhookXid
from chaos.runner import build_faults
from chaos.schema import FaultSpec
from remediator.contracts import KINDS, PLAYBOOK_NAMES

# What the demo showed before it was a drill file (kind and code typed by hand beside each injector).
DEMO_FAULTS = {
    "xid79-gpu-lost": ("webhook", "xid", 79, "gpu-node-2", 1, "gpu-lost"),
    "xid13-single": ("webhook", "xid", 13, "gpu-node-3", 0, None),
    "xid48-dbe": ("webhook", "xid", 48, "gpu-node-3", 7, "gpu-memory-fatal"),  # GPU 7: train-b holds GPU 5
    "xid13-three-jobs": ("webhook", "xid", 13, "gpu-node-3", 6, "app-xid-hardware-suspect"),
    "xid-unknown": ("webhook", "xid", 999, "gpu-node-7", 3, "unknown-xid"),
    "xid119-gsp-hang": ("agent", "xid", 119, "gpu-node-4", 6, "gsp-hang"),
    "ecc-dbe": ("agent", "ecc", "dbe_volatile", "gpu-node-7", 5, "gpu-memory-fatal"),
    "row-remap-pending": ("agent", "ecc", "row_remap_pending", "gpu-node-5", 7, "row-remap-pending"),
    "xid64-remap-failure": ("agent", "xid", 64, "gpu-node-5", 4, "memory-retirement-failure"),
    "xid74-nvlink": ("agent", "xid", 74, "gpu-node-6", 4, "nvlink"),
    "orphaned-memory": ("agent", "memory_leak", "orphaned_memory", "gpu-node-0", 6, "memory-leak"),
    "nccl-timeout-no-suspect": ("agent", "nccl_timeout", "watchdog_timeout", "gpu-node-4", None,
                                "nccl-timeout-no-suspect"),
    "nccl-timeout-suspect": ("agent", "nccl_timeout", "watchdog_timeout", "gpu-node-1", None, "nccl-timeout-suspect"),
}


@pytest.mark.parametrize(("injector", "via", "kind", "code"), [
    pytest.param(WebhookXid(79, times=3), "webhook", "xid", 79, id="webhook-xid"),
    pytest.param(AlertReplay(48, resolved="early"), "webhook", "xid", 48, id="alert-replay"),
    pytest.param(AgentXid(119), "agent", "xid", 119, id="agent-xid"),
    pytest.param(AgentEcc(dbe=2), "agent", "ecc", "dbe_volatile", id="agent-ecc-dbe"),
    pytest.param(AgentEcc(remap_pending=True), "agent", "ecc", "row_remap_pending", id="agent-ecc-remap"),
    pytest.param(AgentOrphan(), "agent", "memory_leak", "orphaned_memory", id="agent-orphan"),
    pytest.param(NcclRanks("pytorch-0", lagging=1), "agent", "nccl_timeout", "watchdog_timeout", id="nccl-ranks"),
])
def test_each_injector_declares_the_kind_and_code_it_produces(injector: object, via: str, kind: str,
                                                              code: int | str) -> None:
    assert (injector.via, injector.kind, injector.code) == (via, kind, code)  # type: ignore[attr-defined]
    assert kind in KINDS


def test_every_fault_type_of_the_schema_builds_its_own_injector() -> None:
    spec_types = {get_args(m.model_fields["type"].annotation)[0]: m for m in get_args(get_args(FaultSpec)[0])}
    assert set(spec_types) == set(INJECTORS)
    for drill in [*list_drills(), demo_drill()]:
        for entry in drill.timeline:
            if entry.fault is not None:
                assert type(entry.fault.injector()) is INJECTORS[entry.fault.type]


def test_the_demo_is_a_drill_file_with_the_standard_faults() -> None:
    faults = {f.name: f for fs in build_faults(demo_drill()).values() for f in fs}
    got = {n: (f.via, f.kind, f.code, f.node, f.gpu, f.playbook) for n, f in faults.items()}
    assert got == DEMO_FAULTS
    assert faults["nccl-timeout-suspect"].job == "pytorch-0" and faults["xid79-gpu-lost"].job is None
    # every playbook family the handlers can choose, except the two that need a reboot path, the slow one, and
    # a leak's job restart (the memory-leak-trend drill; the demo's PyTorchJobs are the NCCL faults')
    assert {f.playbook for f in faults.values()} - {None} == set(PLAYBOOK_NAMES) - {
        "gpu-reset", "node-reboot", "ecc-correctable-rate", "memory-leak-growth"}
    assert all(c in CHECKS for f in demo_drill().expect.faults.values() for c in f.check)


def test_the_demo_only_settings_live_in_its_drill_file() -> None:
    settings = demo_drill().settings
    assert settings["budget_max_node_fraction"] == 0.5  # half of the 8-node pool may be out
    assert settings["verify_hold_down_s"] == 1.0  # 1 s health hold-down
    assert settings["memleak_orphan_for_s"] == 2  # an orphan is acted on after 2 s
    assert settings["breaker_threshold"] > len(DEMO_FAULTS)


def test_drill_run_all_does_not_run_the_demo() -> None:
    assert DEMO_DRILL not in drill_paths() and "demo" not in {d.name for d in list_drills()}


def test_the_harness_defines_no_wire_name_of_its_own() -> None:
    """Labels, annotations and taint keys come from the production code, not from string literals."""
    harness = list(Path(chaos.__file__).parent.glob("*.py"))
    for needle in ('"gpu-remediator.io/', '"training.kubeflow.org/job-name"', '"gpu-remediator/quarantine"'):
        offenders = [p.name for p in harness if needle in p.read_text()]
        assert not offenders, f"{needle} typed in {offenders}"
