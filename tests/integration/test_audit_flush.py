"""``AuditLog.flush`` (the service calls it at stop, within its shutdown bound) anchors every chain head written
since its last checkpoint, several chains at a time, against a real nats-server: a replica that wrote to
thousands of chains within one checkpoint interval has thousands of checkpoints to write at stop
(ARCHITECTURE.md, "Checkpoints at fleet scale")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from remediator import bus
from remediator.audit import AuditLog, iter_checkpoints
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.signing import Signer, generate_seed

pytestmark = pytest.mark.timeout(120)

CHAINS = 120


async def test_flush_anchors_every_chain_with_several_checkpoints_in_flight(nats_server: EmbeddedNats) -> None:
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, Settings(nats_url=nats_server.url))
        log = AuditLog(js, "replica-a", signer=Signer(generate_seed()), checkpoint_every=100,
                       checkpoint_interval_s=600)  # nothing due before the flush
        for i in range(CHAINS):
            await log.append(f"gpu-node-{i}", "event_ignored", "informational")
        assert log.checkpoints_written == 0

        publish = js.publish
        in_flight = peak = 0

        async def counted(*args: Any, **kw: Any) -> Any:  # the real publish, with how many overlap
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0)  # let the others start, as a round trip would
                return await publish(*args, **kw)
            finally:
                in_flight -= 1

        js.publish = counted  # type: ignore[method-assign]
        await log.flush(concurrency=16)
        js.publish = publish  # type: ignore[method-assign]

        assert log.checkpoints_written == CHAINS
        assert 1 < peak <= 16  # chains anchored side by side, never more than asked
        anchored = {cp.chain async for cp in iter_checkpoints(js)}
        assert anchored == {f"gpu-node-{i}" for i in range(CHAINS)}
        assert not log._timers  # the heads' timers are gone: nothing is written after the flush
    finally:
        await nc.close()
