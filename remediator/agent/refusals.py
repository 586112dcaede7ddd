"""The agent's refusal reports: every command the responder refuses reaches the audit trail, batched.

Where it sits: beside the command responder (``remediator.agent.commands``), whose refusals it is told of
(``CommandResponder.on_refused``), and on the agent's one connection (``publisher.BusLink``). It publishes a
signed ``CommandRefusalReport`` (``remediator.identity.reports``) on ``faults.agent.<node>`` — the only
subject the agent may publish, so reporting needs no right beyond the agent's own — which dispatch verifies
against the node's announced key and audits as ``command_refused`` records.

Batching bounds what a flood of forged commands costs: the first refusal is reported at once, later ones
are counted by reason (at most ``MAX_REASONS``; the last command of each kept) and sent at most once per
``interval_s``. While NATS is away the counts wait (nothing is spooled: a report is a summary, and the next
one carries everything counted meanwhile); a report is sent once per ``Nats-Msg-Id``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from remediator.agent.publisher import BusLink
from remediator.contracts import utcnow
from remediator.identity import reports
from remediator.identity.reports import RefusedCommands
from remediator.signing import Signer
from remediator.subjects import faults_subject

log = logging.getLogger(__name__)


class RefusalReporter:
    """Counts refused commands by reason and publishes them as signed reports (see the module docstring)."""

    def __init__(self, node: str, signer: Signer, *, interval_s: float = 10.0, publish_timeout_s: float = 5.0,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.node = node
        self.signer = signer
        self.interval_s = interval_s
        self.publish_timeout_s = publish_timeout_s
        self.clock = clock
        self._pending: dict[str, RefusedCommands] = {}
        self._since: datetime | None = None
        self._wake = asyncio.Event()
        self.reports_sent = 0
        self.publish_failures = 0

    def refused(self, reason: str, verb: str, command_id: str, detail: str) -> None:
        """Count one refused command (the responder's hook; never blocks, never raises)."""
        reason = reason[:64] or "unknown"
        if reason not in self._pending and len(self._pending) >= reports.MAX_REASONS:
            reason = "other"
        before = self._pending.get(reason)
        self._pending[reason] = RefusedCommands(count=min((before.count if before else 0) + 1, 2**31),
                                                last_verb=verb[:64], last_id=command_id[:512],
                                                last_detail=detail[:512])
        if self._since is None:
            self._since = self.clock()
        self._wake.set()

    @property
    def pending(self) -> int:
        return sum(r.count for r in self._pending.values())

    def _take(self) -> tuple[str, bytes, dict[str, RefusedCommands], datetime] | None:
        if not self._pending or self._since is None:
            return None
        taken, since = self._pending, self._since
        self._pending, self._since = {}, None
        until = self.clock()
        report_id = f"refusals|{self.node}|{since.timestamp():.6f}|{sum(r.count for r in taken.values())}"
        body = reports.build(self.signer, report_id=report_id, node=self.node, since=since, until=until,
                             refusals=taken)
        return report_id, body, taken, since

    def _put_back(self, taken: dict[str, RefusedCommands], since: datetime) -> None:
        for reason, r in taken.items():
            now = self._pending.get(reason)
            self._pending[reason] = r if now is None else now.model_copy(
                update={"count": min(now.count + r.count, 2**31)})
        self._since = min(since, self._since) if self._since else since

    async def flush(self, link: BusLink) -> bool:
        """Publish what is counted now; True when a report was acked by JetStream (or nothing was pending)."""
        if link.js is None or not link.connected:
            return not self._pending
        taken = self._take()
        if taken is None:
            return True
        report_id, body, refusals, since = taken
        try:
            await link.js.publish(faults_subject("agent", self.node), body, timeout=self.publish_timeout_s,
                                  headers={"Nats-Msg-Id": report_id, reports.REPORT_HEADER: reports.REFUSALS_KIND})
        except asyncio.CancelledError:
            self._put_back(refusals, since)
            raise
        except Exception as e:  # the bus is away or refused it: keep the counts for the next report
            self._put_back(refusals, since)
            self.publish_failures += 1
            log.warning("refusal report not published (%s); %d refusal(s) kept for the next one", e, self.pending)
            return False
        self.reports_sent += 1
        return True

    async def run(self, link: BusLink) -> None:
        """Report until cancelled: at once after the first refusal, then at most every ``interval_s``."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush(link):
                self._wake.set()  # not sent (NATS away): try again after the interval
            await asyncio.sleep(self.interval_s)
