"""NVML poller: per-GPU ECC, row-remap, retired-page, thermal and lost state, published on change only.

Where it sits: the agent's GPU-state path, beside the kernel-log watcher. Every ``interval_s`` it takes a
``GpuSnapshot`` of each GPU from the ``GpuBackend`` (NVML, or the simulated node) in a worker thread and
compares it with the last values it published (persisted, so a restart does not publish them again):

=============================  ==================================  =========  ==========================
change                         kind / code                          fatal      cleared by (is_healthy)
=============================  ==================================  =========  ==========================
NVML_ERROR_GPU_IS_LOST         gpu_lost / NVML_ERROR_GPU_IS_LOST    yes        the GPU answering again
volatile DBE count rises       ecc / dbe_volatile                   yes        -
volatile SBE count rises       ecc / sbe_volatile                   no         -
row remap pending set          ecc / row_remap_pending              no         the flag clearing
row remap failure set          ecc / row_remap_failure              yes        the flag clearing
retired pages pending set      ecc / retired_pages_pending          no         the flag clearing
DBE retired pages rise         ecc / retired_pages_dbe              no         -
thermal / HW slowdown set      thermal / hw_thermal_slowdown, ...   no         the reason clearing
=============================  ==================================  =========  ==========================

ECC events carry the new value in ``labels["value"]`` and the previous one in ``labels["previous"]``. A
counter that goes down (volatile counters reset with the GPU) only moves the baseline. A field the GPU
does not support (NOT_SUPPORTED) is skipped for that GPU; other read errors (TIMEOUT, ...) leave the
baseline unchanged. Xids also arrive through NVML event sets (``GpuBackend.wait_xid``); ``XidEventWatcher``
publishes those when enabled (by default only when no kernel log is followed, which carries the same Xids
with more detail).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from remediator.agent.events import Clock, make_event
from remediator.agent.host import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    GpuBackend,
    GpuSnapshot,
)
from remediator.agent.state import StateStore
from remediator.contracts import FaultEvent, GpuRef, utcnow

log = logging.getLogger(__name__)

STATE_NAME = "nvml"

_THROTTLE_CODES = (
    (THROTTLE_HW_THERMAL, "hw_thermal_slowdown"),
    (THROTTLE_SW_THERMAL, "sw_thermal_slowdown"),
    (THROTTLE_HW_SLOWDOWN, "hw_slowdown"),
    (THROTTLE_HW_POWER_BRAKE, "hw_power_brake_slowdown"),
)


@dataclass(frozen=True, slots=True)
class _Rule:
    code: str
    kind: str
    counter: bool  # True: publish when it rises; False: a flag, published when set (and when cleared)
    fatal: bool


_ECC_RULES = (
    _Rule("dbe_volatile", "ecc", True, True),
    _Rule("sbe_volatile", "ecc", True, False),
    _Rule("row_remap_pending", "ecc", False, False),
    _Rule("row_remap_failure", "ecc", False, True),
    _Rule("retired_pages_pending", "ecc", False, False),
    _Rule("retired_pages_dbe", "ecc", True, False),
)


def observed_values(snap: GpuSnapshot) -> dict[str, int | None]:
    """The values the change rules look at; None where unsupported or unreadable."""
    rr = snap.remapped_rows
    values: dict[str, int | None] = {
        "dbe_volatile": snap.ecc.dbe_volatile,
        "sbe_volatile": snap.ecc.sbe_volatile,
        "row_remap_pending": None if rr is None else int(rr.pending),
        "row_remap_failure": None if rr is None else int(rr.failure),
        "retired_pages_pending": None if snap.retired_pages_pending is None else int(snap.retired_pages_pending),
        "retired_pages_dbe": snap.retired_pages_dbe,
    }
    if snap.throttle_reasons is not None:
        for bit, code in _THROTTLE_CODES:
            values[code] = int(bool(snap.throttle_reasons & bit))
    return values


class NvmlPoller:
    """Turns successive snapshots into change events; its baselines live in the state directory."""

    def __init__(self, backend: GpuBackend, *, node: str, state: StateStore, boot_id: Callable[[], str],
                 clock: Clock = utcnow, interval_s: float = 5.0) -> None:
        self.backend = backend
        self.node = node
        self.state = state
        self.boot_id = boot_id
        self.clock = clock
        self.interval_s = interval_s
        self._baseline: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, dict[str, Any]] | None = None
        self.latest: list[GpuSnapshot] = []
        self.polls = 0
        data = state.load(STATE_NAME)
        gpus = data.get("gpus")
        if isinstance(gpus, dict):
            self._baseline = {k: dict(v) for k, v in gpus.items() if isinstance(v, dict)}

    def take_snapshots(self) -> list[GpuSnapshot]:
        """Snapshots of every GPU (blocking: call from a worker thread)."""
        return [self.backend.snapshot(i) for i in range(self.backend.gpu_count())]

    def diff(self, snapshots: Sequence[GpuSnapshot]) -> list[FaultEvent]:
        """Events for what changed since the committed baselines (call ``commit`` once they are handed on)."""
        self.latest = list(snapshots)
        self.polls += 1
        new_baseline = {k: dict(v) for k, v in self._baseline.items()}
        events: list[FaultEvent] = []
        boot = self.boot_id()
        for snap in snapshots:
            key = snap.identity.key
            base = new_baseline.setdefault(key, {"n": 0, "values": {}})
            values: dict[str, Any] = base.setdefault("values", {})
            gpu = GpuRef(index=snap.identity.index, uuid=snap.identity.uuid, pci_bus_id=snap.identity.pci_bus_id)

            def emit(kind: str, code: str, message: str, labels: dict[str, str], *, fatal: bool = False,
                     healthy: bool = False, _base: dict[str, Any] = base, _key: str = key,
                     _gpu: GpuRef = gpu) -> None:
                _base["n"] = int(_base.get("n", 0)) + 1
                event = make_event(
                    event_id=f"agent|{self.node}|{boot}|nvml|{_key}|{_base['n']}|{code}", node=self.node,
                    kind=kind, code=code, gpu=_gpu, message=message, labels={"source": "nvml", **labels},
                    clock=self.clock, is_fatal=fatal, is_healthy=healthy)
                if event is not None:
                    events.append(event)

            was_lost = bool(values.get("lost", 0))
            if snap.lost != was_lost:
                values["lost"] = int(snap.lost)
                if snap.lost:
                    emit("gpu_lost", "NVML_ERROR_GPU_IS_LOST",
                         f"GPU {snap.index} ({snap.identity.pci_bus_id}): NVML reports the GPU is lost", {},
                         fatal=True)
                else:
                    emit("gpu_lost", "NVML_ERROR_GPU_IS_LOST",
                         f"GPU {snap.index} ({snap.identity.pci_bus_id}) answers NVML again", {}, healthy=True)
            if snap.lost:
                continue
            observed = observed_values(snap)
            for rule in _ECC_RULES:
                self._apply(rule.code, rule.kind, rule.counter, rule.fatal, observed, values, snap, emit)
            for _, code in _THROTTLE_CODES:
                self._apply(code, "thermal", False, False, observed, values, snap, emit)
        self._pending = new_baseline
        return events

    @staticmethod
    def _apply(code: str, kind: str, counter: bool, fatal: bool, observed: dict[str, int | None],
               values: dict[str, Any], snap: GpuSnapshot, emit: Callable[..., None]) -> None:
        now = observed.get(code)
        if now is None:
            return
        prev = values.get(code)
        values[code] = now
        prev_v = int(prev) if prev is not None else 0
        where = f"GPU {snap.index} ({snap.identity.uuid or snap.identity.pci_bus_id})"
        labels = {"value": str(now), "previous": str(prev_v)}
        if kind == "thermal" and snap.temperature_c is not None:
            labels["temperature_c"] = str(snap.temperature_c)
        if counter:
            if now > prev_v:
                emit(kind, code, f"{where}: {code} {prev_v} -> {now}", labels, fatal=fatal)
            return
        if now and not prev_v:
            emit(kind, code, f"{where}: {code} set", labels, fatal=fatal)
        elif prev_v and not now:
            emit(kind, code, f"{where}: {code} cleared", labels, healthy=True)

    def commit(self) -> None:
        """The last ``diff``'s events were handed on: make its values the baseline, durably."""
        if self._pending is None:
            return
        changed = self._pending != self._baseline
        self._baseline, self._pending = self._pending, None
        if changed:
            self.state.save(STATE_NAME, {"gpus": self._baseline})


class XidEventWatcher:
    """Runs ``GpuBackend.wait_xid`` in a thread and publishes each Xid as an ``xid`` event."""

    def __init__(self, backend: GpuBackend, *, node: str, state: StateStore, boot_id: Callable[[], str],
                 identities: Callable[[], Sequence[GpuSnapshot]], clock: Clock = utcnow,
                 wait_s: float = 1.0) -> None:
        self.backend = backend
        self.node = node
        self.state = state
        self.boot_id = boot_id
        self.identities = identities
        self.clock = clock
        self.wait_s = wait_s
        self._stop = threading.Event()
        self._count = int(state.load("nvml-xid").get("n", 0))

    async def run(self, submit: Callable[[list[FaultEvent]], Any]) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int | None, int]] = asyncio.Queue()

        def pump() -> None:
            while not self._stop.is_set():
                try:
                    notice = self.backend.wait_xid(self.wait_s)
                except Exception as e:  # NVML trouble must not kill the thread silently
                    log.warning("NVML event wait failed: %s", e)
                    self._stop.wait(self.wait_s)
                    continue
                if notice is not None:
                    loop.call_soon_threadsafe(queue.put_nowait, (notice.index, notice.code))

        thread = threading.Thread(target=pump, name="nvml-xid-events", daemon=True)
        thread.start()
        try:
            while True:
                index, code = await queue.get()
                snaps = {s.index: s for s in self.identities()}
                ident = snaps[index].identity if index is not None and index in snaps else None
                gpu = GpuRef(index=index, uuid=ident.uuid if ident else None,
                             pci_bus_id=ident.pci_bus_id if ident else None) if index is not None else None
                self._count += 1
                event = make_event(
                    event_id=f"agent|{self.node}|{self.boot_id()}|nvml-xid|{self._count}", node=self.node,
                    kind="xid", code=code, gpu=gpu, message=f"NVML event: Xid {code} on GPU {index}",
                    labels={"source": "nvml_event"}, clock=self.clock)
                if event is not None:
                    await submit([event])
                self.state.save("nvml-xid", {"n": self._count})
        finally:
            self._stop.set()
            await asyncio.to_thread(thread.join, self.wait_s * 2 + 1)
