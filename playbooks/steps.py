"""The step library: every action a playbook may name, each idempotent and reporting what it changed.

Where it sits: the executor (``remediator.executor``) runs a playbook's steps by looking their names up in
``REGISTRY`` and calling them with a ``StepContext``. Steps ``await`` the ports of ``playbooks.ports``: the
Kubernetes port (node taints, cordons, evictions, job discovery and restarts, events) and the node agent
client (GPU isolation, reset, health, reboot); they import no concrete adapter, never see NATS messages or
the wall clock (``ctx.clock``/``ctx.sleep`` are injected), and never hop threads themselves.

A step is ``async def step(ctx, params) -> Change``, registered with ``@step(name, ...)``, which checks the
signature when applied and returns the function unchanged, so it stays directly testable. The
``contracts.Change`` it returns (the same value the adapter's mutations and the agent's replies carry) is
what the executor records as the step's ``before``/``after``/``detail``; a ``Skipped`` change says the step
chose not to act. Every step checks before it acts (running it twice changes nothing the second time),
raises ``StepFailed`` when it cannot do its job, and lets the adapters' errors propagate: a
``TemporaryError`` (Kubernetes or an agent unavailable for now) reaches ``bus.settle``, which naks with its
delay; a ``PermanentError`` (a drain that timed out, a job that cannot be restarted) fails the step like
``StepFailed``. ``undo`` names the step that reverses it, for rollback.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import httpx

from playbooks.ports import AgentPort, AuditPort, KubePort
from playbooks.schema import Escalation, Playbook, Verification
from remediator.adapters.agent import command_id
from remediator.contracts import AgentReply, Change, Decision, GpuRef, JobRef, StepRecord, resolve_job
from remediator.errors import RemediatorError
from remediator.settings import Settings

Quarantine = Literal["node", "gpu"] | None


async def _real_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class StepContext:
    """What a step may use: the decision it serves and the adapters, settings, clock and audit log.

    ``records`` holds this run's step records so far (by step id), so ``return_to_service`` can read what
    the earlier steps found and changed. ``step_key``/``timeout_s`` describe the step being run.
    """

    decision: Decision
    playbook: Playbook
    kube: KubePort
    agents: AgentPort
    settings: Settings
    clock: Callable[[], datetime]
    audit: AuditPort
    sleep: Callable[[float], Awaitable[None]] = _real_sleep
    records: Mapping[str, StepRecord] = field(default_factory=dict)
    step_key: str = ""
    timeout_s: float = 120.0
    http: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None

    @property
    def node(self) -> str:
        return self.decision.node

    @property
    def gpu(self) -> GpuRef | None:
        return self.decision.gpu

    def command_id(self, verb: str, n: int = 0) -> str:
        """The agent command id of this step's ``n``-th ``verb``: stable across retries and resumes."""
        return command_id(self.decision.incident_id, self.step_key, verb, n)


@dataclass(frozen=True)
class Skipped(Change):
    """The ``Change`` of a step that chose not to act (``return_to_service`` without a passing health
    check): recorded and audited as ``skipped``, not ``succeeded``."""


class StepFailed(RemediatorError):
    """The step could not do its job; the playbook's ``on_failure`` decides what happens next.

    ``before``/``after`` are the state it found and left, recorded like a ``Change``'s.
    """

    def __init__(self, detail: str, *, before: dict[str, Any] | None = None,
                 after: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.before = before or {}
        self.after = after or {}


StepFn = Callable[[StepContext, Mapping[str, Any]], Awaitable[Change]]


@dataclass(frozen=True)
class StepDef:
    """A registered step: its function, the parameters it accepts and how it affects capacity."""

    name: str
    fn: StepFn
    params: frozenset[str]
    undo: str | None
    quarantine: Quarantine
    description: str

    def check_params(self, params: Mapping[str, Any]) -> str | None:
        unknown = sorted(set(params) - self.params)
        if unknown:
            return f"unknown parameter(s) {unknown} for {self.name} (accepts {sorted(self.params) or 'none'})"
        return None


@dataclass
class StepRegistry:
    """Injectable registry of steps; the module-level ``REGISTRY`` is the default one."""

    steps: dict[str, StepDef] = field(default_factory=dict)

    def register(self, d: StepDef) -> None:
        if d.name in self.steps:
            raise ValueError(f"step {d.name!r} registered twice")
        self.steps[d.name] = d

    def get(self, name: str) -> StepDef:
        return self.steps[name]

    def names(self) -> list[str]:
        return sorted(self.steps)

    def __contains__(self, name: object) -> bool:
        return name in self.steps


REGISTRY = StepRegistry()
_STEP_PARAMS = ("ctx", "params")


def step(name: str, *, params: Iterable[str] = (), undo: str | None = None, quarantine: Quarantine = None,
         registry: StepRegistry | None = None) -> Callable[[StepFn], StepFn]:
    """Register ``async def fn(ctx, params) -> Change`` as step ``name``; returns ``fn`` unchanged.

    ``params`` are the parameter names a playbook may pass; ``undo`` the step that reverses this one;
    ``quarantine`` says whether the step takes a node or a GPU out of service (blast radius, breaker).
    """

    def wrap(fn: StepFn) -> StepFn:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"step {name!r}: {fn.__name__} must be an async function")
        got = tuple(inspect.signature(fn).parameters)
        if got != _STEP_PARAMS:
            raise TypeError(f"step {name!r}: {fn.__name__} must take {_STEP_PARAMS}, not {got}")
        doc = inspect.getdoc(fn) or ""
        (registry or REGISTRY).register(
            StepDef(name, fn, frozenset(params), undo, quarantine, doc.splitlines()[0] if doc else ""))
        return fn

    return wrap


def _change(c: Change, what: str) -> Change:
    """``c``, saying ``what`` was done when the adapter said nothing."""
    return c if c.detail else replace(c, detail=what)


def _need_gpu(ctx: StepContext) -> GpuRef:
    if ctx.gpu is None:
        raise StepFailed("this step needs a GPU and the decision names none")
    return ctx.gpu


def _reply(reply: AgentReply, what: str) -> Change:
    if not reply.ok:
        raise StepFailed(f"{what}: agent refused: {reply.detail}", before=dict(reply.before),
                         after=dict(reply.after))
    return _change(reply.change, what)


# --- node-level steps (Kubernetes) ---------------------------------------------------------------------


def taint_value(ctx: StepContext, params: Mapping[str, Any]) -> str:
    """The value of our quarantine taint for this step: its ``value`` parameter, else the playbook's name (the
    one rule, shared by the taint steps and the executor's combined taint+cordon)."""
    return str(params.get("value") or ctx.decision.playbook)


@step("taint", params=("effect", "value"), undo="untaint", quarantine="node")
async def taint_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Add the service's quarantine taint (``settings.taint_key=<playbook>:NoSchedule`` by default)."""
    c = await ctx.kube.taint(ctx.node, ctx.settings.taint_key, taint_value(ctx, params),
                             str(params.get("effect", "NoSchedule")))
    return _change(c, "taint")


@step("untaint", params=("effect", "value"))
async def untaint_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Remove the service's quarantine taint, only when it carries our value (never someone else's)."""
    c = await ctx.kube.untaint(ctx.node, ctx.settings.taint_key, str(params.get("effect", "NoSchedule")),
                               only_if_value=taint_value(ctx, params))
    return _change(c, "untaint")


@step("cordon", undo="uncordon", quarantine="node")
async def cordon_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Mark the node unschedulable (the adapter marks the cordon as ours with an annotation)."""
    return _change(await ctx.kube.cordon(ctx.node), "cordon")


@step("uncordon")
async def uncordon_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Make the node schedulable again, only when the cordon is ours."""
    return _change(await ctx.kube.uncordon(ctx.node, only_if_ours=True), "uncordon")


@step("drain", params=("grace_period_s",), quarantine="node")
async def drain_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Evict every pod but DaemonSet and mirror pods through the Eviction API, honouring PDBs."""
    grace = int(params.get("grace_period_s", ctx.settings.drain_grace_period_s))
    timeout = min(ctx.timeout_s, ctx.settings.drain_timeout_s)
    return _change(await ctx.kube.drain(ctx.node, timeout_s=timeout, grace_period_s=grace), "drain")


async def _gpu_holders(ctx: StepContext, gpu: GpuRef, what: str) -> list[dict[str, Any]] | None:
    """The pods holding ``gpu`` now (``{namespace, name, uid, container}``), as its node agent reads them from
    the kubelet's device allocation (``status`` with the GPU); None when the agent cannot tell."""
    reply = await ctx.agents.call(ctx.node, "status", gpu=gpu, command_id=ctx.command_id("status"),
                                  timeout_s=min(ctx.timeout_s, 30.0))
    if not reply.ok:
        raise StepFailed(f"{what}: agent refused: {reply.detail}", before=dict(reply.before),
                         after=dict(reply.after))
    if not reply.after.get("holders_known"):
        return None
    return [dict(h) for h in reply.after.get("holders") or [] if isinstance(h, Mapping)]


@step("evict_gpu_pods", params=("grace_period_s",), quarantine="gpu")
async def evict_gpu_pods(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Evict exactly the pods that hold the decision's GPU, by UID, as the node agent names them (the
    kubelet's device allocation); the node's other GPUs and their pods stay. Fails when the agent cannot
    tell which pods hold the GPU: then nobody is evicted and the playbook goes to its next rung."""
    gpu = _need_gpu(ctx)
    holders = await _gpu_holders(ctx, gpu, "evict_gpu_pods")
    if holders is None:
        raise StepFailed(f"evict_gpu_pods: the agent on {ctx.node} cannot tell which pods hold GPU {gpu.key}")
    if not holders:
        return Change(False, {"node": ctx.node, "holders": []}, {"node": ctx.node, "evicted": []},
                      f"no pod holds GPU {gpu.key} of {ctx.node}")
    grace = int(params.get("grace_period_s", ctx.settings.drain_grace_period_s))
    timeout = min(ctx.timeout_s, ctx.settings.drain_timeout_s)
    c = await ctx.kube.evict_pods(ctx.node, holders, timeout_s=timeout, grace_period_s=grace)
    return _change(replace(c, before={**c.before, "holders": holders}), "evict_gpu_pods")


# --- GPU-level steps (node agent) ----------------------------------------------------------------------


def _joined(agent: Change, kube: Change) -> Change:
    """The agent's change and the Kubernetes withdrawal's as one: the agent's state at the top level, the
    scheduler's under ``withdrawal``; the detail says both."""
    return Change(agent.changed or kube.changed, {**agent.before, "withdrawal": kube.before},
                  {**agent.after, "withdrawal": kube.after}, f"{agent.detail}; {kube.detail}")


@step("isolate_gpu", params=("effect",), undo="release_gpu", quarantine="gpu")
async def isolate_gpu(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Take one GPU out of service so the scheduler honours it: the agent drains it on the node (``nvidia-smi
    drain``: out of the device plugin's healthy set), then Kubernetes is told (a DRA DeviceTaintRule on that
    device with ``effect`` NoSchedule, or NoExecute to have the control plane evict its pods; with the device
    plugin, which has no per-device control, our NoSchedule node taint)."""
    gpu = _need_gpu(ctx)
    effect = str(params.get("effect", "NoSchedule"))
    if effect not in ("NoSchedule", "NoExecute"):
        raise StepFailed(f"isolate_gpu: effect must be NoSchedule or NoExecute, not {effect!r}")
    reply = await ctx.agents.call(ctx.node, "isolate_gpu", gpu=gpu, command_id=ctx.command_id("isolate_gpu"),
                                  timeout_s=min(ctx.timeout_s, 30.0))
    agent = _reply(reply, "isolate_gpu")
    return _joined(agent, await ctx.kube.withdraw_gpu(ctx.node, gpu, effect=effect, value=ctx.decision.playbook))


@step("release_gpu")
async def release_gpu(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Put an isolated GPU back into the schedulable set: the agent undrains it, then Kubernetes is told
    (our DeviceTaintRule deleted, or the GPU taken off the node's withdrawn list and our node taint removed
    with the last one)."""
    gpu = _need_gpu(ctx)
    reply = await ctx.agents.call(ctx.node, "release_gpu", gpu=gpu, command_id=ctx.command_id("release_gpu"),
                                  timeout_s=min(ctx.timeout_s, 30.0))
    agent = _reply(reply, "release_gpu")
    return _joined(agent, await ctx.kube.restore_gpu(ctx.node, gpu))


@step("kill_orphans")
async def kill_orphans(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Kill processes holding GPU memory whose pod is gone."""
    reply = await ctx.agents.call(ctx.node, "kill_orphans", gpu=ctx.gpu, command_id=ctx.command_id("kill_orphans"),
                                  timeout_s=min(ctx.timeout_s, 30.0))
    return _reply(reply, "kill_orphans")


def _verification(ctx: StepContext, params: Mapping[str, Any]) -> Verification:
    v = ctx.playbook.verification
    hold = float(params.get("hold_down_s", v.hold_down_s))
    if ctx.settings.verify_hold_down_s is not None:
        hold = ctx.settings.verify_hold_down_s
    interval = float(params.get("interval_s", v.interval_s))
    if ctx.settings.verify_interval_s is not None:
        interval = ctx.settings.verify_interval_s
    checks = tuple(params.get("checks", v.checks))
    return Verification(hold_down_s=hold, interval_s=interval, checks=checks)


@step("health_check", params=("hold_down_s", "interval_s", "checks", "scope"))
async def health_check(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Pass only when the agent's health check passes continuously for the hold-down time."""
    v = _verification(ctx, params)
    gpu = ctx.gpu if params.get("scope", "gpu") == "gpu" else None
    started = ctx.clock()
    passing_since: datetime | None = None
    n, last = 0, None
    first: dict[str, Any] | None = None
    while True:
        reply = await ctx.agents.call(ctx.node, "health_check", gpu=gpu, params={"checks": list(v.checks)},
                                      command_id=ctx.command_id("health_check", n), timeout_s=30.0)
        now = ctx.clock()
        first = first if first is not None else dict(reply.before or reply.after)
        last = reply
        if reply.ok:
            passing_since = passing_since or now
            if (now - passing_since).total_seconds() >= v.hold_down_s:
                return Change(False, first, dict(reply.after), f"healthy for {v.hold_down_s:g}s ({n + 1} probes)")
        else:
            passing_since = None
        if (now - started).total_seconds() + v.interval_s > ctx.timeout_s:
            raise StepFailed(f"not healthy for {v.hold_down_s:g}s within {ctx.timeout_s:g}s: "
                             f"{last.detail if last else ''}", before=first, after=dict(last.after) if last else {})
        await ctx.sleep(v.interval_s)
        n += 1


# --- jobs ----------------------------------------------------------------------------------------------


def _job_name(ctx: StepContext) -> tuple[str | None, str | None]:
    """``(namespace, name)`` of the decision's job: ``decision.job`` (``name`` or ``ns/name``), else the one
    resolver's answer (``contracts.resolve_job``: the owner reference the event's maker saw, then the job
    labels); the namespace from the event's origin, else its labels. Never a name guessed from a pod's."""
    d = ctx.decision
    job = d.job or resolve_job(d.origin, d.labels)
    namespace = d.origin.namespace or d.labels.get("namespace") or d.labels.get("pod_namespace") or None
    if job and "/" in job:
        namespace, job = job.split("/", 1)
    return namespace, job


async def _find_job(ctx: StepContext) -> JobRef:
    """The controller of the decision's job, found by the Kubernetes port (owner references of the pods on
    the node, else by name among the kinds that run gangs); without a name, the one job whose pods hold the
    decision's GPU (as its node agent names them), or the one job on the node where the agent cannot tell."""
    namespace, name = _job_name(ctx)
    gpu = ctx.gpu
    on_gpu: Callable[[dict[str, Any]], bool] | None = None
    if name is None and gpu is not None:
        holders = await _gpu_holders(ctx, gpu, "restart_job")
        if holders is not None:
            uids = {str(h.get("uid")) for h in holders}

            def on_gpu(pod: dict[str, Any]) -> bool:
                return str(pod.get("uid")) in uids

    job = await ctx.kube.find_job(ctx.node, name=name, namespace=namespace, pod_filter=on_gpu)
    if job is not None:
        return job
    if name is None:
        raise StepFailed(f"restart_job: the decision names no job and no single job runs on {ctx.node}")
    raise StepFailed(f"restart_job: no PyTorchJob, Job or JobSet named {name!r} in {namespace or 'default'}")


@step("restart_job", params=("grace_period_s",))
async def restart_job(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Restart the whole gang of the decision's job (PyTorchJob, batch Job, StatefulSet/Deployment pods).

    The job is found from its pods' owner references (labels fill in); every rank is deleted for its
    controller to recreate, once per incident (the restart id makes a resumed restart finish, not repeat).
    """
    job = await _find_job(ctx)
    grace = int(params["grace_period_s"]) if "grace_period_s" in params else None
    c = await ctx.kube.restart_job(job, restart_id=ctx.command_id("restart_job"), grace_period_s=grace)
    return _change(c, f"restart_job {job.key}")


# --- hand-over and return ------------------------------------------------------------------------------


async def _post(ctx: StepContext, url: str, body: dict[str, Any]) -> None:
    if ctx.http is not None:
        await ctx.http(url, body)
        return
    async with httpx.AsyncClient(timeout=10.0) as client:
        r = await client.post(url, json=body)
        r.raise_for_status()



@step("escalate", params=("reason", "action", "severity"))
async def escalate(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Hand over to a person: node annotation, Kubernetes Event, audit record, optional webhook."""
    esc: Escalation = ctx.playbook.escalation
    reason = str(params.get("reason") or ctx.decision.reason)
    action = str(params.get("action") or esc.action)
    severity = str(params.get("severity") or esc.severity)
    d = ctx.decision
    after: dict[str, Any] = {"action": action, "severity": severity}
    changed = False
    if esc.annotate or esc.event:
        c = await ctx.kube.escalate(ctx.node, f"[{severity}] {action}: {reason}", d.incident_id)
        changed = bool(c.changed)
        after.update(c.after)
    await ctx.audit.append(ctx.node, "escalated", f"{action}: {reason}", incident=d.incident_id,
                           gpu=d.gpu.key if d.gpu else None, job=d.job, event_id=d.event_id, after=after)
    if esc.webhook and ctx.settings.escalation_webhook_url:
        await _post(ctx, ctx.settings.escalation_webhook_url,
                    {"node": ctx.node, "gpu": d.gpu.model_dump() if d.gpu else None, "incident": d.incident_id,
                     "playbook": d.playbook, "action": action, "severity": severity, "reason": reason})
        after["webhook"] = True
    return Change(changed, {}, after, f"escalated: {action}")


def placed_by_us(rec: StepRecord, ctx: StepContext) -> bool:
    """Whether what step record ``rec`` leaves in place was put there by this service.

    Read from the before-state the step recorded, which survives a resumed step: a cordon is someone
    else's when the node was already unschedulable without our cordon annotation; a taint under our key
    with another value is someone else's; a GPU isolation is ours when the isolating step changed it.
    """
    if rec.status != "succeeded":
        return False
    if rec.name == "cordon":
        return not (rec.before.get("unschedulable") and not rec.before.get("cordoned_by_us"))
    if rec.name == "taint":
        value = str(rec.params.get("value") or ctx.decision.playbook)
        return not any(t.get("key") == ctx.settings.taint_key and t.get("value") != value
                       for t in rec.before.get("taints", []))
    return bool(rec.after.get("changed_by_us"))


@step("return_to_service", params=("require_health",))
async def return_to_service(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Undo what this run added (taint, cordon, GPU isolation) once the last health check passed.

    Never removes a cordon or taint the run found already set: the before-state recorded by the step says
    whether it was ours.
    """
    recs = ctx.records
    if params.get("require_health", True):
        # the checks that ran: a rung skipped because an earlier one healed the fault leaves skipped checks
        checks = [r for r in recs.values() if r.name == "health_check" and r.status in ("succeeded", "failed")]
        if not checks or checks[-1].status != "succeeded":
            return Skipped(False, {}, {"returned": False}, "left out of service: no passing health check in this run")
    undone: list[str] = []
    kept: list[str] = []
    for rec in recs.values():
        if rec.name not in ("taint", "cordon", "isolate_gpu"):
            continue
        if not placed_by_us(rec, ctx):
            kept.append(rec.name)
            continue
        if rec.name == "taint":
            await untaint_node(ctx, rec.params)
        elif rec.name == "cordon":
            await uncordon_node(ctx, {})
        else:
            await release_gpu(ctx, {})
        undone.append(rec.name)
    detail = f"removed {undone or 'nothing'}" + (f"; left {kept} (not added by this run)" if kept else "")
    return Change(bool(undone), {"ours": undone, "not_ours": kept}, {"returned": True}, detail)


def quarantine_of(playbook: Playbook, registry: StepRegistry = REGISTRY) -> Quarantine:
    """How far the playbook takes capacity out: ``node`` beats ``gpu``; None when it takes none."""
    kinds = {registry.get(s.name).quarantine for s in playbook.steps if s.name in registry}
    if "node" in kinds:
        return "node"
    if "gpu" in kinds:
        return "gpu"
    return None


# The GPU reset and the reboot steps live in their own modules, which register them here when imported.
from playbooks import gpu_reset, reboot  # noqa: E402,F401
