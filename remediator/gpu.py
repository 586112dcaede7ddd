"""What a GPU looks like to this project: identity, one poll's snapshot, an NVML Xid notice, and the
``GpuBackend`` port that reads them.

Where it sits: at the bottom, beside ``contracts``. The node agent (``remediator.agent``) talks only to
``GpuBackend``; the NVML adapter (``remediator.adapters.nvml``) and the simulated GPU node
(``chaos.sim.gpu_node``) implement it. Keeping the types here lets the adapter implement the agent's port
without importing the agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "THROTTLE_HW_POWER_BRAKE",
    "THROTTLE_HW_SLOWDOWN",
    "THROTTLE_HW_THERMAL",
    "THROTTLE_SW_THERMAL",
    "EccCounts",
    "GpuBackend",
    "GpuIdentity",
    "GpuProcess",
    "GpuSnapshot",
    "RemappedRows",
    "XidNotice",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})

# Clock-event (throttle) reason bits, as NVML defines them (nvmlClocksEventReason*).
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Who a GPU is: NVML index, UUID and normalised PCI bus id (``DDDD:BB:DD.F``)."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None

    @property
    def key(self) -> str:
        """A stable name for state keys: the UUID, else ``index<N>``."""
        return self.uuid or f"index{self.index}"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process NVML reports on a GPU. ``used_bytes`` is None where NVML cannot tell."""

    pid: int
    used_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error totals (NVML: corrected = single-bit, uncorrected = double-bit); None = not supported."""

    sbe_volatile: int | None = None
    dbe_volatile: int | None = None
    sbe_aggregate: int | None = None
    dbe_aggregate: int | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """``nvmlDeviceGetRemappedRows``: rows remapped for correctable/uncorrectable errors and the flags."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """Everything the agent reads about one GPU in one poll.

    A field is None when the GPU does not support it (its name is then in ``unsupported``) or when reading
    it failed (the error name is in ``errors``). A lost GPU (NVML_ERROR_GPU_IS_LOST) has ``lost`` set and
    keeps the identity read before it was lost; everything else is None.
    """

    identity: GpuIdentity
    lost: bool = False
    ecc: EccCounts = EccCounts()
    retired_pages_pending: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    remapped_rows: RemappedRows | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    # what the driver sets aside (NVML memory info v2); ``memory_used`` includes it, as NVML's v1 ``used`` does
    memory_reserved: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    throttle_reasons: int | None = None
    temperature_c: int | None = None
    unsupported: frozenset[str] = frozenset()
    errors: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    @property
    def index(self) -> int:
        return self.identity.index

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for ``status`` replies and logs)."""
        out: dict[str, Any] = {
            "index": self.identity.index,
            "uuid": self.identity.uuid,
            "pci_bus_id": self.identity.pci_bus_id,
            "lost": self.lost,
            "ecc": asdict(self.ecc),
            "retired_pages_pending": self.retired_pages_pending,
            "retired_pages_sbe": self.retired_pages_sbe,
            "retired_pages_dbe": self.retired_pages_dbe,
            "remapped_rows": asdict(self.remapped_rows) if self.remapped_rows else None,
            "memory_used": self.memory_used,
            "memory_total": self.memory_total,
            "memory_reserved": self.memory_reserved,
            "processes": None if self.processes is None
            else [{"pid": p.pid, "used_bytes": p.used_bytes} for p in self.processes],
            "throttle_reasons": self.throttle_reasons,
            "temperature_c": self.temperature_c,
        }
        if self.unsupported:
            out["unsupported"] = sorted(self.unsupported)
        if self.errors:
            out["errors"] = dict(self.errors)
        return out


@dataclass(frozen=True, slots=True)
class XidNotice:
    """An Xid delivered by an NVML event set (nvmlEventTypeXidCriticalError); ``index`` None = unknown GPU."""

    index: int | None
    code: int


@runtime_checkable
class GpuBackend(Protocol):
    """Read-only access to the node's GPUs. Implemented by ``NvmlBackend`` and ``SimGpuNode``.

    Every method may block (NVML calls, file reads); the agent calls them from a worker thread. ``snapshot``
    never raises for a lost GPU: it returns a snapshot with ``lost`` set.
    """

    def gpu_count(self) -> int: ...

    def snapshot(self, index: int) -> GpuSnapshot: ...

    def wait_xid(self, timeout_s: float) -> XidNotice | None:
        """Block until an Xid event arrives or ``timeout_s`` passes (None); None at once if unsupported."""
        ...

    def close(self) -> None: ...
