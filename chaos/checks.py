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
from chaos.sim.gpu_operator import DEPLOY_PREFIX
from chaos.sim.gpu_operator import NAMESPACE as OPERATOR_NAMESPACE
from chaos.world import World
from playbooks.gpu_reset import OPERANDS_ANNOTATION
from remediator.adapters.kube import COMPONENT, ESCALATED_ANNOTATION, MANAGED_BY_LABEL


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


def _device_of(e_obj: dict[str, Any]) -> tuple[str, str, str] | None:
    sel = (e_obj.get("spec") or {}).get("deviceSelector") or {}
    return (str(sel.get("driver")), str(sel.get("pool")), str(sel.get("device"))) if sel else None


def _allocated(claim: dict[str, Any] | None) -> set[tuple[str, str, str]]:
    results = ((((claim or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    return {(str(r.get("driver")), str(r.get("pool")), str(r.get("device"))) for r in results or []}


def withdrawn_until_returned(world: World, f: Fault) -> list[str]:
    """From the API server's change history: while the GPU was out, the scheduler was kept off it as the
    cluster's allocation mode allows, and it was given back at the end. DRA: one of our DeviceTaintRules
    selected exactly that device (driver, pool = node, ``gpu-<index>``) and was deleted on return; meanwhile
    no claim was allocated the device, and the node itself was never tainted or cordoned. Device plugin: our
    NoSchedule withdrawal taint was on the node and was removed on return; meanwhile no pod was bound to the
    node, and it was never cordoned."""
    assert f.gpu is not None
    events = world.cluster.events_since(world.start_rv)
    key = world.settings.gpu_withdrawn_taint_key
    problems: list[str] = []
    node_events = [e for e in events if e.plural == "nodes" and e.obj["metadata"]["name"] == f.node]
    if any((e.obj.get("spec") or {}).get("unschedulable") for e in node_events):
        problems.append(f"{f.node} was cordoned")
    if world.cluster.gpu_allocation_mode == "dra":
        device = (world.settings.dra_driver, f.node, f"gpu-{f.gpu}")
        added = next((e.rv for e in events if e.plural == "devicetaintrules" and e.type == "ADDED"
                      and _device_of(e.obj) == device
                      and (e.obj["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == COMPONENT), None)
        if added is None:
            return [*problems, f"no DeviceTaintRule of ours ever selected {'/'.join(device)}"]
        removed = next((e.rv for e in events if e.rv > added and e.plural == "devicetaintrules"
                        and e.type == "DELETED" and _device_of(e.obj) == device), None)
        if removed is None:
            problems.append(f"the DeviceTaintRule on {'/'.join(device)} is still there after the GPU was returned")
        for e in events:
            if e.rv <= added or (removed is not None and e.rv >= removed) or e.plural != "resourceclaims":
                continue
            if device in _allocated(e.obj) - _allocated(e.prev):
                problems.append(f"claim {e.obj['metadata']['name']} was allocated the withdrawn {device[2]}")
        if any(any(t.get("key") in (key, world.settings.taint_key) for t in (e.obj.get("spec") or {}).get("taints")
                   or []) for e in node_events):
            problems.append(f"{f.node} was tainted although DRA withdraws the one device")
        return problems

    def ours(obj: dict[str, Any]) -> bool:
        return any(t.get("key") == key and t.get("effect") == "NoSchedule"
                   for t in (obj.get("spec") or {}).get("taints") or [])

    tainted = next((e.rv for e in node_events if ours(e.obj)), None)
    if tainted is None:
        return [*problems, f"{f.node} never carried the {key}:NoSchedule taint"]
    untainted = next((e.rv for e in node_events if e.rv > tainted and not ours(e.obj)), None)
    if untainted is None:
        problems.append(f"{f.node} still carries {key} after the GPU was returned")
    for e in events:
        if e.rv <= tainted or (untainted is not None and e.rv >= untainted) or e.plural != "pods":
            continue
        if e.type == "MODIFIED" and e.obj.get("spec", {}).get("nodeName") == f.node \
                and not (e.prev or {}).get("spec", {}).get("nodeName"):
            problems.append(f"pod {e.obj['metadata']['name']} was scheduled onto {f.node} while it was withdrawn")
    return problems


def orphan_killed(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    problems = only_that_gpu(world, f)
    procs = world.sim(f.node).gpu_state(f.gpu).get("processes", [])
    if any(p.get("pid") == ORPHAN_PID for p in procs):
        problems.append("the orphaned process still holds GPU memory")
    return problems


def memory_back_down(world: World, f: Fault) -> list[str]:
    """The leaking process is gone, and every process on the GPU uses at most its job's baseline x 1.3
    (what it used before the leak: ``SimGpuNode.leak_memory``); the node and its other GPUs untouched."""
    assert f.gpu is not None
    sim = world.sim(f.node)
    problems = only_that_gpu(world, f)
    procs = sim.gpu_state(f.gpu).get("processes", {})
    if any(p.get("growth") for p in procs.values()):
        problems.append(f"the leaking process still runs on GPU {f.gpu} of {f.node}")
    baselines = sim.leak_baselines()
    limit = 1.3 * min(baselines.values()) if baselines else None
    for pid, p in procs.items():
        if limit is not None and int(p["bytes"]) > limit:
            problems.append(f"pid {pid} on GPU {f.gpu} of {f.node} still uses {int(p['bytes']) >> 20} MiB")
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


def _operands_back(world: World, node: str) -> list[str]:
    """The GPU Operator's deploy labels are all back to ``true``, our annotation is gone, and every operand
    DaemonSet has its pod on the node again."""
    problems = []
    obj = world.cluster.node(node)
    labels = obj["metadata"].get("labels") or {}
    changed = sorted(k for k, v in labels.items() if k.startswith(DEPLOY_PREFIX) and v != "true")
    if changed:
        problems.append(f"GPU Operator labels of {node} not restored: {changed}")
    if OPERANDS_ANNOTATION in (obj["metadata"].get("annotations") or {}):
        problems.append(f"{node} still carries {OPERANDS_ANNOTATION}")
    running = {p["metadata"]["ownerReferences"][0]["name"] for p in world.cluster.pods_on(node)
               if p["metadata"]["namespace"] == OPERATOR_NAMESPACE and p["metadata"].get("ownerReferences")}
    wanted = {d["metadata"]["name"] for d in world.cluster.list_objects("daemonsets", OPERATOR_NAMESPACE)}
    if wanted - running:
        problems.append(f"operand pods not back on {node}: {sorted(wanted - running)}")
    return problems


def reset_with_operands_moved(world: World, f: Fault) -> list[str]:
    """The GPU was reset (the operands that held it moved off for it) and returned; the operator's labels
    and pods are back as they were."""
    return gpu_reset_and_returned(world, f) + _operands_back(world, f.node)


def reset_refused_gpu_kept_out(world: World, f: Fault) -> list[str]:
    """The reset never ran (something held the GPU), so the GPU stays isolated for a person; the operator's
    labels were restored; the node stayed in service."""
    assert f.gpu is not None
    st = world.sim(f.node).gpu_state(f.gpu)
    problems = node_in_service(world, f) + _operands_back(world, f.node)
    if st.get("reset_count"):
        problems.append(f"GPU {f.gpu} of {f.node} was reset although its holders never left")
    if not st.get("isolated"):
        problems.append(f"GPU {f.gpu} of {f.node} went back to service without a reset")
    return problems


def _boot_matches(world: World, node: str) -> list[str]:
    obj = world.cluster.node(node)
    reported = (obj["status"].get("nodeInfo") or {}).get("bootID")
    actual = world.sim(node).boot_id
    return [] if reported == actual else [f"{node} reports boot id {reported}, its host's is {actual}"]


def rebooted_with_proof(world: World, f: Fault) -> list[str]:
    """A failed reset left a bug report, then the node rebooted (a new boot id, Ready again) and, healthy,
    went back to service."""
    sim = world.sim(f.node)
    problems = node_in_service(world, f) + _boot_matches(world, f.node)
    if sim.bug_reports < 1:
        problems.append(f"no bug report was collected on {f.node} after the failed reset")
    if sim.reboots < 1 or world.cluster.reboots(f.node) < 1:
        problems.append(f"{f.node} was never rebooted")
    ready = [c for c in world.cluster.node(f.node)["status"]["conditions"] if c["type"] == "Ready"]
    if not ready or ready[0]["status"] != "True":
        problems.append(f"{f.node} is not Ready")
    return problems


def not_returned_without_reboot(world: World, f: Fault) -> list[str]:
    """The reboot command ran but the boot id never changed: the node is still out of service (tainted and
    cordoned) and handed to a person, never returned."""
    sim = world.sim(f.node)
    problems = node_quarantined(world, f) + _boot_matches(world, f.node)
    if sim.reboots:
        problems.append(f"{f.node} rebooted, but this drill's reboot never happens")
    if ESCALATED_ANNOTATION not in world.cluster.node(f.node)["metadata"].get("annotations", {}):
        problems.append(f"{f.node} carries no escalation annotation for a person")
    return problems


# The checks a drill may name (``check:`` of a fault's expectation).
CHECKS: dict[str, Check] = {
    "node_quarantined": node_quarantined,
    "node_drained": node_drained,
    "drained_then_returned": drained_then_returned,
    "node_in_service": node_in_service,
    "gpu_untouched": gpu_untouched,
    "only_that_gpu": only_that_gpu,
    "only_its_pod_evicted": only_its_pod_evicted,
    "withdrawn_until_returned": withdrawn_until_returned,
    "gpu_isolated": gpu_isolated,
    "gpu_reset_and_returned": gpu_reset_and_returned,
    "orphan_killed": orphan_killed,
    "escalated_only": escalated_only,
    "gpu_isolated_and_escalated": gpu_isolated_and_escalated,
    "job_restarted": job_restarted,
    "reset_with_operands_moved": reset_with_operands_moved,
    "reset_refused_gpu_kept_out": reset_refused_gpu_kept_out,
    "rebooted_with_proof": rebooted_with_proof,
    "not_returned_without_reboot": not_returned_without_reboot,
    "memory_back_down": memory_back_down,
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
