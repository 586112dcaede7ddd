"""Judging a drill's expectations: one verdict per thing the drill file says must (or must never) be true.

Where it sits: the last stage of the drill runner (``chaos.runner``), after every fault came to rest (or
its deadline passed) and ``chaos.checks.judge`` wrote each fault's own problems. It reads the final audit
trail (through ``chaos.follow``), the simulated cluster's objects and change history, and the simulated
GPUs, and returns ``Verdict``s: each fault's playbook, outcome, steps and time to rest; outcome counts;
that every injected Kubernetes API error was served; that a fault injected during an outage was handled
only after it; the cluster facts at the end; the audit records that must (not) exist; and what must never
have happened (too many nodes out at once, an untouched node touched, a second remediation, a completed
step run again, an audit chain that does not verify).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.faults import Fault, FaultResult, Progress
from chaos.follow import match_events, read_records, step_of
from chaos.schema import AuditExpect, Drill
from chaos.sim import TRAINING_NAMESPACE
from chaos.world import World
from remediator.audit import verify_chains
from remediator.contracts import AuditRecord


@dataclass
class Verdict:
    """One expectation (or timeline entry) of a drill, and whether it held."""

    what: str
    passed: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "passed": self.passed, "detail": self.detail}


@dataclass
class DrillRun:
    """What the runner keeps while a drill plays, and what its expectations are judged on."""

    world: World
    drill: Drill
    progress: Progress
    faults: dict[str, list[Fault]]  # by the name of the spec that made them
    results: dict[str, FaultResult]  # by fault name
    t0: float = 0.0
    timeline: list[Verdict] = field(default_factory=list)
    background: list[tuple[str, asyncio.Task[str]]] = field(default_factory=list)


async def judge_drill(run: DrillRun) -> list[Verdict]:
    world, drill = run.world, run.drill
    records = await read_records(world)
    out = _fault_verdicts(run)
    if drill.expect.outcomes:
        out.append(_outcome_counts(run))
    for fault in world.kube_faults:
        what = (f"Kubernetes API {fault.status or f'+{fault.latency_s:g}s'} on {fault.method} {fault.path.pattern} "
                "was served")
        if fault.status is not None:
            ok = fault.remaining == 0
            out.append(Verdict(what, ok, f"{fault.hits} served"
                               + ("" if ok else f", {fault.remaining} never asked for")))
        else:
            out.append(Verdict(what, fault.hits > 0, f"{fault.hits} requests delayed"))
    out += _outage_verdicts(run, records)
    out += await _cluster_verdicts(run)
    out += [_audit_verdict(run, records, a) for a in drill.expect.audit]
    out += _never_verdicts(run, records)
    return out


def _fault_verdicts(run: DrillRun) -> list[Verdict]:
    out = []
    exp = run.drill.expect
    for spec_name, faults in run.faults.items():
        fe = exp.faults[spec_name]
        within = fe.within_s or exp.deadline_s
        for f in faults:
            res = run.results[f.name]
            what = (f"fault {f.name}: " + (f"{fe.playbook} → {' or '.join(fe.outcomes)}" if fe.playbook
                                           else "recorded, no remediation") + f" within {within:g}s")
            problems = list(res.problems)
            if fe.actions is not None and res.actions != fe.actions:
                problems.append(f"expected steps {fe.actions}, ran {res.actions}")
            rest = res.rest_s
            if rest is not None and rest > within:
                problems.append(f"came to rest after {rest:.1f}s")
            detail = (f"{res.playbook or 'no playbook'} → {res.outcome}"
                      + (f" in {rest:.1f}s" if rest is not None else "")
                      + (f" [{', '.join(res.actions)}]" if res.actions else ""))
            res.problems[:] = problems  # the fault's own verdict is the one its result reports
            out.append(Verdict(what, not problems, "; ".join(problems) if problems else detail))
            for step, least in fe.min_step_s.items():
                out.append(_step_duration(res, step, least))
    return out


def _step_duration(res: FaultResult, step: str, least: float) -> Verdict:
    """How long step ``step`` of the fault's run took, from its (last) start to its success."""
    what = f"fault {res.fault.name}: step {step} took at least {least:g}s"
    started = [r.time for r in res.timeline if r.what == "step_started" and step_of(r) == step]
    done = [r.time for r in res.timeline if r.what == "step_succeeded" and step_of(r) == step]
    if not started or not done:
        return Verdict(what, False, f"step {step} did not run to success")
    took = (done[-1] - started[-1]).total_seconds()
    return Verdict(what, took >= least, f"{took:.2f}s")


def _outage_verdicts(run: DrillRun, records: list[AuditRecord]) -> list[Verdict]:
    """A fault injected while a chaos action had the bus (or its node's agent) down must have reached the
    service only after it came back: proof the drill exercised the outage, not just the fault."""
    out = []
    for res in run.results.values():
        f = res.fault
        if res.injected_at is None:
            continue
        for o in run.world.outages:
            if not o.covers(res.injected_at, f.node):
                continue
            ids = match_events(records, run.world, f)
            accepted = [r.time for r in records if r.what == "event_accepted" and r.event_id in ids]
            ok = bool(accepted) and o.end is not None and min(accepted) >= o.end
            detail = (f"injected {(res.injected_at - o.start).total_seconds():.1f}s into the outage"
                      + (f", accepted {(min(accepted) - o.end).total_seconds():.1f}s after it ended"
                         if accepted and o.end is not None else ", never accepted"))
            out.append(Verdict(f"fault {f.name}: injected while {o.what} was down, handled after it came back",
                               ok, detail))
    return out


def _outcome_counts(run: DrillRun) -> Verdict:
    want = run.drill.expect.outcomes
    got = Counter(r.outcome for r in run.results.values())
    what = "outcomes: " + ", ".join(f"{n} {o}" for o, n in want.items())
    ok = all(got.get(o, 0) == n for o, n in want.items())
    return Verdict(what, ok, ", ".join(f"{n} {o}" for o, n in sorted(got.items())))


def _exact(what: str, want: Sequence[str], got: Sequence[str]) -> Verdict:
    ok = sorted(want) == sorted(got)
    return Verdict(what, ok, f"{sorted(got) or 'none'}" + ("" if ok else f" (expected {sorted(want) or 'none'})"))


async def _cluster_verdicts(run: DrillRun) -> list[Verdict]:
    world, c = run.world, run.drill.expect.cluster
    names = world.cluster.node_names()
    tainted = [n for n in names if world.tainted(n)]
    cordoned = [n for n in names if world.cluster.is_cordoned(n)]
    out = []
    if c.tainted is not None:
        out.append(_exact(f"cluster: exactly {c.tainted or 'no nodes'} carry the quarantine taint", c.tainted,
                          tainted))
    if c.cordoned is not None:
        out.append(_exact(f"cluster: exactly {c.cordoned or 'no nodes'} are cordoned", c.cordoned, cordoned))
    if c.tainted_count is not None:
        out.append(Verdict(f"cluster: {c.tainted_count} nodes carry the quarantine taint",
                           len(tainted) == c.tainted_count, f"{len(tainted)}: {tainted}"))
    if c.cordoned_count is not None:
        out.append(Verdict(f"cluster: {c.cordoned_count} nodes are cordoned", len(cordoned) == c.cordoned_count,
                           f"{len(cordoned)}: {cordoned}"))
    for node in c.drained:
        seeded = {p["metadata"]["uid"] for p in world.seeded_pods[node]}
        left = [p["metadata"]["name"] for p in world.training_pods(node) if p["metadata"]["uid"] in seeded]
        daemons = [p for p in world.cluster.pods_on(node) if p["metadata"]["namespace"] != TRAINING_NAMESPACE]
        problems = ([f"training pods left: {left}"] if left else []) + (
            ["DaemonSet pods were evicted"] if len(daemons) < 2 else [])
        out.append(Verdict(f"cluster: {node} drained (DaemonSet pods stay)", not problems,
                           "; ".join(problems) or "no training pod of the start left"))
    if c.isolated_gpus is not None:
        isolated = [f"{n}/{i}" for n in names for i in range(world.sim(n).gpu_count())
                    if world.sim(n).gpu_state(i).get("isolated")]
        out.append(_exact(f"cluster: exactly {c.isolated_gpus or 'no GPUs'} isolated", c.isolated_gpus, isolated))
    if c.restarted_jobs is not None:
        restarted = []
        for kind, plural in (("Job", "jobs"), ("PyTorchJob", "pytorchjobs")):
            for obj in world.cluster.list_objects(plural, TRAINING_NAMESPACE):
                if world.cluster.job_restarts(kind, TRAINING_NAMESPACE, obj["metadata"]["name"]) > 0:
                    restarted.append(f"{kind}/{obj['metadata']['name']}")
        out.append(_exact(f"cluster: exactly {c.restarted_jobs or 'no jobs'} restarted", c.restarted_jobs, restarted))
    if c.breaker is not None:
        from remediator.cli.operator import breaker_status  # what `remediator breaker status` shows

        server = world.nats_server
        creds = server.creds("operator") if server is not None and server.secure else None
        status = await breaker_status(world.nats_url, creds)
        state = "open" if status["open"] else "closed"
        since = f" since {status['tripped_at']}: {status['reason']}" if status["open"] else ""
        out.append(Verdict(f"`remediator breaker status`: {c.breaker}", state == c.breaker, state + since))
    return out


def _fault_scope(run: DrillRun, records: list[AuditRecord], spec_name: str) -> tuple[set[str], set[str]]:
    """Event ids and incidents of every fault made from the spec ``spec_name``."""
    ids: set[str] = set()
    incidents: set[str] = set()
    for f in run.faults[spec_name]:
        fids = match_events(records, run.world, f)
        ids |= fids
        incidents |= {r.incident for r in records if r.what == "decision" and r.event_id in fids
                      and "handler" in r.after and r.incident}
    return ids, incidents


def _audit_verdict(run: DrillRun, records: list[AuditRecord], a: AuditExpect) -> Verdict:
    picked = [r for r in records if r.what == a.what and r.time >= run.world.started]
    filters = [f"{a.what}"]
    if a.node is not None:
        picked = [r for r in picked if r.node == a.node]
        filters.append(f"on {a.node}")
    if a.fault is not None:
        ids, incidents = _fault_scope(run, records, a.fault)
        picked = [r for r in picked if r.event_id in ids or r.incident in incidents]
        filters.append(f"of fault {a.fault}")
    if a.guard is not None:
        picked = [r for r in picked if r.after.get("guard") == a.guard]
        filters.append(f"guard {a.guard}")
    if a.allowed is not None:
        picked = [r for r in picked if r.after.get("allowed") is a.allowed]
        filters.append("allowed" if a.allowed else "refused")
    if a.contains is not None:
        picked = [r for r in picked if a.contains in r.why]
        filters.append(f"saying {a.contains!r}")
    if a.actor is not None:
        picked = [r for r in picked if r.actor == a.actor]
        filters.append(f"by {a.actor}")
    n = len(picked)
    if a.count is not None:
        ok, want = n == a.count, f"exactly {a.count}"
    else:
        lo = a.min if a.min is not None else (1 if a.max is None else 0)
        ok = n >= lo and (a.max is None or n <= a.max)
        want = f"{lo}…{a.max}" if a.max is not None else f"at least {lo}"
    sample = f"; e.g. #{picked[0].seq} {picked[0].why[:100]}" if picked else ""
    return Verdict(f"audit: {want} {' '.join(filters)}", ok, f"{n} found{sample}")


def _node_out(node: dict[str, Any], taint_key: str) -> bool:
    spec = node.get("spec", {})
    return bool(spec.get("unschedulable")) or any(t.get("key") == taint_key for t in spec.get("taints") or [])


def _history(run: DrillRun) -> tuple[int, dict[str, list[str]]]:
    """From the API server's change history since the start: the most nodes out of service at any moment,
    and for each node what was done to it (taints, cordon, annotations, pods deleted or evicted)."""
    world = run.world
    key = world.settings.taint_key
    events = world.cluster.events_since(world.start_rv)
    out: set[str] = set()
    seen: set[str] = set()
    touched: dict[str, list[str]] = {}
    for n in world.cluster.node_names():
        first = next((e for e in events if e.plural == "nodes" and e.obj["metadata"]["name"] == n), None)
        before = first.prev if first is not None and first.prev is not None else world.cluster.node(n)
        if _node_out(before, key):
            out.add(n)
    peak = len(out)
    for e in events:
        if e.plural == "nodes":
            name = e.obj["metadata"]["name"]
            now = _node_out(e.obj, key)
            (out.add if now else out.discard)(name)
            peak = max(peak, len(out))
            prev = e.prev or {}
            for what, get in (("taints", lambda o: o.get("spec", {}).get("taints") or []),
                              ("cordon", lambda o: bool(o.get("spec", {}).get("unschedulable"))),
                              ("annotations", lambda o: o.get("metadata", {}).get("annotations") or {})):
                if get(prev) != get(e.obj) and what not in touched.get(name, []):
                    touched.setdefault(name, []).append(what)
        elif e.plural == "pods":
            node = e.obj.get("spec", {}).get("nodeName")
            uid = e.obj["metadata"]["uid"]
            if node and uid not in seen and (e.type == "DELETED" or e.obj["metadata"].get("deletionTimestamp")):
                seen.add(uid)
                touched.setdefault(node, []).append(f"pod {e.obj['metadata']['name']} deleted")
    return peak, touched


def _never_verdicts(run: DrillRun, records: list[AuditRecord]) -> list[Verdict]:
    world, nv = run.world, run.drill.expect.never
    out: list[Verdict] = []
    peak, touched = _history(run)
    if nv.max_nodes_out is not None:
        out.append(Verdict(f"never: more than {nv.max_nodes_out} nodes out of service at once",
                           peak <= nv.max_nodes_out, f"at most {peak} out at once"))
    untouched = ([n for n in world.cluster.node_names() if n not in run.drill.named_nodes()]
                 if nv.untouched == "others" else nv.untouched)
    if untouched:
        problems = []
        for n in untouched:
            reasons = list(touched.get(n, []))
            sim = world.sim(n)
            reasons += [f"GPU {i} isolated or reset" for i in range(sim.gpu_count())
                        if sim.gpu_state(i).get("isolated") or sim.gpu_state(i).get("reset_count")]
            if reasons:
                problems.append(f"{n}: {', '.join(reasons)}")
        label = "the other nodes" if nv.untouched == "others" else ", ".join(untouched)
        out.append(Verdict(f"never: {label} touched", not problems,
                           "; ".join(problems) or f"{len(untouched)} nodes untouched"))
    if nv.no_second_remediation:
        problems = _second_remediations(run, records)
        out.append(Verdict("never: a second incident or remediation for one fault", not problems,
                           "; ".join(problems) or "one incident and one run per fault"))
    if nv.no_step_repeated:
        problems = _repeated_steps(records, world)
        out.append(Verdict("never: a completed step run again", not problems,
                           "; ".join(problems) or "every completed step ran once"))
    if nv.audit_chains_verify:
        reports = verify_chains(records)
        bad = [f"{r.chain}: {r.problem}" for r in reports if not r.ok]
        out.append(Verdict("the audit chains verify", not bad,
                           "; ".join(bad) or f"{len(reports)} chains, {len(records)} records"))
    return out


def _runs(records: list[AuditRecord]) -> list[AuditRecord]:
    """The executor's first ``decision`` record of each run (not the dispatcher's, not a resume, not a retried
    start: a redelivery after every earlier delivery failed before the guards' outcome, so before any step)."""
    return [r for r in records if r.what == "decision" and "handler" not in r.after and not r.after.get("resumed")
            and not r.after.get("delivery")]


def _second_remediations(run: DrillRun, records: list[AuditRecord]) -> list[str]:
    problems = []
    for inc, n in Counter(r.incident for r in _runs(records)).items():
        if n > 1:
            problems.append(f"incident {inc} was started {n} times")
    for inc, n in Counter(r.incident for r in records if r.what == "playbook_finished").items():
        if n > 1:
            problems.append(f"incident {inc} finished {n} times")
    for name, res in run.results.items():
        ids = match_events(records, run.world, res.fault)
        incidents = {r.incident for r in records if r.what == "decision" and "handler" in r.after
                     and r.event_id in ids}
        if len(incidents) > 1:
            problems.append(f"fault {name} opened {len(incidents)} incidents: {sorted(i or '' for i in incidents)}")
    return problems


def _repeated_steps(records: list[AuditRecord], world: World) -> list[str]:
    problems = []
    done: dict[tuple[str, str], str] = {}
    for r in records:
        if r.incident is None or r.time < world.started:
            continue
        key = (r.incident, step_of(r))
        if r.what == "step_succeeded":
            if key in done:
                problems.append(f"{r.incident}: step {key[1]} succeeded twice ({done[key]}, then {r.actor})")
            done[key] = r.actor
        elif r.what == "step_started" and key in done:
            problems.append(f"{r.incident}: step {key[1]} started again by {r.actor} after {done[key]} completed it")
    return problems

