"""``bus.verify``: what ``serve`` checks instead of provisioning — it changes nothing and names every problem."""

from __future__ import annotations

import pytest

from remediator import bus, subjects
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings


async def test_verify_names_everything_missing_then_passes_once_provisioned(nats_server: EmbeddedNats) -> None:
    nc, js = await bus.connect(nats_server.url, name="test-verify")
    try:
        with pytest.raises(bus.BusNotProvisioned) as info:
            await bus.verify(js, Settings())
        text = str(info.value)
        for what in ("stream FAULTS is missing", "KV bucket remediator-locks is missing",
                     "consumer REMEDIATIONS/executor is missing", "remediator bus init --replicas 1"):
            assert what in text, text
        assert await js.streams_info() == []  # verifying created nothing
        await bus.provision(js, Settings())
        await bus.verify(js, Settings())
        # a bus with fewer replicas than the service expects, or a consumer that would drop messages
        with pytest.raises(bus.BusNotProvisioned, match=r"stream FAULTS has 1 replica\(s\), fewer than 3"):
            await bus.verify(js, Settings(bus_replicas=3))
        with pytest.raises(bus.BusNotProvisioned, match="delivers at most 5 times, fewer than max_deliver 9"):
            await bus.verify(js, Settings(max_deliver=9))
        await js.delete_consumer(subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER)
        with pytest.raises(bus.BusNotProvisioned, match="consumer FAULTS/dispatch is missing"):
            await bus.verify(js, Settings())
    finally:
        await nc.close()
