"""Running the steps of a run: one step at a time, its record persisted before and after it runs.

Where it sits: the "steps" phase of the executor (lock → guards → steps → finish), between the run record
(``remediator.run``) and the step library (``playbooks.steps``). ``StepRunner.run`` stores the step as
``running`` in ``run.<incident>`` (compare-and-set), audits ``step_started``, calls the library step under its
timeout in a ``step <id>`` span (a child of the executor's run span), and stores and audits how it ended; a
replica killed in between leaves a ``running`` record, which the next replica re-runs (steps are idempotent)
while never re-running one that completed. A ``TemporaryError`` (Kubernetes, an agent) propagates to the
executor's settling; a ``PermanentError`` or ``StepFailed`` fails the step. Also here: the escalation and the
rollback a failed ladder ends with, and the check for a person's override.

Quarantine first: a run whose next steps are ``taint`` then ``cordon`` takes both in one request
(``StepRunner.quarantine``: the Kubernetes port's ``quarantine``, one PATCH carrying the taint and
``spec.unschedulable`` from the rate limiter's priority lane), each still recorded and audited as its own
step, with one run-record write before and one after; the two ``step_started`` records are appended while
that request is in flight.

The steps write audit records through ``StepAudit``, the incident's bound appender in the shape the step
library's ``AuditPort`` has, so their records carry the incident's provenance as the executor's do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from playbooks.schema import StepSpec
from playbooks.steps import Skipped, StepContext, StepFailed, StepRegistry, placed_by_us, taint_value
from remediator.adapters.ratelimit import deadline
from remediator.audit import IncidentAudit, step_after
from remediator.contracts import AuditRecord, AuditWhat, Change, StepRecord
from remediator.errors import PermanentError
from remediator.run import RunRecord, StoredRun
from remediator.telemetry import span

__all__ = ["ESCALATE_KEY", "StepAudit", "StepRunner"]

ESCALATE_KEY = "escalate-on-failure"

log = logging.getLogger(__name__)


async def _settled(task: asyncio.Future[None]) -> None:
    """Wait for ``task`` while another error is on its way out: never left running unowned, its own failure
    (an audit append the bus refused) logged, not raised over the one already raised."""
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        log.warning("audit records of the quarantine not written: %r", task.exception())


class StepAudit:
    """The incident's bound appender as the step library calls it (``playbooks.ports.AuditPort``): the
    binding's incident, GPU, event, job, fingerprint and trace id win over what a step passes."""

    def __init__(self, bound: IncidentAudit) -> None:
        self.bound = bound

    async def append(self, node: str | None, what: AuditWhat, why: str = "", *, incident: str | None = None,
                     gpu: str | None = None, before: dict[str, Any] | None = None,
                     after: dict[str, Any] | None = None, event_id: str | None = None, job: str | None = None,
                     fingerprint: str | None = None, trace_id: str | None = None) -> AuditRecord:
        c = self.bound.context
        target = self.bound if node in (None, c.node) else self.bound.log.bind(replace(c, node=node))
        return await target.append(what, why, before=before, after=after)


class StepRunner:
    """Runs library steps (``steps``) for the executor, timing their records with ``clock``."""

    def __init__(self, steps: StepRegistry, clock: Callable[[], datetime]) -> None:
        self.steps = steps
        self.clock = clock

    async def run(self, ctx: StepContext, spec: StepSpec, stored: StoredRun, key: str | None = None) -> str:
        """Run ``spec`` as step ``key`` (default: its id) of ``stored``; returns the status it ended with."""
        key = key or spec.key
        with span(f"step {key}", attributes={"remediator.step": key, "remediator.step.name": spec.name}) as sp:
            status = await self._step(ctx, spec, stored, key)
            sp.set_attribute("remediator.step.status", status)
        return status

    async def _step(self, ctx: StepContext, spec: StepSpec, stored: StoredRun, key: str) -> str:
        run, audit = stored.run, ctx.audit
        prior = run.records.get(key)
        started = self.clock()
        run.put(key, StepRecord(name=spec.name, status="running", params=dict(spec.params), started_at=started,
                                detail="resumed after an interrupted attempt" if prior else ""))
        await stored.save()
        await audit.append(ctx.node, "step_started", f"{key}: {spec.name}" + (" (resumed)" if prior else ""),
                           after={"step": key, "params": dict(spec.params), "timeout_s": spec.timeout_s})
        sctx = replace(ctx, records=dict(run.records), step_key=key, timeout_s=spec.timeout_s)
        fn = self.steps.get(spec.name).fn
        try:
            with deadline(time.monotonic() + spec.timeout_s):  # its Kubernetes requests stop with the step
                res = await asyncio.wait_for(fn(sctx, spec.params), timeout=spec.timeout_s)
        # A TemporaryError (Kubernetes, an agent) propagates to settle, which naks with its delay; a
        # PermanentError (a drain that timed out, an unrestartable job) fails the step like StepFailed.
        except (StepFailed, PermanentError, TimeoutError) as e:
            detail = str(e) or f"timed out after {spec.timeout_s:g}s"
            before = getattr(e, "before", {}) or {}
            after = getattr(e, "after", {}) or {}
            run.put(key, StepRecord(name=spec.name, status="failed", params=dict(spec.params), before=before,
                                    after=after, detail=detail[:2000], started_at=started,
                                    finished_at=self.clock()))
            await stored.save()
            await audit.append(ctx.node, "step_failed", f"{key}: {detail}"[:4000], before=before,
                               after=step_after(key, after))
            return "failed"
        skipped = isinstance(res, Skipped)
        status = "skipped" if skipped else "succeeded"
        after = {**res.after, "changed_by_us": res.changed}
        run.put(key, StepRecord(name=spec.name, status=status, params=dict(spec.params), before=res.before,
                                after=after, detail=res.detail[:2000], started_at=started, finished_at=self.clock()))
        await stored.save()
        await audit.append(ctx.node, "step_skipped" if skipped else "step_succeeded",
                           f"{key}: {res.detail}"[:4000], before=res.before, after=step_after(key, after))
        return status

    async def quarantine(self, ctx: StepContext, taint: StepSpec, cordon: StepSpec, stored: StoredRun) -> bool:
        """Run the steps ``taint`` and ``cordon`` as one request where the Kubernetes port can
        (``quarantine``); True when both succeeded. Each keeps its own step record (``running`` in one write
        before the request, the outcome in one write after) and its own ``step_started``/``step_succeeded``
        records, so a reader, the ladder and a resumed run see the two steps as if run one after the other.
        False when the port has no such request, or the combined request failed for a reason that is not
        temporary: the records still say ``running``, and the caller runs the steps one by one (they are
        idempotent), which records what failed as that step's failure."""
        combined = getattr(ctx.kube, "quarantine", None)
        if combined is None:
            return False
        run, audit = stored.run, ctx.audit
        started = self.clock()
        for spec in (taint, cordon):
            prior = run.records.get(spec.key)
            run.put(spec.key, StepRecord(name=spec.name, status="running", params=dict(spec.params),
                                         started_at=started,
                                         detail="resumed after an interrupted attempt" if prior else ""))
        await stored.save()

        async def audit_started() -> None:
            for spec in (taint, cordon):
                await audit.append(ctx.node, "step_started", f"{spec.key}: {spec.name} (one request with "
                                   f"{cordon.key if spec is taint else taint.key})",
                                   after={"step": spec.key, "params": dict(spec.params), "timeout_s": spec.timeout_s})

        # The two step_started records are appended while the request is in flight (the ``running`` records
        # stored just above are what a resumed run goes by), and are stored before anything else of the run's
        # is appended: quarantine first, two audit round trips off the time to cordon. Where they fail (the
        # AUDIT stream without a leader), the node is quarantined all the same, the outcome (``changed_by_us``)
        # is stored, and then their error is raised, as a failed ``step_succeeded`` append is.
        records = asyncio.ensure_future(audit_started())
        key, value = ctx.settings.taint_key, taint_value(ctx, taint.params)
        effect = str(taint.params.get("effect", "NoSchedule"))  # as the taint step sends it
        # One span per step, as for steps run one by one: the request under the taint's, the cordon's beside it.
        with span(f"step {taint.key}", attributes={"remediator.step": taint.key, "remediator.step.name": taint.name,
                                                   "remediator.step.request": f"one with {cordon.key}"}) as sp:
            try:
                limit = min(taint.timeout_s, cordon.timeout_s)
                with deadline(time.monotonic() + limit):
                    changes: tuple[Change, Change] = await asyncio.wait_for(
                        combined(ctx.node, key, value, effect), timeout=limit)
            except (StepFailed, PermanentError, TimeoutError):
                sp.set_attribute("remediator.step.status", "retried-alone")
                await records
                return False
            except BaseException:
                await _settled(records)
                raise
            sp.set_attribute("remediator.step.status", "succeeded")
        with span(f"step {cordon.key}", attributes={"remediator.step": cordon.key, "remediator.step.name": cordon.name,
                                                    "remediator.step.request": f"one with {taint.key}"}) as sp:
            sp.set_attribute("remediator.step.status", "succeeded")
        finished = self.clock()
        for spec, c, what in ((taint, changes[0], "taint"), (cordon, changes[1], "cordon")):
            after = {**c.after, "changed_by_us": c.changed}
            run.put(spec.key, StepRecord(name=spec.name, status="succeeded", params=dict(spec.params),
                                         before=c.before, after=after, detail=(c.detail or what)[:2000],
                                         started_at=started, finished_at=finished))
        try:
            await stored.save()  # what the request changed is stored first, whatever became of the records
        except BaseException:
            await _settled(records)
            raise
        await records
        for spec, c, what in ((taint, changes[0], "taint"), (cordon, changes[1], "cordon")):
            after = run.records[spec.key].after
            await audit.append(ctx.node, "step_succeeded", f"{spec.key}: {c.detail or what}"[:4000], before=c.before,
                               after=step_after(spec.key, after))
        return True

    async def skip(self, ctx: StepContext, spec: StepSpec, stored: StoredRun, why: str) -> None:
        """Record ``spec`` as skipped without running it (a rung the ladder passes over, a dry run)."""
        now = self.clock()
        stored.run.put(spec.key, StepRecord(name=spec.name, status="skipped", params=dict(spec.params), detail=why,
                                            started_at=now, finished_at=now))
        await stored.save()
        await ctx.audit.append(ctx.node, "step_skipped", f"{spec.key}: {why}", after=step_after(spec.key))

    async def escalate(self, ctx: StepContext, stored: StoredRun, reason: str) -> None:
        """Hand the incident to a person (the ``escalate`` step), once per run."""
        done = stored.run.records.get(ESCALATE_KEY)
        if done is not None and done.status == "succeeded":
            return
        spec = StepSpec(name="escalate", id=ESCALATE_KEY, params={"reason": reason}, timeout_s=60.0)
        await self.run(ctx, spec, stored, ESCALATE_KEY)

    async def rollback(self, ctx: StepContext, stored: StoredRun) -> None:
        """The playbook's rollback steps, else the undo of every step that changed something, newest first."""
        run, pb = stored.run, ctx.playbook
        if pb.rollback:
            specs = list(pb.rollback)
        else:
            specs = []
            for k in reversed(list(run.order)):
                rec = run.records[k]
                undo = self.steps.get(rec.name).undo if rec.name in self.steps else None
                if undo and rec.status == "succeeded" and rec.after.get("changed_by_us"):
                    specs.append(StepSpec(name=undo, id=f"undo-{k}", params=dict(rec.params), timeout_s=120.0))
        for spec in specs:
            key = f"rollback-{spec.key}"
            if run.records.get(key) is not None and run.records[key].status == "succeeded":
                continue
            await self.run(ctx, spec, stored, key)

    @staticmethod
    async def overridden(ctx: StepContext, run: RunRecord) -> str:
        """A person removed our taint or uncordoned the node while the run is open: the reason, else ''."""
        recs = list(run.records.values())
        if any(r.name == "return_to_service" for r in recs):
            return ""
        taint = any(r.name == "taint" and placed_by_us(r, ctx) and r.after.get("changed_by_us") for r in recs)
        cordon = any(r.name == "cordon" and placed_by_us(r, ctx) and r.after.get("changed_by_us") for r in recs)
        if not (taint or cordon):
            return ""
        node = await ctx.kube.get_node(ctx.node)
        taint_key = ctx.settings.taint_key
        if taint and not any(t.get("key") == taint_key for t in node.get("taints", [])):
            return f"our taint {taint_key} was removed from {ctx.node}"
        if cordon and not node.get("unschedulable"):
            return f"{ctx.node} was uncordoned"
        return ""
