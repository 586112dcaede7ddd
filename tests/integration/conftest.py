"""Fixtures of the integration tests: real processes on loopback, each test with its own.

Where it sits: beside the integration tests; shared support that is more than a fixture lives in the
``*_support.py`` modules of this folder. A missing binary fails the test (never skips it): a skipped
integration test would hide a broken install.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from nats.js.kv import KeyValue

from chaos.nats_cluster import NatsCluster
from remediator import bus
from remediator.natsd import EmbeddedNats
from remediator.subjects import STATE_BUCKET

from .executor_support import fast_settings


@pytest.fixture
def nats_server() -> Iterator[EmbeddedNats]:
    """A fresh ``nats-server -js`` on a free port with a temporary store; fails loudly when the binary is
    missing."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    """Three ``nats-server -js`` processes clustered over loopback routes (R3 streams and buckets are real
    Raft groups); each test gets its own, with temporary stores."""
    with NatsCluster(3) as cluster:
        yield cluster


@pytest.fixture
async def kv(nats_server: EmbeddedNats) -> AsyncIterator[KeyValue]:
    """The ``remediator-state`` bucket of a fresh server, provisioned as ``bus init`` does."""
    nc, js = await bus.connect(nats_server.url)
    try:
        await bus.provision(js, fast_settings(nats_server.url))
        yield await js.key_value(STATE_BUCKET)
    finally:
        await nc.drain()
