"""API fault injection for chaos drills: errors and latency on matching requests, and request counters.

Where it sits: consulted by the HTTP front (``kube_api``) before it serves each request
(``take_faults``), and fed by it after (``record_request``); drills and tests arm faults through the
facade (``ClusterState.inject_error``/``add_latency``) and read the counters back. It shares the store's
lock and wakes ``wait_for`` callers when a fault is hit or a request counted.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass

from chaos.sim.resources import ApiError


@dataclass
class InjectedFault:
    """A chaos rule: requests whose method and path match are delayed and/or answered with ``status``.

    ``remaining`` counts the requests it still applies to (``None``: until removed); ``hits`` counts those
    it applied to.
    """

    method: str
    path: re.Pattern[str]
    status: int | None = None
    latency_s: float = 0.0
    remaining: int | None = 1
    retry_after: int | None = None
    message: str = ""
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.method in ("*", method.upper())) and self.path.search(path) is not None

    def error(self) -> ApiError:
        assert self.status is not None
        msg = self.message or f"injected by the chaos simulator ({self.status})"
        return ApiError(self.status, msg, retry_after=self.retry_after)



class FaultInjector:
    """The armed faults and the request counters, under the store's lock."""

    def __init__(self, lock: threading.RLock, wakeup: threading.Condition) -> None:
        self._lock = lock
        self._wakeup = wakeup
        self._faults: list[InjectedFault] = []
        self._counts: Counter[str] = Counter()

    def inject_error(self, status: int, *, method: str = "*", path: str = ".*", count: int | None = 1,
                     retry_after: int | None = None, message: str = "") -> InjectedFault:
        """Answer the next ``count`` requests matching ``method`` (or ``*``) and the path regex with an
        error ``Status`` of ``status`` (e.g. 500, 503, 429), with a ``Retry-After`` header when given.

        ``path`` is searched (``re.search``) in the URL path without the query string.
        ``count=None`` keeps the fault until ``remove_fault``/``clear_faults``.
        """
        fault = InjectedFault(method.upper(), re.compile(path), status=status, remaining=count,
                              retry_after=retry_after, message=message)
        with self._lock:
            self._faults.append(fault)
        return fault

    def add_latency(self, seconds: float, *, method: str = "*", path: str = ".*",
                    count: int | None = None) -> InjectedFault:
        """Delay matching requests by ``seconds`` (all of them until removed, or the next ``count``)."""
        fault = InjectedFault(method.upper(), re.compile(path), latency_s=seconds, remaining=count)
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove_fault(self, fault: InjectedFault) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_faults(self, method: str, path: str) -> tuple[float, ApiError | None]:
        """For the server: the latency to add and the error to answer with, consuming matching faults."""
        with self._lock:
            latency = 0.0
            error: ApiError | None = None
            for f in self._faults:
                if not f.matches(method, path):
                    continue
                if f.status is None:
                    latency += f.latency_s
                elif error is None:
                    error = f.error()
                else:
                    continue
                f.hits += 1
                if f.remaining is not None:
                    f.remaining -= 1
                self._wakeup.notify_all()
            self._faults = [f for f in self._faults if f.remaining is None or f.remaining > 0]
            return latency, error

    def record_request(self, verb: str, resource: str) -> None:
        """Count one request served and wake ``wait_for`` callers (watchers are not woken)."""
        with self._lock:
            self._counts[f"{verb} {resource}"] += 1
            self._wakeup.notify_all()

    def request_counts(self) -> dict[str, int]:
        """Requests served, keyed ``"<verb> <resource>"``: ``"patch nodes"``, ``"create pods/eviction"``,
        ``"list pods"``, ``"get /version"`` (non-resource paths are counted by path)."""
        with self._lock:
            return dict(self._counts)

    def count(self, verb: str, resource: str) -> int:
        with self._lock:
            return self._counts.get(f"{verb} {resource}", 0)

    def reset_counters(self) -> None:
        with self._lock:
            self._counts.clear()
