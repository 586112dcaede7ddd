"""NVML adapter: the only module that imports ``pynvml`` (nvidia-ml-py).

Where it sits: under the node agent, as its ``GpuBackend`` on a real node (``remediator agent --nvml``).
It reads, per GPU: UUID, PCI bus id, volatile and aggregate ECC totals (corrected = single-bit,
uncorrected = double-bit), retired pages (count by cause, pending flag), remapped rows (correctable,
uncorrectable, pending, failure), memory used/total/reserved (memory info v2, else v1), running compute
processes (pid, used memory: the per-process samples of the agent's memory-trend watch),
clock-event (throttle) reasons and temperature; and Xids through an NVML event set
(``nvmlEventTypeXidCriticalError``) on the GPUs that support it. For a safe reset (``GpuControl`` of
``remediator.agent.host``) it reads and sets persistence mode (``nvmlDeviceGetPersistenceMode``/
``nvmlDeviceSetPersistenceMode``) and reads who answers at a PCI address afresh
(``nvmlDeviceGetHandleByPciBusId_v2``, then the UUID), so the agent can tell the same GPU came back.

Error mapping (gpu-faults.md §2.7): NVML_ERROR_GPU_IS_LOST on any call marks the snapshot ``lost`` (the
identity read at start is kept); NOT_SUPPORTED leaves that field None and names it in ``unsupported``;
FUNCTION_NOT_FOUND (an older driver) is treated the same; any other error (TIMEOUT, UNKNOWN, ...) leaves the
field None and is named in ``errors``. ``library_path`` loads another ``libnvidia-ml.so`` (the test
suite's stub in ``chaos/native/nvml_stub.c``), so pynvml's own ctypes layer is what the tests exercise.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from remediator.contracts import normalize_pci_bus_id
from remediator.gpu import (
    EccCounts,
    GpuIdentity,
    GpuProcess,
    GpuSnapshot,
    RemappedRows,
    XidNotice,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST for this GPU."""


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def use_library(path: str) -> None:
    """Make pynvml use the NVML library at ``path`` instead of ``libnvidia-ml.so.1`` (before ``nvmlInit``)."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = ctypes.CDLL(path)
        pynvml._nvmlGetFunctionPointer_cache.clear()


def nvml_error_name(e: pynvml.NVMLError) -> str:
    """``NVML_ERROR_TIMEOUT``-style name of an NVML error."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == e.value:
            return name
    return f"NVML_ERROR_{e.value}"


class NvmlBackend:
    """``GpuBackend`` over NVML. Thread-safe for one poller thread plus one event-wait thread."""

    def __init__(self, library_path: str | None = None, *, xid_events: bool = True) -> None:
        if library_path:
            use_library(library_path)
        pynvml.nvmlInit()
        self._closed = False
        self._lock = threading.Lock()
        count = pynvml.nvmlDeviceGetCount()
        self._handles: list[Any] = []
        self._identities: list[GpuIdentity] = []
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._handles.append(handle)
            self._identities.append(self._identity(i, handle))
        self._event_set: Any = None
        self._handle_index: dict[int | None, int] = {
            ctypes.cast(h, ctypes.c_void_p).value: i for i, h in enumerate(self._handles)}
        if xid_events:
            self._register_events()

    # --- identity ------------------------------------------------------------------------------------

    def _identity(self, index: int, handle: Any) -> GpuIdentity:
        uuid: str | None = None
        pci: str | None = None
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as e:
            if e.value != pynvml.NVML_ERROR_GPU_IS_LOST:
                log.warning("NVML: UUID of GPU %d: %s", index, nvml_error_name(e))
        try:
            info = pynvml.nvmlDeviceGetPciInfo_v3(handle)
            pci = normalize_pci_bus_id(_text(info.busId))
        except pynvml.NVMLError as e:
            if e.value != pynvml.NVML_ERROR_GPU_IS_LOST:
                log.warning("NVML: PCI info of GPU %d: %s", index, nvml_error_name(e))
        except ValueError as e:
            log.warning("NVML: PCI bus id of GPU %d: %s", index, e)
        return GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci)

    def identities(self) -> list[GpuIdentity]:
        return list(self._identities)

    def driver_version(self) -> str | None:
        """The kernel driver's version (``nvmlSystemGetDriverVersion``), None where NVML cannot tell."""
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            return None

    def minor_number(self, index: int) -> int | None:
        """The GPU's device minor number (``/dev/nvidia<minor>``, ``nvmlDeviceGetMinorNumber``): what NVIDIA's
        DRA driver names its devices by (``gpu-<minor>``). None where NVML cannot tell."""
        try:
            return int(pynvml.nvmlDeviceGetMinorNumber(self._handles[index]))
        except (pynvml.NVMLError, IndexError):
            return None

    # --- GpuBackend ----------------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return len(self._handles)

    def snapshot(self, index: int) -> GpuSnapshot:
        handle = self._handles[index]
        ident = self._identities[index]
        unsupported: set[str] = set()
        errors: dict[str, str] = {}

        def read(name: str, fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost from e
                if e.value in _NOT_SUPPORTED:
                    unsupported.add(name)
                else:
                    errors[name] = nvml_error_name(e)
                return None

        if ident.uuid is None or ident.pci_bus_id is None:
            fresh = self._identity(index, handle)
            if fresh.uuid or fresh.pci_bus_id:
                ident = self._identities[index] = fresh
        try:
            ecc = EccCounts(
                sbe_volatile=read("ecc.sbe_volatile", lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC))),
                dbe_volatile=read("ecc.dbe_volatile", lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))),
                sbe_aggregate=read("ecc.sbe_aggregate", lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC))),
                dbe_aggregate=read("ecc.dbe_aggregate", lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC))),
            )
            pending = read("retired_pages_pending",
                           lambda: int(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)))
            retired_sbe = read("retired_pages_sbe", lambda: len(pynvml.nvmlDeviceGetRetiredPages(
                handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)))
            retired_dbe = read("retired_pages_dbe", lambda: len(pynvml.nvmlDeviceGetRetiredPages(
                handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
            rows = read("remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
            mem = read("memory", lambda: self._memory(handle))
            procs = read("processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            throttle = read("throttle_reasons", lambda: self._clock_reasons(handle))
            temp = read("temperature", lambda: int(pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU)))
        except GpuLost:
            return GpuSnapshot(identity=ident, lost=True)
        return GpuSnapshot(
            identity=ident,
            ecc=ecc,
            retired_pages_pending=None if pending is None else bool(pending),
            retired_pages_sbe=retired_sbe,
            retired_pages_dbe=retired_dbe,
            remapped_rows=None if rows is None else RemappedRows(
                correctable=int(rows[0]), uncorrectable=int(rows[1]), pending=bool(rows[2]),
                failure=bool(rows[3])),
            memory_used=None if mem is None else mem[0],
            memory_total=None if mem is None else mem[1],
            memory_reserved=None if mem is None else mem[2],
            processes=None if procs is None else tuple(
                GpuProcess(pid=int(p.pid), used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in procs),
            throttle_reasons=throttle,
            temperature_c=temp,
            unsupported=frozenset(unsupported),
            errors=errors,
        )

    @staticmethod
    def _memory(handle: Any) -> tuple[int, int, int | None]:
        """(used, total, reserved) framebuffer bytes. Memory info v2 separates what the driver reserves from
        what is allocated; ``used`` is returned as v1 counts it (allocated + reserved), so ``used - reserved``
        is what processes (or leaks) hold. An older driver without v2: v1, reserve unknown (None)."""
        try:
            m2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as e:
            if e.value not in _NOT_SUPPORTED and e.value != pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                raise
        else:
            return int(m2.used) + int(m2.reserved), int(m2.total), int(m2.reserved)
        m1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(m1.used), int(m1.total), None

    @staticmethod
    def _clock_reasons(handle: Any) -> int:
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError as e:
            if e.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    # --- GpuControl: persistence mode, identity by PCI address --------------------------------------

    def persistence_mode(self, index: int) -> bool | None:
        try:
            with self._lock:
                mode = int(pynvml.nvmlDeviceGetPersistenceMode(self._handles[index]))
            return bool(mode == pynvml.NVML_FEATURE_ENABLED)
        except pynvml.NVMLError as e:
            log.info("NVML: persistence mode of GPU %d: %s", index, nvml_error_name(e))
            return None

    def set_persistence_mode(self, index: int, enabled: bool) -> str | None:
        mode = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
        try:
            with self._lock:
                pynvml.nvmlDeviceSetPersistenceMode(self._handles[index], mode)
        except pynvml.NVMLError as e:
            return (f"nvmlDeviceSetPersistenceMode(GPU {index}, {'on' if enabled else 'off'}): "
                    f"{nvml_error_name(e)}")
        self._refresh_handle(index)
        return None

    def _refresh_handle(self, index: int) -> None:
        """A new handle for GPU ``index``: NVML invalidates the old one when persistence mode goes off on a
        GPU with its own NUMA memory, and after a reset."""
        ident = self._identities[index]
        try:
            with self._lock:
                handle = (pynvml.nvmlDeviceGetHandleByPciBusId(ident.pci_bus_id) if ident.pci_bus_id
                          else pynvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError as e:
            log.info("NVML: a new handle for GPU %d: %s", index, nvml_error_name(e))
            return
        self._handles[index] = handle
        self._handle_index = {ctypes.cast(h, ctypes.c_void_p).value: i for i, h in enumerate(self._handles)}

    def identity_at(self, pci_bus_id: str) -> GpuIdentity | None:
        try:
            with self._lock:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as e:
            log.info("NVML: the GPU at %s: %s", pci_bus_id, nvml_error_name(e))
            return None
        index = next((i for i, ident in enumerate(self._identities) if ident.pci_bus_id == pci_bus_id), -1)
        if index >= 0:
            self._handles[index] = handle
            if self._identities[index].uuid != uuid:
                log.warning("NVML: GPU %d at %s answers with UUID %s, was %s", index, pci_bus_id, uuid,
                            self._identities[index].uuid)
                self._identities[index] = GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci_bus_id)
        return GpuIdentity(index=index, uuid=uuid, pci_bus_id=pci_bus_id)

    # --- Xid events ----------------------------------------------------------------------------------

    def _register_events(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            log.info("NVML event sets unavailable (%s): Xids come from the kernel log only", nvml_error_name(e))
            return
        registered = 0
        for i, handle in enumerate(self._handles):
            try:
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.info("GPU %d does not support Xid events", i)
                    continue
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except pynvml.NVMLError as e:
                log.info("GPU %d: no Xid event registration (%s)", i, nvml_error_name(e))
        if registered:
            self._event_set = event_set
        else:
            pynvml.nvmlEventSetFree(event_set)

    def wait_xid(self, timeout_s: float) -> XidNotice | None:
        event_set = self._event_set
        if event_set is None or self._closed:
            return None
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            return None
        index = self._handle_index.get(ctypes.cast(data.device, ctypes.c_void_p).value)
        return XidNotice(index=index, code=int(data.eventData))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            if self._event_set is not None:
                try:
                    pynvml.nvmlEventSetFree(self._event_set)
                except pynvml.NVMLError as e:
                    log.debug("nvmlEventSetFree: %s", nvml_error_name(e))
                self._event_set = None
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as e:
                log.debug("nvmlShutdown: %s", nvml_error_name(e))
