"""Closing the Kubernetes adapter ends every wait of a call in flight: no worker thread outlives the stop.

A call retrying against an API server that is away held its worker thread for up to ``retry_budget_s``
(60 s) after ``close()``, and the interpreter waits for those threads at exit: ``bench storm`` whose
simulated cluster died took a minute to end, and a ``serve`` stopped with its API server away as long.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chaos.sim.cluster import seed_cluster
from chaos.sim.kube_api import KubeApiServer
from remediator.adapters.kube import AsyncKube, KubeAdapter, KubeTemporaryError
from remediator.adapters.ratelimit import LanedLimiter, LimiterClosed


def _in_thread(fn: object) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def body() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:  # what it ended with is the test's
            raised.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, raised


def _until(cond: object, what: str) -> None:
    """A synchronisation (bounded), not a timing assertion."""
    for _ in range(2000):
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise AssertionError(what)


def test_close_wakes_every_request_waiting_for_a_token() -> None:
    limiter = LanedLimiter(rate=0.01, burst=1)  # the next token in 100 s: every later request waits
    limiter.acquire("bulk")
    waiting = [_in_thread(lambda name=name: limiter.acquire(name)) for name in ("bulk", "read", "quarantine")]
    _until(lambda: sum(limiter.queued().values()) == 3, "the requests never queued")
    limiter.close()
    for t, raised in waiting:
        t.join(10)  # the head sleeps for its token (100 s), the others wait to become the head
        assert not t.is_alive() and len(raised) == 1 and isinstance(raised[0], LimiterClosed), raised
    assert limiter.queued() == {"quarantine": 0, "read": 0, "bulk": 0}
    with pytest.raises(LimiterClosed):
        limiter.acquire("read")


def _dead_api_server(tmp_path: Path) -> Path:
    """A kubeconfig whose API server has gone: every request is refused."""
    server = KubeApiServer(seed_cluster(nodes=1)).start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.stop()
    return kubeconfig


def test_a_call_retrying_a_dead_api_server_ends_when_the_adapter_is_closed(tmp_path: Path) -> None:
    adapter = KubeAdapter(str(_dead_api_server(tmp_path)), retry_budget_s=60.0)
    t, raised = _in_thread(lambda: adapter.get_node("gpu-node-0"))
    time.sleep(0.5)  # refused, backing off, refused again: well inside its 60 s budget
    assert t.is_alive()
    adapter.close()
    t.join(10)
    assert not t.is_alive(), "the call went on retrying after close()"
    assert len(raised) == 1 and isinstance(raised[0], KubeTemporaryError), raised
    assert "closed" in str(raised[0])


async def test_a_call_after_close_is_a_temporary_error_not_a_crash(tmp_path: Path) -> None:
    """The executor's runs still going as the benchmark closed the adapter once died on the thread pool's
    ``RuntimeError: cannot schedule new futures after shutdown``, a traceback per run."""
    kube = AsyncKube(KubeAdapter(str(_dead_api_server(tmp_path))))
    kube.close()
    with pytest.raises(KubeTemporaryError, match="closed"):
        await kube.get_node("gpu-node-0")
