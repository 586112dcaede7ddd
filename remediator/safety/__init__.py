"""Safety rails: everything that stands between a handler's ``Decision`` and a change to the cluster.

Where it sits: under the executor, above the KV helper (``remediator.kv``) and the contracts. The executor
passes the rails in this order for each decision (DESIGN.md §7), and audits every verdict:

- ``lock``      the node lock (one running playbook per node across replicas; a refusal is a ``lock`` verdict);
- ``guards``    the named, pure guards over a snapshot and a policy (opt-out, dry-run, cooldown, lock, budget,
                breaker, approval);
- ``gate``      evaluates the guards and commits their bookkeeping to the ledger by compare-and-set;
- ``ledger``    budget reservations and the circuit breaker, one document shared by all replicas;
- ``attempts``  recent remediations per node, which the cooldown counts.

A handler can propose; only these modules say yes. The guard functions themselves are in ``GUARDS`` (by
name) and in ``remediator.safety.guards``; ``remediator.safety.lock`` is the lock module.
"""

from remediator.safety.attempts import Attempt, AttemptLog
from remediator.safety.gate import Facts, Gate, GateResult
from remediator.safety.guards import (
    ALWAYS_ON,
    GUARD_NAMES,
    GUARDS,
    Effect,
    Guard,
    GuardVerdict,
    PoolUsage,
    Quarantine,
    SafetyPolicy,
    SafetySnapshot,
    blocking,
    evaluate,
    shadow,
)
from remediator.safety.ledger import BreakerState, Ledger, LedgerStore, reservation_key
from remediator.safety.lock import Lease, LockHeld, LockLost, NodeLocks

__all__ = [
    "ALWAYS_ON", "GUARDS", "GUARD_NAMES", "Attempt", "AttemptLog", "BreakerState", "Effect", "Facts", "Gate",
    "GateResult", "Guard", "GuardVerdict", "Lease", "Ledger", "LedgerStore", "LockHeld", "LockLost", "NodeLocks",
    "PoolUsage", "Quarantine", "SafetyPolicy", "SafetySnapshot", "blocking", "evaluate",
    "reservation_key", "shadow",
]
