"""``bus.verify`` names a provisioned executor pending limit that caps ``executor_concurrency`` (real server)."""

from __future__ import annotations

import logging

import pytest

from remediator import bus
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings


async def test_verify_says_when_a_provisioned_limit_caps_the_concurrency(
        nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture) -> None:
    nats_url = nats_server.url
    nc, js = await bus.connect(nats_url)
    try:
        await bus.provision(js, Settings(nats_url=nats_url, executor_concurrency=8))  # declares 64
        with caplog.at_level(logging.WARNING, logger="remediator.bus"):
            await bus.verify(js, Settings(nats_url=nats_url, executor_concurrency=8))
            assert not [r for r in caplog.records if "caps executor_concurrency" in r.getMessage()]
            await bus.verify(js, Settings(nats_url=nats_url, executor_concurrency=100))
        (line,) = [r.getMessage() for r in caplog.records if "caps executor_concurrency" in r.getMessage()]
        assert "--reset-consumers" in line and "202" in line
    finally:
        await nc.close()
