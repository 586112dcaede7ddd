"""Failure at the edges: every command that needs NATS or Kubernetes fails within a bound, in one line.

Where it sits: under every CLI command. ``remediator.cli.main`` (the group) turns any exception a command
lets escape into one line on standard error, naming the problem and the flag or setting that fixes it
(``one_line``), and exit status 1; the traceback is printed only with the global ``--debug`` flag
(``REMEDIATOR_DEBUG=1``). Commands bound their waits with ``bounded`` (``startup_timeout_s``, default 30 s)
and connect with ``remediator.bus.connect_within``, so none hangs on a server that is away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from remediator import eventloop
from remediator.errors import SetupError
from remediator.settings import Settings

__all__ = ["bounded", "load_settings", "one_line"]

T = TypeVar("T")


def one_line(exc: BaseException) -> str:
    """What went wrong, in one line that names the fix where we know it."""
    if isinstance(exc, SetupError):
        return str(exc)
    import nats.errors
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    name = type(exc).__name__
    if isinstance(exc, NotFoundError):
        return (f"the bus lacks a stream, bucket or consumer this command needs ({exc}); run "
                "`remediator bus init --replicas N` against it")
    if isinstance(exc, ServiceUnavailableError):
        return "JetStream is not available on this NATS server (is it running with -js, and has a quorum?)"
    if isinstance(exc, nats.errors.NoServersError | nats.errors.ConnectionClosedError):
        return f"cannot reach NATS ({name}); check --nats URL / REMEDIATOR_NATS_URL and that the servers are up"
    if isinstance(exc, TimeoutError):
        return (f"timed out waiting for NATS or Kubernetes ({name}: {exc}); check that they are up "
                "(REMEDIATOR_STARTUP_TIMEOUT_S bounds the wait)").replace(": )", ")")
    if isinstance(exc, FileNotFoundError | PermissionError):
        return f"{exc.strerror or name}: {exc.filename}" if exc.filename else f"{name}: {exc}"
    text = " ".join(str(exc).split()) or name
    return f"{name}: {text[:500]} (run with --debug for the traceback)"


def bounded(coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
    """Run ``coro`` to completion on a fresh event loop, failing with ``SetupError`` after ``timeout_s``
    (``eventloop.wait_within``: a ``coro`` that swallowed the cancel of its timeout is cancelled again, where
    3.11's ``asyncio.wait_for`` waited for it)."""

    async def within() -> T:
        try:
            return await eventloop.wait_within(coro, timeout_s)
        except TimeoutError as e:
            raise SetupError(f"{what} did not finish within {timeout_s:g}s; check that NATS is up and "
                             "reachable (--nats URL / REMEDIATOR_NATS_URL; REMEDIATOR_STARTUP_TIMEOUT_S "
                             "bounds the wait)") from e

    return asyncio.run(within())


def load_settings(**overrides: Any) -> Settings:
    """``Settings`` from the environment and ``overrides``; an invalid value is a ``SetupError`` naming each
    variable and what is wrong with it, in one line (a startup error, never a traceback)."""
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = ".".join(str(p) for p in err.get("loc", ())) or "settings"
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            problems.append(f"REMEDIATOR_{field.upper()}: {msg}" if field != "settings" else msg)
        raise SetupError("invalid settings: " + "; ".join(problems)) from e
