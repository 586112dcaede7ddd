"""Checks: what must, and must not, be true of the cluster and the GPUs once a fault came to rest.

Where it sits: at the end of a drill's run (``chaos.runner``), after ``chaos.follow`` filled each fault's
``FaultResult`` from the audit trail. A check reads the world (``chaos.world.World``: the simulated
cluster's objects, the simulated GPUs' state) and returns its problems, none when all is well; a drill
file names the checks of each fault (``expect.faults.<name>.check``, validated against ``CHECKS``).
``judge`` writes each fault's problems: not at rest, the wrong playbook or outcome, its checks failing.
The expectations over the whole drill (cluster facts, audit records, what must never have happened) are
``chaos.expectations``'.
"""

from __future__ import annotations

from typing import Any

from chaos.faults import Check, Fault, FaultResult
from chaos.injectors import ORPHAN_PID, NcclRanks
from chaos.sim import TRAINING_NAMESPACE
from chaos.world import World
from remediator.adapters.kube import ESCALATED_ANNOTATION


def node_quarantined(world: World, f: Fault) -> list[str]:
    problems = []
    if not world.tainted(f.node):
        problems.append(f"{f.node} does not carry the {world.settings.taint_key} taint")
    if not world.cluster.is_cordoned(f.node):
        problems.append(f"{f.node} is not cordoned")
    return problems


def node_drained(world: World, f: Fault) -> list[str]:
    seeded = {p["metadata"]["uid"] for p in world.seeded_pods[f.node]}
    left = [p["metadata"]["name"] for p in world.training_pods(f.node) if p["metadata"]["uid"] in seeded]
    daemons = [p for p in world.cluster.pods_on(f.node) if p["metadata"]["namespace"] != TRAINING_NAMESPACE]
    problems = node_quarantined(world, f)
    if left:
        problems.append(f"training pods still on {f.node}: {left}")
    if len(daemons) < 2:
        problems.append(f"DaemonSet pods were evicted from {f.node}")
    return problems


def drained_then_returned(world: World, f: Fault) -> list[str]:
    """The node was drained while its links were reset and, the reset having healed it, is back in service."""
    seeded = {p["metadata"]["uid"] for p in world.seeded_pods[f.node]}
    left = [p["metadata"]["name"] for p in world.training_pods(f.node) if p["metadata"]["uid"] in seeded]
    problems = node_in_service(world, f)
    if left:
        problems.append(f"training pods were not drained from {f.node}: {left}")
    return problems


def node_in_service(world: World, f: Fault) -> list[str]:
    problems = []
    if world.tainted(f.node) or world.cluster.is_cordoned(f.node):
        problems.append(f"{f.node} was taken out of service")
    return problems


def gpu_untouched(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    st = world.sim(f.node).gpu_state(f.gpu)
    problems = node_in_service(world, f)
    if st.get("isolated") or st.get("reset_count", 0):
        problems.append(f"GPU {f.gpu} of {f.node} was isolated or reset")
    return problems


def only_that_gpu(world: World, f: Fault) -> list[str]:
    """Per-GPU remediation: the node stays in service and pods on GPUs no fault touched keep running."""
    assert f.gpu is not None
    problems = node_in_service(world, f)
    remediated = {g.gpu for g in world.faults if g.node == f.node and g.playbook is not None and g is not f}
    for pod in world.seeded_pods[f.node]:
        if _restarted_job(world, pod):
            continue  # its job was restarted by another fault of the demo (NCCL): a new pod, by design
        indices = world.gpus_of(pod)
        if f.gpu not in indices and indices & remediated:
            continue  # it holds the GPU of another fault on this node, which may evict it
        still_there = any(p["metadata"]["uid"] == pod["metadata"]["uid"] for p in world.training_pods(f.node))
        if f.gpu not in indices and not still_there:
            problems.append(f"pod {pod['metadata']['name']} (GPUs {sorted(indices)}) was evicted too")
        if f.gpu in indices and still_there:
            problems.append(f"pod {pod['metadata']['name']} bound to GPU {f.gpu} is still running")
    targets = {g.gpu for g in world.faults if g.node == f.node}
    others = [i for i in range(world.sim(f.node).gpu_count()) if i not in targets
              and world.sim(f.node).gpu_state(i).get("isolated")]
    if others:
        problems.append(f"other GPUs of {f.node} isolated: {others}")
    return problems


def only_its_pod_evicted(world: World, f: Fault) -> list[str]:
    """Exactly one pod was bound to the faulty GPU, and only it went: every other pod of the node (on other
    GPUs) still runs, no other GPU of the node was isolated or reset, the node stayed in service."""
    assert f.gpu is not None
    bound = [p for p in world.seeded_pods[f.node] if f.gpu in world.gpus_of(p)]
    problems = [] if len(bound) == 1 else [
        f"the drill needs exactly one pod on GPU {f.gpu} of {f.node}; {len(bound)} are bound to it"]
    running = {p["metadata"]["uid"] for p in world.training_pods(f.node)}
    for pod in world.seeded_pods[f.node]:
        name, on_gpu = pod["metadata"]["name"], f.gpu in world.gpus_of(pod)
        if on_gpu and pod["metadata"]["uid"] in running:
            problems.append(f"pod {name} bound to GPU {f.gpu} is still running")
        if not on_gpu and pod["metadata"]["uid"] not in running:
            problems.append(f"pod {name} (GPUs {sorted(world.gpus_of(pod))}) was evicted too")
    sim = world.sim(f.node)
    touched = [i for i in range(sim.gpu_count()) if i != f.gpu
               and (sim.gpu_state(i).get("isolated") or sim.gpu_state(i).get("reset_count"))]
    if touched:
        problems.append(f"other GPUs of {f.node} were isolated or reset: {touched}")
    return problems + node_in_service(world, f)


def _restarted_job(world: World, pod: dict[str, Any]) -> bool:
    """The pod belongs to a PyTorchJob (its controlling owner) that was restarted since the start."""
    owners = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return any(r.get("kind") == "PyTorchJob" and world.cluster.job_restarts(
        "PyTorchJob", pod["metadata"]["namespace"], r["name"]) > 0 for r in owners)


def gpu_isolated(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    problems = only_that_gpu(world, f)
    if not world.sim(f.node).gpu_state(f.gpu).get("isolated"):
        problems.append(f"GPU {f.gpu} of {f.node} is not isolated")
    return problems


def gpu_reset_and_returned(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    st = world.sim(f.node).gpu_state(f.gpu)
    problems = only_that_gpu(world, f)
    if not st.get("reset_count"):
        problems.append(f"GPU {f.gpu} of {f.node} was never reset")
    if st.get("isolated"):
        problems.append(f"GPU {f.gpu} of {f.node} is still isolated after a passing health check")
    return problems


def orphan_killed(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    problems = only_that_gpu(world, f)
    procs = world.sim(f.node).gpu_state(f.gpu).get("processes", [])
    if any(p.get("pid") == ORPHAN_PID for p in procs):
        problems.append("the orphaned process still holds GPU memory")
    return problems


def job_restarted(world: World, f: Fault) -> list[str]:
    """The fault's PyTorchJob was restarted and runs again. When the injector named a lagging rank, the
    fault's node is the suspect: tainted out, and no rank placed back on it; otherwise no node of the job
    was tainted."""
    problems = []
    job = f.job
    if job is None:
        return [f"{f.name}: job_restarted needs a fault that names its job (nccl_ranks)"]
    suspect = f.node if isinstance(f.injector, NcclRanks) and f.injector.lagging is not None else None
    if world.cluster.job_restarts("PyTorchJob", TRAINING_NAMESPACE, job) < 1:
        problems.append(f"PyTorchJob {job} was not restarted")
    pods = world.cluster.job_pods("PyTorchJob", TRAINING_NAMESPACE, job)
    if not pods or any(p.get("status", {}).get("phase") != "Running" for p in pods):
        problems.append(f"PyTorchJob {job} is not running again: "
                        f"{[(p['metadata']['name'], p.get('status', {}).get('phase')) for p in pods]}")
    if suspect is not None:
        if not world.tainted(suspect):
            problems.append(f"suspect node {suspect} was not tainted out")
        if any(p["spec"].get("nodeName") == suspect for p in pods):
            problems.append(f"a rank of {job} was placed back on the suspect node {suspect}")
    else:
        nodes = {p["spec"].get("nodeName") for p in pods}
        problems += [f"{n} was tainted although no node was suspect" for n in nodes if n and world.tainted(n)]
    return problems


def escalated_only(world: World, f: Fault) -> list[str]:
    problems = node_in_service(world, f)
    node = world.cluster.node(f.node)
    if ESCALATED_ANNOTATION not in node["metadata"].get("annotations", {}):
        problems.append(f"{f.node} carries no escalation annotation for a person")
    return problems


def gpu_isolated_and_escalated(world: World, f: Fault) -> list[str]:
    return gpu_isolated(world, f) + [p for p in escalated_only(world, f) if "out of service" not in p]


# The checks a drill may name (``check:`` of a fault's expectation).
CHECKS: dict[str, Check] = {
    "node_quarantined": node_quarantined,
    "node_drained": node_drained,
    "drained_then_returned": drained_then_returned,
    "node_in_service": node_in_service,
    "gpu_untouched": gpu_untouched,
    "only_that_gpu": only_that_gpu,
    "only_its_pod_evicted": only_its_pod_evicted,
    "gpu_isolated": gpu_isolated,
    "gpu_reset_and_returned": gpu_reset_and_returned,
    "orphan_killed": orphan_killed,
    "escalated_only": escalated_only,
    "gpu_isolated_and_escalated": gpu_isolated_and_escalated,
    "job_restarted": job_restarted,
}



def judge(world: World, results: list[FaultResult], settled: set[str], timeout_s: float) -> None:
    """Write each fault's problems: not at rest, the wrong playbook or outcome, its checks failing."""
    for res in results:
        f = res.fault
        if f.name not in settled:
            res.problems.append(f"did not come to rest within {timeout_s:.0f}s (last seen: {res.outcome})")
        if res.playbook != f.playbook:
            res.problems.append(f"expected playbook {f.playbook or 'none'}, got {res.playbook or 'none'}")
        if f.playbook is not None and res.outcome not in f.outcomes:
            res.problems.append(f"expected outcome {' or '.join(f.outcomes)}, got {res.outcome}")
        if f.name in settled:
            try:
                res.problems += f.check(world, f)
            except Exception as e:  # a check that cannot run is a failed check, not a failed drill
                res.problems.append(f"its checks could not run: {type(e).__name__}: {e}")
