"""The executor: runs each decision's playbook behind the safety rails, crash-safe and audited.

Where it sits: after dispatch. ``on_message`` handles the deliveries of REMEDIATIONS (durable pull consumer
``executor``, subscribed on faststream by ``remediator.consumers``; explicit ack through ``bus.settle``) and,
per decision:

1. reads the run record ``run.<incident>`` (KV ``remediator-state``); a finished run is acked again;
2. takes the node lock (KV ``remediator-locks`` ``node.<node>``, create-if-absent, renewed while running,
   released at the end), so two replicas never run playbooks on one node;
3. gathers a ``SafetySnapshot`` and evaluates the guards (``remediator.safety``); each verdict is audited;
   a passing verdict's bookkeeping (budget reservation, breaker count) is committed by compare-and-set on
   the ledger ``safety.ledger``, re-evaluating when another replica won the race;
4. runs the playbook's steps (``playbooks.steps``), persisting each step's record in the run record by
   compare-and-set before and after it runs: a replica killed mid-step is resumed (after the lock TTL and
   the message's redelivery) by whichever replica gets the message next, which re-runs only the step that
   was running (steps are idempotent) and never one that completed;
5. notices a person's override (our taint or cordon removed while the run is open) and stops;
6. audits ``playbook_finished``, closes the incident in the node's history and releases the lock.

Outcomes map to the message: a finished run (whatever its outcome) acks; waiting for a lock or an approval,
a temporary Kubernetes or agent failure nak with a delay (the run record keeps the progress); a decision
naming no known playbook goes to the dead letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from playbooks.catalog import PlaybookCatalog
from playbooks.schema import REPAIR_RUNGS, Playbook, StepSpec
from playbooks.steps import (
    REGISTRY,
    AgentOps,
    AuditOps,
    KubeOps,
    StepContext,
    StepFailed,
    StepRegistry,
    placed_by_us,
    quarantine_of,
)
from remediator import consumers, safety
from remediator.adapters.agent import AgentUnavailable
from remediator.adapters.kube import DrainTimeout, KubePermanentError, KubeTemporaryError, NotFound
from remediator.bus import PermanentError, TemporaryError, dead_letter_publisher, settle
from remediator.contracts import Decision, StepRecord, utcnow
from remediator.safety import Attempt, BreakerState, GuardVerdict, PoolUsage, SafetyPolicy, SafetySnapshot
from remediator.settings import Settings
from remediator.state import StateStore
from remediator.subjects import (
    LOCKS_BUCKET,
    STATE_BUCKET,
    node_from_token,
    node_key,
    node_token,
)

log = logging.getLogger(__name__)

__all__ = ["LEDGER_KEY", "Executor", "RunResult", "StepAction", "approval_key", "attempts_key", "run_key"]

LEDGER_KEY = "safety.ledger"
POOL_CACHE_S = 2.0  # how long a pool's node list serves the budget guard


def run_key(incident: str) -> str:
    return f"run.{incident}"


def attempts_key(node: str) -> str:
    return f"attempts.{node_token(node)}"


def approval_key(incident: str) -> str:
    return f"approval.{incident}"


@dataclass(frozen=True)
class StepAction:
    """One line of a run's story: the step (its id), the library step, what happened."""

    step: str
    name: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class RunResult:
    """What a decision's run came to.

    ``outcome``: ``completed`` (every step ran or was skipped by the ladder), ``escalated`` (handed to a
    person: a step failed, or a guard said so), ``rolled-back``, ``dry-run`` (shadow: nothing touched),
    ``blocked`` (opt-out, breaker), ``cancelled`` (a person's override), ``node-gone``.
    ``actions`` lists the steps in the order they ran, with their status; ``verdicts`` the guard verdicts.
    """

    incident: str
    node: str
    playbook: str
    outcome: str
    actions: tuple[StepAction, ...] = ()
    verdicts: tuple[GuardVerdict, ...] = ()
    detail: str = ""

    def done(self) -> list[str]:
        """Names of the steps that succeeded, in order (what the demo prints as the actions)."""
        return [a.name for a in self.actions if a.status == "succeeded"]


# --- persisted progress ----------------------------------------------------------------------------


@dataclass
class RunRecord:
    """The progress of one incident's run, stored under ``run.<incident>`` (compare-and-set)."""

    incident: str
    node: str
    playbook: str
    owner: str
    status: str = "running"  # running | finished
    outcome: str = ""
    detail: str = ""
    guards_passed: bool = False
    shadow: bool = False
    reserved: bool = False
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, StepRecord] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"incident": self.incident, "node": self.node, "playbook": self.playbook, "owner": self.owner,
                "status": self.status, "outcome": self.outcome, "detail": self.detail,
                "guards_passed": self.guards_passed, "shadow": self.shadow, "reserved": self.reserved,
                "verdicts": self.verdicts, "order": self.order,
                "records": {k: r.model_dump(mode="json") for k, r in self.records.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RunRecord:
        return RunRecord(d["incident"], d["node"], d["playbook"], d.get("owner", ""), d.get("status", "running"),
                         d.get("outcome", ""), d.get("detail", ""), bool(d.get("guards_passed")),
                         bool(d.get("shadow")), bool(d.get("reserved")), list(d.get("verdicts", [])),
                         {k: StepRecord.model_validate(v) for k, v in d.get("records", {}).items()},
                         list(d.get("order", [])))

    def put(self, key: str, rec: StepRecord) -> None:
        if key not in self.records:
            self.order.append(key)
        self.records[key] = rec

    def result(self) -> RunResult:
        actions = tuple(StepAction(k, self.records[k].name, self.records[k].status, self.records[k].detail)
                        for k in self.order)
        verdicts = tuple(GuardVerdict(v["guard"], v["allowed"], v["reason"], v.get("effect", "proceed"))
                         for v in self.verdicts)
        return RunResult(self.incident, self.node, self.playbook, self.outcome or self.status, actions, verdicts,
                         self.detail)


class LockLost(TemporaryError):
    """The node lock expired or was taken while the run was going on: stop and let redelivery resume."""


class _Cancelled(Exception):
    """A person overrode our workflow on the node (removed our taint or cordon)."""


# --- the plan: which step is next -------------------------------------------------------------------


@dataclass(frozen=True)
class Next:
    """What the run does next: run ``spec``, or skip it with ``skip_reason``, or stop (``spec`` None)."""

    spec: StepSpec | None
    skip_reason: str = ""
    stop: str = ""  # "escalate" | "rollback" | "finish" when the run ends here


def next_step(pb: Playbook, records: Mapping[str, StepRecord]) -> Next:
    """The next step of ``pb`` given the step records so far: a pure function of the ladder semantics
    (playbooks.schema): repair rungs are fallbacks of each other; ``next-rung`` abandons a rung;
    ``on_success: finish`` ends the run; ``escalate``/``rollback`` failures stop it."""
    failed_rungs: set[str] = set()
    healed_by: str | None = None
    rungs_done: dict[str, bool] = {}
    for s in pb.steps:
        rec = records.get(s.key)
        if rec is None or rec.status in ("pending", "running"):
            if s.rung in failed_rungs:
                return Next(s, skip_reason=f"rung {s.rung} abandoned after a failed step")
            if s.rung in REPAIR_RUNGS and healed_by is not None and healed_by != s.rung:
                return Next(s, skip_reason=f"rung {healed_by} already healed the fault")
            return Next(s)
        if rec.status == "failed":
            if s.on_failure == "next-rung":
                assert s.rung is not None
                failed_rungs.add(s.rung)
                rungs_done[s.rung] = False
                continue
            if s.on_failure in ("escalate", "rollback"):
                return Next(None, stop=s.on_failure)
            continue  # continue
        if rec.status == "succeeded" and s.on_success == "finish":
            return Next(None, stop="finish")
        if s.rung in REPAIR_RUNGS and rec.status == "succeeded" and s.rung not in failed_rungs:
            # a repair rung whose steps all succeeded heals; remember it once its last step is through
            last_of_rung = [x for x in pb.steps if x.rung == s.rung][-1]
            if last_of_rung.key == s.key and s.rung != "replace":
                healed_by = s.rung
    repair = [r for r in dict.fromkeys(x.rung for x in pb.steps) if r in REPAIR_RUNGS]
    if repair and healed_by is None and all(r in failed_rungs for r in repair):
        return Next(None, stop="escalate")
    return Next(None)


# --- the ledger: budget reservations and the breaker, in one CAS'd key --------------------------------


@dataclass(frozen=True)
class Ledger:
    breaker: BreakerState = field(default_factory=BreakerState)
    # node -> {"incident", "pool", "kind": "node"|"gpu", "gpus", "finished": bool, "at"}
    reservations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"breaker": self.breaker.to_json(), "reservations": {k: dict(v) for k, v in self.reservations.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Ledger:
        return Ledger(BreakerState.from_json(d.get("breaker", {})), dict(d.get("reservations", {})))


def _reservation_key(decision: Decision) -> str:
    return f"{decision.node}|{decision.gpu.key if decision.gpu else ''}"


class KvDoc:
    """A JSON document in KV with its revision; writes are compare-and-set."""

    def __init__(self, kv: KeyValue, key: str) -> None:
        self.kv = kv
        self.key = key

    async def get(self) -> tuple[dict[str, Any] | None, int]:
        try:
            entry = await self.kv.get(self.key)
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        if not entry.value:
            return None, int(entry.revision or 0)
        return json.loads(entry.value), int(entry.revision or 0)

    async def put(self, doc: Mapping[str, Any], revision: int) -> int:
        """Write ``doc`` if the key is still at ``revision`` (0: absent); raises KeyWrongLastSequenceError."""
        data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        if revision == 0:
            return int(await self.kv.create(self.key, data))
        return int(await self.kv.update(self.key, data, last=revision))


# --- the executor ----------------------------------------------------------------------------------


class Executor:
    """Runs decisions' playbooks; ``execute`` one decision, ``on_message`` one delivery, ``run`` consumes until
    stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, settings: Settings, kube: KubeOps, audit: AuditOps,
                 playbooks: PlaybookCatalog, agents: AgentOps, clock: Callable[[], datetime] = utcnow, *,
                 steps: StepRegistry = REGISTRY, actor: str | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 http: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None) -> None:
        self._nc = nc
        self._js = js
        self._dead_letter = dead_letter_publisher(js, on_dead_letter=self._audit_dead_letter)
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
        self._pool = ThreadPoolExecutor(max_workers=settings.executor_concurrency + 4,
                                        thread_name_prefix="executor-kube")
        self._state_kv: KeyValue | None = None
        self._locks_kv: KeyValue | None = None
        self._pool_cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._pool_locks: dict[str, asyncio.Lock] = {}
        self.results: list[RunResult] = []

    # --- plumbing ---------------------------------------------------------------------------------

    async def _kvs(self) -> tuple[KeyValue, KeyValue]:
        if self._state_kv is None or self._locks_kv is None:
            self._state_kv = await self._js.key_value(STATE_BUCKET)
            self._locks_kv = await self._js.key_value(LOCKS_BUCKET)
        return self._state_kv, self._locks_kv

    async def _sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def policy(self) -> SafetyPolicy:
        s = self.settings
        enabled = frozenset(g.strip() for g in s.guards_enabled.split(",") if g.strip())
        return SafetyPolicy(
            enabled=enabled, global_dry_run=s.dry_run, cooldown_s=s.cooldown_s, attempt_window_s=s.attempt_window_s,
            max_node_attempts=s.max_node_attempts, max_gpu_attempts=s.max_gpu_attempts,
            budget_max_node_fraction=s.budget_max_node_fraction, budget_max_nodes=s.budget_max_nodes,
            budget_max_gpu_fraction=s.budget_max_gpu_fraction, budget_max_gpus=s.budget_max_gpus,
            breaker_threshold=s.breaker_threshold, breaker_window_s=s.breaker_window_s,
            lock_retry_s=max(s.nak_delay_s, 5.0))

    async def _audit(self, d: Decision, what: Any, why: str, **kw: Any) -> None:
        await self.audit.append(d.node, what, why, incident=d.incident_id, gpu=d.gpu.key if d.gpu else None,
                                event_id=d.event_id, job=d.job, **kw)

    # --- the node lock ----------------------------------------------------------------------------

    async def _acquire(self, d: Decision, me: str, msg: Msg | None) -> int:
        """Take ``node.<node>`` in the locks bucket, waiting up to ``lock_wait_s``; returns its revision."""
        _, locks = await self._kvs()
        key = node_key(d.node)
        body = json.dumps({"owner": me, "incident": d.incident_id, "at": self.clock().isoformat()}).encode()
        waited = 0.0
        holder = "?"
        while True:
            try:
                return int(await locks.create(key, body))
            except KeyWrongLastSequenceError:
                pass
            try:
                entry = await locks.get(key)
                holder = json.loads(entry.value or b"{}").get("owner", "?")
            except (KeyNotFoundError, KeyDeletedError):
                continue
            if waited >= self.settings.lock_wait_s:
                raise TemporaryError(f"{d.node} is locked by {holder}", delay=max(self.settings.nak_delay_s, 5.0))
            if msg is not None:
                with contextlib.suppress(Exception):
                    await msg.in_progress()
            await asyncio.sleep(0.5)
            waited += 0.5

    async def _release(self, d: Decision, revision: int) -> None:
        _, locks = await self._kvs()
        with contextlib.suppress(KeyWrongLastSequenceError, KeyNotFoundError, nats.errors.Error):
            await locks.delete(node_key(d.node), last=revision)

    async def _keep_lock(self, d: Decision, me: str, rev: list[int], lost: asyncio.Event, msg: Msg | None) -> None:
        """Renew the lock (and the message's ack deadline) until cancelled; sets ``lost`` if it was taken."""
        _, locks = await self._kvs()
        body = json.dumps({"owner": me, "incident": d.incident_id}).encode()
        every = max(1.0, min(self.settings.lock_ttl_s / 3.0, 10.0))
        while True:
            await asyncio.sleep(every)
            try:
                rev[0] = int(await locks.update(node_key(d.node), body, last=rev[0]))
            except KeyWrongLastSequenceError:
                lost.set()
                return
            except nats.errors.Error as e:
                log.warning("renewing the lock of %s failed: %s", d.node, e)
            if msg is not None:
                with contextlib.suppress(Exception):
                    await msg.in_progress()

    # --- one decision -----------------------------------------------------------------------------

    async def execute(self, decision: Decision, msg: Msg | None = None) -> RunResult:
        """Run ``decision`` to an outcome and return it; raises ``TemporaryError`` when it must be retried
        later (lock held elsewhere, approval pending, Kubernetes or the agent unavailable) and
        ``PermanentError`` when it can never run (unknown playbook)."""
        state_kv, _ = await self._kvs()
        runs = KvDoc(state_kv, run_key(decision.incident_id))
        doc, _rev = await runs.get()
        if doc is not None and doc.get("status") == "finished":
            return RunRecord.from_json(doc).result()
        if decision.playbook not in self.playbooks:
            raise PermanentError(f"no playbook named {decision.playbook!r}")
        pb = self.playbooks.get(decision.playbook)
        me = f"{self.actor}|{decision.incident_id}|{uuid.uuid4().hex[:8]}"
        lock_rev = [await self._acquire(decision, me, msg)]
        lost = asyncio.Event()
        keeper = asyncio.create_task(self._keep_lock(decision, me, lock_rev, lost, msg))
        try:
            result = await self._run_locked(decision, pb, me, runs, lost)
        except (KubeTemporaryError, AgentUnavailable) as e:  # outside a step: the guards' reads, escalation
            raise TemporaryError(str(e), delay=getattr(e, "retry_after", None) or self.settings.nak_delay_s) from e
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await self._release(decision, lock_rev[0])
        self.results.append(result)
        return result

    async def _run_locked(self, d: Decision, pb: Playbook, me: str, runs: KvDoc, lost: asyncio.Event) -> RunResult:
        doc, rev = await runs.get()  # re-read under the lock: another replica may have finished meanwhile
        if doc is not None and doc.get("status") == "finished":
            return RunRecord.from_json(doc).result()
        resumed = doc is not None
        run = RunRecord.from_json(doc) if doc else RunRecord(d.incident_id, d.node, pb.name, me)
        run.owner = me
        await self._audit(d, "decision", ("resuming" if resumed else "received") + f" by {self.actor}: playbook "
                          f"{pb.name}" + (f", {len(run.order)} steps recorded" if resumed else ""),
                          after={"playbook": pb.name, "resumed": resumed})
        rev = await runs.put(run.to_json(), rev)

        if not run.guards_passed:
            gate = await self._guards(d, pb, run, me)
            run.verdicts = [v.to_json() for v in gate]
            run.shadow = safety.shadow(gate)
            stop = safety.blocking(gate)
            if stop is not None:
                return await self._stopped_by_guard(d, pb, run, runs, rev, stop)
            run.guards_passed = True
            rev = await runs.put(run.to_json(), rev)

        ctx = StepContext(decision=d, playbook=pb, kube=self.kube, agents=self.agents, settings=self.settings,
                          clock=self.clock, audit=self.audit, sleep=self._sleep, http=self._http,
                          run_sync=self._sync)
        outcome, detail = "completed", ""
        try:
            while True:
                if lost.is_set():
                    raise LockLost(f"lost the lock of {d.node}")
                nxt = next_step(pb, run.records)
                if nxt.spec is None:
                    if nxt.stop in ("escalate", "rollback"):
                        failed = [run.records[k] for k in run.order if run.records[k].status == "failed"]
                        why = failed[-1].detail if failed else "no rung of the ladder healed the fault"
                        if nxt.stop == "rollback" and not run.shadow:
                            rev = await self._rollback(ctx, pb, run, runs, rev)
                            outcome = "rolled-back"
                        rev = await self._escalate(ctx, run, runs, rev, f"{pb.name} failed: {why}")
                        outcome = outcome if outcome == "rolled-back" else "escalated"
                        detail = why
                    break
                spec = nxt.spec
                if nxt.skip_reason or run.shadow:
                    why = nxt.skip_reason or f"dry-run: would run {spec.name} {spec.params or ''}".strip()
                    rec = StepRecord(name=spec.name, status="skipped", params=dict(spec.params), detail=why,
                                     started_at=self.clock(), finished_at=self.clock())
                    run.put(spec.key, rec)
                    rev = await runs.put(run.to_json(), rev)
                    await self._audit(d, "step_skipped", f"{spec.key}: {why}", after={"step": spec.key})
                    continue
                if not run.shadow:
                    reason = await self._overridden(ctx, run)
                    if reason:
                        raise _Cancelled(reason)
                if spec.requires_approval:
                    await self._await_approval(d, spec)
                rev = await self._run_step(ctx, spec, run, runs, rev)
            if run.shadow:
                outcome = "dry-run"
        except _Cancelled as c:
            outcome, detail = "cancelled", str(c)
            await self._audit(d, "override", f"{c}: cancelling {pb.name} on {d.node}",
                              after={"cancelled": True})
        if outcome == "completed" and any(r.name == "escalate" and r.status == "succeeded"
                                           for r in run.records.values()):
            outcome = "escalated"  # handed over to a person (gpu-lost, unknown-xid, the replace rung)
        return await self._finish(d, pb, run, runs, rev, outcome, detail)

    async def _finish(self, d: Decision, pb: Playbook, run: RunRecord, runs: KvDoc, rev: int, outcome: str,
                      detail: str) -> RunResult:
        run.status, run.outcome, run.detail = "finished", outcome, detail
        if run.reserved:
            returned = any(r.name == "return_to_service" and r.status == "succeeded" and r.after.get("returned")
                           for r in run.records.values())
            await self._settle_reservation(d, released=returned or outcome in ("cancelled", "dry-run"))
        await self._audit(d, "playbook_finished", f"{pb.name}: {outcome}" + (f" ({detail})" if detail else ""),
                          after={"outcome": outcome, "steps": [f"{k}:{run.records[k].status}" for k in run.order]})
        await runs.put(run.to_json(), rev)
        # NCCL incidents live in their job's history, not the node's (handlers.nccl.history_key).
        history = d.labels.get("history_key") or node_key(d.node)
        await StateStore(self._state_kv).close_incident(history, d.group)  # type: ignore[arg-type]
        return run.result()

    # --- guards -----------------------------------------------------------------------------------

    async def _pool_nodes(self, pool: str) -> list[dict[str, Any]]:
        """The pool's GPU nodes, listed at most once per ``POOL_CACHE_S`` however many runs ask at once.

        Staleness only hides nodes someone else took out in the last seconds: nodes this service takes out
        are counted from the ledger's reservations, which are written by compare-and-set.
        """
        loop = asyncio.get_running_loop()
        async with self._pool_locks.setdefault(pool, asyncio.Lock()):
            cached = self._pool_cache.get(pool)
            if cached is not None and loop.time() - cached[0] < POOL_CACHE_S:
                return cached[1]
            nodes: list[dict[str, Any]] = await self._sync(self.kube.list_gpu_nodes, pool)
            self._pool_cache[pool] = (loop.time(), nodes)
            return nodes

    async def _snapshot(self, d: Decision, pb: Playbook, me: str, node: Mapping[str, Any], ledger: Ledger,
                        policy: SafetyPolicy) -> SafetySnapshot:
        state_kv, _ = await self._kvs()
        quarantine = quarantine_of(pb, self.steps)
        attempts: tuple[Attempt, ...] = ()
        if "cooldown" in policy.enabled:
            doc, _ = await KvDoc(state_kv, attempts_key(d.node)).get()
            attempts = tuple(Attempt.from_json(a) for a in (doc or {}).get("attempts", []))
        usage: PoolUsage | None = None
        if "budget" in policy.enabled and quarantine is not None:
            pool = str(node.get("pool") or "default")
            nodes = await self._pool_nodes(pool)
            gpus_of = {str(n["name"]): int(n.get("gpus") or 0) for n in nodes}
            out = {str(n["name"]) for n in nodes
                   if n.get("unschedulable") or any(t.get("key") == self.settings.taint_key for t in n["taints"])}
            reserved_nodes = {str(r["node"]) for r in ledger.reservations.values()
                              if r.get("pool") == pool and r.get("kind") == "node"}
            nodes_out = out | reserved_nodes
            gpu_only = sum(1 for r in ledger.reservations.values()
                           if r.get("pool") == pool and r.get("kind") == "gpu" and r["node"] not in nodes_out)
            usage = PoolUsage(pool, len(nodes), sum(gpus_of.values()), frozenset(nodes_out),
                              sum(gpus_of.get(n, 0) for n in nodes_out) + gpu_only, int(node.get("gpus") or 0))
        return SafetySnapshot(policy=policy, node_labels=dict(node.get("labels") or {}), playbook_dry_run=pb.dry_run,
                              quarantine=quarantine, attempts=attempts, lock_holder=me, me=me, pool=usage,
                              breaker=ledger.breaker)

    async def _guards(self, d: Decision, pb: Playbook, run: RunRecord, me: str) -> list[GuardVerdict]:
        """Evaluate the guards and commit their bookkeeping by CAS; audits each verdict once."""
        state_kv, _ = await self._kvs()
        policy = self.policy()
        ledger_doc = KvDoc(state_kv, LEDGER_KEY)
        try:
            node = await self._sync(self.kube.get_node, d.node)
        except NotFound:
            node = None
        if node is None:
            v = GuardVerdict("opt_out", False, f"node {d.node} does not exist", "block")
            await self._audit(d, "guard_verdict", f"opt_out: {v.reason}", after=v.to_json())
            return [v]
        uses_ledger = bool({"budget", "breaker"} & policy.enabled)
        for _attempt in range(50):
            raw, lrev = await ledger_doc.get() if uses_ledger else (None, 0)
            ledger = Ledger.from_json(raw or {})
            snap = await self._snapshot(d, pb, me, node, ledger, policy)
            now = self.clock()
            verdicts = safety.evaluate(d, snap, now, only=frozenset(safety.GUARD_NAMES) - {"approval"})
            stop = safety.blocking(verdicts)
            shadow = safety.shadow(verdicts)
            new = ledger
            if stop is not None and stop.effect == "trip":
                new = replace(ledger, breaker=ledger.breaker.tripped(now, stop.reason))
            elif stop is None and not shadow and snap.quarantine is not None:
                res = dict(ledger.reservations)
                if "budget" in policy.enabled and snap.pool is not None:
                    res[_reservation_key(d)] = {"incident": d.incident_id, "node": d.node, "pool": snap.pool.pool,
                                                "kind": snap.quarantine, "finished": False, "at": now.isoformat()}
                b = ledger.breaker
                if "breaker" in policy.enabled:
                    b = b.with_quarantine(d.incident_id, now, policy.breaker_window_s)
                new = Ledger(b, res)
            if uses_ledger and new != ledger:
                try:
                    await ledger_doc.put(new.to_json(), lrev)
                except KeyWrongLastSequenceError:
                    continue  # another replica changed the ledger: re-read and re-decide
            mine = new.reservations.get(_reservation_key(d))
            run.reserved = mine is not None and mine.get("incident") == d.incident_id
            break
        else:
            raise TemporaryError("the safety ledger kept changing under us", delay=1.0)
        for v in verdicts:
            await self._audit(d, "guard_verdict", f"{v.name}: {v.reason}", after=v.to_json())
        if stop is not None and stop.effect == "trip":
            await self.audit.append(None, "breaker_trip", stop.reason, incident=d.incident_id,
                                    after=new.breaker.to_json())
        if stop is None and not shadow and "cooldown" in policy.enabled:
            await self._record_attempt(d, now)
        return verdicts

    async def _record_attempt(self, d: Decision, now: datetime) -> None:
        state_kv, _ = await self._kvs()
        doc = KvDoc(state_kv, attempts_key(d.node))
        for _ in range(20):
            raw, rev = await doc.get()
            attempts = [Attempt.from_json(a) for a in (raw or {}).get("attempts", [])]
            if any(a.incident == d.incident_id for a in attempts):
                return
            since = now.timestamp() - self.settings.attempt_window_s
            kept = [a for a in attempts if a.at.timestamp() > since]
            kept.append(Attempt(d.incident_id, d.node, d.gpu.key if d.gpu else "", now))
            try:
                await doc.put({"attempts": [a.to_json() for a in kept]}, rev)
                return
            except KeyWrongLastSequenceError:
                continue

    async def _settle_reservation(self, d: Decision, *, released: bool) -> None:
        """At the end of a run: drop the reservation when capacity came back, else mark it finished (the
        node or GPU stays out, and counts, until it is returned)."""
        state_kv, _ = await self._kvs()
        doc = KvDoc(state_kv, LEDGER_KEY)
        key = _reservation_key(d)
        for _ in range(50):
            raw, rev = await doc.get()
            ledger = Ledger.from_json(raw or {})
            res = dict(ledger.reservations)
            if key not in res or res[key].get("incident") != d.incident_id:
                return
            if released:
                del res[key]
            else:
                res[key] = {**res[key], "finished": True}
            try:
                await doc.put(Ledger(ledger.breaker, res).to_json(), rev)
                return
            except KeyWrongLastSequenceError:
                continue

    async def _stopped_by_guard(self, d: Decision, pb: Playbook, run: RunRecord, runs: KvDoc, rev: int,
                                stop: GuardVerdict) -> RunResult:
        if stop.effect in ("retry", "wait"):
            await runs.put(run.to_json(), rev)
            raise TemporaryError(f"{stop.name}: {stop.reason}", delay=stop.retry_after_s)
        if stop.effect == "escalate" and not run.shadow:
            ctx = StepContext(decision=d, playbook=pb, kube=self.kube, agents=self.agents, settings=self.settings,
                              clock=self.clock, audit=self.audit, sleep=self._sleep, http=self._http,
                              run_sync=self._sync)
            rev = await self._escalate(ctx, run, runs, rev, f"{stop.name}: {stop.reason}")
            return await self._finish(d, pb, run, runs, rev, "escalated", f"{stop.name}: {stop.reason}")
        return await self._finish(d, pb, run, runs, rev, "blocked", f"{stop.name}: {stop.reason}")

    async def _await_approval(self, d: Decision, spec: StepSpec) -> None:
        state_kv, _ = await self._kvs()
        waited = 0.0
        while True:
            raw, _ = await KvDoc(state_kv, approval_key(d.incident_id)).get()
            snap = SafetySnapshot(policy=self.policy(), approval_steps=(spec.key,),
                                  approved_by=(raw or {}).get("by"))
            v = safety.evaluate(d, snap, self.clock(), only=frozenset({"approval"}))[0]
            if v.allowed or waited >= self.settings.approval_wait_s:
                await self._audit(d, "guard_verdict", f"approval: {v.reason}", after={**v.to_json(), "step": spec.key})
                if v.allowed:
                    return
                raise TemporaryError(f"approval: {v.reason}", delay=max(self.settings.nak_delay_s, 5.0))
            await asyncio.sleep(1.0)
            waited += 1.0

    # --- steps ------------------------------------------------------------------------------------

    async def _run_step(self, ctx: StepContext, spec: StepSpec, run: RunRecord, runs: KvDoc, rev: int,
                        key: str | None = None) -> int:
        d = ctx.decision
        key = key or spec.key
        prior = run.records.get(key)
        started = self.clock()
        run.put(key, StepRecord(name=spec.name, status="running", params=dict(spec.params), started_at=started,
                                detail="resumed after an interrupted attempt" if prior else ""))
        rev = await runs.put(run.to_json(), rev)
        await self._audit(d, "step_started", f"{key}: {spec.name}" + (" (resumed)" if prior else ""),
                          after={"step": key, "params": dict(spec.params), "timeout_s": spec.timeout_s})
        sctx = replace(ctx, records=dict(run.records), step_key=key, timeout_s=spec.timeout_s)
        fn = self.steps.get(spec.name).fn
        try:
            res = await asyncio.wait_for(fn(sctx, spec.params), timeout=spec.timeout_s)
        except (KubeTemporaryError, AgentUnavailable) as e:
            delay = getattr(e, "retry_after", None) or self.settings.nak_delay_s
            raise TemporaryError(f"{key}: {e}", delay=delay) from e
        except (StepFailed, DrainTimeout, KubePermanentError, TimeoutError) as e:
            detail = str(e) or f"timed out after {spec.timeout_s:g}s"
            before = getattr(e, "before", {}) or {}
            after = getattr(e, "after", {}) or {}
            if isinstance(e, DrainTimeout):
                after = {"pods_left": e.pods_left, "evicted": e.evicted}
            run.put(key, StepRecord(name=spec.name, status="failed", params=dict(spec.params), before=before,
                                    after=after, detail=detail[:2000], started_at=started,
                                    finished_at=self.clock()))
            rev = await runs.put(run.to_json(), rev)
            await self._audit(d, "step_failed", f"{key}: {detail}"[:4000], before=before, after=after)
            return rev
        status = "skipped" if res.skipped else "succeeded"
        after = {**res.after, "changed_by_us": res.changed}
        run.put(key, StepRecord(name=spec.name, status=status, params=dict(spec.params), before=res.before,
                                after=after, detail=res.detail[:2000], started_at=started, finished_at=self.clock()))
        rev = await runs.put(run.to_json(), rev)
        await self._audit(d, "step_skipped" if res.skipped else "step_succeeded", f"{key}: {res.detail}"[:4000],
                          before=res.before, after=after)
        return rev

    async def _escalate(self, ctx: StepContext, run: RunRecord, runs: KvDoc, rev: int, reason: str) -> int:
        key = "escalate-on-failure"
        if key in run.records and run.records[key].status == "succeeded":
            return rev
        spec = StepSpec(name="escalate", id=key, params={"reason": reason}, timeout_s=60.0)
        return await self._run_step(ctx, spec, run, runs, rev, key)

    async def _rollback(self, ctx: StepContext, pb: Playbook, run: RunRecord, runs: KvDoc, rev: int) -> int:
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
            rev = await self._run_step(ctx, spec, run, runs, rev, key)
        return rev

    async def _overridden(self, ctx: StepContext, run: RunRecord) -> str:
        """A person removed our taint or uncordoned the node while the run is open: the reason, else ''."""
        recs = list(run.records.values())
        if any(r.name == "return_to_service" for r in recs):
            return ""
        taint = any(r.name == "taint" and placed_by_us(r, ctx) and r.after.get("changed_by_us") for r in recs)
        cordon = any(r.name == "cordon" and placed_by_us(r, ctx) and r.after.get("changed_by_us") for r in recs)
        if not (taint or cordon):
            return ""
        node = await self._sync(self.kube.get_node, ctx.node)
        if taint and not any(t.get("key") == self.settings.taint_key for t in node.get("taints", [])):
            return f"our taint {self.settings.taint_key} was removed from {ctx.node}"
        if cordon and not node.get("unschedulable"):
            return f"{ctx.node} was uncordoned"
        return ""

    # --- one delivery -----------------------------------------------------------------------------

    async def on_message(self, msg: Msg) -> None:
        """Execute one REMEDIATIONS delivery and settle it (``bus.settle``): the entry point of the
        ``executor`` subscriber (``remediator.consumers``), which runs ``executor_concurrency`` at once."""
        error: BaseException | None = None
        try:
            try:
                decision = Decision.model_validate_json(msg.data)
            except ValidationError as exc:
                raise PermanentError(f"not a Decision v1: {exc.errors()[0]['msg']}") from exc
            await self.execute(decision, msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # mapped to ack/nak/term by settle, the one place that decides
            if not isinstance(exc, TemporaryError):
                log.warning("executing %s failed: %s", msg.subject, exc, exc_info=exc)
            error = exc
        await settle(msg, error, max_deliver=self.settings.max_deliver, nak_delay=self.settings.nak_delay_s,
                     dead_letter=self._dead_letter)

    async def _audit_dead_letter(self, msg: Msg, reason: str, subject: str) -> None:
        node = node_from_token(msg.subject.rsplit(".", 1)[-1])
        await self.audit.append(node, "dead_letter", reason, after={"subject": msg.subject, "moved_to": subject})

    async def run(self, stop: asyncio.Event) -> None:
        """Consume REMEDIATIONS until ``stop`` is set, at most ``executor_concurrency`` decisions at once: the
        ``executor`` subscriber alone, on a faststream broker with its own connection to the servers of ``nc``
        (the service runs it on one broker with dispatch's)."""
        await self._kvs()
        broker = consumers.broker_like(self._nc, "executor")
        consumers.declare_executor(broker, self, concurrency=self.settings.executor_concurrency)
        await consumers.run_until(broker, self._js, (consumers.EXECUTOR,), stop)

    def close(self) -> None:
        """Stop the worker threads of Kubernetes calls (after ``run`` returned)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
