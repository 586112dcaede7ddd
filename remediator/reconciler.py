"""The reconciler: settles what the ledger and the histories hold against what the cluster shows.

Where it sits: beside the executor, in ``serve`` (``remediator.service`` runs one per replica). The executor
ends every run itself (reservation released, target handed over, incident closed); the reconciler settles
what only the cluster can tell, and what a run that died never settled:

* a **handover** (a run ended leaving our taint, cordon or GPU isolation on its target, for a person) is
  settled when the node is repaired (a ``node`` handover: our taint gone, the node schedulable and Ready; a
  ``gpu`` handover: that, and every GPU allocatable again) or deleted;
* a **reservation** is released when its node was deleted, or its run is finished or was never recorded
  (a replica died between the guards and the finish);
* an **open incident** in a node's history is closed when the node was deleted (periodic resync only).

``plan`` is pure: from the ledger, the runs and the nodes it returns the ``Settlement``s. ``Reconciler.run``
drives it from node changes through the Kubernetes port (``wait_node_change``: the first change after a
token to one of the nodes the ledger named at the last pass; then a fresh read of those nodes) plus a full
resync every ``reconcile_resync_s``. With the adapter's node cache synced (``serve``) the wait is on the
cache and sends no request, and changes to other nodes (a large cluster's status updates, hundreds a
second) wake nothing; without it each wait is one watch request, woken by any node. A handover recorded
after a pass read the ledger is seen at the next pass, at the latest ``reconcile_watch_s`` later.

Each settlement is a compare-and-set removal that is a no-op when already done, and is audited only by the
replica whose removal changed the ledger, so two replicas reconciling at once are harmless: no lock is
needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue

from handlers.base import History
from remediator.audit import AuditLog
from remediator.contracts import utcnow
from remediator.run import RunLog, RunRecord
from remediator.safety.ledger import Ledger, LedgerStore
from remediator.state import StateStore

log = logging.getLogger(__name__)

__all__ = ["NodeSource", "Reconciler", "Settlement", "node_repaired", "plan"]

Subject = Literal["reservation", "handover", "incident"]


class NodeSource(Protocol):
    """What the reconciler reads of Kubernetes (``AsyncKube``)."""

    async def find_node(self, name: str) -> dict[str, Any] | None: ...

    async def node_names(self) -> frozenset[str]: ...

    async def wait_node_change(self, resource_version: str | None, timeout_s: float,
                               names: Collection[str] | None = ...) -> str | None: ...


@dataclass(frozen=True)
class Settlement:
    """One thing to settle: ``subject`` (reservation, handover, incident) under ``key`` (the ledger key, or
    the history key and incident group), for ``incident`` on ``node``, and why."""

    subject: Subject
    key: str
    incident: str
    node: str
    reason: str
    entry: Mapping[str, Any]


def node_repaired(node: Mapping[str, Any], taint_key: str, *, gpus_too: bool,
                  withdrawn_key: str | None = None) -> str:
    """Why ``node`` (a node summary) counts as back in service, or "" when it does not: our taint gone, the
    node schedulable and Ready, and (``gpus_too``) every GPU allocatable and our GPU-withdrawn taint
    (``withdrawn_key``, the device-plugin fallback) gone too: a GPU handover is settled only once nothing of
    ours keeps new pods off the node."""
    ours = {taint_key, withdrawn_key} if gpus_too and withdrawn_key else {taint_key}
    if any(t.get("key") in ours for t in node.get("taints") or []):
        return ""
    if node.get("unschedulable") or not node.get("ready"):
        return ""
    if gpus_too and int(node.get("gpus_allocatable") or 0) < int(node.get("gpus") or 0):
        return ""
    return ("every GPU allocatable, " if gpus_too else "") + "our taint gone, schedulable and Ready"


def plan(ledger: Ledger, runs: Mapping[str, RunRecord | None], nodes: Mapping[str, Mapping[str, Any] | None],
         taint_key: str, withdrawn_key: str | None = None) -> list[Settlement]:
    """The settlements the ledger calls for, given each reservation's run (by incident; None: no record)
    and the nodes it names (None: deleted; absent: not read, nothing is decided about it). Pure."""
    out: list[Settlement] = []
    for key, h in sorted(ledger.handovers.items()):
        name = str(h.get("node"))
        if name not in nodes:
            continue
        node = nodes[name]
        if node is None:
            out.append(Settlement("handover", key, str(h.get("incident")), name, f"node {name} was deleted", h))
            continue
        why = node_repaired(node, taint_key, gpus_too=h.get("kind") == "gpu", withdrawn_key=withdrawn_key)
        if why:
            out.append(Settlement("handover", key, str(h.get("incident")), name, f"{name} repaired: {why}", h))
    for key, r in sorted(ledger.reservations.items()):
        name, incident = str(r.get("node")), str(r.get("incident"))
        if nodes.get(name, {}) is None:
            out.append(Settlement("reservation", key, incident, name, f"node {name} was deleted", r))
            continue
        if incident not in runs:
            continue
        run = runs[incident]
        if run is None:
            out.append(Settlement("reservation", key, incident, name, f"run {incident} was never recorded", r))
        elif run.finished:
            out.append(Settlement("reservation", key, incident, name,
                                  f"run {incident} ended ({run.outcome}) without releasing it", r))
    return out


class Reconciler:
    """Settles the ledger and the histories against the cluster; ``reconcile`` once, ``run`` until stopped."""

    def __init__(self, state_kv: KeyValue, kube: NodeSource, audit: AuditLog, *, taint_key: str,
                 withdrawn_key: str | None = None, resync_s: float = 30.0, watch_timeout_s: float = 30.0,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self._kv = state_kv
        self.ledger = LedgerStore(state_kv)
        self.runs = RunLog(state_kv)
        self.state = StateStore(state_kv)
        self.kube = kube
        self.audit = audit
        self.taint_key = taint_key
        self.withdrawn_key = withdrawn_key
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.clock = clock
        self.settled: list[Settlement] = []
        self.passes = 0  # how many times ``reconcile`` ran
        self.watched: frozenset[str] = frozenset()  # the nodes the ledger named at the last pass

    async def _nodes(self, names: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        return {n: await self.kube.find_node(n) for n in sorted(set(names))}

    async def reconcile(self, *, incidents: bool = False) -> list[Settlement]:
        """One pass: read the ledger, the runs of its reservations and the nodes it names, settle what
        ``plan`` says (each audited once); with ``incidents``, also close the open incidents of deleted
        nodes. Returns what this replica settled."""
        self.passes += 1
        ledger = await self.ledger.read()
        names = [str(e.get("node")) for e in (*ledger.handovers.values(), *ledger.reservations.values())]
        self.watched = frozenset(names)
        nodes = await self._nodes(names)
        runs = {str(r.get("incident")): (await self.runs.get(str(r.get("incident"))))[0]
                for r in ledger.reservations.values()}
        done: list[Settlement] = []
        for s in plan(ledger, runs, nodes, self.taint_key, self.withdrawn_key):
            if await self._settle(s):
                done.append(s)
        if incidents:
            done += await self._orphaned_incidents()
        self.settled += done
        return done

    async def _settle(self, s: Settlement) -> bool:
        if s.subject == "handover":
            gone = await self.ledger.settle_handover(s.key, s.incident)
        else:
            gone = await self.ledger.release(s.key, s.incident)
        if gone is None:  # another replica (or the run itself) settled it first
            return False
        after = {"subject": s.subject, "key": s.key, "by": "reconciler", "entry": dict(gone)}
        gpu = gone.get("gpu")
        await self.audit.append(s.node, "settled", f"{s.subject} {s.key} of {s.incident}: {s.reason}",
                                incident=s.incident, gpu=str(gpu) if gpu else None, after=after)
        log.info("settled %s %s of %s: %s", s.subject, s.key, s.incident, s.reason)
        return True

    async def _orphaned_incidents(self) -> list[Settlement]:
        """Close the open incidents of nodes that no longer exist (their histories under ``node.*``)."""
        try:  # every key, filtered here: nats.py's subject filters find nothing on some servers
            keys = [k for k in await self._kv.keys() if k.startswith("node.")]
        except NoKeysError:
            return []
        present = await self.kube.node_names()
        done: list[Settlement] = []
        for key in keys:
            name = key.split(".", 1)[1].replace("_", ".")
            if name in present:
                continue
            history, _ = await self.state.get(key)
            if not history.incidents or await self.kube.find_node(name) is not None:
                continue
            for inc in history.incidents:
                closed = await self.state.update(key, _closing(inc.group))
                if not closed:
                    continue
                s = Settlement("incident", f"{key}|{inc.group}", inc.incident_id, name,
                               f"node {name} was deleted", inc.to_json())
                await self.audit.append(name, "settled", f"incident {inc.incident_id}: {s.reason}",
                                        incident=inc.incident_id,
                                        after={"subject": "incident", "key": s.key, "by": "reconciler",
                                               "entry": inc.to_json()})
                done.append(s)
        return done

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile at start, after every change to a node the last pass watched, and every ``resync_s``
        (with the open incidents then), until ``stop`` is set. The token to wait from is taken before the
        pass reads the nodes, so a change made during a pass wakes the next one. Errors (the bus,
        Kubernetes) are logged and retried on the next turn; they never end the loop."""
        loop = asyncio.get_running_loop()
        rv: str | None = None
        next_resync = 0.0
        while not stop.is_set():
            try:
                if rv is None:
                    rv = await self.kube.wait_node_change(None, self.watch_timeout_s)
                full = loop.time() >= next_resync
                await self.reconcile(incidents=full)
                if full:
                    next_resync = loop.time() + self.resync_s
                wait = max(1.0, min(self.watch_timeout_s, next_resync - loop.time()))
                if rv is None:  # no watch to be had: poll at the resync interval
                    await _sleep_or_stop(stop, wait)
                    continue
                watch = asyncio.ensure_future(self.kube.wait_node_change(rv, wait, self.watched))
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if not watch.done():
                    watch.cancel()
                    return
                rv = watch.result()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("reconciling failed (retrying): %s", e)
                rv = None
                await _sleep_or_stop(stop, min(self.resync_s, 5.0))


def _closing(group: str) -> Callable[[History], tuple[History, bool]]:
    """The history update that closes ``group``'s incident, saying whether it was open."""
    def close(h: History) -> tuple[History, bool]:
        return h.without_incident(group), h.open_incident(group) is not None
    return close


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
