"""The GPU reset steps: ``reset_gpu``, safe on a GPU Operator node, and ``collect_bug_report`` after a reset
that failed.

Where it sits: in the step library (``playbooks.steps`` imports this module so its steps register in
``REGISTRY``); it talks to Kubernetes and the node agent through the ports of ``playbooks.ports`` only.

``reset_gpu``, in order:

1. **Operands off.** The GPU Operator's operands (device plugin, DCGM and its exporter, feature discovery,
   MIG manager: the setting ``gpu_operands``) hold every GPU of their node open, so a reset fails "in use"
   while they run. Each operand's DaemonSet selects nodes by the label ``nvidia.com/gpu.deploy.<operand>``;
   the step sets each such label the node carries (and that is not already ``false``) to ``false``, after
   writing the values it found into the node annotation ``gpu-remediator.io/operands-withdrawn`` (so a run
   resumed after a crash restores them too), and waits up to ``gpu_operand_timeout_s`` for the pods whose
   ``nodeSelector`` names those labels to be gone. A node without any of the labels is not a GPU Operator
   node: nothing is changed.
2. **Reset** through the agent (``reset_gpu`` verb: by UUID, persistence mode handled, verified). While a
   process holds the GPU the agent refuses naming the PIDs and their pods; the step names the pods (from
   their UIDs) and waits for them, up to ``wait_idle_s``, except for DaemonSet pods and operands that did
   not leave, which no waiting removes: then the reset is refused at once with the holders named.
3. **Labels back**, whatever happened: each label we changed gets the value it had (a label that was absent
   is removed again), and the annotation goes. Labels we did not change are never touched.

A refused reset fails the step with ``after.refused``/``after.holders``; a reset that ran and failed (or
whose verification failed: another UUID at the PCI address, retirement or remap pending) fails it with
``after.reset_failed``. ``collect_bug_report`` runs the agent's bug-report command only after the latter
(it reads the run's ``reset_gpu`` record), so playbooks place it first in the rung after the reset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from playbooks.steps import Skipped, StepContext, StepFailed, _need_gpu, step
from remediator.contracts import AgentReply, Change, GpuRef

OPERAND_LABEL_PREFIX = "nvidia.com/gpu.deploy."
OPERANDS_ANNOTATION = "gpu-remediator.io/operands-withdrawn"


def operand_labels(operands: str) -> list[str]:
    """The ``nvidia.com/gpu.deploy.<operand>`` labels of a comma-separated operand list."""
    return [OPERAND_LABEL_PREFIX + o.strip() for o in operands.split(",") if o.strip()]


def _saved(annotations: Mapping[str, str]) -> dict[str, str | None]:
    raw = annotations.get(OPERANDS_ANNOTATION)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    labels = doc.get("labels") if isinstance(doc, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {str(k): None if v is None else str(v) for k, v in labels.items() if str(k).startswith(OPERAND_LABEL_PREFIX)}


async def withdraw_operands(ctx: StepContext) -> dict[str, str | None]:
    """Set the node's operand labels to ``false``; returns each changed label's value before (None: it was
    absent), including those an interrupted attempt changed (read back from our annotation)."""
    node = await ctx.kube.get_node(ctx.node)
    labels: dict[str, str] = dict(node.get("labels") or {})
    saved = _saved(node.get("annotations") or {})
    wanted = {k: "false" for k in operand_labels(ctx.settings.gpu_operands) if k in labels and labels[k] != "false"}
    previous: dict[str, str | None] = {**{k: labels[k] for k in wanted}, **saved}
    if wanted:
        await ctx.kube.annotate(ctx.node, {OPERANDS_ANNOTATION: json.dumps(
            {"incident": ctx.decision.incident_id, "labels": previous}, sort_keys=True)})
        await ctx.kube.label(ctx.node, dict(wanted))
    return previous


async def restore_operands(ctx: StepContext, previous: Mapping[str, str | None]) -> Change:
    """Give each label we changed its value back and drop our annotation."""
    if not previous:
        return Change(False, {}, {}, "")
    c = await ctx.kube.label(ctx.node, dict(previous))
    await ctx.kube.annotate(ctx.node, {OPERANDS_ANNOTATION: None})
    return c


def _pod_name(p: Mapping[str, Any]) -> str:
    return f"{p.get('namespace')}/{p.get('name')}"


async def wait_operands_gone(ctx: StepContext, keys: list[str], timeout_s: float,
                             interval_s: float) -> tuple[list[dict[str, Any]], float]:
    """The operand pods still on the node after at most ``timeout_s`` (terminating ones count: they still
    hold the GPU), and how long it waited."""
    waited = 0.0
    while True:
        left = await ctx.kube.pods_selecting(ctx.node, keys)
        if not left or waited >= timeout_s:
            return left, waited
        await ctx.sleep(interval_s)
        waited += interval_s


async def name_holders(ctx: StepContext, processes: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The processes an agent named as holding the GPU, each with its pod (namespace/name, DaemonSet or not)
    found by UID among the node's pods; ``pod`` None for a process of no pod on this node."""
    pods = {str(p.get("uid")): p for p in await ctx.kube.pods_on_node(ctx.node)}
    out = []
    for proc in processes[:64]:
        pod = pods.get(str(proc.get("pod_uid"))) if proc.get("pod_uid") else None
        out.append({"pid": proc.get("pid"), "pod_uid": proc.get("pod_uid"),
                    "pod": _pod_name(pod) if pod is not None else None,
                    "daemonset": bool(pod and pod.get("daemonset"))})
    return out


def _holders_text(holders: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"pid {h.get('pid')}" + (f" ({h['pod']})" if h.get("pod") else "") for h in holders)


@step("reset_gpu", params=("wait_idle_s", "interval_s"))
async def reset_gpu(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Reset the GPU through the agent once nothing holds it, moving GPU Operator operands off for it."""
    gpu = _need_gpu(ctx)
    interval = float(params.get("interval_s", 2.0))
    budget = max(ctx.timeout_s - 15.0, 0.0)  # time left for the labels to go back if the step is cut short
    previous = await withdraw_operands(ctx)
    withdrawn = sorted(k for k in previous)
    base: dict[str, Any] = {"operands_withdrawn": withdrawn}
    try:
        waited = 0.0
        if withdrawn:
            left, waited = await wait_operands_gone(ctx, withdrawn, min(ctx.settings.gpu_operand_timeout_s,
                                                                        budget / 2), interval)
            if left:
                names = ", ".join(_pod_name(p) for p in left)
                raise StepFailed(f"reset_gpu: refused: GPU Operator operand pod(s) did not leave {ctx.node} within "
                                 f"{waited:g}s: {names}", after={**base, "refused": "operands_stayed",
                                                                 "holders": [{"pod": _pod_name(p)} for p in left]})
        deadline = float(params.get("wait_idle_s", max(budget - waited, 0.0)))
        result = await _reset(ctx, gpu, deadline=deadline, interval=interval, base=base)
    except StepFailed as e:
        restored = await restore_operands(ctx, previous)
        e.after = {**e.after, "operands_restored": restored.after.get("labels", {})}
        raise
    except BaseException:  # cancelled (the step's timeout) or an adapter error: the labels go back first
        await restore_operands(ctx, previous)
        raise
    restored = await restore_operands(ctx, previous)
    if not previous:
        return result
    return replace(result, after={**result.after, "operands_restored": restored.after.get("labels", {})},
                   detail=f"{result.detail}; GPU Operator operands moved off for the reset and their labels "
                          f"restored ({', '.join(withdrawn)})")


async def _reset(ctx: StepContext, gpu: GpuRef, *, deadline: float, interval: float,
                 base: dict[str, Any]) -> Change:
    waited, n = 0.0, 0
    while True:
        reply: AgentReply = await ctx.agents.call(ctx.node, "reset_gpu", gpu=gpu,
                                                  command_id=ctx.command_id("reset_gpu", n),
                                                  timeout_s=min(ctx.timeout_s, 60.0))
        after = {**dict(reply.after), **base}
        if reply.ok:
            c = reply.change
            return Change(c.changed, dict(c.before), after, c.detail or "reset_gpu")
        if reply.after.get("reset_failed"):
            raise StepFailed(f"reset_gpu: the reset failed: {reply.detail}", before=dict(reply.before), after=after)
        holders: list[dict[str, Any]] = []
        if reply.after.get("refused") == "in_use":
            holders = await name_holders(ctx, list(reply.after.get("processes") or []))
            after["holders"] = holders
            stuck = [h for h in holders if h["daemonset"]]
            if stuck:
                raise StepFailed(f"reset_gpu: refused: GPU {gpu.key} is held by DaemonSet pod(s) that do not leave "
                                 f"by waiting: {_holders_text(stuck)}", before=dict(reply.before), after=after)
        if waited >= deadline:
            named = f" (held by {_holders_text(holders)})" if holders else ""
            raise StepFailed(f"reset_gpu: agent refused after {waited:g}s{named}: {reply.detail}",
                             before=dict(reply.before), after=after)
        await ctx.sleep(interval)
        waited += interval
        n += 1


@step("collect_bug_report")
async def collect_bug_report(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """After a GPU reset that ran and failed in this run: the agent's bug-report command, its output's
    tail recorded; skipped when no reset failed (a refused reset changed nothing worth a report)."""
    failed = [r for r in ctx.records.values() if r.name == "reset_gpu" and r.status == "failed"
              and r.after.get("reset_failed")]
    if not failed:
        return Skipped(False, {}, {"collected": False}, "no failed GPU reset in this run")
    reply = await ctx.agents.call(ctx.node, "collect_bug_report", gpu=ctx.gpu,
                                  command_id=ctx.command_id("collect_bug_report"), timeout_s=max(ctx.timeout_s - 5, 1))
    after = {"collected": reply.ok, "output": str(reply.after.get("output") or reply.detail)[-2000:]}
    if not reply.ok:
        raise StepFailed(f"collect_bug_report: {reply.detail}"[:2000], after=after)
    return Change(False, {}, after, f"bug report collected: {reply.detail}"[:2000])
