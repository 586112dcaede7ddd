"""How ``serve`` stops: a cancellation that a library swallows no longer hangs it, its NATS connect or a
timeout, and a second signal ends a stop that hangs.

On Python 3.11, ``asyncio.wait_for`` gives the inner result when that result arrives together with a cancel
(CPython gh-86296). nats-py connects under it, so a cancel that landed as a refused attempt came back was
taken for a connection error and retried for ever; ``connect_within``'s own ``wait_for`` then waited for
ever for the connect it had cancelled, and ``serve`` ignored its SIGINT (a CI run of
``test_a_second_signal_exits_at_once`` waited 30 s for "SIGINT: stopping").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from remediator import bus, eventloop


async def _swallows_one_cancel(ended: list[str]) -> str:
    """What nats-py's connect loop does under 3.11's ``wait_for``: the first cancel is taken for an error
    and the work goes on; only a second one ends it."""
    try:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed
            await asyncio.Event().wait()
        await asyncio.Event().wait()
        return "never"
    finally:
        ended.append("ended")


async def test_a_timeout_ends_an_awaitable_that_swallowed_its_cancel() -> None:
    ended: list[str] = []
    async with asyncio.timeout(10):  # asyncio.wait_for waited here for ever
        with pytest.raises(TimeoutError):
            await eventloop.wait_within(_swallows_one_cancel(ended), 0.05)
    assert ended == ["ended"]


async def test_cancelling_the_caller_ends_an_awaitable_that_swallowed_its_cancel() -> None:
    ended: list[str] = []
    caller = asyncio.ensure_future(eventloop.wait_within(_swallows_one_cancel(ended), 3600))
    await asyncio.sleep(0.01)
    caller.cancel()
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert ended == ["ended"]


async def test_cancel_firmly_keeps_cancelling_when_its_own_caller_is_cancelled() -> None:
    ended: list[str] = []
    inner = asyncio.ensure_future(_swallows_one_cancel(ended))
    await asyncio.sleep(0)
    outer = asyncio.ensure_future(eventloop.cancel_firmly(inner, every_s=0.05))
    await asyncio.sleep(0.01)
    outer.cancel()  # serve repeats its cancel: the cancelling goes on, and the cancel is raised at the end
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await outer
    assert ended == ["ended"] and inner.done()


async def test_wait_within_gives_the_result_and_the_error() -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    async def fails() -> None:
        await asyncio.sleep(0)
        raise OSError("refused")

    assert await eventloop.wait_within(ok(), 5) == 7
    with pytest.raises(OSError, match="refused"):
        await eventloop.wait_within(fails(), 5)


async def test_connect_within_ends_when_cancelled_as_a_refused_attempt_returns() -> None:
    """The real nats-py against a port nobody listens on, cancelled at many points around the moment its
    first attempt is refused (one or two milliseconds in, where the old code hung about one time in ten)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{s.getsockname()[1]}"
    for i in range(60):
        attempt = asyncio.ensure_future(bus.connect_within(url, 300, name="cancel-test", quiet=True))
        await asyncio.sleep(0.0002 * i)
        attempt.cancel()
        async with asyncio.timeout(10):
            with pytest.raises(asyncio.CancelledError):
                await attempt
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == [], leftover  # no connect left retrying behind a cancelled caller



def test_a_cli_bound_ends_a_command_that_swallowed_the_cancel_of_its_timeout() -> None:
    """``cli.edges.bounded`` (every CLI command that needs NATS or Kubernetes): with ``asyncio.wait_for`` a
    command whose wait swallowed the timeout's cancel went on past its bound, here for ever."""
    import threading

    from remediator.cli.edges import bounded
    from remediator.errors import SetupError

    ended: list[str] = []
    raised: list[BaseException] = []

    def body() -> None:
        try:
            bounded(_swallows_one_cancel(ended), 0.05, "the test command")
        except BaseException as e:  # the test's
            raised.append(e)

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the command went on past its bound"
    assert len(raised) == 1 and isinstance(raised[0], SetupError), raised
    assert "the test command did not finish within 0.05s" in str(raised[0]) and ended == ["ended"]

_SERVE_WITH_A_FAKE_SERVICE = """
import asyncio, contextlib, sys
import remediator.service
from remediator.cli import serve
from remediator.settings import Settings

class EmbeddedNats:
    def kill(self):
        print("embedded nats-server killed", file=sys.stderr, flush=True)

class Service:
    nats = EmbeddedNats()
    def __init__(self, settings): pass
    async def start(self):
        print("starting", flush=True)
        if sys.argv[1] == "swallows-a-cancel":
            with contextlib.suppress(asyncio.CancelledError):  # as a library under 3.11's wait_for may
                await asyncio.Event().wait()
        await asyncio.Event().wait()
    async def stop(self):
        if sys.argv[1] == "stop-hangs":
            print("stopping", flush=True)
            await asyncio.Event().wait()

remediator.service.Service = Service
asyncio.run(serve._serve(Settings(shutdown_timeout_s=60)))
"""


def _serve_with_a_fake_service(behaviour: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVE_WITH_A_FAKE_SERVICE, behaviour], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "REMEDIATOR_API_TOKENS": ""})
    assert proc.stdout is not None and proc.stdout.readline() == "starting\n"
    return proc


def test_serve_stops_on_a_signal_whose_first_cancel_was_swallowed() -> None:
    proc = _serve_with_a_fake_service("swallows-a-cancel")
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)  # the old serve waited for shutdown_timeout_s (60 s) here
    finally:
        proc.kill()
        proc.wait()
    print(f"\nserve stopped {time.monotonic() - t0:.1f}s after SIGINT although its first cancel was swallowed")
    assert proc.returncode == 0 and "remediator stopped" in err, err[-3000:]


def test_a_second_signal_ends_a_stop_that_hangs_and_kills_the_embedded_server() -> None:
    proc = _serve_with_a_fake_service("stop-hangs")
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None and proc.stdout.readline() == "stopping\n"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert "second SIGTERM; exiting now" in err and "embedded nats-server killed" in err, err[-3000:]


def test_a_handler_cancelled_as_the_consumers_stop_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    """faststream logs each handler cancelled at stop at ERROR with its traceback (a stopped storm printed
    194 of them); it is how stopping works, and its message comes back."""
    import logging

    from remediator import consumers

    try:
        raise asyncio.CancelledError("Cancelled via cancel scope 7f1c by <Task cancelling ...>")
    except asyncio.CancelledError as e:
        cancelled = e
    try:
        raise ValueError("a handler's bug")
    except ValueError as e:
        bug = e
    with caplog.at_level(logging.DEBUG, logger=consumers.log.name):
        consumers.log.log(logging.ERROR, "CancelledError: Cancelled via cancel scope", exc_info=cancelled)
        consumers.log.log(logging.ERROR, "ValueError: a handler's bug", exc_info=bug)
    stopped, failed = caplog.records
    assert (stopped.levelno, stopped.exc_info) == (logging.INFO, None)
    assert stopped.getMessage() == "a handler was cancelled as the consumers stopped; its message comes back"
    assert failed.levelno == logging.ERROR and failed.exc_info is not None  # a real error keeps its traceback

