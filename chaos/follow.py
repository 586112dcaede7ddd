"""Following the audit trail: what came of each fault, read back the way an operator would read it.

Where it sits: between the world (``chaos.world.World.records``, the observer's read of the whole audit
stream) and the judging (``chaos.checks``, ``chaos.expectations``), for the drill runner
(``chaos.runner``). ``match_events`` finds the events a fault produced (by the ids ingest answered for a
webhook, by node, GPU, kind and code, or by job, for an agent), ``follow`` fills a ``FaultResult`` with the
fault's decision, incident, steps and outcome, and ``settle_faults`` polls until every fault came to rest.
Nothing here asks the service: only its audit trail.
"""

from __future__ import annotations

import asyncio
import time

from chaos.faults import Fault, FaultResult, Progress
from chaos.world import World
from remediator.contracts import AuditRecord


def step_of(r: AuditRecord) -> str:
    """The step id of a ``step_*`` record: its ``after.step``, else the prefix of ``"<step>: <what it did>"``."""
    step = r.after.get("step")
    return str(step) if step else r.why.split(":")[0]


def _kind_code(r: AuditRecord) -> str:
    """``"<kind> <code>"`` of an ``event_accepted`` record (dispatch writes ``"<kind> <code> from <source>"``)."""
    if "kind" in r.after and "code" in r.after:
        return f"{r.after['kind']} {r.after['code']}"
    return r.why.split(" from ", 1)[0]


def match_events(records: list[AuditRecord], world: World, f: Fault) -> set[str]:
    """Ids of the events this fault produced: known for webhooks, found by node/GPU/kind/code for agents, by
    job for faults that declare one (NCCL)."""
    if f.event_ids:
        return set(f.event_ids)
    gpu_key = world.gpu_uuid(f.node, f.gpu) if f.gpu is not None else None
    ids = set()
    for r in records:
        if r.what != "event_accepted" or r.event_id is None or r.time < world.started:
            continue
        kind_code = _kind_code(r)
        if not kind_code.startswith(f"{f.kind} "):
            continue
        if f.job is not None:
            if r.job == f.job:
                ids.add(r.event_id)
        elif r.node == f.node and r.gpu == gpu_key and kind_code == f"{f.kind} {f.code}":
            ids.add(r.event_id)
    return ids


def follow(records: list[AuditRecord], world: World, f: Fault, res: FaultResult) -> bool:
    """Fill ``res`` from the audit trail; True once the fault has come to rest."""
    ids = match_events(records, world, f)
    if not ids:
        return False
    # the dispatcher's decisions (the executor's "received" records carry no handler); a later one supersedes
    decisions = [r for r in records if r.what == "decision" and r.event_id in ids and "handler" in r.after]
    decisions = decisions[-1:]
    if f.playbook is None:
        verdicts = [r for r in records if r.event_id in ids and r.what in ("event_ignored", "incident_updated")]
        res.timeline = [r for r in records if r.event_id in ids]
        if decisions:
            res.playbook = str(decisions[0].after.get("playbook"))
            res.incident = decisions[0].incident
        res.outcome = "recorded" if verdicts and not decisions else res.outcome
        if verdicts or decisions:
            res.rest_at = (verdicts or decisions)[0].time
        return bool(verdicts) or bool(decisions)
    if not decisions:
        return False
    first = decisions[0]
    res.incident, res.playbook = first.incident, str(first.after.get("playbook"))
    res.timeline = [r for r in records if r.incident == res.incident or
                    (r.event_id in ids and r.what == "event_accepted")]
    finished = [r for r in res.timeline if r.what == "playbook_finished"]
    res.actions = [step_of(r) for r in res.timeline if r.what == "step_succeeded"]
    if finished:
        res.outcome = str(finished[-1].after.get("outcome", "unknown"))
        res.rest_at = finished[-1].time
        return True
    res.outcome = "running"
    return False


async def settle_faults(world: World, results: list[FaultResult], progress: Progress, timeout_s: float,
                        poll_s: float = 0.5) -> set[str]:
    """Follow every fault until it comes to rest or ``timeout_s`` passes; returns the names at rest."""
    deadline = time.monotonic() + timeout_s
    settled: set[str] = set()
    while time.monotonic() < deadline and len(settled) < len(results):
        records = await world.records()
        for res in results if records is not None else []:
            if res.fault.name in settled:
                continue
            assert records is not None
            if follow(records, world, res.fault, res):
                settled.add(res.fault.name)
                progress(f"✓ {res.fault.name:<26} {res.playbook or 'no playbook'} → {res.outcome}"
                         + (f" [{', '.join(res.actions)}]" if res.actions else ""))
        await asyncio.sleep(poll_s)
    return settled


async def read_records(world: World, attempts: int = 20) -> list[AuditRecord]:
    """The whole audit trail, retrying while the bus does not answer; raises after ``attempts``."""
    for _ in range(attempts):
        records = await world.records()
        if records is not None:
            return records
        await asyncio.sleep(0.5)
    raise RuntimeError("the audit trail could not be read")


async def step_running(world: World, node: str, step: str, within_s: float) -> str | None:
    """Wait until playbook step ``step`` has started on ``node`` and not yet ended; its incident, or None
    after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        records = await world.records() or []
        started = [i for i, r in enumerate(records) if r.what == "step_started" and r.node == node
                   and step_of(r) == step]
        if started:
            i = started[-1]
            ended = any(r.incident == records[i].incident and step_of(r) == step
                        and r.what in ("step_succeeded", "step_failed", "step_skipped") for r in records[i + 1:])
            if not ended:
                return records[i].incident
        await asyncio.sleep(0.1)
    return None
