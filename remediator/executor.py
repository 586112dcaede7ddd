"""The executor: runs each decision's playbook behind the safety rails, crash-safe and audited.

Where it sits: after dispatch. ``on_message`` handles the deliveries of REMEDIATIONS (durable pull consumer
``executor``, subscribed on faststream by ``remediator.consumers``; explicit ack through ``bus.settle``) and
continues the W3C trace of the message's ``traceparent`` header (a span for the run, one per step). Every
audit record of a run is written through the incident's binding (``AuditContext.of_decision``), so each
carries the incident, node, GPU, event id, job, alert fingerprint and trace id. Per decision, in order:

1. **lock**: ``safety.lock`` (KV ``remediator-locks`` ``node.<node>``, renewed while running, released at
   the end), so two replicas never run playbooks on one node; a refusal is an audited ``lock`` verdict and
   the message is retried later; a free node's lock is taken before the run record is read (once, under
   it), a held one is waited for only once the record said the run is not finished;
2. **guards**: ``safety.gate`` evaluates the guards over a snapshot and commits their bookkeeping to the
   ledger by compare-and-set; every verdict is audited, after the run's ``decision`` record and before the
   run record that says they passed, which rides on the first step's write (``StoredRun.defer``);
3. **steps**: the playbook's ladder (``remediator.run.next_step``) over the step library
   (``playbooks.steps``), each step's record persisted in ``run.<incident>`` by compare-and-set before and
   after it runs: a replica killed mid-step is resumed (after the lock TTL and the message's redelivery) by
   whichever replica gets the message next, which re-runs only the step that was running (steps are
   idempotent) and never one that completed; a person's override (our taint or cordon removed) stops it;
4. **finish** (every outcome: completed, escalated, rolled back, cancelled by a person, blocked, dead-lettered):
   the budget reservation released, a target left out of service recorded as handed over in the ledger
   (for ``remediator.reconciler``), ``playbook_finished`` audited with the state the node was left in, the
   incident closed in its history. A dead-lettered decision is escalated first (``abandon``).

Outcomes map to the message: a finished run (whatever its outcome) acks; waiting for a lock or an approval,
a temporary Kubernetes or agent failure, a lost compare-and-set nak with a delay (the run record keeps the
progress); a decision naming no known playbook goes to the dead letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import httpx
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import ValidationError

from playbooks.catalog import PlaybookCatalog
from playbooks.ports import AgentPort, KubePort
from playbooks.schema import Playbook, StepSpec
from playbooks.steps import REGISTRY, StepContext, StepRegistry, quarantine_of
from remediator import consumers, safety
from remediator.audit import AuditContext, AuditLog, IncidentAudit, finished_after
from remediator.bus import dead_letter_publisher, decision_incident, num_delivered, settle
from remediator.contracts import Decision, utcnow
from remediator.errors import PermanentError, TemporaryError
from remediator.run import (
    RunLog,
    RunRecord,
    RunResult,
    StepAction,
    StoredRun,
    handover_of,
    left_by_run,
    next_step,
)
from remediator.safety import (
    Facts,
    Gate,
    GateResult,
    GuardVerdict,
    Lease,
    LockHeld,
    LockLost,
    NodeLocks,
    SafetyPolicy,
    SafetySnapshot,
)
from remediator.settings import Settings
from remediator.state import StateStore
from remediator.step_runner import StepAudit, StepRunner
from remediator.subjects import (
    CLUSTER_TOKEN,
    LOCKS_BUCKET,
    STATE_BUCKET,
    node_from_token,
    node_key,
)
from remediator.telemetry import span, trace_id_of

log = logging.getLogger(__name__)

__all__ = ["Executor", "LockLost", "RunResult", "StepAction", "next_step"]


class _Cancelled(Exception):
    """A person overrode our workflow on the node (removed our taint or cordon)."""


class Executor:
    """Runs decisions' playbooks; ``execute`` one decision, ``on_message`` one delivery, ``run`` consumes until
    stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, settings: Settings, kube: KubePort, audit: AuditLog,
                 playbooks: PlaybookCatalog, agents: AgentPort, clock: Callable[[], datetime] = utcnow, *,
                 steps: StepRegistry = REGISTRY, actor: str | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 http: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None,
                 keep_results: int = 1024) -> None:
        self._nc = nc
        self._js = js
        self._dead_letter = dead_letter_publisher(js, on_dead_letter=self._audit_dead_letter,
                                                  incident_of=decision_incident)
        self.settings = settings
        self.kube = kube
        self.audit = audit
        self.playbooks = playbooks
        self.agents = agents
        self.clock = clock
        self.steps = steps
        self.actor = actor or settings.replica_id or getattr(audit, "actor", "") or "executor"
        self._sleep = sleep or asyncio.sleep
        self._http = http
        self._state_kv: KeyValue | None = None
        self._rails: tuple[NodeLocks, Gate, RunLog] | None = None
        self._runner = StepRunner(steps, clock)
        # The most recent runs' results, for tests, drills and benchmarks: bounded, so a replica that runs for
        # months does not grow with every incident it ever handled; ``finished`` counts them all.
        self.results: deque[RunResult] = deque(maxlen=keep_results)
        self.finished = 0

    # --- plumbing ---------------------------------------------------------------------------------

    async def _kv(self) -> tuple[NodeLocks, Gate, RunLog]:
        if self._rails is None:
            self._state_kv = await self._js.key_value(STATE_BUCKET)
            locks = NodeLocks(await self._js.key_value(LOCKS_BUCKET), self.clock)
            self._rails = (locks, Gate(self._state_kv), RunLog(self._state_kv))
        return self._rails

    def policy(self) -> SafetyPolicy:
        return SafetyPolicy.of(self.settings.safety_view(), lock_retry_s=max(self.settings.nak_delay_s, 5.0))

    def _context(self, d: Decision, pb: Playbook, audit: IncidentAudit) -> StepContext:
        return StepContext(decision=d, playbook=pb, kube=self.kube, agents=self.agents, settings=self.settings,
                           clock=self.clock, audit=StepAudit(audit), sleep=self._sleep, http=self._http)

    @staticmethod
    async def _verdict(audit: IncidentAudit, v: GuardVerdict, **extra: Any) -> None:
        await audit.append("guard_verdict", f"{v.name}: {v.reason}", after={**v.to_json(), **extra})

    # --- one decision: lock -> guards -> steps -> finish ------------------------------------------

    async def execute(self, decision: Decision, msg: Msg | None = None) -> RunResult:
        """Run ``decision`` to an outcome and return it, in a span that continues the trace of ``msg``'s
        headers; raises ``TemporaryError`` when it must be retried later (lock held elsewhere, approval
        pending, Kubernetes or the agent unavailable, a lost compare-and-set) and ``PermanentError`` when it
        can never run (unknown playbook)."""
        attributes = {"remediator.incident": decision.incident_id, "remediator.node": decision.node,
                      "remediator.playbook": decision.playbook}
        with span("executor.run", msg.headers if msg is not None else None, attributes) as sp:
            audit = self.audit.bind(AuditContext.of_decision(decision, trace_id_of(sp)))
            result = await self._execute(decision, msg, audit)
            sp.set_attribute("remediator.outcome", result.outcome)
        self.results.append(result)
        self.finished += 1
        return result

    async def _execute(self, d: Decision, msg: Msg | None, audit: IncidentAudit) -> RunResult:
        locks, _gate, runs = await self._kv()
        me = f"{self.actor}|{d.incident_id}|{uuid.uuid4().hex[:8]}"

        async def heartbeat() -> None:
            if msg is not None:
                with contextlib.suppress(Exception):
                    await msg.in_progress()

        # The common case, a free node: its lock at once, and the run record read once, under it. A held lock
        # is waited for only after the record said the run is not finished (a finished run's redelivery acks
        # without waiting for another incident's run on the node).
        got = await locks.try_take(d.node, me, d.incident_id)
        if isinstance(got, Lease):
            lease = got
        else:
            run, _rev = await runs.get(d.incident_id)
            if run is not None and run.finished:
                return run.result()
            lease = await self._take_lock(d, me, audit, heartbeat)
        every = max(1.0, min(self.settings.lock_ttl_s / 3.0, 10.0))
        keeper = asyncio.create_task(locks.keep(lease, every, heartbeat))
        try:
            if d.playbook not in self.playbooks:  # unless the run finished before the playbook went away
                run, _rev = await runs.get(d.incident_id)
                if run is not None and run.finished:
                    return run.result()
                raise PermanentError(f"no playbook named {d.playbook!r}")
            pb = self.playbooks.get(d.playbook)
            return await self._run_locked(d, pb, lease, runs, audit, num_delivered(msg) if msg is not None else 1)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await locks.release(lease)

    async def _take_lock(self, d: Decision, me: str, audit: IncidentAudit,
                         heartbeat: Callable[[], Awaitable[None]]) -> Lease:
        """The node lock, waiting up to ``lock_wait_s``; a refusal is audited as the ``lock`` guard's verdict
        over the real holder, and re-raised (``LockHeld``: retried after the guard's delay)."""
        locks, _, _ = await self._kv()
        policy = self.policy()
        try:
            return await locks.take(d.node, me, d.incident_id, wait_s=self.settings.lock_wait_s,
                                    retry_s=policy.lock_retry_s, heartbeat=heartbeat)
        except LockHeld as held:
            snap = SafetySnapshot(policy=policy, lock_holder=held.holder, me=me)
            v = safety.evaluate(d, snap, self.clock(), only=frozenset({"lock"}))[0]
            await self._verdict(audit, v, holder=held.holder)
            raise

    async def _run_locked(self, d: Decision, pb: Playbook, lease: Lease, runs: RunLog,
                          audit: IncidentAudit, delivery: int = 1) -> RunResult:
        run, rev = await runs.get(d.incident_id)  # re-read under the lock: another replica may have finished
        if run is not None and run.finished:
            return run.result()
        resumed = run is not None
        stored = StoredRun(runs, run or RunRecord(d.incident_id, d.node, pb.name, lease.owner), rev)
        run = stored.run
        run.owner = lease.owner
        off = sorted(set(safety.GUARD_NAMES) - self.policy().enabled - set(safety.ALWAYS_ON))
        # A redelivery with no run record: every earlier delivery failed before the guards' outcome was
        # stored, so nothing acted yet; the record says so (a retried start, not a second remediation).
        retried = delivery if not resumed and delivery > 1 else None
        # The decision record is written while the guards read their facts (it precedes every verdict on the
        # node's chain: _guards awaits it before the first one), not before them: one round trip off the path.
        decided = asyncio.ensure_future(audit.append(
            "decision", ("resuming" if resumed else "received") + f" by {self.actor}: playbook "
            f"{pb.name}" + (f", {len(run.order)} steps recorded" if resumed else "")
            + (f" (delivery {retried}: no earlier one got past the guards)" if retried else ""),
            after={"playbook": pb.name, "resumed": resumed, **({"guards_off": off} if off else {}),
                   **({"delivery": retried} if retried else {})}))
        ctx = self._context(d, pb, audit)
        try:
            gate = None if run.guards_passed else await self._guards(d, pb, lease, audit, decided)
            if gate is None:  # resumed past the guards: the new owner is the first write
                await stored.save()
        except BaseException:
            await asyncio.wait([decided])  # never left running unowned; the first error is the one raised
            if not decided.cancelled():
                decided.exception()
            raise
        await decided

        if gate is not None:
            run.verdicts = [v.to_json() for v in gate.verdicts]
            run.shadow, run.reserved = gate.shadow, gate.reserved
            if gate.stop is not None:
                return await self._stopped_by_guard(ctx, stored, gate.stop, audit)
            run.guards_passed = True
            stored.defer()  # written with the first step's ``running`` record, before anything acts

        outcome, detail = "completed", ""
        try:
            while True:
                if lease.lost.is_set():
                    raise LockLost(f"lost the lock of {d.node}")
                nxt = next_step(pb, run.records)
                if nxt.spec is None:
                    if nxt.stop in ("escalate", "rollback"):
                        failed = [run.records[k] for k in run.order if run.records[k].status == "failed"]
                        why = failed[-1].detail if failed else "no rung of the ladder healed the fault"
                        if nxt.stop == "rollback" and not run.shadow:
                            await self._runner.rollback(ctx, stored)
                            outcome = "rolled-back"
                        await self._runner.escalate(ctx, stored, f"{pb.name} failed: {why}")
                        outcome = outcome if outcome == "rolled-back" else "escalated"
                        detail = why
                    break
                spec = nxt.spec
                if nxt.skip_reason or run.shadow:
                    why = nxt.skip_reason or f"dry-run: would run {spec.name} {spec.params or ''}".strip()
                    await self._runner.skip(ctx, spec, stored, why)
                    continue
                if not run.shadow:
                    reason = await self._runner.overridden(ctx, run)
                    if reason:
                        raise _Cancelled(reason)
                if spec.requires_approval:
                    await stored.flush()  # the guards' outcome is stored before a wait that may end in a nak
                    await self._await_approval(d, spec, audit)
                cordon = self._cordon_with(pb, spec, run)
                if cordon is not None and await self._runner.quarantine(ctx, spec, cordon, stored):
                    continue
                await self._runner.run(ctx, spec, stored)
            if run.shadow:
                outcome = "dry-run"
        except _Cancelled as c:
            outcome, detail = "cancelled", str(c)
            await audit.append("override", f"{c}: cancelling {pb.name} on {d.node}", after={"cancelled": True})
        except BaseException:  # a nak, a lost lock, a stop: the guards' outcome survives the delivery
            with contextlib.suppress(Exception):
                await stored.flush()
            raise
        if outcome == "completed" and any(r.name == "escalate" and r.status == "succeeded"
                                           for r in run.records.values()):
            outcome = "escalated"  # handed over to a person (gpu-lost, unknown-xid, the replace rung)
        return await self._finish(d, pb, stored, outcome, detail, audit)

    @staticmethod
    def _cordon_with(pb: Playbook, spec: StepSpec, run: RunRecord) -> StepSpec | None:
        """The ``cordon`` step to take in one request with ``spec`` (the quarantine first): when ``spec`` is a
        ``taint`` the playbook follows with a ``cordon`` that has not run and needs no approval."""
        if spec.name != "taint":
            return None
        keys = [s.key for s in pb.steps]
        i = keys.index(spec.key) if spec.key in keys else -1
        if i < 0 or i + 1 >= len(pb.steps):
            return None
        nxt = pb.steps[i + 1]
        done = run.records.get(nxt.key)
        if nxt.name != "cordon" or nxt.requires_approval or nxt.rung != spec.rung or (
                done is not None and done.status not in ("pending", "running")):
            return None
        return nxt

    async def _finish(self, d: Decision, pb: Playbook | None, stored: StoredRun, outcome: str, detail: str,
                      audit: IncidentAudit) -> RunResult:
        """End the run, whatever its outcome: the reservation released, the target handed over in the ledger
        when the run left something of ours out of service (the reconciler settles it once the cluster shows
        it repaired or gone), ``playbook_finished`` audited with the state the node was left in (``left``),
        and the incident closed in its history (a later fault opens a new incident, which the guards judge)."""
        _, gate, _ = await self._kv()
        await stored.flush()  # a run that ends before its first step: the guards' outcome before the release
        run = stored.run
        run.status, run.outcome, run.detail = "finished", outcome, detail
        left = await self._left(d, run)
        handover = handover_of(d, outcome, left, self.clock()) if left.get("out_of_service") else None
        await gate.ledger.finish(d, handover)
        steps = [f"{k}:{run.records[k].status}" for k in run.order]
        name = pb.name if pb is not None else d.playbook
        after = {**finished_after(name, outcome, steps), "left": left,
                 "reservation": "released" if run.reserved else "none",
                 "incident": "handed-over" if handover is not None else "closed"}
        await audit.append("playbook_finished", f"{name}: {outcome}" + (f" ({detail})" if detail else ""),
                           after=after)
        await stored.save()
        # NCCL incidents live in their job's history, not the node's (handlers.nccl.history_key).
        history = d.origin.history_key or d.labels.get("history_key") or node_key(d.node)
        assert self._state_kv is not None
        await StateStore(self._state_kv).close_incident(history, d.group)
        return run.result()

    async def _left(self, d: Decision, run: RunRecord) -> dict[str, Any]:
        """The state the run leaves its target in: what of ours the step records say is still in place
        (taint, cordon, GPU isolation not undone), and the node as Kubernetes shows it when it answers."""
        ours = left_by_run(run)
        state: dict[str, Any] = {"ours": ours, "gpu": d.gpu.key if d.gpu else None}
        try:
            node = await self.kube.find_node(d.node)
        except Exception as e:  # Kubernetes unavailable (often why a run is dead-lettered): the records say it
            state["node"] = "unknown"
            state["error"] = str(e)[:200]
            state["out_of_service"] = bool(ours)
            return state
        if node is None:
            state["node"] = "deleted"
            state["out_of_service"] = False
            return state
        tainted = any(t.get("key") == self.settings.taint_key for t in node.get("taints") or [])
        isolated = max(0, int(node.get("gpus") or 0) - int(node.get("gpus_allocatable") or 0))
        state.update(node="present", pool=node.get("pool"), ready=bool(node.get("ready")), tainted=tainted,
                     cordoned=bool(node.get("unschedulable")), gpus_unallocatable=isolated)
        state["out_of_service"] = bool(ours) and (tainted or bool(node.get("unschedulable"))
                                                  or "isolate_gpu" in ours)
        return state

    # --- guards -----------------------------------------------------------------------------------

    async def _guards(self, d: Decision, pb: Playbook, lease: Lease, audit: IncidentAudit,
                      decided: Awaitable[Any]) -> GateResult:
        """Gather the facts, let the gate evaluate and commit, and audit each verdict once, after the
        ``decided`` record (the run's ``decision``, in flight while the facts are read)."""
        _, gate, _ = await self._kv()
        policy = self.policy()
        node = await self.kube.find_node(d.node)
        if node is None:
            hint = " (an alert's Hostname names no node: set NODE_NAME on dcgm-exporter, or relabel the node " \
                   "into a node label)" if d.origin.fingerprint else ""
            v = GuardVerdict("opt_out", False, f"node {d.node} does not exist{hint}", "block")
            await decided
            await self._verdict(audit, v)
            return GateResult((v,))
        quarantine = quarantine_of(pb, self.steps)
        # read once: the attempt the gate records is a compare-and-set on this revision, not a second read
        attempts = await gate.attempts.read(d.node) if "cooldown" in policy.enabled else None
        pool_nodes = None
        if "budget" in policy.enabled and quarantine is not None:
            pool_nodes = await self.kube.pool_view(str(node.get("pool") or "default"))
        facts = Facts(node=node, quarantine=quarantine, playbook_dry_run=pb.dry_run, me=lease.owner,
                      lock_holder=None if lease.lost.is_set() else lease.owner, taint_key=self.settings.taint_key,
                      attempts=attempts.value if attempts is not None else (), pool_nodes=pool_nodes,
                      attempts_revision=attempts.revision if attempts is not None else None)
        result = await gate.evaluate(d, policy, facts, self.clock())
        await decided
        for v in result.verdicts:
            if v.name in policy.enabled or v.name in safety.ALWAYS_ON:  # a guard that is off: the decision says so
                await self._verdict(audit, v)
        if result.tripped is not None:
            stop = result.stop
            await audit.log.bind(replace(audit.context, node=CLUSTER_TOKEN)).append(
                "breaker_trip", stop.reason if stop else "", after=result.tripped.to_json())
        return result

    async def _stopped_by_guard(self, ctx: StepContext, stored: StoredRun, stop: GuardVerdict,
                                audit: IncidentAudit) -> RunResult:
        d, pb, why = ctx.decision, ctx.playbook, f"{stop.name}: {stop.reason}"
        if stop.effect in ("retry", "wait"):
            await stored.save()
            raise TemporaryError(why, delay=stop.retry_after_s)
        if stop.effect == "escalate" and not stored.run.shadow:
            await self._runner.escalate(ctx, stored, why)
            return await self._finish(d, pb, stored, "escalated", why, audit)
        return await self._finish(d, pb, stored, "blocked", why, audit)

    async def _await_approval(self, d: Decision, spec: StepSpec, audit: IncidentAudit) -> None:
        """The ``approval`` guard before a gated step, polled for up to ``approval_wait_s``; audited once."""
        _, gate, _ = await self._kv()
        waited = 0.0
        while True:
            v = await gate.approval(d, self.policy(), spec.key, self.clock())
            if not v.allowed and waited == 0.0:  # a person must be told: the audit view and fleet page list it
                await audit.append("approval_requested", f"step {spec.key} of {d.playbook} waits for "
                                   f"`remediator approve {d.incident_id}`", after={"step": spec.key,
                                                                                  "playbook": d.playbook})
            if v.allowed or waited >= self.settings.approval_wait_s:
                await self._verdict(audit, v, step=spec.key)
                if v.allowed:
                    return
                raise TemporaryError(f"approval: {v.reason}", delay=max(self.settings.nak_delay_s, 5.0))
            await asyncio.sleep(1.0)
            waited += 1.0

    # --- one delivery -----------------------------------------------------------------------------

    async def on_message(self, msg: Msg) -> None:
        """Execute one REMEDIATIONS delivery and settle it (``bus.settle``): the entry point of the
        ``executor`` subscriber (``remediator.consumers``), which runs ``executor_concurrency`` at once.
        Expected conditions (our errors: a held lock, a lost race, a pending approval) are logged by
        ``settle`` in one line; only a bug gets a traceback, once."""
        error: BaseException | None = None
        try:
            try:
                decision = Decision.model_validate_json(msg.data)
            except ValidationError as exc:
                raise PermanentError(f"not a Decision v1: {exc.errors()[0]['msg']}") from exc
            await self.execute(decision, msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # mapped to ack/nak/term (and logged) by settle, the one place that decides
            if isinstance(exc, PermanentError):  # settle dead-letters it without a word
                log.warning("executing %s failed: %s", msg.subject, exc)
            error = exc
        await settle(msg, error, max_deliver=self.settings.max_deliver, nak_delay=self.settings.nak_delay_s,
                     dead_letter=self._dead_letter)

    async def _audit_dead_letter(self, msg: Msg, reason: str, subject: str) -> None:
        after = {"subject": msg.subject, "moved_to": subject}
        try:
            decision = Decision.model_validate_json(msg.data)
        except ValidationError:
            node = node_from_token(msg.subject.rsplit(".", 1)[-1])
            await self.audit.append(node, "dead_letter", reason, after=after)
            return
        audit = self.audit.bind(AuditContext.of_decision(decision))
        await audit.append("dead_letter", reason, after=after)
        await self.abandon(decision, f"dead-lettered: {reason}", audit)

    async def abandon(self, d: Decision, reason: str, audit: IncidentAudit | None = None) -> RunResult | None:
        """End a run that will never be retried (its message was dead-lettered) like any failed run: escalate
        it to a person (annotation, Kubernetes Event, audit record, webhook) and finish it as
        ``dead-lettered`` (reservation released, target handed over, incident closed). Idempotent: a run
        already finished is left alone. When Kubernetes cannot be reached for the escalation, the
        ``escalated`` record and the webhook still go out."""
        audit = audit or self.audit.bind(AuditContext.of_decision(d))
        _, _, runs = await self._kv()
        run, rev = await runs.get(d.incident_id)
        if run is not None and run.finished:
            return None
        pb = self.playbooks.get(d.playbook) if d.playbook in self.playbooks else None
        stored = StoredRun(runs, run or RunRecord(d.incident_id, d.node, d.playbook, self.actor), rev)
        if pb is not None:
            try:
                await self._runner.escalate(self._context(d, pb, audit), stored, reason)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("escalating dead-lettered %s through Kubernetes failed: %s", d.incident_id, e)
                await self._escalate_without_kube(d, reason, audit, e)
        else:
            await self._escalate_without_kube(d, reason, audit, None)
        return await self._finish(d, pb, stored, "dead-lettered", reason, audit)

    async def _escalate_without_kube(self, d: Decision, reason: str, audit: IncidentAudit,
                                     error: BaseException | None) -> None:
        """The hand-over when the ``escalate`` step cannot run: the audit record and the webhook."""
        after: dict[str, Any] = {"action": "look at the node: its remediation was dead-lettered",
                                 "severity": "critical", "annotation": False}
        if error is not None:
            after["error"] = str(error)[:500]
        url = self.settings.escalation_webhook_url
        if url:
            body = {"node": d.node, "gpu": d.gpu.model_dump() if d.gpu else None, "incident": d.incident_id,
                    "playbook": d.playbook, "action": after["action"], "severity": "critical", "reason": reason}
            try:
                if self._http is not None:
                    await self._http(url, body)
                else:
                    async with httpx.AsyncClient(timeout=10.0) as client:
                        (await client.post(url, json=body)).raise_for_status()
                after["webhook"] = True
            except Exception as e:
                after["webhook"] = False
                log.warning("escalation webhook for %s failed: %s", d.incident_id, e)
        await audit.append("escalated", f"{after['action']}: {reason}", after=after)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume REMEDIATIONS until ``stop`` is set, at most ``executor_concurrency`` decisions at once: the
        ``executor`` subscriber alone, on a faststream broker with its own connection to the servers of ``nc``
        (the service runs it on one broker with dispatch's)."""
        await self._kv()
        broker = consumers.broker_like(self._nc, "executor")
        consumers.declare_executor(broker, self, concurrency=self.settings.executor_concurrency)
        await consumers.run_until(broker, self._js, (consumers.EXECUTOR,), stop)

    def close(self) -> None:
        """Nothing to release: the Kubernetes port owns its threads (``AsyncKube.close``, by whoever built
        it)."""
