"""The gate: evaluate the guards over one snapshot and commit what they imply to the ledger, atomically.

Where it sits: in ``remediator.safety``, between the executor (which holds the node lock and has read the
node and the other facts) and the ledger. ``decide`` is pure: from the facts and one ledger it builds the
``SafetySnapshot`` (pool usage counts the nodes Kubernetes shows out of service plus the ledger's
reservations), runs ``guards.evaluate`` and returns the ledger as the verdicts leave it (a reservation and a
quarantine count when the run goes ahead, a tripped breaker when it trips). ``Gate.evaluate`` runs ``decide``
inside a compare-and-set update of the ledger, so a replica that lost the race re-decides on the ledger that
won, and then records the attempt. Auditing the verdicts is the caller's (it knows the incident's binding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from nats.js.kv import KeyValue

from remediator.contracts import Decision
from remediator.kv import Entry, json_documents
from remediator.pools import PoolView
from remediator.safety.attempts import Attempt, AttemptLog
from remediator.safety.guards import (
    GUARD_NAMES,
    GuardVerdict,
    PoolUsage,
    Quarantine,
    SafetyPolicy,
    SafetySnapshot,
    blocking,
    evaluate,
    shadow,
)
from remediator.safety.ledger import BreakerState, Ledger, LedgerStore
from remediator.subjects import LEDGER_KEY, approval_key

__all__ = ["Facts", "Gate", "GateResult", "decide", "pool_usage"]


@dataclass(frozen=True)
class Facts:
    """What the guards need besides the ledger, read once per evaluation by the executor.

    ``node``: the node as the Kubernetes adapter returns it (``labels``, ``pool``, ``gpus``); ``pool_nodes``:
    its pool, only when the budget applies: a ``PoolView`` (the adapter's, kept by its node watch) or the
    pool's GPU node summaries (``name``, ``gpus``, ``gpus_allocatable``, ``unschedulable``, ``taints``);
    ``lock_holder``: who holds the node lock now (``me`` when this run does).
    """

    node: Mapping[str, Any]
    quarantine: Quarantine
    playbook_dry_run: bool
    me: str
    lock_holder: str | None
    taint_key: str
    attempts: tuple[Attempt, ...] = ()
    pool_nodes: PoolView | Sequence[Mapping[str, Any]] | None = None
    attempts_revision: int | None = None  # the revision ``attempts`` were read at, when read for this decision


@dataclass(frozen=True)
class GateResult:
    """The verdicts in order; whether the run holds a budget reservation; the breaker if it tripped."""

    verdicts: tuple[GuardVerdict, ...]
    reserved: bool = False
    tripped: BreakerState | None = None

    @property
    def stop(self) -> GuardVerdict | None:
        return blocking(list(self.verdicts))

    @property
    def shadow(self) -> bool:
        return shadow(list(self.verdicts))


def pool_usage(facts: Facts, ledger: Ledger) -> PoolUsage | None:
    """The node's pool as the budget guard sees it: nodes out (cordoned or carrying our taint, as Kubernetes
    shows them, or reserved by a running node playbook, or handed over and not yet settled) and GPUs isolated
    on their own (on each node in service, the GPUs missing from ``allocatable`` or reserved or handed over
    by GPU playbooks, whichever is more). Reads the pool's notable nodes and the ledger's entries of the
    pool, never every node of it (``remediator.pools``)."""
    if facts.pool_nodes is None:
        return None
    pool = str(facts.node.get("pool") or "default")
    view = facts.pool_nodes
    if not isinstance(view, PoolView):
        view = PoolView.of(pool, view, facts.taint_key)
    if view.taint_key != facts.taint_key:
        raise ValueError(f"the pool view counts taint {view.taint_key!r}, the guard {facts.taint_key!r}")
    out = {str(n["name"]) for n in view.notable
           if n.get("unschedulable") or any(t.get("key") == facts.taint_key for t in n.get("taints") or [])}
    # Handovers count as out too until the reconciler settles them: the cluster view may be a few seconds
    # old, and a run that just ended must not leave a gap in which its target is not counted.
    running = [r for r in (*ledger.reservations.values(), *ledger.handovers.values()) if r.get("pool") == pool]
    reserved = {str(r["node"]) for r in running if r.get("kind") == "node"}
    nodes_out = out | reserved
    reserved_gpus: dict[str, int] = {}
    for r in running:
        if r.get("kind") == "gpu":
            reserved_gpus[str(r["node"])] = reserved_gpus.get(str(r["node"]), 0) + 1
    isolated = 0
    counted: set[str] = set()
    for n in view.notable:  # a node that is not notable has every GPU allocatable: only reservations count
        name = str(n["name"])
        if name in nodes_out:
            continue
        gpus = int(n.get("gpus") or 0)
        allocatable = n.get("gpus_allocatable")
        missing = max(0, gpus - int(allocatable)) if allocatable is not None else 0
        isolated += max(missing, reserved_gpus.get(name, 0))
        counted.add(name)
    isolated += sum(c for name, c in reserved_gpus.items() if name not in counted and name not in nodes_out)
    gpus_of = view.gpus_of
    return PoolUsage(pool, view.nodes, view.gpus, frozenset(nodes_out),
                     sum(gpus_of.get(n, 0) for n in nodes_out) + isolated, int(facts.node.get("gpus") or 0),
                     isolated)


def decide(d: Decision, policy: SafetyPolicy, facts: Facts, ledger: Ledger,
           now: datetime) -> tuple[Ledger, GateResult]:
    """The guards' verdicts (all but ``approval``, which gates single steps) over ``facts`` and ``ledger``,
    and the ledger they leave behind. Pure: the ledger's compare-and-set may run it several times."""
    snap = SafetySnapshot(policy=policy, node_labels=dict(facts.node.get("labels") or {}),
                          playbook_dry_run=facts.playbook_dry_run, quarantine=facts.quarantine,
                          attempts=facts.attempts, lock_holder=facts.lock_holder, me=facts.me,
                          pool=pool_usage(facts, ledger), breaker=ledger.breaker)
    verdicts = tuple(evaluate(d, snap, now, only=frozenset(GUARD_NAMES) - {"approval"}))
    stop = blocking(list(verdicts))
    new = ledger
    tripped: BreakerState | None = None
    if stop is not None and stop.effect == "trip":
        tripped = ledger.breaker.tripped(now, stop.reason)
        new = replace(ledger, breaker=tripped)
    elif stop is None and not shadow(list(verdicts)) and snap.quarantine is not None:
        if "budget" in policy.enabled and snap.pool is not None:
            new = new.reserved(d, snap.pool.pool, snap.quarantine, now)
        if "breaker" in policy.enabled:
            new = replace(new, breaker=new.breaker.with_quarantine(d.incident_id, now, policy.breaker_window_s))
    return new, GateResult(verdicts, new.holds(d), tripped)


class Gate:
    """Evaluates a decision's guards against the shared ledger and attempts of the state bucket."""

    def __init__(self, state_kv: KeyValue) -> None:
        self.ledger = LedgerStore(state_kv)
        self.attempts = AttemptLog(state_kv)
        self.approvals = json_documents(state_kv)

    async def approval(self, d: Decision, policy: SafetyPolicy, step: str, now: datetime) -> GuardVerdict:
        """The ``approval`` guard for one gated ``step``: allowed once someone approved the incident
        (``approval.<incident>``, written by ``remediator approve``)."""
        approved = (await self.approvals.get(approval_key(d.incident_id))).value
        snap = SafetySnapshot(policy=policy, approval_steps=(step,), approved_by=(approved or {}).get("by"))
        return evaluate(d, snap, now, only=frozenset({"approval"}))[0]

    async def evaluate(self, d: Decision, policy: SafetyPolicy, facts: Facts, now: datetime) -> GateResult:
        """The verdicts over ``facts``, their bookkeeping committed; a run that goes ahead for real (not
        shadow) is recorded as an attempt of its node."""
        if facts.pool_nodes is not None:  # the budget counts handovers: the whole ledger, shards and all
            result = await self.ledger.update(lambda led: decide(d, policy, facts, led, now))
        elif {"budget", "breaker"} & policy.enabled:  # the document alone (breaker, reservations)
            result = await self.ledger.docs.update(LEDGER_KEY, lambda led: decide(d, policy, facts, led, now))
        else:
            _, result = decide(d, policy, facts, Ledger(), now)
        if result.stop is None and not result.shadow and "cooldown" in policy.enabled:
            read = None if facts.attempts_revision is None else Entry(facts.attempts, facts.attempts_revision)
            await self.attempts.record(Attempt(d.incident_id, d.node, d.gpu.key if d.gpu else "", now),
                                       policy.attempt_window_s, read=read)
        return result
