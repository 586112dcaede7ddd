"""The pool index and ``pool_usage`` over a ``PoolView``: the same budget as walking every node of the pool.

``reference_usage`` is the budget's count as it was written before the index (every node of the pool walked
on every decision); the index, fed any sequence of node changes, must give the guard the same ``PoolUsage``
as that walk over the nodes the cluster holds at the end, whatever the ledger holds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from remediator.adapters.kube import KubeAdapter, slim_node
from remediator.adapters.pool_index import PoolIndex
from remediator.contracts import POOL_LABEL
from remediator.pools import PoolView
from remediator.safety import Facts, Ledger
from remediator.safety.gate import pool_usage
from remediator.safety.guards import PoolUsage

TAINT = "gpu-remediator/quarantine"
NAMES = [f"n{i}" for i in range(6)]
POOLS = ["pool-a", "pool-b"]


def raw_node(name: str, rv: int, *, pool: str, gpus: int, allocatable: int, cordoned: bool, taint: str | None,
             gpu_node: bool = True) -> dict[str, Any]:
    """A Node as the API server serves it (what the node cache stores, slimmed)."""
    labels = {POOL_LABEL: pool}
    if gpu_node:
        labels["nvidia.com/gpu.present"] = "true"
    else:
        labels = {}
    capacity = {"cpu": "192", **({"nvidia.com/gpu": str(gpus)} if gpu_node else {})}
    allocs = {"cpu": "192", **({"nvidia.com/gpu": str(allocatable)} if gpu_node else {})}
    return slim_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": str(rv), "uid": f"uid-{name}", "labels": labels},
        "spec": {"unschedulable": cordoned, **({"taints": [{"key": taint, "effect": "NoSchedule"}]} if taint else {})},
        "status": {"capacity": capacity, "allocatable": allocs, "conditions": [{"type": "Ready", "status": "True"}]},
    })


def index() -> PoolIndex:
    return PoolIndex(KubeAdapter._node_summary, KubeAdapter._is_gpu_node, TAINT)


def reference_usage(facts: Facts, summaries: list[dict[str, Any]], ledger: Ledger) -> PoolUsage:
    """The budget's count before the index: every node of the pool, walked."""
    pool = str(facts.node.get("pool") or "default")
    gpus_of = {str(n["name"]): int(n.get("gpus") or 0) for n in summaries}
    out = {str(n["name"]) for n in summaries
           if n.get("unschedulable") or any(t.get("key") == facts.taint_key for t in n.get("taints") or [])}
    running = [r for r in (*ledger.reservations.values(), *ledger.handovers.values()) if r.get("pool") == pool]
    nodes_out = out | {str(r["node"]) for r in running if r.get("kind") == "node"}
    reserved_gpus: dict[str, int] = {}
    for r in running:
        if r.get("kind") == "gpu":
            reserved_gpus[str(r["node"])] = reserved_gpus.get(str(r["node"]), 0) + 1
    isolated = 0
    for n in summaries:
        name = str(n["name"])
        if name in nodes_out:
            continue
        gpus = int(n.get("gpus") or 0)
        allocatable = n.get("gpus_allocatable")
        missing = max(0, gpus - int(allocatable)) if allocatable is not None else 0
        isolated += max(missing, reserved_gpus.get(name, 0))
    isolated += sum(c for name, c in reserved_gpus.items() if name not in gpus_of and name not in nodes_out)
    return PoolUsage(pool, len(summaries), sum(gpus_of.values()), frozenset(nodes_out),
                     sum(gpus_of.get(n, 0) for n in nodes_out) + isolated, int(facts.node.get("gpus") or 0), isolated)


changes = st.lists(st.tuples(
    st.sampled_from(NAMES),
    st.sampled_from(["put", "put", "put", "drop", "not-gpu"]),
    st.sampled_from(POOLS),
    st.sampled_from([4, 8]),  # capacity
    st.integers(0, 8),  # allocatable
    st.booleans(),  # cordoned
    st.sampled_from([None, TAINT, "nvidia.com/gpu"]),  # our taint, someone else's, none
), max_size=40)
entries = st.lists(st.tuples(st.sampled_from([*NAMES, "gone-node"]), st.sampled_from(POOLS),
                             st.sampled_from(["node", "gpu"]), st.booleans()), max_size=6)


def _ledger(rows: list[tuple[str, str, str, bool]]) -> Ledger:
    reservations: dict[str, dict[str, Any]] = {}
    handovers: dict[str, dict[str, Any]] = {}
    for i, (name, pool, kind, handed_over) in enumerate(rows):
        (handovers if handed_over else reservations)[f"inc-{i}"] = {"node": name, "pool": pool, "kind": kind}
    return Ledger(reservations=reservations, handovers=handovers)


@settings(max_examples=300, deadline=None)
@given(initial=changes, later=changes, rows=entries, target=st.sampled_from(NAMES), pool=st.sampled_from(POOLS))
def test_the_index_gives_the_budget_what_walking_every_node_gives(
        initial: list[Any], later: list[Any], rows: list[Any], target: str, pool: str) -> None:
    cluster: dict[str, dict[str, Any]] = {}
    idx = index()

    def apply(change: tuple[Any, ...], rv: int, tell: bool) -> None:
        name, op, p, gpus, alloc, cordoned, taint = change
        if op == "drop":
            cluster.pop(name, None)
            if tell:
                idx.drop(name)
            return
        obj = raw_node(name, rv, pool=p, gpus=gpus, allocatable=min(alloc, gpus), cordoned=cordoned, taint=taint,
                       gpu_node=op != "not-gpu")
        cluster[name] = obj
        if tell:
            idx.put(obj)

    for rv, change in enumerate(initial, 1):  # what the list finds ...
        apply(change, rv, tell=False)
    idx.reset(cluster.values())
    for rv, change in enumerate(later, 1000):  # ... then the watch's events, one at a time
        apply(change, rv, tell=True)

    summaries = sorted((KubeAdapter._node_summary(o) for o in cluster.values() if KubeAdapter._is_gpu_node(o)),
                       key=lambda n: str(n["name"]))
    in_pool = [n for n in summaries if n["pool"] == pool]
    ledger = _ledger(rows)
    facts = Facts(node={"name": target, "pool": pool, "gpus": 8, "labels": {}}, quarantine="node",
                  playbook_dry_run=False, me="me", lock_holder="me", taint_key=TAINT, pool_nodes=idx.view(pool))
    expected = reference_usage(facts, in_pool, ledger)
    assert pool_usage(facts, ledger) == expected
    listed = Facts(**{**facts.__dict__, "pool_nodes": in_pool})  # the fallback: summaries, no index
    assert pool_usage(listed, ledger) == expected
    view = idx.view(pool)
    assert (view.nodes, view.gpus) == (len(in_pool), sum(n["gpus"] for n in in_pool))
    assert {n["name"] for n in view.notable} == {n["name"] for n in PoolView.of(pool, in_pool, TAINT).notable}


def test_a_view_is_not_changed_by_what_the_index_learns_after_it() -> None:
    idx = index()
    idx.reset([raw_node(n, 1, pool="pool-a", gpus=8, allocatable=8, cordoned=False, taint=None) for n in NAMES])
    before = idx.view("pool-a")
    idx.put(raw_node("n9", 2, pool="pool-a", gpus=8, allocatable=8, cordoned=False, taint=None))
    idx.put(raw_node("n0", 3, pool="pool-a", gpus=8, allocatable=8, cordoned=True, taint=TAINT))
    idx.put(raw_node("n1", 4, pool="pool-b", gpus=8, allocatable=8, cordoned=False, taint=None))
    assert (before.nodes, before.gpus, sorted(before.gpus_of), before.notable) == (6, 48, sorted(NAMES), ())
    after = idx.view("pool-a")
    assert (after.nodes, after.gpus, [n["name"] for n in after.notable]) == (6, 48, ["n0"])
    assert "n1" not in after.gpus_of and idx.view("pool-b").gpus_of == {"n1": 8}


def test_only_notable_nodes_are_held_in_a_view() -> None:
    idx = index()
    healthy = [raw_node(f"h{i}", 1, pool="pool-a", gpus=8, allocatable=8, cordoned=False, taint="nvidia.com/gpu")
               for i in range(1000)]  # tainted, but not with our key: GPU nodes often are
    idx.reset([*healthy, raw_node("iso", 1, pool="pool-a", gpus=8, allocatable=7, cordoned=False, taint=None)])
    view = idx.view("pool-a")
    assert (view.nodes, view.gpus) == (1001, 8008)
    assert [n["name"] for n in view.notable] == ["iso"]
