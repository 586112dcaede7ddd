"""The guards: named, pure verdicts every decision passes before the executor touches anything.

Where it sits: the first module of ``remediator.safety``, called by the executor between receiving a
``Decision`` and running its playbook (DESIGN.md §7). The executor takes the node lock
(``safety.lock``), gathers a ``SafetySnapshot`` (node labels from Kubernetes, attempts from
``safety.attempts``, the lock's holder, pool usage, the breaker and reservations from ``safety.ledger``,
approvals from KV), and ``safety.gate`` calls ``evaluate`` and commits the bookkeeping a passing verdict
implies by compare-and-set. Every verdict is audited. A handler can propose; only these guards say yes.

Every guard is a pure function ``guard(decision, snapshot, now) -> GuardVerdict``; ``GUARDS`` lists them in
the order they are evaluated, and evaluation stops at the first that does not allow the decision:

1. ``opt_out``   the node carries ``gpu-remediator.io/opt-out=true``: touch nothing.
2. ``dry_run``   global or per-playbook shadow mode: record what would happen, touch nothing.
3. ``cooldown``  a recent remediation of the same target, or too many attempts per node/GPU in the window:
                 escalate to a person instead of trying again.
4. ``lock``      another run holds the node lock (``snapshot.lock_holder`` is not ``snapshot.me``): retry
                 later. The executor evaluates it on its own, and audits it, when the lock is refused.
5. ``budget``    the pool would have too many whole GPU nodes out, or too many GPUs isolated on their own:
                 escalate instead (two budgets; the first node of a pool always passes).
6. ``breaker``   open, or this quarantine completes a burst that trips it: block until a person resets it.
7. ``approval``  a step is marked ``requires_approval`` and nobody approved the incident yet: wait.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from remediator.contracts import OPT_OUT_LABEL, Decision
from remediator.safety.attempts import Attempt
from remediator.safety.ledger import BreakerState
from remediator.settings import SafetySettings

Effect = Literal["proceed", "shadow", "escalate", "retry", "block", "trip", "wait"]
Quarantine = Literal["node", "gpu"] | None

GUARD_NAMES: tuple[str, ...] = ("opt_out", "dry_run", "cooldown", "lock", "budget", "breaker", "approval")


@dataclass(frozen=True)
class GuardVerdict:
    """One guard's answer. ``effect`` tells the executor what to do when ``allowed`` is False (or, for
    ``shadow``, how to proceed): escalate, retry later, block, trip the breaker, wait for approval."""

    name: str
    allowed: bool
    reason: str
    effect: Effect = "proceed"
    retry_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"guard": self.name, "allowed": self.allowed, "reason": self.reason, "effect": self.effect}


@dataclass(frozen=True)
class PoolUsage:
    """Capacity of one node pool and what is out of service in it (GPU nodes only).

    ``nodes_out``: nodes cordoned or carrying our taint (anyone's doing) plus nodes reserved by running
    playbooks. ``gpus_out``: GPUs of those nodes plus GPUs isolated on their own (``gpus_isolated``: on
    nodes in service, the GPUs missing from ``allocatable`` or reserved by running GPU playbooks).
    """

    pool: str
    nodes_total: int
    gpus_total: int
    nodes_out: frozenset[str] = frozenset()
    gpus_out: int = 0
    node_gpus: int = 0  # GPUs of the decision's node
    gpus_isolated: int | None = None  # GPUs out on their own, on nodes not in nodes_out

    @property
    def isolated(self) -> int:
        """GPUs isolated on their own (``gpus_isolated``; when not given, ``gpus_out`` less ``node_gpus`` per
        node out, i.e. a pool of equal nodes)."""
        if self.gpus_isolated is not None:
            return self.gpus_isolated
        return max(0, self.gpus_out - self.node_gpus * len(self.nodes_out))


@dataclass(frozen=True)
class SafetyPolicy:
    """The limits the guards apply; ``of`` builds them from the ``safety`` settings section."""

    enabled: frozenset[str] = frozenset(GUARD_NAMES)
    global_dry_run: bool = False
    cooldown_s: float = 600.0
    attempt_window_s: float = 86_400.0
    max_node_attempts: int = 3
    max_gpu_attempts: int = 2
    budget_max_node_fraction: float = 0.1
    budget_max_nodes: int = 50
    budget_max_gpu_fraction: float = 0.1
    budget_max_gpus: int = 400
    breaker_threshold: int = 10
    breaker_window_s: float = 300.0
    lock_retry_s: float = 10.0

    @staticmethod
    def of(s: SafetySettings, *, lock_retry_s: float = 10.0) -> SafetyPolicy:
        """The limits of the ``safety`` settings section; a refused lock is retried after ``lock_retry_s``."""
        return SafetyPolicy(
            enabled=s.guards_enabled, global_dry_run=s.dry_run, cooldown_s=s.cooldown_s,
            attempt_window_s=s.attempt_window_s, max_node_attempts=s.max_node_attempts,
            max_gpu_attempts=s.max_gpu_attempts, budget_max_node_fraction=s.budget_max_node_fraction,
            budget_max_nodes=s.budget_max_nodes, budget_max_gpu_fraction=s.budget_max_gpu_fraction,
            budget_max_gpus=s.budget_max_gpus, breaker_threshold=s.breaker_threshold,
            breaker_window_s=s.breaker_window_s, lock_retry_s=lock_retry_s)

    def node_limit(self, total: int) -> int:
        """Most GPU nodes of a pool of ``total`` that may be out at once: never below one."""
        return max(1, min(self.budget_max_nodes, math.floor(self.budget_max_node_fraction * total)))

    def gpu_limit(self, total: int) -> int:
        return max(1, min(self.budget_max_gpus, math.floor(self.budget_max_gpu_fraction * total)))


@dataclass(frozen=True)
class SafetySnapshot:
    """The facts the guards need, gathered by the executor at one moment."""

    policy: SafetyPolicy
    node_labels: Mapping[str, str] = field(default_factory=dict)
    playbook_dry_run: bool = False
    quarantine: Quarantine = None
    attempts: tuple[Attempt, ...] = ()
    lock_holder: str | None = None
    me: str = ""
    pool: PoolUsage | None = None
    breaker: BreakerState = field(default_factory=BreakerState)
    approval_steps: tuple[str, ...] = ()
    approved_by: str | None = None


def _gpu_key(decision: Decision) -> str:
    return decision.gpu.key if decision.gpu else ""


def opt_out(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Blocks when the node is labelled ``gpu-remediator.io/opt-out=true``."""
    if snap.node_labels.get(OPT_OUT_LABEL, "").lower() == "true":
        return GuardVerdict("opt_out", False, f"{decision.node} is labelled {OPT_OUT_LABEL}=true", "block")
    return GuardVerdict("opt_out", True, "node not opted out")


def dry_run(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Shadow mode, globally or for this playbook: the run records what it would do and touches nothing."""
    if snap.policy.global_dry_run:
        return GuardVerdict("dry_run", True, "global dry-run: recording what would happen", "shadow")
    if snap.playbook_dry_run:
        return GuardVerdict("dry_run", True, f"playbook {decision.playbook} is in dry-run", "shadow")
    return GuardVerdict("dry_run", True, "acting for real")


def cooldown(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Escalates instead of acting when the target was remediated within the cooldown, or the node/GPU
    used up its attempts in the window. The decision's own incident never counts (a resumed run), nor the
    incident it supersedes (``labels["supersedes"]``: the handler replaced that decision with this one, e.g.
    an NCCL suspect found after a no-suspect job restart; the two are one remediation)."""
    p = snap.policy
    if snap.quarantine is None:
        # A job restart or a hand-over to a person takes nothing on the node out of service: another
        # playbook that just ran there (on some GPU of it) is no reason to hold this one back.
        return GuardVerdict("cooldown", True, f"the playbook takes no capacity out of {decision.node}; "
                            "node and GPU cooldowns do not apply")
    since = now - timedelta(seconds=p.attempt_window_s)
    mine = {decision.incident_id, decision.labels.get("supersedes")}
    others = [a for a in snap.attempts if a.incident not in mine and a.at > since]
    on_node = [a for a in others if a.node == decision.node]
    gpu = _gpu_key(decision)
    on_gpu = [a for a in on_node if gpu and a.gpu == gpu]
    if len(on_node) >= p.max_node_attempts:
        return GuardVerdict("cooldown", False, f"{decision.node} was remediated {len(on_node)} times in "
                            f"{p.attempt_window_s:g}s (limit {p.max_node_attempts})", "escalate")
    if gpu and len(on_gpu) >= p.max_gpu_attempts:
        return GuardVerdict("cooldown", False, f"GPU {gpu} was remediated {len(on_gpu)} times in "
                            f"{p.attempt_window_s:g}s (limit {p.max_gpu_attempts})", "escalate")
    same_target = [a for a in (on_gpu if gpu else on_node) if (now - a.at).total_seconds() < p.cooldown_s]
    if same_target:
        last = max(same_target, key=lambda a: a.at)
        ago = (now - last.at).total_seconds()
        return GuardVerdict("cooldown", False, f"{gpu or decision.node} was remediated {ago:.0f}s ago by "
                            f"{last.incident} (cooldown {p.cooldown_s:g}s)", "escalate")
    return GuardVerdict("cooldown", True, f"{len(on_node)} earlier attempts on the node, {len(on_gpu)} on the GPU")


def lock(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """One playbook per node: allowed only when this run holds the node lock."""
    if snap.lock_holder == snap.me:
        return GuardVerdict("lock", True, f"holding the lock of {decision.node}")
    return GuardVerdict("lock", False, f"{decision.node} is locked by {snap.lock_holder or 'another run'}",
                        "retry", snap.policy.lock_retry_s)


def budget(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Blast radius, counted in two separate budgets per pool (ARCHITECTURE.md, "Lifecycle, budgets and the
    reconciler"): whole nodes out of service against ``node_limit``, and GPUs isolated on their own (on
    nodes still in service) against ``gpu_limit``; each limit is the smaller of a fraction and a count, and
    never below one. A node quarantine is judged by the node budget only, so isolated GPUs never block
    quarantining a dead node, and the first node out of a pool is always allowed; a GPU quarantine by the
    GPU budget only, and a GPU of a node already out costs nothing."""
    if snap.quarantine is None:
        return GuardVerdict("budget", True, "the playbook takes no capacity out")
    pool = snap.pool
    if pool is None:
        return GuardVerdict("budget", True, "not a GPU node: no pool budget applies")
    p = snap.policy
    node_limit, gpu_limit = p.node_limit(pool.nodes_total), p.gpu_limit(pool.gpus_total)
    if decision.node in pool.nodes_out:
        return GuardVerdict("budget", True, f"{decision.node} is already out of service in pool {pool.pool}")
    isolated = pool.isolated
    if snap.quarantine == "node":
        if not pool.nodes_out:
            return GuardVerdict("budget", True, f"first node out in pool {pool.pool} (always allowed; "
                                f"{isolated} GPUs isolated on their own do not count against nodes)")
        if len(pool.nodes_out) + 1 > node_limit:
            return GuardVerdict("budget", False, f"pool {pool.pool}: {len(pool.nodes_out)} of {pool.nodes_total} "
                                f"GPU nodes out; one more exceeds the limit {node_limit}", "escalate")
        return GuardVerdict("budget", True, f"pool {pool.pool}: {len(pool.nodes_out)}/{node_limit} nodes out "
                            "before this one")
    if isolated + 1 > gpu_limit:
        return GuardVerdict("budget", False, f"pool {pool.pool}: {isolated} of {pool.gpus_total} GPUs isolated "
                            f"on their own; one more exceeds the limit {gpu_limit}", "escalate")
    return GuardVerdict("budget", True, f"pool {pool.pool}: {isolated}/{gpu_limit} GPUs isolated on their own, "
                        f"{len(pool.nodes_out)} nodes out, before this one")


def breaker(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Blocks while the breaker is open; trips it when this quarantine would exceed ``breaker_threshold``
    quarantines within ``breaker_window_s`` (so at most the threshold get through)."""
    b = snap.breaker
    if b.open:
        since = b.tripped_at.isoformat() if b.tripped_at else "?"
        return GuardVerdict("breaker", False, f"circuit breaker open since {since}: {b.reason}", "block")
    if snap.quarantine is None:
        return GuardVerdict("breaker", True, "the playbook quarantines nothing")
    p = snap.policy
    recent = b.recent(now, p.breaker_window_s, exclude=decision.incident_id)
    if len(recent) >= p.breaker_threshold:
        return GuardVerdict("breaker", False, f"{len(recent)} quarantines in {p.breaker_window_s:g}s reached "
                            f"the threshold {p.breaker_threshold}: tripping the breaker", "trip")
    return GuardVerdict("breaker", True, f"{len(recent)} quarantines in the last {p.breaker_window_s:g}s "
                        f"(threshold {p.breaker_threshold})")


def approval(decision: Decision, snap: SafetySnapshot, now: datetime) -> GuardVerdict:
    """Waits while a step marked ``requires_approval`` lacks an approval of the incident."""
    if not snap.approval_steps:
        return GuardVerdict("approval", True, "no step needs approval")
    if snap.approved_by:
        return GuardVerdict("approval", True, f"approved by {snap.approved_by}")
    return GuardVerdict("approval", False, f"steps {list(snap.approval_steps)} need `remediator approve "
                        f"{decision.incident_id}`", "wait")


Guard = Callable[[Decision, SafetySnapshot, datetime], GuardVerdict]
GUARDS: tuple[tuple[str, Guard], ...] = (
    ("opt_out", opt_out), ("dry_run", dry_run), ("cooldown", cooldown), ("lock", lock), ("budget", budget),
    ("breaker", breaker), ("approval", approval),
)
ALWAYS_ON = frozenset({"lock"})


def evaluate(decision: Decision, snap: SafetySnapshot, now: datetime, *,
             only: frozenset[str] | None = None) -> list[GuardVerdict]:
    """Run the enabled guards in order, stopping after the first that does not allow the decision.

    ``only`` restricts evaluation to some guards (e.g. re-checking the approval gate before one step).
    A disabled guard is reported as allowed with reason "disabled", so the audit says it was off.
    """
    out: list[GuardVerdict] = []
    for name, fn in GUARDS:
        if only is not None and name not in only:
            continue
        if name not in snap.policy.enabled and name not in ALWAYS_ON:
            out.append(GuardVerdict(name, True, "disabled"))
            continue
        v = fn(decision, snap, now)
        out.append(v)
        if not v.allowed:
            break
    return out


def shadow(verdicts: list[GuardVerdict]) -> bool:
    return any(v.effect == "shadow" for v in verdicts)


def blocking(verdicts: list[GuardVerdict]) -> GuardVerdict | None:
    return next((v for v in verdicts if not v.allowed), None)
