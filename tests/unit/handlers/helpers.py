"""Builders shared by the handler tests: events with an injected clock, and a runner over a sequence."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from handlers.base import History, Verdict
from remediator.contracts import FaultEvent, GpuRef, Origin

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
_ids = itertools.count(1)

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
GPU_C = "GPU-cccccccc-0000-0000-0000-000000000003"

JOB = "training.kubeflow.org/job-name"  # a pod label ``remediator.contracts.resolve_job`` reads


def ev(kind: str, code: int | str | None = None, *, gpu: str | None = GPU_A, node: str = "node-1",
       at: datetime = T0, labels: dict[str, str] | None = None, message: str = "", is_fatal: bool = False,
       is_healthy: bool = False, event_id: str | None = None, origin: Origin | None = None) -> FaultEvent:
    return FaultEvent(
        id=event_id or f"e{next(_ids)}", source="agent", node=node,
        gpu=GpuRef(uuid=gpu) if gpu else None, kind=kind,  # type: ignore[arg-type]
        code=code, is_fatal=is_fatal, is_healthy=is_healthy, message=message, observed_at=at,
        received_at=at, labels=labels or {}, origin=origin or Origin(),
    )


def at(seconds: float = 0, *, minutes: float = 0, hours: float = 0) -> datetime:
    return T0 + timedelta(seconds=seconds, minutes=minutes, hours=hours)


Decide = Callable[[FaultEvent, History, datetime], Verdict]  # a handler's decide with its policy bound


def run(decide: Decide, steps: Iterable[tuple[FaultEvent, datetime]],
        history: History | None = None) -> tuple[list[Verdict], History]:
    """Feed ``(event, now)`` pairs through ``decide``, threading the history; return every verdict."""
    h = history or History()
    out: list[Verdict] = []
    for event, now in steps:
        v = decide(event, h, now)
        out.append(v)
        h = v.history
    return out, h


def decisions(verdicts: Iterable[Verdict]) -> list[str]:
    return [v.decision.playbook for v in verdicts if v.decision is not None]
