"""``/metrics`` shows the Kubernetes client rate limiter per lane (read when rendered)."""

from __future__ import annotations

from remediator.adapters.ratelimit import LanedLimiter
from remediator.metrics import ServiceMetrics


def test_the_limiters_queue_requests_and_waiting_per_lane_are_rendered() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    limiter = LanedLimiter(rate=10, burst=1, clock=lambda: now[0], sleep=sleep)
    for lane in ("quarantine", "read", "bulk", "bulk"):
        limiter.acquire(lane)
    m = ServiceMetrics()
    assert b"remediator_kube_requests" not in m.render()  # no limiter watched: no series
    m.watch_limiter(limiter)
    text = m.render().decode()
    assert "# TYPE remediator_kube_requests_queued gauge" in text
    for lane in ("quarantine", "read", "bulk"):
        assert f'remediator_kube_requests_queued{{lane="{lane}"}} 0' in text
    assert 'remediator_kube_requests_total{lane="bulk"} 2' in text
    assert 'remediator_kube_requests_total{lane="quarantine"} 1' in text
    # three requests beyond the burst of one waited 0.1 s each
    waited = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("remediator_kube_request_wait_seconds_total{")}
    assert round(sum(waited.values()), 6) == 0.3
