"""The drill runner: builds the world a drill file describes, plays its timeline, settles, judges.

Where it sits: on top of the drill harness, under the command line (``remediator drill run``,
``remediator demo``: ``remediator.cli.drill``/``demo``). ``run_drill`` takes a validated drill
(``chaos.catalog``/``chaos.schema``), makes one ``Fault`` per fault of its timeline (its injector from
``chaos.injectors``, its checks from ``chaos.checks``), starts the world (``chaos.world.environment``),
plays the timeline in order — injecting faults and taking chaos actions (``chaos.actions``), waiting for a
playbook step where an entry says ``when`` —, follows every fault to rest through the audit trail
(``chaos.follow``), and judges the fault checks and the drill's expectations (``chaos.expectations``).
It returns a ``DrillReport``: one verdict per expectation (and per timeline action), passed only when all
pass. This runner builds the simulated world; ``remediator drill run --kubeconfig`` runs the drills that fit
a real cluster through ``chaos.remote`` instead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos import actions
from chaos.checks import CHECKS, judge
from chaos.expectations import DrillRun, Verdict, judge_drill
from chaos.faults import Fault, FaultResult, Progress
from chaos.follow import follow, read_records, settle_faults, step_running
from chaos.schema import (
    ActionSpec,
    AgentDisconnectSpec,
    BlockPdbSpec,
    Drill,
    FaultExpect,
    FaultSpec,
    HostileClientSpec,
    KillServiceSpec,
    KubeApiErrorsSpec,
    KubeLatencySpec,
    ManualUncordonSpec,
    NatsRestartSpec,
    NatsServerKillSpec,
    OptOutSpec,
    ReplicaLossSpec,
)
from chaos.world import ExtraJob, World, environment


@dataclass
class DrillReport:
    """What ``run_drill`` found: every verdict, and each fault's result (its audit timeline included)."""

    name: str
    seconds: float
    expectations: list[Verdict] = field(default_factory=list)
    results: list[FaultResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.expectations) and all(v.passed for v in self.expectations)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "seconds": round(self.seconds, 2),
                "expectations": [v.to_json() for v in self.expectations]}



def _fault(spec: FaultSpec, node: str, expect: FaultExpect) -> Fault:
    checks = [CHECKS[c] for c in expect.check]

    def check(world: World, f: Fault) -> list[str]:
        return [p for c in checks for p in c(world, f)]

    return Fault(spec.fault_name(node), node, spec.gpu, spec.injector(), expect.playbook, tuple(expect.outcomes),
                 check)


def build_faults(drill: Drill) -> dict[str, list[Fault]]:
    """The faults of the timeline, by the name their spec gives (a fanned-out spec makes several)."""
    out: dict[str, list[Fault]] = {}
    for entry in drill.timeline:
        if entry.fault is not None:
            spec = entry.fault
            out[spec.name] = [_fault(spec, n, drill.expect.faults[spec.name]) for n in spec.targets()]
    return out


async def run_drill(drill: Drill, progress: Progress, *, label: str = "drill", data_dir: Path | None = None,
                    nats_port: int | None = None) -> DrillReport:
    """Start the world the drill describes, play its timeline, follow its faults to rest and judge every
    expectation. ``label`` names the replicas (``<label>-replica-<n>``); ``data_dir`` and ``nats_port`` are
    the embedded nats-server's store (kept afterwards) and port. Never raises for a failing drill: a crash
    of the harness is a failed verdict."""
    t0 = time.monotonic()
    report = DrillReport(drill.name, 0.0)
    faults = build_faults(drill)
    agents = None if drill.cluster.agents == "all" else list(drill.cluster.agents)
    jobs = [ExtraJob(j.name, j.node, j.gpus) for j in drill.cluster.jobs]
    try:
        async with environment(progress, nodes=drill.cluster.nodes, pools=drill.cluster.pools,
                               gpus=drill.cluster.gpus_per_node, settings=drill.settings, agents=agents,
                               jobs=jobs, label=label,
                               crashable=bool(drill.crashes() or drill.replica_losses()), kubelet=True,
                               data_dir=data_dir, nats_port=nats_port,
                               service_replicas=drill.cluster.replicas,
                               nats_servers=drill.cluster.nats_servers,
                               gpu_operator=drill.cluster.gpu_operator,
                               unmanaged_operands=drill.cluster.unmanaged_operands,
                               gpu_allocation=drill.cluster.gpu_allocation,
                               gpu_pods_per_node=drill.cluster.gpu_pods_per_node,
                               gpu_conditions=[c.model_dump() for c in drill.cluster.gpu_conditions]) as world:
            world.faults = [f for fs in faults.values() for f in fs]
            run = DrillRun(world, drill, progress, faults, {f.name: FaultResult(f) for f in world.faults})
            try:
                await _play(run)
            finally:
                for _what, task in run.background:
                    task.cancel()
            report.results = list(run.results.values())
            report.expectations = run.timeline + await judge_drill(run)
    except Exception as e:  # the harness itself failed: a failed drill, with the reason
        report.expectations.append(Verdict("the drill ran to its end", False, f"{type(e).__name__}: {e}"))
    report.seconds = time.monotonic() - t0
    return report


async def inject_fault(world: World, f: Fault, res: FaultResult, progress: Progress) -> None:
    """Say what is injected, stamp the injection time, and inject it."""
    progress(f"→ inject {f.name:<26} {f.kind} {f.code} on {f.node}"
             + (f" GPU {f.gpu}" if f.gpu is not None else "") + f" via {f.via}")
    res.injected_at = datetime.now(UTC)
    await f.injector(world, f)



async def _play(run: DrillRun) -> None:
    world, drill = run.world, run.drill
    crashes = drill.crashes()
    if crashes:
        await actions.set_redelivery(world, min(c.redeliver_after_s for c in crashes))
    run.t0 = time.monotonic()
    for entry in drill.timeline:
        await asyncio.sleep(max(0.0, run.t0 + entry.at_s - time.monotonic()))
        kind = entry.fault.type if entry.fault is not None else entry.action.type if entry.action else ""
        label = f"{entry.at_s:g}s {kind}"
        if entry.when is not None:
            met = await step_running(world, entry.when.node, entry.when.step_running, entry.when.within_s)
            if met is None:
                run.timeline.append(Verdict(f"timeline {label}: when {entry.when.step_running} runs on "
                                            f"{entry.when.node}", False,
                                            f"the step was not seen running within {entry.when.within_s:g}s"))
                continue
            await asyncio.sleep(entry.when.plus_s)
            label += f" (while {entry.when.step_running} ran on {entry.when.node})"
        try:
            if entry.fault is not None:
                for f in run.faults[entry.fault.name]:
                    await inject_fault(world, f, run.results[f.name], run.progress)
            else:
                assert entry.action is not None
                await _act(run, entry.action, label)
        except Exception as e:
            run.timeline.append(Verdict(f"timeline {label}", False, f"{type(e).__name__}: {e}"))
    deadline = run.t0 + drill.expect.deadline_s
    results = list(run.results.values())
    settled = await settle_faults(world, results, run.progress, max(0.0, deadline - time.monotonic()),
                                     poll_s=0.25)
    for what, task in run.background:
        try:
            detail = await asyncio.wait_for(task, timeout=max(5.0, deadline - time.monotonic()))
            run.timeline.append(Verdict(f"timeline {what}", True, detail))
        except Exception as e:
            run.timeline.append(Verdict(f"timeline {what}", False, f"{type(e).__name__}: {e}"))
    run.background.clear()
    await asyncio.sleep(drill.expect.quiet_s)  # late duplicates or second remediations would show by now
    records = await read_records(world)
    for res in results:  # refresh from the final trail (actions, outcome)
        follow(records, world, res.fault, res)
    judge(world, results, settled, drill.expect.deadline_s)


async def _act(run: DrillRun, action: ActionSpec, label: str) -> None:
    world = run.world

    def done(detail: str) -> None:
        run.progress(f"⚡ {label}: {detail}")
        run.timeline.append(Verdict(f"timeline {label}", True, detail))

    def later(coro: Any, what: str) -> None:
        run.progress(f"⚡ {label}: {what}")
        run.background.append((label, asyncio.create_task(coro)))

    if isinstance(action, NatsRestartSpec):
        later(actions.nats_restart(world, action.down_s), f"stopping nats-server for {action.down_s:g}s")
    elif isinstance(action, KubeApiErrorsSpec):
        actions.kube_api_errors(world, action.status, count=action.count, method=action.method, path=action.path,
                           retry_after=action.retry_after)
        run.progress(f"⚡ {label}: the next {action.count} {action.method} {action.path} requests answer "
                     f"{action.status}" + (f" (Retry-After {action.retry_after})" if action.retry_after else ""))
    elif isinstance(action, KubeLatencySpec):
        task = actions.kube_latency(world, action.seconds, method=action.method, path=action.path, for_s=action.for_s)
        if action.for_s is None:
            done(await task)
        else:
            later(task, f"+{action.seconds:g}s on {action.method} {action.path} for {action.for_s:g}s")
    elif isinstance(action, KillServiceSpec):
        old = world.replica.actor
        new = await actions.kill_replica(world)
        done(f"{old} killed (no graceful drain); {new.actor} started on the same bus")
    elif isinstance(action, NatsServerKillSpec):
        detail, elections = await actions.nats_server_kill(world, action.server, action.down_s)
        done(detail)
        if elections is not None:
            later(elections, "following the Raft elections")
    elif isinstance(action, ReplicaLossSpec):
        done(await actions.lose_replica(world, action.node))
    elif isinstance(action, AgentDisconnectSpec):
        later(actions.agent_disconnect(world, action.node, action.down_s),
              f"agent of {action.node} stopped for {action.down_s:g}s")
    elif isinstance(action, ManualUncordonSpec):
        done(actions.manual_uncordon(world, action.node, remove_taint=action.remove_taint))
    elif isinstance(action, OptOutSpec):
        done(actions.opt_out(world, action.node))
    elif isinstance(action, HostileClientSpec):
        from chaos import hostile

        done(await hostile.attack(world, action.node, action.other))
    else:
        assert isinstance(action, BlockPdbSpec)
        done(actions.block_pdb(world, action.namespace, action.name, action.blocked))
