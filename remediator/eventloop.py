"""The event loop a long-running process of ours runs on: uvloop where it is installed (``uvicorn[standard]``,
a dependency, brings it), else asyncio's own.

Where it sits: under ``serve`` and under the benchmarks that measure what ``serve`` runs (``remediator bench
storm``, ``webhook``, ``dispatch``: their replicas included), so both run on the same loop: every consumer,
request and await of the service runs on it, and a benchmark on another loop measures another service
(ARCHITECTURE.md, "One loop for `serve` and its benchmarks"). ``NAME`` says which loop ``run`` makes;
``current`` which one runs now (the benchmarks print it).

``wait_within`` and ``cancel_firmly`` are the timeout and the cancellation every caller of a library that may
swallow a cancellation needs: on Python 3.11, ``asyncio.wait_for`` returns the inner result (or raises its
error) when that result arrives together with the cancellation (CPython gh-86296, fixed in 3.12). nats-py
runs its connect attempts under that ``wait_for``, so a cancel that lands as a refused attempt returns is
taken for a connection error and retried, and an outer ``wait_for`` that waits for the connect it cancelled
waits for ever: ``serve`` then ignored its SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

__all__ = ["NAME", "cancel_firmly", "current", "run", "wait_within"]

log = logging.getLogger(__name__)

T = TypeVar("T")

try:
    import uvloop
except ImportError:  # optional: asyncio's loop runs everything too, slower
    uvloop = None  # type: ignore[assignment]

NAME = "uvloop" if uvloop is not None else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop of the kind ``NAME`` says, as ``asyncio.run`` does."""
    if uvloop is None:
        return asyncio.run(main)
    return uvloop.run(main)


def current() -> str:
    """The kind of the running loop, ``uvloop`` or ``asyncio`` (the package its class comes from)."""
    return type(asyncio.get_running_loop()).__module__.split(".", 1)[0]


async def wait_within(aw: Awaitable[T], timeout_s: float) -> T:
    """What ``aw`` gives, as ``asyncio.wait_for(aw, timeout_s)``, except that neither a timeout nor a
    cancellation of the caller can hang on an ``aw`` that swallowed a cancel: both cancel it with
    ``cancel_firmly``. Raises ``TimeoutError`` after ``timeout_s``; a cancellation of the caller is re-raised
    once ``aw`` ended (or was given up on)."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        await cancel_firmly(task)
        raise
    if not done:
        await cancel_firmly(task)
        raise TimeoutError(f"not done within {timeout_s:g}s")
    return task.result()


async def cancel_firmly(task: asyncio.Future[Any], *, every_s: float = 0.1, give_up_s: float = 10.0) -> None:
    """Cancel ``task`` again every ``every_s`` until it ends, for at most ``give_up_s`` (then it is left,
    logged). A cancellation of the caller meanwhile does not stop the cancelling; it is re-raised at the end.
    What the task raised or returned is dropped: its caller gave up on it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    interrupted = False
    while not task.done():
        if loop.time() >= deadline:
            log.error("%r did not end within %gs of being cancelled; left running", task, give_up_s)
            break
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=every_s)
        except asyncio.CancelledError:
            interrupted = True
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: it is not "never retrieved" at exit
    if interrupted:
        raise asyncio.CancelledError
