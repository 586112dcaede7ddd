"""The adapters' errors carry their retry meaning to ``bus.settle`` without glue in between.

A Kubernetes 429 with ``Retry-After`` raised inside a playbook step (through the async port, the step
library and nothing else) naks the message for as long as the API server asked; a permanent Kubernetes
error dead-letters; an agent that does not answer naks quietly; a drain that timed out is a step failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from playbooks.catalog import PlaybookCatalog
from playbooks.steps import StepContext, StepFailed, drain_node, isolate_gpu, taint_node
from remediator.adapters.agent import AgentUnavailable
from remediator.adapters.kube import (
    AsyncKube,
    DrainTimeout,
    KubeConflict,
    KubePermanentError,
    KubeTemporaryError,
    NotFound,
)
from remediator.bus import settle
from remediator.contracts import Decision, GpuRef
from remediator.errors import Conflict, PermanentError, RemediatorError, TemporaryError
from remediator.settings import Settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass
class FakeMsg:
    """What ``settle`` calls on a delivery, recorded (not a JetStream delivery: counts as the first)."""

    subject: str = "remediation.gpu-node-0"
    data: bytes = b"{}"
    headers: dict[str, str] | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.calls.append(("nak", delay))

    async def term(self) -> None:
        self.calls.append(("term", None))


async def settled(error: BaseException) -> tuple[list[tuple[str, Any]], list[str]]:
    msg = FakeMsg()
    dead: list[str] = []

    async def dead_letter(_msg: Any, reason: str) -> None:
        dead.append(reason)

    await settle(msg, error, max_deliver=5, nak_delay=2.0, dead_letter=dead_letter)  # type: ignore[arg-type]
    return msg.calls, dead


class RefusingKube:
    """A synchronous adapter whose every mutation meets the error it was built with."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def taint(self, *_a: Any, **_kw: Any) -> Any:
        raise self.error

    def drain(self, *_a: Any, **_kw: Any) -> Any:
        raise self.error

    def close(self) -> None:
        pass


class SilentAgents:
    async def call(self, node: str, verb: str, **_kw: Any) -> Any:
        raise AgentUnavailable(f"agent on {node} did not answer {verb} (NoRespondersError)")


def context(kube: Any, agents: Any = None) -> StepContext:
    d = Decision(incident_id="inc-1", handler="xid", playbook="gpu-lost", node="gpu-node-0",
                 gpu=GpuRef(index=0), group="node", reason="Xid 79", event_id="ev-1", kind="xid", code=79,
                 decided_at=T0)
    return StepContext(decision=d, playbook=PlaybookCatalog.load().get("gpu-lost"), kube=kube,
                       agents=agents or SilentAgents(), settings=Settings(), clock=lambda: T0,
                       audit=None)  # type: ignore[arg-type]


async def test_a_kubernetes_429_with_retry_after_naks_for_that_long_through_a_step() -> None:
    port = AsyncKube(RefusingKube(KubeTemporaryError("PATCH /api/v1/nodes/gpu-node-0: 429 too many requests",
                                                     status=429, retry_after=30.0)))  # type: ignore[arg-type]
    try:
        with pytest.raises(KubeTemporaryError) as err:
            await taint_node(context(port), {})
    finally:
        port.close()
    assert isinstance(err.value, TemporaryError) and err.value.delay == 30.0
    calls, dead = await settled(err.value)
    assert calls == [("nak", 30.0)] and dead == []


async def test_a_temporary_kubernetes_error_without_retry_after_naks_after_the_configured_delay() -> None:
    calls, _ = await settled(KubeTemporaryError("GET /api/v1/nodes: 503", status=503))
    assert calls == [("nak", 2.0)]


async def test_conflicting_writers_are_a_conflict() -> None:
    err = KubeConflict("node gpu-node-0: concurrent writers won 5 times in a row", status=409)
    assert isinstance(err, Conflict) and isinstance(err, KubeTemporaryError)
    calls, _ = await settled(err)
    assert calls == [("nak", 2.0)]


@pytest.mark.parametrize("error", [
    KubePermanentError("PATCH /api/v1/nodes/gpu-node-0: 403 forbidden", status=403),
    NotFound("Node gpu-node-0 not found", kind="Node", name="gpu-node-0"),
], ids=["forbidden", "not-found"])
async def test_a_permanent_kubernetes_error_dead_letters_at_once(error: Exception) -> None:
    calls, dead = await settled(error)
    assert calls == [("term", None)]
    assert len(dead) == 1 and dead[0].startswith("permanent error")


async def test_an_agent_that_does_not_answer_naks_as_an_expected_condition(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(AgentUnavailable) as err:
        await isolate_gpu(context(None), {})
    assert isinstance(err.value, TemporaryError)
    with caplog.at_level(logging.INFO, logger="remediator.bus"):
        calls, _ = await settled(err.value)
    assert calls == [("nak", 2.0)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no "unexpected error" traceback


async def test_a_drain_that_timed_out_is_a_permanent_step_failure_naming_the_pods_left() -> None:
    left = [{"name": "p", "namespace": "ns", "uid": "u", "owner": None, "reason": "blocked by PodDisruptionBudget"}]
    port = AsyncKube(RefusingKube(DrainTimeout("gpu-node-0", 5.0, left, [])))  # type: ignore[arg-type]
    try:
        with pytest.raises(PermanentError) as err:
            await drain_node(context(port), {})
    finally:
        port.close()
    assert isinstance(err.value, DrainTimeout)
    assert err.value.after == {"pods_left": left, "evicted": []}  # what the executor records, read generically


def test_step_failed_is_one_of_ours() -> None:
    assert issubclass(StepFailed, RemediatorError)
    assert not issubclass(StepFailed, TemporaryError | PermanentError)  # the playbook's on_failure decides
