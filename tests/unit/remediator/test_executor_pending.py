"""The executor consumer's pending limit follows ``executor_concurrency`` (it used to cap it at 64, silently)."""

from __future__ import annotations

import pytest

from remediator import bus
from remediator.settings import Settings


@pytest.mark.parametrize("concurrency", [1, 32, 63, 64, 96, 500])
def test_the_declared_limit_leaves_every_replica_its_concurrency(concurrency: int) -> None:
    settings = Settings(executor_concurrency=concurrency)
    (_, _dispatch), (stream, executor) = bus._consumer_specs(settings)
    assert stream == "REMEDIATIONS" and executor.durable_name == bus.EXECUTOR_CONSUMER
    assert executor.max_ack_pending == bus.executor_max_ack_pending(settings)
    # each of the replicas the limit leaves room for holds its concurrency plus the decision its pull loop waits with
    assert executor.max_ack_pending >= bus.EXECUTOR_REPLICA_ROOM * (concurrency + 1)
    assert executor.max_ack_pending >= bus.EXECUTOR_MAX_ACK_PENDING
