"""Readiness: whether this replica can do its work now, condition by condition (DESIGN.md §5, ``/readyz``).

Where it sits: beside the service (``remediator.service`` builds one ``Readiness`` over the parts it
started) and under the ingest app, whose ``/readyz`` answers from ``Readiness.report``. A background task
(``Readiness.run``) probes every condition each ``interval_s``, each probe bounded by ``timeout_s``, so
``/readyz`` never waits on a dead dependency and answers from the last probe:

=============  =========================================================================================
condition      ready when
=============  =========================================================================================
``bus``        NATS is connected and JetStream answers for the FAULTS stream (``bus.bus_ready``)
``consumers``  the durable consumers ``dispatch`` and ``executor`` exist (a deleted one stops all
               remediation; ``remediator bus init`` re-creates it)
``kubernetes`` the Kubernetes API answers ``GET /version`` (``KubeAdapter.ping``)
=============  =========================================================================================

Each change of a condition is one log line (WARNING when it fails, INFO when it is back) and the gauge
``remediator_ready{condition=...}`` (``ServiceMetrics.set_ready``). The ``/readyz`` body names what is
wrong: ``{"ready": false, "conditions": {"kubernetes": {"ok": false, "detail": "..."}, ...}}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

__all__ = ["Condition", "Probe", "Readiness"]

# A probe returns None when its condition holds, else one line saying what is wrong; it may also raise.
Probe = Callable[[], Awaitable[str | None]]


@dataclass(frozen=True)
class Condition:
    """One condition as last probed."""

    name: str
    ok: bool
    detail: str


class Readiness:
    """The conditions of one replica, probed in the background; ``report`` is what ``/readyz`` answers."""

    def __init__(self, probes: Mapping[str, Probe], *, interval_s: float = 1.0, timeout_s: float = 3.0,
                 on_change: Callable[[Condition], None] | None = None) -> None:
        self._probes = dict(probes)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_change = on_change
        self._state: dict[str, Condition] = {
            name: Condition(name, False, "not probed yet") for name in self._probes}

    async def _probe(self, name: str, probe: Probe) -> Condition:
        try:
            detail = await asyncio.wait_for(probe(), self._timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            detail = f"no answer within {self._timeout_s:g}s"
        except Exception as e:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return Condition(name, detail is None, detail or "ok")

    async def check(self) -> None:
        """Probe every condition once (concurrently) and record the result."""
        results = await asyncio.gather(*(self._probe(n, p) for n, p in self._probes.items()))
        for cond in results:
            before = self._state.get(cond.name)
            self._state[cond.name] = cond
            if before is None or before.ok != cond.ok or (not cond.ok and before.detail != cond.detail):
                if cond.ok:
                    log.info("ready: %s is back (%s)", cond.name, cond.detail)
                else:
                    log.warning("not ready: %s: %s", cond.name, cond.detail)
                if self._on_change is not None:
                    self._on_change(cond)

    async def run(self) -> None:
        """``check`` every ``interval_s`` until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self._interval_s)

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self._state.values())

    def report(self) -> dict[str, object]:
        """``{"ready": bool, "conditions": {name: {"ok": bool, "detail": str}}}``."""
        return {"ready": self.ready,
                "conditions": {n: {"ok": c.ok, "detail": c.detail} for n, c in self._state.items()}}
