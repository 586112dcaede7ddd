"""Drills against a real cluster: ``remediator drill run NAME|FILE --kubeconfig FILE``.

Where it sits: beside the drill runner (``chaos.runner``), under ``remediator drill run --kubeconfig``. The
cluster is whatever the kubeconfig names — a real one, or the simulator served by ``remediator sim``, which
this module treats the same way: it speaks to it only over the Kubernetes API, through the service's own
adapter (``remediator.adapters.kube.KubeAdapter``), never through the simulator's internals. The drill runs
its own service (an embedded nats-server in operator mode, ingest, dispatch, executor, the harness's fast
settings plus the drill's) against that API, injects its faults only as Alertmanager webhook payloads to
that service, follows them through its audit trail (``chaos.follow``) and judges what the API shows.

What a drill may use here (``refusals`` says, in one line each, why a drill cannot run): faults
``webhook_xid`` (without ``jobs``) and ``alert_replay``; the action ``opt_out`` (a node label); fault checks
``node_quarantined``, ``node_drained``, ``node_in_service``; cluster expectations ``tainted``, ``cordoned``,
``drained`` (over the drill's nodes); every audit expectation; ``never`` expectations ``untouched`` (a node's
taints, cordon, annotations and pods before and after), ``max_nodes_out`` (sampled every 0.5 s),
``no_second_remediation``, ``no_step_repeated`` and ``audit_chains_verify``. Everything that needs the
simulator's internals (agents on simulated GPU nodes, GPU state, API faults, killing a replica or a NATS
server, PodDisruptionBudget switches) is refused: use the drill without ``--kubeconfig``.

Confirmation: every node the drill names — and, for ``untouched: others``, every GPU node of the cluster
it compares — must carry the label ``gpu-remediator.io/drills=allowed``; the drill refuses to start
otherwise, naming the ``kubectl label`` command. Afterwards the drill undoes on its nodes what the service
did (our taint, a cordon that was not there before, our escalation annotation, the opt-out label it set);
evicted pods are not brought back (their controllers recreate them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from chaos.expectations import (
    DrillRun,
    Verdict,
    _audit_verdict,
    _exact,
    _fault_verdicts,
    _repeated_steps,
    _second_remediations,
)
from chaos.faults import Fault, FaultResult, Progress
from chaos.follow import follow as follow_fault
from chaos.follow import read_records, settle_faults
from chaos.runner import DrillReport, inject_fault
from chaos.schema import AlertReplaySpec, Drill, FaultExpect, FaultSpec, OptOutSpec, WebhookXidSpec
from chaos.world import World, harness_settings
from remediator import bus
from remediator.adapters.kube import ESCALATED_ANNOTATION, KubeAdapter
from remediator.audit import iter_records, verify_chains
from remediator.contracts import DRILLS_LABEL, OPT_OUT_LABEL, AuditRecord
from remediator.natsd import EmbeddedNats
from remediator.service import Service
from remediator.settings import Settings

CONFIRM_LABEL = DRILLS_LABEL
CONFIRM_VALUE = "allowed"
REMOTE_CHECKS = ("node_quarantined", "node_drained", "node_in_service")
REMOTE_CLUSTER = ("tainted", "cordoned", "drained")
SAMPLE_S = 0.5


class DrillRefused(Exception):
    """This drill cannot, or may not, run against this cluster; ``reasons`` are one line each."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def refusals(drill: Drill) -> list[str]:
    """Why ``drill`` needs the simulator's internals (empty: it can run against a real cluster)."""
    out: list[str] = []
    for e in drill.timeline:
        if e.fault is not None:
            if not isinstance(e.fault, WebhookXidSpec | AlertReplaySpec):
                out.append(f"fault {e.fault.name}: {e.fault.type} is injected into a simulated node; against a "
                           "real cluster only Alertmanager payloads are (webhook_xid, alert_replay)")
            elif isinstance(e.fault, WebhookXidSpec) and e.fault.jobs:
                out.append(f"fault {e.fault.name}: per-job alerts name the simulator's seeded pods")
        elif e.action is not None and not isinstance(e.action, OptOutSpec):
            out.append(f"action {e.action.type} needs the simulator (only opt_out runs against a real cluster)")
        if e.when is not None:
            out.append("a timeline entry waits on a step (when:); not supported against a real cluster")
    for name, fe in drill.expect.faults.items():
        for c in fe.check:
            if c not in REMOTE_CHECKS:
                out.append(f"fault {name}: check {c} reads the simulator (checkable: {', '.join(REMOTE_CHECKS)})")
    ce = drill.expect.cluster
    if ce is not None:
        for key in ce.model_dump(exclude_none=True):
            if key not in REMOTE_CLUSTER:
                out.append(f"expect.cluster.{key} needs the simulator (checkable: {', '.join(REMOTE_CLUSTER)})")
    if drill.expect.outcomes:
        out.append("expect.outcomes is not supported against a real cluster")
    if drill.cluster.agents != "all" or drill.cluster.replicas != 1 or drill.cluster.nats_servers != 1:
        out.append("cluster.agents/replicas/nats_servers shape the simulated world; the real one is what it is")
    return out


@dataclass
class RemoteWorld:
    """What the injectors, ``chaos.follow`` and the audit expectations read of a world, for a real cluster:
    the drill's own service (``http``, ``base_url``), its bus (``records``) and the Kubernetes API."""

    kube: KubeAdapter
    settings: Settings
    http: httpx.AsyncClient
    base_url: str
    nc: NATS
    js: JetStreamContext
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    faults: list[Fault] = field(default_factory=list)
    peak_out: int = 0

    def gpu_uuid(self, node: str, index: int) -> str:
        return ""  # a real node's GPU identity is the agent's to know; the alert names the index

    def gpu_pci(self, node: str, index: int) -> str:
        return ""

    async def records(self) -> list[AuditRecord] | None:
        try:
            return [r async for r in iter_records(self.js)]
        except asyncio.CancelledError:
            raise
        except Exception:
            return None

    def node(self, name: str) -> dict[str, Any]:
        return self.kube.get_node(name)

    def tainted(self, node: str) -> bool:
        return any(t.get("key") == self.settings.taint_key for t in self.node(node).get("taints") or [])

    def cordoned(self, node: str) -> bool:
        return bool(self.node(node).get("unschedulable"))

    def workload_pods(self, node: str) -> dict[str, str]:
        return _workload_pods(self.kube, node)


def _workload_pods(kube: KubeAdapter, node: str) -> dict[str, str]:
    """uid → namespace/name of the pods on ``node`` a drain evicts (not DaemonSet pods, not mirror pods, not
    already terminating)."""
    return {str(p["uid"]): f"{p['namespace']}/{p['name']}" for p in kube.pods_on_node(node)
            if not p.get("daemonset") and not p.get("mirror") and not p.get("terminating")}


def _snapshot(kube: KubeAdapter, node: str) -> dict[str, Any]:
    """What ``untouched`` compares: the node's taints, cordon and annotations, and its workload pods."""
    n = kube.get_node(node)  # the adapter's node summary
    return {"taints": list(n.get("taints") or []), "cordoned": bool(n.get("unschedulable")),
            "annotations": dict(n.get("annotations") or {}), "pods": _workload_pods(kube, node)}


# --- fault checks over the API --------------------------------------------------------------------------


def _quarantined(world: RemoteWorld, f: Fault) -> list[str]:
    problems = []
    if not world.tainted(f.node):
        problems.append(f"{f.node} does not carry the {world.settings.taint_key} taint")
    if not world.cordoned(f.node):
        problems.append(f"{f.node} is not cordoned")
    return problems


def _remote_check(name: str, before: dict[str, dict[str, Any]]) -> Any:
    def check(world: Any, f: Fault) -> list[str]:
        w = cast(RemoteWorld, world)
        if name == "node_quarantined":
            return _quarantined(w, f)
        if name == "node_in_service":
            return [f"{f.node} was taken out of service"] if w.tainted(f.node) or w.cordoned(f.node) else []
        left = sorted(set(before[f.node]["pods"]) & set(w.workload_pods(f.node)))
        return _quarantined(w, f) + ([f"workload pods still on {f.node}: {[before[f.node]['pods'][u] for u in left]}"]
                                     if left else [])
    return check


def _fault(spec: FaultSpec, node: str, expect: FaultExpect, before: dict[str, dict[str, Any]]) -> Fault:
    checks = [_remote_check(c, before) for c in expect.check]

    def check(world: Any, f: Fault) -> list[str]:
        return [p for c in checks for p in c(world, f)]

    return Fault(spec.fault_name(node), node, spec.gpu, spec.injector(), expect.playbook, tuple(expect.outcomes),
                 check)


# --- the run ----------------------------------------------------------------------------------------------


def confirm(kube: KubeAdapter, nodes: set[str]) -> None:
    """Every node in ``nodes`` exists and carries the drill confirmation label; else ``DrillRefused``."""
    missing, unlabelled = [], []
    for n in sorted(nodes):
        found = kube.find_node(n)
        if found is None:
            missing.append(n)
        elif (found.get("labels") or {}).get(CONFIRM_LABEL) != CONFIRM_VALUE:
            unlabelled.append(n)
    reasons = [f"node {n} does not exist in this cluster" for n in missing]
    if unlabelled:
        reasons.append(f"nodes not confirmed for drills: {', '.join(unlabelled)}; a drill acts on them for real — "
                       f"confirm with `kubectl label node {' '.join(unlabelled)} {CONFIRM_LABEL}={CONFIRM_VALUE}`")
    if reasons:
        raise DrillRefused(reasons)


@contextlib.asynccontextmanager
async def _service(kubeconfig: Path, drill: Drill, root: Path) -> AsyncIterator[tuple[Service, EmbeddedNats]]:
    with EmbeddedNats(data_dir=str(root / "nats"), secure=True) as server:
        settings = harness_settings(server.url, kubeconfig, f"drill-{drill.name}",
                                    {**drill.settings, "nats_creds_file": server.creds("service"),
                                     "data_dir": str(root / "nats")})
        nc, js = await bus.connect(server.url, name="drill-admin", credentials=bus.Credentials(
            creds_file=server.creds("admin")))
        try:
            await bus.provision(js, settings)
        finally:
            await nc.close()
        service = Service(settings, provision=False)
        await service.start()
        try:
            yield service, server
        finally:
            await service.stop()
            if service.executor is not None:
                service.executor.close()


async def run_remote(drill: Drill, kubeconfig: Path, progress: Progress, root: Path) -> DrillReport:
    """Run ``drill`` against the cluster ``kubeconfig`` names (see the module docstring). Raises
    ``DrillRefused`` before touching anything when the drill cannot or may not run there."""
    reasons = refusals(drill)
    if reasons:
        raise DrillRefused(reasons)
    kube = KubeAdapter.from_settings(Settings(kubeconfig=str(kubeconfig)), instance="drill")
    try:
        named = drill.named_nodes()
        nv = drill.expect.never
        compared: set[str] = set(named)
        if nv.untouched == "others":
            compared |= {n["name"] for n in kube.list_gpu_nodes()}
        elif nv.untouched:
            compared |= set(nv.untouched)
        await asyncio.to_thread(confirm, kube, compared)
        return await _run(drill, kube, kubeconfig, progress, root, named, compared)
    finally:
        kube.close()


async def _run(drill: Drill, kube: KubeAdapter, kubeconfig: Path, progress: Progress, root: Path,
               named: set[str], compared: set[str]) -> DrillReport:
    t0 = time.monotonic()
    report = DrillReport(drill.name, 0.0)
    before = {n: await asyncio.to_thread(_snapshot, kube, n) for n in sorted(compared)}
    progress(f"• cluster {kubeconfig}: {len(named)} drill node(s), {len(compared)} compared before and after")
    opted_out: list[str] = []
    try:
        async with _service(kubeconfig, drill, root) as (service, server):
            progress(f"• service: ingest on {service.http_url}, dispatch, executor (against the cluster's API)")
            nc, js = await bus.connect(server.url, name="drill-observer", credentials=bus.Credentials(
                creds_file=server.creds("admin")))
            try:
                async with httpx.AsyncClient(timeout=10) as http:
                    world = RemoteWorld(kube, service.settings, http, service.http_url, nc, js,
                                        started=datetime.now(UTC) - timedelta(seconds=1))
                    faults = {e.fault.name: [_fault(e.fault, n, drill.expect.faults[e.fault.name], before)
                                             for n in e.fault.targets()]
                              for e in drill.timeline if e.fault is not None}
                    world.faults = [f for fs in faults.values() for f in fs]
                    run = DrillRun(cast(World, world), drill, progress, faults,
                                   {f.name: FaultResult(f) for f in world.faults})
                    sampler = asyncio.create_task(_sample_out(world, sorted(compared)))
                    try:
                        await _play(run, world, opted_out)
                    finally:
                        sampler.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await sampler
                    report.results = list(run.results.values())
                    report.expectations = run.timeline + await _judge(run, world, before, named)
            finally:
                await nc.close()
    except DrillRefused:
        raise
    except Exception as e:
        report.expectations.append(Verdict("the drill ran to its end", False, f"{type(e).__name__}: {e}"))
    finally:
        for line in await asyncio.to_thread(_restore, kube, before, named, opted_out, drill):
            progress(f"↺ {line}")
    report.seconds = time.monotonic() - t0
    return report


async def _sample_out(world: RemoteWorld, nodes: list[str]) -> None:
    """The most nodes out of service at once, sampled every ``SAMPLE_S`` through the API."""
    while True:
        out = 0
        for n in nodes:
            snap = await asyncio.to_thread(world.node, n)
            if snap.get("unschedulable") or any(t.get("key") == world.settings.taint_key
                                                for t in snap.get("taints") or []):
                out += 1
        world.peak_out = max(world.peak_out, out)
        await asyncio.sleep(SAMPLE_S)


async def _play(run: DrillRun, world: RemoteWorld, opted_out: list[str]) -> None:
    drill = run.drill
    t0 = time.monotonic()
    for entry in drill.timeline:
        await asyncio.sleep(max(0.0, t0 + entry.at_s - time.monotonic()))
        kind = entry.fault.type if entry.fault is not None else entry.action.type if entry.action else ""
        label = f"{entry.at_s:g}s {kind}"
        try:
            if entry.fault is not None:
                for f in run.faults[entry.fault.name]:
                    await inject_fault(cast(World, world), f, run.results[f.name], run.progress)
            elif isinstance(entry.action, OptOutSpec):
                node = entry.action.node
                await asyncio.to_thread(world.kube.label, node, {OPT_OUT_LABEL: "true"})
                opted_out.append(node)
                run.progress(f"⚡ {label}: {node} labelled {OPT_OUT_LABEL}=true")
                run.timeline.append(Verdict(f"timeline {label}", True, f"{node} labelled {OPT_OUT_LABEL}=true"))
        except Exception as e:
            run.timeline.append(Verdict(f"timeline {label}", False, f"{type(e).__name__}: {e}"))
    deadline = t0 + drill.expect.deadline_s
    results = list(run.results.values())
    settled = await settle_faults(cast(World, world), results, run.progress,
                                  max(0.0, deadline - time.monotonic()), poll_s=0.25)
    await asyncio.sleep(drill.expect.quiet_s)
    records = await read_records(cast(World, world))
    for res in results:
        follow_fault(records, cast(World, world), res.fault, res)
    from chaos.checks import judge

    await asyncio.to_thread(judge, cast(World, world), results, settled, drill.expect.deadline_s)


async def _judge(run: DrillRun, world: RemoteWorld, before: dict[str, dict[str, Any]],
                 named: set[str]) -> list[Verdict]:
    records = await read_records(cast(World, world))
    out = _fault_verdicts(run)
    after = {n: await asyncio.to_thread(_snapshot, world.kube, n) for n in before}
    ce = run.drill.expect.cluster
    if ce is not None:  # over the nodes the drill names or compares (the rest of a real cluster is not ours)
        nodes = sorted(before)
        if ce.tainted is not None:
            out.append(_exact(f"cluster: exactly {ce.tainted or 'no nodes'} carry the quarantine taint", ce.tainted,
                              [n for n in nodes if any(t.get("key") == world.settings.taint_key
                                                       for t in after[n]["taints"])]))
        if ce.cordoned is not None:
            out.append(_exact(f"cluster: exactly {ce.cordoned or 'no nodes'} are cordoned", ce.cordoned,
                              [n for n in nodes if after[n]["cordoned"]]))
        for node in ce.drained:
            left = [before[node]["pods"][u] for u in sorted(set(before[node]["pods"]) & set(after[node]["pods"]))]
            out.append(Verdict(f"cluster: {node} drained", not left,
                               f"workload pods left: {left}" if left else "no workload pod of the start left"))
    out += [_audit_verdict(run, records, a) for a in run.drill.expect.audit]
    nv = run.drill.expect.never
    if nv.max_nodes_out is not None:
        out.append(Verdict(f"never: more than {nv.max_nodes_out} nodes out of service at once",
                           world.peak_out <= nv.max_nodes_out,
                           f"at most {world.peak_out} out at once (sampled every {SAMPLE_S:g}s)"))
    untouched = sorted(set(before) - named) if nv.untouched == "others" else list(nv.untouched or [])
    if untouched:
        problems = []
        for n in untouched:
            b, a = before[n], after[n]
            why = [what for what in ("taints", "cordoned", "annotations") if b[what] != a[what]]
            gone = sorted(set(b["pods"]) - set(a["pods"]))
            why += [f"pod {b['pods'][u]} gone" for u in gone]
            if why:
                problems.append(f"{n}: {', '.join(why)}")
        label = "the other nodes" if nv.untouched == "others" else ", ".join(untouched)
        out.append(Verdict(f"never: {label} touched", not problems,
                           "; ".join(problems) or f"{len(untouched)} nodes untouched"))
    if nv.no_second_remediation:
        problems = _second_remediations(run, records)
        out.append(Verdict("never: a second incident or remediation for one fault", not problems,
                           "; ".join(problems) or "one incident and one run per fault"))
    if nv.no_step_repeated:
        problems = _repeated_steps(records, cast(World, world))
        out.append(Verdict("never: a completed step run again", not problems,
                           "; ".join(problems) or "every completed step ran once"))
    if nv.audit_chains_verify:
        chains = verify_chains(records)
        bad = [f"{r.chain}: {r.problem}" for r in chains if not r.ok]
        out.append(Verdict("the audit chains verify", not bad,
                           "; ".join(bad) or f"{len(chains)} chains, {len(records)} records"))
    return out


def _restore(kube: KubeAdapter, before: dict[str, dict[str, Any]], named: set[str], opted_out: list[str],
             drill: Drill) -> list[str]:
    """Undo on the drill's nodes what the drill and the service did (see the module docstring)."""
    done = []
    key = Settings(**{k: v for k, v in drill.settings.items() if k == "taint_key"}).taint_key
    for n in sorted(named):
        try:
            changes = [("our taint", kube.untaint(n, key, effect=None))]
            if not before[n]["cordoned"]:
                changes.append(("cordon", kube.uncordon(n)))
            if ESCALATED_ANNOTATION not in before[n]["annotations"]:
                changes.append(("escalation annotation", kube.annotate(n, {ESCALATED_ANNOTATION: None})))
            if n in opted_out:
                changes.append((f"label {OPT_OUT_LABEL}", kube.label(n, {OPT_OUT_LABEL: None})))
            undone = [what for what, c in changes if c.changed]
            if undone:
                done.append(f"{n}: undone: {', '.join(undone)}")
        except Exception as e:  # report, never hide: the node may need a person
            done.append(f"{n}: could not be restored ({type(e).__name__}: {e}); check it by hand")
    return done
