"""The event loop a long-running process of ours runs on: uvloop where it is installed (``uvicorn[standard]``,
a dependency, brings it), else asyncio's own.

Where it sits: under ``serve`` and under the benchmarks that measure what ``serve`` runs (``remediator bench
storm``, ``webhook``, ``dispatch``: their replicas included), so both run on the same loop: every consumer,
request and await of the service runs on it, and a benchmark on another loop measures another service
(ARCHITECTURE.md, "One loop for `serve` and its benchmarks"). ``NAME`` says which loop ``run`` makes;
``current`` which one runs now (the benchmarks print it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["NAME", "current", "run"]

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
