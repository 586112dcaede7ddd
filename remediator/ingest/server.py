"""The HTTP server's connection limits: a request head must arrive within a bounded time.

Where it sits: under ``remediator.service``, which runs the ingest app under uvicorn with
``uvicorn_limits(settings)``. uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but puts
no limit on how long a client may take to send a request's head, so 2,000 slow clients could hold 2,000
connections for as long as they like. ``header_deadline_protocol`` wraps uvicorn's HTTP protocol: from the
moment a connection opens (and again after each response), the client has ``header_timeout_s`` to complete
a request head, else the connection is closed. The body's own deadline is the handler's
(``http_body_timeout_s``, answered 408 in ``remediator.ingest.app``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # uvicorn[standard] brings httptools, uvicorn's default ("auto") protocol when present
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Default
except ImportError:  # pragma: no cover - httptools is a dependency through uvicorn[standard]
    _Default = H11Protocol  # type: ignore[assignment,misc]

__all__ = ["header_deadline_protocol", "uvicorn_limits"]


def header_deadline_protocol(header_timeout_s: float, base: type[Any] = _Default) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` with a deadline of ``header_timeout_s`` for every request head."""

    class HeaderDeadline(base):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        _cycle_at_arm: object = None

        def _arm(self) -> None:
            self._disarm()
            self._cycle_at_arm = getattr(self, "cycle", None)
            self._deadline = asyncio.get_running_loop().call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if getattr(self, "cycle", None) is self._cycle_at_arm and not self.transport.is_closing():
                self.transport.close()  # no complete request head in time: a slow or idle client

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if getattr(self, "cycle", None) is not self._cycle_at_arm:
                self._disarm()  # a new request's head is complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # a keep-alive connection: the next head has the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def uvicorn_limits(header_timeout_s: float, keep_alive_s: float) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords of the limits: the head deadline and the keep-alive timeout."""
    return {"http": header_deadline_protocol(header_timeout_s), "timeout_keep_alive": keep_alive_s}
