"""The Kubernetes client's rate limit (one token bucket handed out in lanes), driven by a fake clock (no test
waits on the rate)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from remediator.adapters.ratelimit import DeadlineExceeded, LanedLimiter, current_lane, deadline, lane


class FakeClock:
    """A monotonic clock that only moves when told to; ``sleep`` advances it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_starts_full_and_allows_a_burst_without_waiting(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=20, burst=40, clock=clock, sleep=clock.sleep)
    assert [limiter.acquire("read") for _ in range(40)] == [0.0] * 40
    assert clock.slept == []


def test_beyond_the_burst_each_call_waits_one_interval(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=10, burst=2, clock=clock, sleep=clock.sleep)
    limiter.acquire()
    limiter.acquire()
    assert limiter.acquire() == pytest.approx(0.1)
    assert limiter.acquire() == pytest.approx(0.1)
    assert clock.slept == [pytest.approx(0.1)] * 2


def test_the_rate_holds_over_time(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=5, burst=1, clock=clock, sleep=clock.sleep)
    start = clock.now
    for _ in range(11):
        limiter.acquire()
    # One free token, then ten more at 5 per second: two seconds of fake time, no more.
    assert clock.now - start == pytest.approx(2.0)
    assert len(clock.slept) == 10 and all(s == pytest.approx(0.2) for s in clock.slept)


def test_refill_is_capped_at_burst(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=100, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        limiter.acquire()
    clock.advance(3600)  # an hour idle saves up three tokens, not 360,000
    assert [limiter.acquire() for _ in range(3)] == [0.0] * 3
    assert limiter.acquire() == pytest.approx(0.01)


def test_partial_refill(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=4, burst=4, clock=clock, sleep=clock.sleep)
    for _ in range(4):
        limiter.acquire()
    clock.advance(0.5)  # two tokens back
    assert [limiter.acquire(), limiter.acquire()] == [0.0, 0.0]
    assert limiter.acquire() == pytest.approx(0.25)


def test_a_clock_stepping_backwards_neither_adds_nor_removes_tokens(clock: FakeClock) -> None:
    limiter = LanedLimiter(rate=1, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        limiter.acquire()
    clock.advance(-100)
    clock.advance(100)  # back where it was: still nothing earned
    assert limiter.acquire() == pytest.approx(1.0)
    clock.advance(2)
    assert [limiter.acquire(), limiter.acquire()] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("rate", "burst"),
    [pytest.param(0, 1, id="zero-rate"), pytest.param(-1, 1, id="negative-rate"), pytest.param(1, 0, id="no-burst")],
)
def test_rejects_nonsense_configuration(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        LanedLimiter(rate=rate, burst=burst)


def test_concurrent_requests_get_each_token_once() -> None:
    """Many threads at once: the burst free, then one token per 1/rate, none handed out twice."""
    limiter = LanedLimiter(rate=2000, burst=5)  # real clock and sleep: 35 tokens beyond the burst, ~18 ms
    barrier = threading.Barrier(8)
    start = time.monotonic()

    def worker() -> None:
        barrier.wait()
        for _ in range(5):
            limiter.acquire("bulk")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert limiter.taken()["bulk"] == 40 and sum(limiter.queued().values()) == 0
    # 35 tokens beyond the burst cannot have come sooner than the rate allows
    assert time.monotonic() - start >= 35 / 2000 * 0.9


# --- the lanes of the adapter's limiter ----------------------------------------------------------------


class GatedClock(FakeClock):
    """A fake clock whose ``sleep`` blocks until the test lets one sleeper through (``step``), so the test
    decides when time moves while threads queue up."""

    def __init__(self) -> None:
        super().__init__()
        self._gate = threading.Semaphore(0)

    def sleep(self, seconds: float) -> None:
        assert self._gate.acquire(timeout=10), "the test never let this sleeper through"
        super().sleep(seconds)

    def step(self) -> None:
        self._gate.release()


def _until(cond: Callable[[], bool]) -> None:
    """Wait (bounded) for other threads to reach a state; a synchronisation, not a timing assertion."""
    for _ in range(1000):
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError("the threads never got there")


def _run_in_lanes(limiter: LanedLimiter, clock: GatedClock, lanes: list[str]) -> list[str]:
    """Queue one acquire per entry of ``lanes`` (in that order, each waiting behind the bucket), then let time
    move one sleeper at a time; returns the lanes in the order their tokens were handed out."""
    done: list[str] = []
    lock = threading.Lock()

    def take(name: str) -> None:
        limiter.acquire(name)
        with lock:
            done.append(name)

    threads = []
    for i, name in enumerate(lanes):
        t = threading.Thread(target=take, args=(name,))
        t.start()
        threads.append(t)
        _until(lambda i=i: sum(limiter.queued().values()) == i + 1)
    while any(t.is_alive() for t in threads):
        clock.step()
        _until(lambda: len(done) + sum(limiter.queued().values()) == len(lanes))
        time.sleep(0.01)
    for t in threads:
        t.join(timeout=10)
    return done


def test_the_quarantine_lane_is_served_before_every_queued_drain() -> None:
    clock = GatedClock()
    limiter = LanedLimiter(rate=10, burst=1, clock=clock, sleep=clock.sleep)
    limiter.acquire("bulk")  # the burst is spent: every later request waits for the rate
    order = _run_in_lanes(limiter, clock, ["bulk"] * 5 + ["quarantine"])
    assert order[0] == "quarantine"
    assert order[1:] == ["bulk"] * 5
    assert limiter.taken() == {"quarantine": 1, "read": 0, "bulk": 6}
    assert limiter.queued() == {"quarantine": 0, "read": 0, "bulk": 0}


def test_reads_and_drains_take_turns_so_neither_starves() -> None:
    clock = GatedClock()
    limiter = LanedLimiter(rate=10, burst=1, clock=clock, sleep=clock.sleep)
    limiter.acquire("bulk")
    order = _run_in_lanes(limiter, clock, ["bulk"] * 4 + ["read"] * 4)
    assert order == ["read", "bulk"] * 4


def test_the_lanes_share_one_rate() -> None:
    clock = FakeClock()
    limiter = LanedLimiter(rate=5, burst=1, clock=clock, sleep=clock.sleep)
    start = clock.now
    for name in ["quarantine", "read", "bulk"] * 4:
        limiter.acquire(name)
    # one free token, then eleven more at 5 per second, whatever their lanes
    assert clock.now - start == pytest.approx(11 / 5)
    assert limiter.taken() == {"quarantine": 4, "read": 4, "bulk": 4}


def test_lane_context_and_the_default_lane_of_a_method() -> None:
    assert current_lane("GET") == "read"
    assert current_lane("PATCH") == "bulk"
    with lane("quarantine"):
        assert current_lane("GET") == "quarantine"
        assert current_lane("PATCH") == "quarantine"
    assert current_lane("GET") == "read"
    with pytest.raises(ValueError), lane("fast"):
        pass
    with pytest.raises(ValueError):
        LanedLimiter(rate=1, burst=1).acquire("fast")


def test_a_request_whose_deadline_passes_while_it_waits_is_never_sent() -> None:
    clock = FakeClock()
    limiter = LanedLimiter(rate=10, burst=1, clock=clock, sleep=clock.sleep)
    limiter.acquire("bulk")  # the burst is spent: the next token is 0.1 s away
    with deadline(clock.now + 0.05), pytest.raises(DeadlineExceeded):
        limiter.acquire("bulk")
    assert clock.slept == [pytest.approx(0.05)]  # it slept only up to its deadline
    assert limiter.queued() == {"quarantine": 0, "read": 0, "bulk": 0}
    assert limiter.taken()["bulk"] == 1
    with deadline(clock.now + 10):  # a deadline far enough away changes nothing
        limiter.acquire("bulk")
    assert limiter.taken()["bulk"] == 2
