"""Client-side rate limit: one token bucket shared by every Kubernetes API call of one adapter, in lanes.

Where it sits: under ``remediator.adapters.kube``. Every request the Kubernetes adapter sends (each retry
attempt included) takes one token first, so a storm of remediations cannot flood the API server; the
defaults (20 requests per second, bursts of 40) follow ``Settings.kube_qps`` and ``Settings.kube_burst``.

``LanedLimiter`` (what the adapter uses) hands the tokens of that one bucket out by lane, so the total rate
never exceeds the limit while the order of who waits changes:

* ``quarantine`` — the first protective action of a run (the one PATCH that taints and cordons a failing
  node): always served first, so time-to-cordon stays small however many drains are queued;
* ``read`` and ``bulk`` — node and pod reads, and everything else (drains, evictions, their polls,
  restarts, annotations, events): served in turn when both wait, so neither starves the other.

Which lane a request is in is a context variable (``lane("quarantine")``), set by the adapter method
that sends it and carried onto the worker thread by ``AsyncKube``; without one, a GET is a ``read`` and
anything else ``bulk``. ``queued()`` and ``taken()`` (per lane) are what ``/metrics`` shows.

It is thread-safe (the async port calls the adapter from its worker threads) and takes its clock and its
sleep as arguments, so tests move a fake clock instead of sleeping. ``close()`` (the adapter closing) makes
every waiting and later ``acquire`` raise ``LimiterClosed``, so no worker thread waits for a token past the
stop of its process.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from remediator.errors import TemporaryError

__all__ = ["LANES", "DeadlineExceeded", "LanedLimiter", "LimiterClosed", "current_lane", "deadline", "lane"]

LANES: Final = ("quarantine", "read", "bulk")
_LANE: contextvars.ContextVar[str | None] = contextvars.ContextVar("kube_lane", default=None)


@contextlib.contextmanager
def lane(name: str) -> Iterator[None]:
    """Send the requests of the block in lane ``name`` (one of ``LANES``); the innermost block wins."""
    if name not in LANES:
        raise ValueError(f"unknown lane {name!r}; lanes are {', '.join(LANES)}")
    token = _LANE.set(name)
    try:
        yield
    finally:
        _LANE.reset(token)


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("kube_deadline", default=None)


class DeadlineExceeded(TimeoutError):
    """A request's caller gave up (its step timed out) before the request got its token: it is not sent."""


class LimiterClosed(TemporaryError):
    """The limiter was closed (its adapter is stopping) before the request got its token: it is not sent."""


@contextlib.contextmanager
def deadline(at: float) -> Iterator[None]:
    """Requests of the block that are still waiting for a token at ``at`` (the limiter's clock, monotonic
    seconds) are not sent: ``acquire`` raises ``DeadlineExceeded``. The executor sets it to a step's timeout,
    so an adapter call the step stopped waiting for (``asyncio.wait_for`` cannot stop its thread) does not go
    on acting after the step was recorded as failed. The earliest enclosing deadline wins."""
    outer = _DEADLINE.get()
    token = _DEADLINE.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_lane(method: str) -> str:
    """The lane of a request with HTTP ``method`` here: the enclosing ``lane`` block's, else ``read`` for a
    GET and ``bulk`` for anything else."""
    return _LANE.get() or ("read" if method == "GET" else "bulk")


class _Bucket:
    """The token arithmetic: ``rate`` tokens per second, at most ``burst`` saved up, starting full."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self._rate = float(rate)
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = clock()

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> int:
        return int(self._burst)

    def _refill(self, now: float) -> None:
        # A clock that steps backwards (it should not: monotonic) never takes tokens away.
        elapsed = max(0.0, now - self._stamp)
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        self._stamp = max(self._stamp, now)


class _Ticket:
    """One waiting request; woken (alone) when it becomes the head of the queue."""

    __slots__ = ("cond",)

    def __init__(self, lock: threading.Lock) -> None:
        self.cond = threading.Condition(lock)


class LanedLimiter(_Bucket):
    """``rate`` tokens per second, at most ``burst`` saved up (starts full), handed out by lane: the head of
    ``quarantine`` first, then the heads of ``read`` and ``bulk`` in turn. Within a lane, first come first
    served. Only the head waits for the rate; the others sleep until they become the head (one wake-up per
    token, however many wait)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(rate, burst, clock=clock, sleep=sleep)
        self._queues: dict[str, deque[_Ticket]] = {name: deque() for name in LANES}
        self._taken: dict[str, int] = dict.fromkeys(LANES, 0)
        self._waited: dict[str, float] = dict.fromkeys(LANES, 0.0)
        self._last_shared = "bulk"  # which of read/bulk took the last token (they alternate when both wait)
        self._closed = threading.Event()

    def close(self) -> None:
        """Refuse every request from now on, those waiting for a token included (woken at once)."""
        with self._lock:
            self._closed.set()
            for queue in self._queues.values():
                for ticket in queue:
                    ticket.cond.notify()

    def _head(self) -> _Ticket | None:
        q = self._queues
        if q["quarantine"]:
            return q["quarantine"][0]
        read, bulk = q["read"], q["bulk"]
        if read and bulk:
            return bulk[0] if self._last_shared == "read" else read[0]
        if read:
            return read[0]
        return bulk[0] if bulk else None

    def _wake_head(self) -> None:
        head = self._head()
        if head is not None:
            head.cond.notify()

    def _take(self, lane_name: str, start: float) -> float:
        self._tokens -= 1.0
        self._taken[lane_name] += 1
        if lane_name != "quarantine":
            self._last_shared = lane_name
        waited = max(0.0, self._clock() - start)
        self._waited[lane_name] += waited
        return waited

    def acquire(self, lane_name: str = "bulk") -> float:
        """Take one token in lane ``lane_name``, waiting for this lane's turn and for the rate; returns the
        seconds waited. ``DeadlineExceeded`` when an enclosing ``deadline`` passes first."""
        if lane_name not in self._queues:
            raise ValueError(f"unknown lane {lane_name!r}; lanes are {', '.join(LANES)}")
        limit = _DEADLINE.get()
        with self._lock:
            if self._closed.is_set():
                raise LimiterClosed(f"the {lane_name} lane is closed: the Kubernetes adapter is stopping")
            start = self._clock()
            self._refill(start)
            if self._tokens >= 1.0 and self._head() is None:  # nobody waits and a token is there
                return self._take(lane_name, start)
            ticket = _Ticket(self._lock)
            queue = self._queues[lane_name]
            queue.append(ticket)
            try:
                while True:
                    if self._closed.is_set():
                        raise LimiterClosed(f"the {lane_name} lane closed while waiting: the Kubernetes adapter "
                                            "is stopping")
                    self._refill(self._clock())
                    if limit is not None and self._clock() >= limit:
                        raise DeadlineExceeded(f"gave up waiting for the {lane_name} lane: the caller's deadline "
                                               "passed")
                    if self._head() is ticket:
                        if self._tokens >= 1.0:
                            queue.popleft()
                            waited = self._take(lane_name, start)
                            self._wake_head()
                            return waited
                        delay = (1.0 - self._tokens) / self._rate
                        if limit is not None:
                            delay = max(0.0, min(delay, limit - self._clock()))
                        self._lock.release()  # the head sleeps for its token outside the lock
                        try:  # the real sleep ends early on close(); an injected one is the test's
                            if self._sleep is time.sleep:
                                self._closed.wait(delay)
                            else:
                                self._sleep(delay)
                        finally:
                            self._lock.acquire()
                        if self._head() is not ticket:  # a request of a lane served first queued meanwhile
                            self._wake_head()
                    else:
                        ticket.cond.wait(timeout=1.0)  # woken when it becomes the head
            except BaseException:
                with contextlib.suppress(ValueError):
                    queue.remove(ticket)
                self._wake_head()
                raise

    def queued(self) -> dict[str, int]:
        """Requests waiting now, per lane."""
        with self._lock:
            return {name: len(q) for name, q in self._queues.items()}

    def taken(self) -> dict[str, int]:
        """Tokens taken so far (requests sent), per lane."""
        with self._lock:
            return dict(self._taken)

    def waited(self) -> dict[str, float]:
        """Seconds requests spent waiting for their token so far, summed per lane."""
        with self._lock:
            return dict(self._waited)
