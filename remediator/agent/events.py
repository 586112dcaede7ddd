"""Turning what the agent saw into ``FaultEvent``s, and the interface they leave the watchers through.

Where it sits: between the watchers (kernel log, NVML poller, container logs, orphan check) and the
publisher. ``EventSink.submit`` returns once the events are durably handed on (acked by JetStream or
appended to the spool); a watcher persists its read position only after that, so a crash re-reads at most
the last batch, whose ids JetStream then drops as duplicates. ``GpuDirectory`` maps a PCI bus id to the
GPU's index and UUID, learned from NVML and from the driver's identity lines
(``NVRM: GPU at PCI:0000:3b:00: GPU-...``).

Event ids (DESIGN.md §5), all beginning ``agent|<node>|``:

==========================  ===========================================================================
source                      id
==========================  ===========================================================================
kmsg record                 ``agent|<node>|<boot id>|<kmsg sequence>``
journal entry               ``agent|<node>|<boot id>|j:<hash of the journal cursor>``
plain text line (dmesg,     ``agent|<node>|file|<dev>:<inode>:<first-line fingerprint>@<byte offset>``
syslog file)
container log line          ``agent|<node>|pod|<pod uid>|<container>|<dev>:<inode>:<fingerprint>@<offset>``
NVML change                 ``agent|<node>|<boot id>|nvml|<gpu>|<n>|<code>`` (n: persisted per-GPU counter)
orphaned memory             ``agent|<node>|<boot id>|orphan|<gpu>|<sorted pids>``
==========================  ===========================================================================
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from remediator.contracts import KINDS, FaultEvent, GpuRef, Origin, normalize_pci_bus_id, utcnow

Clock = Callable[[], datetime]

MAX_MESSAGE = 8192

_SECRET_RE = re.compile(
    r"(?i)\b(password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key|authorization)(\s*[=:]\s*)"
    r"(\"[^\"]*\"|'[^']*'|\S+)"
)
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")


def redact(text: str) -> str:
    """``text`` with values of secret-looking ``key=value`` pairs and bearer tokens replaced, cut to 8 KiB."""
    if "=" in text or ":" in text:
        text = _SECRET_RE.sub(r"\1\2[REDACTED]", text)
    if "earer" in text:
        text = _BEARER_RE.sub(r"\1[REDACTED]", text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class SpoolFull(Exception):
    """The spool reached its size limit while NATS is unreachable: the caller keeps its batch and retries."""


class EventSink(Protocol):
    async def submit(self, events: Sequence[FaultEvent]) -> None:
        """Return once every event is acked by JetStream or spooled; raise ``SpoolFull`` when neither."""
        ...


async def submit_when_room(sink: EventSink, events: Sequence[FaultEvent], retry_s: float) -> None:
    """Hand ``events`` to ``sink``, waiting ``retry_s`` between tries while the spool is full: a watcher
    keeps its batch (and its read position) rather than dropping events."""
    while events:
        try:
            await sink.submit(events)
            return
        except SpoolFull:
            await asyncio.sleep(retry_s)


class GpuDirectory:
    """PCI bus id -> (index, UUID) for this node's GPUs, from NVML snapshots and driver identity lines."""

    def __init__(self) -> None:
        self._by_pci: dict[str, tuple[int | None, str | None]] = {}
        self._index_by_uuid: dict[str, int] = {}

    def learn(self, pci: str | None, uuid: str | None, index: int | None = None) -> bool:
        """Record what is known of one GPU; True when that added something."""
        if not pci:
            if uuid and index is not None and self._index_by_uuid.get(uuid) != index:
                self._index_by_uuid[uuid] = index
                return True
            return False
        try:
            pci = normalize_pci_bus_id(pci)
        except ValueError:
            return False
        old_index, old_uuid = self._by_pci.get(pci, (None, None))
        if uuid and index is None:
            index = self._index_by_uuid.get(uuid)
        new = (index if index is not None else old_index, uuid or old_uuid)
        if uuid and index is not None:
            self._index_by_uuid[uuid] = index
        if new == (old_index, old_uuid):
            return False
        self._by_pci[pci] = new
        return True

    def ref(self, pci: str | None, uuid: str | None = None, index: int | None = None) -> GpuRef | None:
        """The fullest ``GpuRef`` for what a line said; unknown parts stay empty. None when nothing is known."""
        if pci:
            try:
                pci = normalize_pci_bus_id(pci)
            except ValueError:
                pci = None
        if pci:
            known_index, known_uuid = self._by_pci.get(pci, (None, None))
            uuid = uuid or known_uuid
            index = index if index is not None else known_index
        if uuid and index is None:
            index = self._index_by_uuid.get(uuid)
        if pci is None and uuid is None and index is None:
            return None
        return GpuRef(index=index, uuid=uuid, pci_bus_id=pci)

    def to_json(self) -> dict[str, list[object]]:
        return {pci: [idx, uuid] for pci, (idx, uuid) in sorted(self._by_pci.items())}

    def load_json(self, data: Mapping[str, object]) -> None:
        for pci, v in data.items():
            if isinstance(v, list) and len(v) == 2:
                idx, uuid = v
                self.learn(pci, uuid if isinstance(uuid, str) else None,
                           idx if isinstance(idx, int) else None)


def detail_labels(detail: Mapping[str, object], keys: Sequence[str] | None = None) -> dict[str, str]:
    """The scalar entries of a signal's ``detail`` as string labels (``keys``: only those); a list or tuple of
    scalars (``lagging_ranks``) becomes a comma-separated label."""
    out: dict[str, str] = {}
    for k, v in detail.items():
        if keys is not None and k not in keys:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, str | int | float):
            out[k] = str(v)
        elif isinstance(v, list | tuple) and all(isinstance(x, str | int | float) for x in v):
            out[k] = ",".join(str(x) for x in v)
    return out


def make_event(*, event_id: str, node: str, kind: str, code: int | str | None, gpu: GpuRef | None,
               message: str, labels: Mapping[str, str], clock: Clock = utcnow, is_fatal: bool = False,
               is_healthy: bool = False, recommended_action: str | None = None,
               observed_at: datetime | None = None, origin: Origin | None = None) -> FaultEvent | None:
    """A ``FaultEvent`` from the agent, or None when ``kind`` is not in the event vocabulary.

    ``origin``: the pod the agent saw the fault in (namespace, name, UID, container), when it knows one;
    the agent never guesses the job (the service resolves it from the pod's owner reference).
    """
    if kind not in KINDS:
        return None
    now = clock()
    return FaultEvent(
        id=event_id, source="agent", node=node, gpu=gpu, kind=kind,
        code=code, is_fatal=is_fatal, is_healthy=is_healthy, message=redact(message),
        observed_at=observed_at or now, received_at=now, labels=dict(labels), origin=origin or Origin(),
        recommended_action=recommended_action,
    )
