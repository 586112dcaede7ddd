"""The pool index: what the budget guard reads of each node pool, kept up to date by the node cache.

Where it sits: inside the Kubernetes adapter, beside ``remediator.adapters.nodecache``. The node cache calls
``reset`` after each list and ``put``/``drop`` (under its lock) for each stored change: watch events and our
own writes; ``KubeAdapter.pool_view`` answers from ``view``. A view costs the pool's notable nodes
(cordoned, our taint, GPUs not allocatable: ``remediator.pools``), not its size, so a decision at
100,000 nodes no longer summarises and walks every node of its pool.

Per pool the index holds each GPU node's GPU count (``gpus_of``, replaced by a new dict whenever a node
joins, leaves or changes its count, so the dict a view holds never changes under it), their sum, and the
notable nodes' summaries. Imports no client library.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from remediator.pools import PoolView, is_notable

__all__ = ["PoolIndex"]

# What a notable node's summary keeps: what ``safety.gate.pool_usage`` reads.
_KEPT = ("name", "gpus", "gpus_allocatable", "unschedulable", "taints")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _kept(summary: Mapping[str, Any]) -> dict[str, Any]:
    return {k: summary.get(k) for k in _KEPT}


@dataclass
class _Tally:
    gpus_of: dict[str, int] = field(default_factory=dict)
    gpus: int = 0
    notable: dict[str, Mapping[str, Any]] = field(default_factory=dict)


class PoolIndex:
    """Per-pool counts, GPU counts and notable nodes of the GPU nodes the node cache holds."""

    def __init__(self, summarise: Callable[[Mapping[str, Any]], dict[str, Any]],
                 is_gpu_node: Callable[[Mapping[str, Any]], bool], taint_key: str) -> None:
        self._summarise = summarise
        self._is_gpu_node = is_gpu_node
        self.taint_key = taint_key
        self._lock = threading.Lock()
        self._pools: dict[str, _Tally] = {}
        self._pool_of: dict[str, str] = {}  # node name -> the pool it is counted in

    def reset(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Count ``objs`` (every node, as a list returned them) instead of what was held."""
        pools: dict[str, _Tally] = {}
        pool_of: dict[str, str] = {}
        for obj in objs:
            if not self._is_gpu_node(obj):
                continue
            s = self._summarise(obj)
            name, pool = str(s["name"]), str(s["pool"])
            tally = pools.setdefault(pool, _Tally())
            tally.gpus_of[name] = int(s.get("gpus") or 0)
            tally.gpus += tally.gpus_of[name]
            if is_notable(s, self.taint_key):
                tally.notable[name] = _kept(s)
            pool_of[name] = pool
        with self._lock:
            self._pools, self._pool_of = pools, pool_of

    def put(self, obj: Mapping[str, Any]) -> None:
        """Count ``obj`` (a node added or changed) in place of what was held of it."""
        name = _name(obj)
        if not name:
            return
        if not self._is_gpu_node(obj):
            self.drop(name)
            return
        s = self._summarise(obj)
        pool, gpus = str(s["pool"]), int(s.get("gpus") or 0)
        with self._lock:
            if self._pool_of.get(name, pool) != pool:
                self._forget(name)
            tally = self._pools.setdefault(pool, _Tally())
            held = tally.gpus_of.get(name)
            if held != gpus:  # a new dict: views taken before keep the one they hold
                tally.gpus_of = {**tally.gpus_of, name: gpus}
                tally.gpus += gpus - (held or 0)
            self._pool_of[name] = pool
            if is_notable(s, self.taint_key):
                tally.notable[name] = _kept(s)
            else:
                tally.notable.pop(name, None)

    def drop(self, name: str) -> None:
        """Stop counting the node ``name`` (deleted, or no longer a GPU node)."""
        with self._lock:
            self._forget(name)

    def _forget(self, name: str) -> None:
        pool = self._pool_of.pop(name, None)
        tally = self._pools.get(pool) if pool is not None else None
        if tally is None:
            return
        held = tally.gpus_of.get(name)
        if held is not None:
            tally.gpus_of = {k: v for k, v in tally.gpus_of.items() if k != name}
            tally.gpus -= held
        tally.notable.pop(name, None)

    def view(self, pool: str) -> PoolView:
        """The pool as it stands now (an empty pool when no node is in it)."""
        with self._lock:
            tally = self._pools.get(pool)
            if tally is None:
                return PoolView(pool, self.taint_key, 0, 0, MappingProxyType({}))
            return PoolView(pool, self.taint_key, len(tally.gpus_of), tally.gpus, MappingProxyType(tally.gpus_of),
                            tuple(tally.notable.values()))
