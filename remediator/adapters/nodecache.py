"""The node cache: every Node of the cluster in memory, kept by one list-then-watch (client-go's informer).

Where it sits: inside the Kubernetes adapter (``remediator.adapters.kube``), which owns the requests; this
module owns the loop and the store, and imports no client library. Once started (``AsyncKube.start``: the
service and the benchmarks do), the adapter answers ``get_node``/``find_node``/``list_gpu_nodes``/
``pool_view`` — what the guards, the override checks, the budget and the escalation read — from here instead
of the API server. An ``index`` (``NodeIndex``: the adapter's ``pool_index``) is kept with the store: reset
after every list and told of every object stored or dropped. Mutations still read and write with optimistic
concurrency: the first attempt patches on the cached ``resourceVersion``; a 409 (the cache was behind)
re-reads the node from the API server. The object a successful write returns is stored at once (client-go's
mutation cache), so the next read sees our own write before its watch
event arrives.

The loop, as client-go's reflector runs it:

1. **list** every node (paginated; the list's ``resourceVersion`` is one snapshot) and replace the store;
2. **watch** from that ``resourceVersion`` (``timeoutSeconds`` bounded): ``ADDED``/``MODIFIED`` store the
   object when its ``resourceVersion`` is newer than the one held, ``DELETED`` drops it, ``BOOKMARK`` only
   moves the resourceVersion; a watch that ends normally is re-opened from the last resourceVersion seen;
3. an ``ERROR`` event (``410 Gone``: the resourceVersion fell out of the server's watch window) or a broken
   stream means **list again** (after a short, growing pause when the server keeps failing);
4. a full **resync** (list again) every ``resync_s`` whatever happened, so a missed event cannot live on.

**Changes** are numbered (``generation``): every node stored or dropped, and every list (after which any node
may have changed), moves it on. ``wait_changed`` blocks until a change after a given generation touches one
of a set of names, so a reader that cares about a few nodes (the reconciler: the ones its ledger names)
wakes for those alone, however busy the rest of the cluster is, and sends no request of its own. The last
``CHANGE_LOG`` changes are kept by name; a wait whose generation is older than that is answered at once,
as if its nodes had changed (the reader re-reads them: never a change missed).

``synced`` is true from the first successful list until the loop stops or fails for longer than
``stale_after_s``; while it is false the adapter reads the API server as before, so a cache that cannot
keep up never serves stale data for long. A node the cache does not hold is read from the API server too
(it may be seconds old).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["CHANGE_LOG", "Lister", "NodeCache", "NodeIndex", "Transform", "Watcher", "newer"]

Transform = Callable[[Mapping[str, Any]], dict[str, Any]]
# Every node, each passed through the transform as it arrives (a page at a time: a large cluster's raw list is
# never held whole), and the list's resourceVersion.
Lister = Callable[[Transform], tuple[list[dict[str, Any]], str]]
Watcher = Callable[[str, float], Iterator[dict[str, Any]]]
CHANGE_LOG = 4096  # the changes kept by name for ``wait_changed``; older waits are answered at once


class NodeIndex(Protocol):
    """What is derived from the stored nodes and kept with them (``remediator.adapters.pool_index``): told of
    every list (``reset``) and of every object stored or dropped after it."""

    def reset(self, objs: Iterable[Mapping[str, Any]]) -> None: ...

    def put(self, obj: Mapping[str, Any]) -> None: ...

    def drop(self, name: str) -> None: ...


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def newer(candidate: str, held: str) -> bool:
    """Whether resourceVersion ``candidate`` is newer than ``held``. Kubernetes calls them opaque; every API
    server in use (etcd revisions) and the simulator issue increasing integers, which client-go's mutation
    cache compares the same way. Unparseable ones count as newer (the latest arrival wins)."""
    if not held:
        return True
    try:
        return int(candidate) > int(held)
    except ValueError:
        return candidate != held


class NodeCache:
    """The store and the list-then-watch loop (a daemon thread, ``start``/``stop``)."""

    def __init__(self, lister: Lister, watcher: Watcher, *, resync_s: float = 300.0, watch_timeout_s: float = 60.0,
                 stale_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 transform: Transform = dict, index: NodeIndex | None = None) -> None:
        self._list = lister
        self.index = index  # kept with the store: reset after each list, told of each change
        self._transform = transform  # what is stored of each object (client-go's SetTransform); a copy
        self._watch = watcher
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified under the store's lock at each change
        self._generation = 0
        self._recent: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)  # (generation, name), oldest first
        self._forgotten = 0  # the generation of the newest change dropped from ``_recent``, or of the last list
        self._nodes: dict[str, dict[str, Any]] = {}
        self._rv = ""
        self._listed_at: float | None = None
        self._failing_since: float | None = None
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0  # how many times it listed (the first, resyncs, relists after 410 or errors)
        self.events = 0  # watch events applied

    # --- reading ---------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True while the store can answer: listed at least once, and not failing for ``stale_after_s``."""
        if not self._synced.is_set():
            return False
        failing = self._failing_since
        return failing is None or self._clock() - failing < self.stale_after_s

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the first list filled the store (or ``timeout_s`` passed); returns ``synced``."""
        self._synced.wait(timeout_s)
        return self.synced

    def get(self, name: str) -> dict[str, Any] | None:
        """The node as last seen (the stored object itself: callers must not change it), None when absent."""
        with self._lock:
            return self._nodes.get(name)

    def nodes(self) -> list[dict[str, Any]]:
        """Every node as last seen (the stored objects: callers must not change them)."""
        with self._lock:
            return list(self._nodes.values())

    @property
    def resource_version(self) -> str:
        return self._rv

    @property
    def generation(self) -> int:
        """How many changes the store has seen (see "Changes" above): the token ``wait_changed`` takes."""
        return self._generation

    def names(self) -> frozenset[str]:
        """The names of every node held."""
        with self._lock:
            return frozenset(self._nodes)

    def wait_changed(self, after: int, names: Collection[str] | None, timeout_s: float) -> int:
        """Block until a change after generation ``after`` touches one of ``names`` (any node: ``None``), or
        ``timeout_s`` passes; returns the generation to wait from next. A list after ``after``, or changes
        too old to be told apart (``CHANGE_LOG``), count as a change to every node."""
        wanted = None if names is None else frozenset(names)
        deadline = time.monotonic() + timeout_s  # a real wait, whatever clock judges staleness
        seen = after
        with self._changed:
            while True:
                if self._forgotten > seen or self._generation < after:  # (a lower one: not this store's token)
                    return self._generation
                for gen, name in reversed(self._recent):
                    if gen <= seen:
                        break
                    if wanted is None or name in wanted:
                        return self._generation
                seen = self._generation
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return seen
                self._changed.wait(min(left, 1.0))

    def _note_change(self, name: str) -> None:
        """Number a change to ``name`` and wake the waiters (the caller holds the store's lock)."""
        self._generation += 1
        if len(self._recent) == self._recent.maxlen:
            self._forgotten = self._recent[0][0]
        self._recent.append((self._generation, name))
        self._changed.notify_all()

    def observe(self, obj: Mapping[str, Any]) -> None:
        """Store ``obj`` (what a write of ours returned) when it is newer than what the cache holds."""
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        with self._lock:
            held = self._nodes.get(str(name))
            if held is None or newer(_rv(obj), _rv(held)):
                stored = self._nodes[str(name)] = self._transform(obj)
                if self.index is not None:
                    self.index.put(stored)
                self._note_change(str(name))

    # --- the loop --------------------------------------------------------------------------------------

    def start(self) -> NodeCache:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kube-node-cache", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (an open watch ends at its timeout at the latest; the thread is a daemon)."""
        self._stop.set()
        self._synced.clear()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _relist(self) -> None:
        items, rv = self._list(self._transform)
        fresh = {str(o["metadata"]["name"]): o for o in items if (o.get("metadata") or {}).get("name")}
        if self.index is not None:  # like the store, it may miss a write of ours made meanwhile: the watch has it
            self.index.reset(fresh.values())
        with self._lock:
            self._nodes = fresh
            self._rv = rv
            self._generation += 1
            self._forgotten = self._generation  # any node may have changed: every wait from before wakes
            self._changed.notify_all()
        self.lists += 1
        self._listed_at = self._clock()
        self._failing_since = None
        self._synced.set()

    def _apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; False when the watch must be given up (an ERROR event: list again)."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            log.info("node watch ended by the API server (%s); listing again",
                     (obj.get("message") or obj.get("reason") or obj) if isinstance(obj, dict) else obj)
            return False
        rv = _rv(obj)
        name = str((obj.get("metadata") or {}).get("name") or "")
        with self._lock:
            if kind == "BOOKMARK":
                pass
            elif kind == "DELETED":
                if self._nodes.pop(name, None) is not None:
                    self._note_change(name)
                if self.index is not None:
                    self.index.drop(name)
            elif kind in ("ADDED", "MODIFIED") and name:
                held = self._nodes.get(name)
                if held is None or newer(rv, _rv(held)):
                    stored = self._nodes[name] = self._transform(obj)
                    if self.index is not None:
                        self.index.put(stored)
                    self._note_change(name)
            else:
                return False
            if rv:
                self._rv = rv
        self.events += 1
        return True

    def _run(self) -> None:
        pause = 0.5
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or (self._listed_at is not None and self._clock() - self._listed_at >= self.resync_s):
                    self._relist()
                    need_list = False
                need_list = not self._watch_once()
                pause = 0.5
            except Exception as e:  # the API server away or refusing: reads fall back to it until we recover
                if self._failing_since is None:
                    self._failing_since = self._clock()
                    log.warning("node cache: %s: %s; reading nodes from the API server until it recovers",
                                type(e).__name__, str(e)[:300])
                need_list = True
                self._stop.wait(pause)
                pause = min(pause * 2, 10.0)

    def _watch_once(self) -> bool:
        """One watch from the held resourceVersion, until it ends; False when it must be followed by a list."""
        left = self.resync_s - (self._clock() - (self._listed_at or self._clock()))
        timeout = max(1.0, min(self.watch_timeout_s, left))
        for event in self._watch(self._rv, timeout):
            if self._stop.is_set():
                return True
            if not self._apply(event):
                return False
        return True
