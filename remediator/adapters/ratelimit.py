"""Client-side rate limit: a token bucket shared by every Kubernetes API call of one adapter.

Where it sits: under ``remediator.adapters.kube``. Every request the Kubernetes adapter sends (each retry
attempt included) takes one token first, so a storm of remediations cannot flood the API server; the
defaults (20 requests per second, bursts of 40) follow ``Settings.kube_qps`` and ``Settings.kube_burst``.

The bucket is thread-safe (the async port, ``AsyncKube``, calls the adapter from its worker threads) and
takes its clock and its sleep as arguments, so tests move a fake clock instead of sleeping. It works by
reservation, like Go's
``rate.Limiter``: taking a token may drive the balance below zero, and the caller then waits until the
debt is paid back. Waiting happens outside the lock, so callers queue fairly in reservation order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full."""

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

    def available(self) -> float:
        """Tokens that could be taken right now without waiting (negative while callers are queued)."""
        with self._lock:
            self._refill(self._clock())
            return self._tokens

    def reserve(self, tokens: int = 1) -> float:
        """Take ``tokens`` now and return how many seconds the caller must wait before using them.

        ``0.0`` means go ahead. A request for more than ``burst`` tokens can never be satisfied and raises
        ``ValueError``.
        """
        if tokens < 1:
            raise ValueError(f"tokens must be at least 1, got {tokens!r}")
        if tokens > self._burst:
            raise ValueError(f"cannot take {tokens} tokens from a bucket of burst {int(self._burst)}")
        with self._lock:
            self._refill(self._clock())
            self._tokens -= tokens
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self._rate

    def try_acquire(self, tokens: int = 1) -> bool:
        """Take ``tokens`` only if they are available now; never waits."""
        if tokens < 1:
            raise ValueError(f"tokens must be at least 1, got {tokens!r}")
        with self._lock:
            self._refill(self._clock())
            if self._tokens >= tokens:
                self._tokens -= tokens
                return True
            return False

    def acquire(self, tokens: int = 1) -> float:
        """Take ``tokens``, sleeping as long as the rate requires; returns the seconds slept."""
        delay = self.reserve(tokens)
        if delay > 0:
            self._sleep(delay)
        return delay
