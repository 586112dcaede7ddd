"""A node pool as the budget guard reads it: counts, each node's GPUs, and the few nodes that are out.

Where it sits: a data contract below both of its users, the Kubernetes adapter and the budget guard
(``remediator.safety.gate.pool_usage``), which may not import each other. The adapter
keeps one ``PoolView`` per pool up to date from its node cache's watch (``remediator.adapters.pool_index``),
so a decision reads the pool in time proportional to the nodes that are out, not to the pool: at 100,000
nodes the guard no longer walks every node on every decision. ``PoolView.of`` builds one from node summaries
(the adapter's fallback while its cache is not synced, and tests).

A node is *notable* when the budget has something to count on it: cordoned, carrying our taint key, or with
fewer GPUs allocatable than it has. Every other node of the pool counts only in ``nodes`` and ``gpus``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["PoolView", "is_notable"]


def is_notable(summary: Mapping[str, Any], taint_key: str) -> bool:
    """Whether the budget counts something on this node: cordoned, our taint, or GPUs not allocatable."""
    if summary.get("unschedulable") or any(t.get("key") == taint_key for t in summary.get("taints") or []):
        return True
    allocatable = summary.get("gpus_allocatable")
    return allocatable is not None and int(allocatable) < int(summary.get("gpus") or 0)


@dataclass(frozen=True)
class PoolView:
    """One pool's GPU nodes: how many, their GPUs, each node's GPU count, and the notable nodes' summaries
    (``name``, ``gpus``, ``gpus_allocatable``, ``unschedulable``, ``taints``).

    ``gpus_of`` is never changed once a view holds it (the index replaces it when a node joins, leaves or
    changes its GPU count), so a view is a consistent snapshot without a copy of the whole pool.
    """

    pool: str
    taint_key: str
    nodes: int
    gpus: int
    gpus_of: Mapping[str, int]
    notable: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, pool: str, summaries: Iterable[Mapping[str, Any]], taint_key: str) -> PoolView:
        """The view of ``summaries`` (the pool's GPU nodes as the adapter summarises them)."""
        listed = list(summaries)
        gpus_of = {str(n["name"]): int(n.get("gpus") or 0) for n in listed}
        return cls(pool, taint_key, len(gpus_of), sum(gpus_of.values()), MappingProxyType(gpus_of),
                   tuple(n for n in listed if is_notable(n, taint_key)))
