"""The audit trail a benchmark's service parts write: as ``serve`` writes it, or with parts left out to measure them.

Where it sits: beside the service, never on its path. ``bench dispatch`` and ``bench storm`` make their
replicas' ``AuditLog`` here, so what one event or one incident costs can be split by measurement rather than
by a sampling profiler (py-spy on these machines over-weights the frames next to a system call):

* ``full`` (the default): as ``serve`` writes it (``AuditLog.for_replica``), every record signed and each
  chain checkpointed;
* ``unsigned``: the same records and chains, no signature and so no checkpoint;
* ``off``: no record written at all (``_UnwrittenAudit``).

The difference between two modes' CPU per event (or per incident) is what that part of the trail costs.
``unsigned`` and ``off`` are measurements only: ``serve`` has no such switch, and nothing outside the
benchmarks makes one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from remediator.audit import AuditLog
from remediator.contracts import GENESIS_HASH, AuditRecord, utcnow
from remediator.settings import Settings
from remediator.signing import Signer

__all__ = ["AUDIT_MODES", "bench_audit"]

AUDIT_MODES = ("full", "unsigned", "off")


class _UnwrittenAudit(AuditLog):
    """``off``: appends write nothing (no chain head read, no hash, no signature, no publish) and return one
    placeholder record."""

    def __init__(self, js: Any, actor: str) -> None:
        super().__init__(js, actor)
        self._placeholder = AuditRecord(seq=1, time=utcnow(), node="_cluster", actor=actor, what="event_ignored",
                                        why="not written: a benchmark run with --audit off",
                                        prev_hash=GENESIS_HASH, hash=GENESIS_HASH)

    async def append(self, *_args: Any, **_kwargs: Any) -> AuditRecord:
        return self._placeholder


def bench_audit(mode: str, js: Any, settings: Settings, actor: str, signer: Signer, *,
                observers: Iterable[Callable[[AuditRecord], None]] = ()) -> AuditLog:
    """The audit log of a benchmark's replica in ``mode`` (one of ``AUDIT_MODES``)."""
    if mode == "full":
        return AuditLog.for_replica(js, settings, actor, signer, observers=observers)
    if mode == "unsigned":
        return AuditLog(js, actor, observers=observers)
    if mode == "off":
        return _UnwrittenAudit(js, actor)
    raise ValueError(f"audit must be one of {', '.join(AUDIT_MODES)} (got {mode!r})")
