"""Reboot with proof: the ``reboot_node`` step and the providers that ask for the reboot.

Where it sits: in the step library (``playbooks.steps`` imports this module so the step registers); it talks
to Kubernetes, the node agent and a hook through the ports of ``playbooks.ports`` only.

A provider only *asks* for a reboot (setting ``reboot_provider``):

- ``agent``: the node agent runs its ``--reboot-command`` (verb ``reboot_node``). An agent whose reboot
  took it down before it answered is not a failure: the proof below decides.
- ``hook``: POST ``{node, incident, reason, idempotency_key}`` to ``reboot_hook_url`` (a power controller).
- ``annotation``: set ``reboot_annotation`` (a label with ``reboot_annotation_as_label``) on the node to the
  incident id, for a controller that reboots nodes so marked (a cloud node-repair, a medik8s-style
  remediator); removed once the reboot is proven.
- ``job``: create the batch/v1 Job of ``reboot_job_manifest`` in ``reboot_job_namespace``, its pod pinned to
  the node (``spec.nodeName``), named after the incident; deleted once the reboot is proven.

The step succeeds only with proof: the node's ``status.nodeInfo.bootID`` differs from the one read before
the request, and the node is Ready again, within ``reboot_timeout_s`` (and the step's own timeout). The boot
id read before the request is kept in the node annotation ``gpu-remediator.io/reboot`` with the incident,
so a run resumed after a crash compares against the boot id before the reboot, not after it. Without proof
the step fails, and the playbook moves to its next rung (a person): a node whose reboot cannot be shown is
never returned to service.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from playbooks.steps import StepContext, StepFailed, _post, step
from remediator.contracts import Change
from remediator.errors import TemporaryError

REBOOT_ANNOTATION = "gpu-remediator.io/reboot"
PROVIDERS = ("agent", "hook", "annotation", "job")


def provider_of(ctx: StepContext, params: Mapping[str, Any]) -> str:
    """The provider for this step: its ``provider`` parameter, else the setting (unset: ``hook`` when a hook
    URL is configured, else ``agent``)."""
    chosen = str(params.get("provider") or ctx.settings.reboot_provider
                 or ("hook" if ctx.settings.reboot_hook_url else "agent"))
    if chosen not in PROVIDERS:
        raise StepFailed(f"reboot_node: unknown reboot provider {chosen!r} (one of {', '.join(PROVIDERS)})")
    return chosen


def job_name(incident: str) -> str:
    """The reboot Job's name for an incident: stable (a resumed step finds its Job), a valid DNS label."""
    return f"gpu-remediator-reboot-{hashlib.sha256(incident.encode()).hexdigest()[:16]}"


def job_manifest(path: str, *, name: str, namespace: str, node: str, incident: str) -> dict[str, Any]:
    """The configured Job, named, namespaced, labelled with the incident and pinned to ``node``."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise StepFailed(f"reboot_node: cannot read reboot_job_manifest {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "Job" or not isinstance(doc.get("spec"), dict):
        raise StepFailed(f"reboot_node: reboot_job_manifest {path} is not a batch/v1 Job manifest")
    meta = dict(doc.get("metadata") or {})
    meta.update(name=name, namespace=namespace,
                labels={**(meta.get("labels") or {}), "gpu-remediator.io/reboot-for": node},
                annotations={**(meta.get("annotations") or {}), "gpu-remediator.io/incident": incident})
    meta.pop("generateName", None)
    spec = dict(doc["spec"])
    template = dict(spec.get("template") or {})
    pod_spec = dict(template.get("spec") or {})
    pod_spec["nodeName"] = node
    template["spec"] = pod_spec
    spec["template"] = template
    return {**doc, "apiVersion": "batch/v1", "metadata": meta, "spec": spec}


async def _request(ctx: StepContext, provider: str, reason: str) -> dict[str, Any]:
    """Ask ``provider`` for the reboot (idempotent per incident); what was asked, for the record."""
    d = ctx.decision
    if provider == "hook":
        url = ctx.settings.reboot_hook_url
        if not url:
            raise StepFailed("reboot_node: reboot_provider is hook but reboot_hook_url is not set")
        await _post(ctx, url, {"node": ctx.node, "incident": d.incident_id, "reason": reason,
                               "idempotency_key": ctx.command_id("reboot_node")})
        return {"provider": "hook", "url": url}
    if provider == "annotation":
        key = ctx.settings.reboot_annotation
        if ctx.settings.reboot_annotation_as_label:
            await ctx.kube.label(ctx.node, {key: _label_value(d.incident_id)})
        else:
            await ctx.kube.annotate(ctx.node, {key: d.incident_id})
        return {"provider": "annotation", "key": key, "label": ctx.settings.reboot_annotation_as_label}
    if provider == "job":
        path = ctx.settings.reboot_job_manifest
        if not path:
            raise StepFailed("reboot_node: reboot_provider is job but reboot_job_manifest is not set")
        name, ns = job_name(d.incident_id), ctx.settings.reboot_job_namespace
        c = await ctx.kube.create_job(ns, job_manifest(path, name=name, namespace=ns, node=ctx.node,
                                                       incident=d.incident_id))
        return {"provider": "job", "job": f"{ns}/{name}", "created": c.changed}
    try:
        reply = await ctx.agents.call(ctx.node, "reboot_node", command_id=ctx.command_id("reboot_node"),
                                      params={"reason": reason}, timeout_s=min(ctx.timeout_s, 60.0))
    except TemporaryError as e:  # the reboot may have taken the agent down before it answered
        return {"provider": "agent", "answer": f"none ({e})"}
    if not reply.ok:
        raise StepFailed(f"reboot_node: agent refused: {reply.detail}", after={"provider": "agent"})
    return {"provider": "agent", "answer": reply.detail}


def _label_value(incident: str) -> str:
    """A label value naming the incident (at most 63 characters of ``[A-Za-z0-9-_.]``)."""
    clean = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in incident)[:63].strip("-_.")
    return clean or "requested"


async def _withdraw_request(ctx: StepContext, asked: Mapping[str, Any]) -> None:
    """Remove what the provider left on the cluster (the annotation or label, the Job)."""
    if asked.get("provider") == "annotation":
        key = ctx.settings.reboot_annotation
        if asked.get("label"):
            await ctx.kube.label(ctx.node, {key: None})
        else:
            await ctx.kube.annotate(ctx.node, {key: None})
    elif asked.get("provider") == "job":
        ns, _, name = str(asked["job"]).partition("/")
        await ctx.kube.delete_job(ns, name)


def _remembered(node: Mapping[str, Any], incident: str) -> dict[str, Any] | None:
    raw = (node.get("annotations") or {}).get(REBOOT_ANNOTATION)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("incident") == incident else None


@step("reboot_node", params=("reason", "provider"), quarantine="node")
async def reboot_node(ctx: StepContext, params: Mapping[str, Any]) -> Change:
    """Reboot the node through the configured provider; succeeds only when its boot id changed and it is
    Ready again within ``reboot_timeout_s``."""
    reason = str(params.get("reason", ctx.decision.reason))
    provider = provider_of(ctx, params)
    incident = ctx.decision.incident_id
    node = await ctx.kube.get_node(ctx.node)
    memo = _remembered(node, incident)
    if memo is None:
        boot_before = node.get("boot_id")
        if not boot_before:
            raise StepFailed(f"reboot_node: {ctx.node} reports no status.nodeInfo.bootID, so a reboot could not "
                             "be proven; not rebooting")
        memo = {"incident": incident, "boot_id": boot_before, "provider": provider}
        await ctx.kube.annotate(ctx.node, {REBOOT_ANNOTATION: json.dumps(memo, sort_keys=True)})
    boot_before = str(memo["boot_id"])
    asked = await _request(ctx, provider, reason)
    before = {"boot_id": boot_before, "provider": provider}
    limit = min(ctx.settings.reboot_timeout_s, max(ctx.timeout_s - 5.0, 0.0))
    interval = ctx.settings.reboot_poll_s
    started = ctx.clock()
    seen_down = False
    slept = 0.0
    while True:
        now_node = await ctx.kube.get_node(ctx.node)
        boot_now, ready = now_node.get("boot_id"), bool(now_node.get("ready"))
        seen_down = seen_down or not ready
        waited = max((ctx.clock() - started).total_seconds(), slept)
        if boot_now and boot_now != boot_before and ready:
            await _withdraw_request(ctx, asked)
            await ctx.kube.annotate(ctx.node, {REBOOT_ANNOTATION: None})
            return Change(True, before, {**asked, "boot_id": boot_now, "ready": True, "waited_s": round(waited, 1),
                                         "was_not_ready": seen_down, "rebooted": True},
                          f"{ctx.node} rebooted through {provider}: boot id {boot_before} -> {boot_now}, Ready "
                          f"again after {waited:.0f}s")
        if waited + interval > limit:
            await _withdraw_request(ctx, asked)
            await ctx.kube.annotate(ctx.node, {REBOOT_ANNOTATION: None})
            why = ("the boot id never changed" if boot_now == boot_before
                   else "the node did not become Ready again")
            raise StepFailed(f"reboot_node: no proof of a reboot of {ctx.node} through {provider} within "
                             f"{limit:g}s: {why} (boot id {boot_before} before, {boot_now} now, Ready={ready})",
                             before=before, after={**asked, "boot_id": boot_now, "ready": ready, "rebooted": False})
        await ctx.sleep(interval)
        slept += interval
