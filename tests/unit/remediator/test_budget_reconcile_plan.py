"""The reconciler's pure plan: which handovers and reservations the cluster and the runs say are settled."""

from __future__ import annotations

from typing import Any

import pytest

from remediator.reconciler import node_repaired, plan
from remediator.run import RunRecord
from remediator.safety import Ledger

TAINT = "gpu-remediator/quarantine"


def node(*, tainted: bool = False, cordoned: bool = False, ready: bool = True, alloc: int = 8) -> dict[str, Any]:
    return {"name": "n0", "gpus": 8, "gpus_allocatable": alloc, "unschedulable": cordoned, "ready": ready,
            "taints": [{"key": TAINT, "effect": "NoSchedule"}] if tainted else []}


@pytest.mark.parametrize(("n", "gpus_too", "repaired"), [
    (node(), False, True),
    (node(tainted=True), False, False),
    (node(cordoned=True), False, False),
    (node(ready=False), False, False),
    (node(alloc=7), False, True),   # a node handover: a GPU still lost does not keep it (a person took over)
    (node(alloc=7), True, False),   # a GPU handover: settled only once every GPU is allocatable again
], ids=["clean", "our-taint", "cordoned", "not-ready", "node-gpu-missing", "gpu-missing"])
def test_node_repaired(n: dict[str, Any], gpus_too: bool, repaired: bool) -> None:
    assert bool(node_repaired(n, TAINT, gpus_too=gpus_too)) is repaired


def ledger() -> Ledger:
    return Ledger(reservations={"n0|": {"incident": "inc-r", "node": "n0", "pool": "p", "kind": "node"}},
                  handovers={"n0|G": {"incident": "inc-h", "node": "n0", "kind": "gpu"}})


def run(status: str) -> RunRecord:
    return RunRecord("inc-r", "n0", "gpu-lost", "me", status=status, outcome="escalated")


def test_nothing_is_settled_while_the_node_is_out_and_the_run_runs() -> None:
    assert plan(ledger(), {"inc-r": run("running")}, {"n0": node(tainted=True, alloc=7)}, TAINT) == []


def test_nodes_not_read_are_not_judged() -> None:
    assert plan(ledger(), {}, {}, TAINT) == []


def test_a_deleted_node_settles_everything_of_it() -> None:
    got = plan(ledger(), {"inc-r": run("running")}, {"n0": None}, TAINT)
    assert [(s.subject, s.incident) for s in got] == [("handover", "inc-h"), ("reservation", "inc-r")]
    assert all("deleted" in s.reason for s in got)


def test_a_finished_or_unrecorded_run_releases_its_reservation() -> None:
    assert [s.subject for s in plan(ledger(), {"inc-r": run("finished")}, {"n0": node(alloc=7)}, TAINT)] == [
        "reservation"]
    assert "never recorded" in plan(ledger(), {"inc-r": None}, {"n0": node(alloc=7)}, TAINT)[0].reason


def test_a_repaired_gpu_settles_its_handover() -> None:
    got = plan(ledger(), {"inc-r": run("running")}, {"n0": node()}, TAINT)
    assert [(s.subject, s.key) for s in got] == [("handover", "n0|G")]


WITHDRAWN = "gpu-remediator/gpu-withdrawn"


def withdrawn(**kw: Any) -> dict[str, Any]:
    """A device-plugin node whose GPU came back (allocatable) while our GPU-withdrawn taint is still on it."""
    n = node(**kw)
    n["taints"] = [*n["taints"], {"key": WITHDRAWN, "value": "gpu-memory-fatal", "effect": "NoSchedule"}]
    return n


def test_a_gpu_handover_waits_for_our_withdrawn_taint_to_go_too() -> None:
    """Allocatable GPUs alone do not settle a GPU handover while our NoSchedule taint keeps new pods off the
    node (a person who released the GPU by hand and left the taint would otherwise leave it on forever,
    with nothing of ours tracking it); a node handover is not judged on that taint."""
    assert node_repaired(withdrawn(), TAINT, gpus_too=True, withdrawn_key=WITHDRAWN) == ""
    assert node_repaired(withdrawn(), TAINT, gpus_too=False, withdrawn_key=WITHDRAWN) != ""
    assert plan(ledger(), {"inc-r": run("running")}, {"n0": withdrawn()}, TAINT, WITHDRAWN) == []
    got = plan(ledger(), {"inc-r": run("running")}, {"n0": node()}, TAINT, WITHDRAWN)
    assert [(s.subject, s.key) for s in got] == [("handover", "n0|G")]
