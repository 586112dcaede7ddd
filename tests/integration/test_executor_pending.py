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


async def test_kv_buckets_answer_reads_by_direct_get(nats_server: EmbeddedNats) -> None:
    from nats.js import api

    from remediator import subjects

    nc, js = await bus.connect(nats_server.url)
    try:
        # a bucket made before (no direct get) is brought to the declaration by bus init
        await js.create_key_value(api.KeyValueConfig(bucket=subjects.LOCKS_BUCKET, history=1, ttl=300))
        done = await bus.provision(js, Settings(nats_url=nats_server.url))
        assert any(line.startswith(f"updated KV bucket {subjects.LOCKS_BUCKET}") and "allow_direct" in line
                   for line in done), done
        for bucket in (subjects.STATE_BUCKET, subjects.LOCKS_BUCKET):
            assert (await js.stream_info(f"KV_{bucket}")).config.allow_direct is True
            kv = await js.key_value(bucket)
            assert kv._direct  # nats-py then reads keys with $JS.API.DIRECT.GET
            await kv.put("node.gpu-node-0", b"{}")
            assert (await kv.get("node.gpu-node-0")).value == b"{}"
        assert await bus.provision(js, Settings(nats_url=nats_server.url)) == []
    finally:
        await nc.close()
