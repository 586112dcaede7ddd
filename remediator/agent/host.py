"""The node agent's view of its host: what a GPU looks like, and the interfaces behind which the GPUs,
the processes and the node-local actions live.

Where it sits: at the bottom of ``remediator.agent``. The watchers and the command responder only talk to
these protocols; the composition root (``remediator agent``) plugs in the real implementations (the NVML
adapter in ``remediator.adapters.nvml``, ``SubprocessHostRunner`` and ``ProcPodView`` here) or the
simulated node of ``chaos.sim.gpu_node``, which implements all three, so ``--sim-gpus N`` runs the same
agent code as a real node.

- ``GpuBackend``: read-only GPU state (one ``GpuSnapshot`` per GPU) and NVML Xid events. Blocking; the
  agent calls it from a worker thread.
- ``HostRunner``: the side effects of the node-local playbook steps (drain/undrain a GPU, reset it, kill a
  process, the reboot hook, the configured health command).
- ``PodView``: which pods the kubelet runs and which pod a PID belongs to (for orphan detection).
- ``PodResourcesView``: which pods (namespace, name, UID, container) the kubelet's device manager gave a
  GPU to, for ``isolate_gpu``/``status`` replies and so for the service's per-GPU eviction. The simulated
  node implements it from the simulated kubelet's allocation; on a real node it is the kubelet's
  PodResources API (issue 10), until then there is none and the agent says it cannot tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from remediator.gpu import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    EccCounts,
    GpuBackend,
    GpuIdentity,
    GpuProcess,
    GpuSnapshot,
    RemappedRows,
    XidNotice,
)

# The GPU types and the backend port live below the agent, in remediator.gpu; re-exported here.
__all__ = [
    "THROTTLE_HW_POWER_BRAKE",
    "THROTTLE_HW_SLOWDOWN",
    "THROTTLE_HW_THERMAL",
    "THROTTLE_SW_THERMAL",
    "EccCounts",
    "GpuBackend",
    "GpuHolder",
    "GpuIdentity",
    "GpuProcess",
    "GpuSnapshot",
    "HostRunner",
    "PidInfo",
    "PodResourcesView",
    "PodView",
    "ProcPodView",
    "RemappedRows",
    "RunResult",
    "SubprocessHostRunner",
    "XidNotice",
    "kubelet_pod_uids",
    "pod_uid_from_cgroup",
]


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcome of one host action: ``ok``, and what happened in one line (with the tool's output tail)."""

    ok: bool
    detail: str = ""


@runtime_checkable
class HostRunner(Protocol):
    """The side effects of node-local steps. ``SubprocessHostRunner`` on a real node, ``SimGpuNode`` in sims.

    Each method does the action once; checking whether it is needed (idempotency, refusals such as a reset
    while processes hold the GPU) is the command responder's job, not the runner's.
    """

    async def isolate_gpu(self, gpu: GpuIdentity) -> RunResult: ...

    async def release_gpu(self, gpu: GpuIdentity) -> RunResult: ...

    async def reset_gpu(self, gpu: GpuIdentity) -> RunResult: ...

    async def kill_process(self, pid: int) -> RunResult: ...

    async def reboot_node(self) -> RunResult | None:
        """Reboot (or run the configured hook); None when no reboot hook is configured."""
        ...

    async def health_command(self) -> RunResult | None:
        """Run the configured extra health check (e.g. ``dcgmi diag -r 1``); None when none is configured."""
        ...


@dataclass(frozen=True, slots=True)
class PidInfo:
    """What the host knows of a PID NVML reported: whether it is visible in our /proc, and its pod UID."""

    visible: bool
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A container the kubelet allocated a GPU to. ``uid`` is None where the source cannot tell it."""

    namespace: str
    name: str
    uid: str | None
    container: str

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid, "container": self.container}


@runtime_checkable
class PodResourcesView(Protocol):
    """Which containers hold which GPU, as the kubelet's device manager allocated them."""

    def gpu_holders(self, gpu: GpuIdentity) -> tuple[GpuHolder, ...] | None:
        """The containers holding ``gpu``; None when this source cannot tell (then nobody is assumed)."""
        ...


@runtime_checkable
class PodView(Protocol):
    """Pods and processes on the node, for orphan detection."""

    def running_pod_uids(self) -> frozenset[str] | None:
        """UIDs of the pods the kubelet runs now; None when that cannot be known (then nothing is an orphan)."""
        ...

    def pid_info(self, pid: int) -> PidInfo: ...


# --- real implementations ----------------------------------------------------------------------------

# kubepods cgroup paths carry the pod UID as pod<uid> (cgroupfs: dashes; systemd driver: underscores).
_POD_UID_RE = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})", re.IGNORECASE
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in the contents of ``/proc/<pid>/cgroup`` (v1 or v2, either cgroup driver), or None."""
    for line in text.splitlines():
        if "kubepods" not in line:
            continue
        m = _POD_UID_RE.search(line)
        if m is not None:
            return m.group(1).replace("_", "-").lower()
    return None


def kubelet_pod_uids(pods_dir: Path) -> frozenset[str] | None:
    """UIDs of the pods the kubelet has on this node: the directories under ``/var/lib/kubelet/pods``.

    The kubelet creates ``<pods_dir>/<uid>`` before a pod's containers start and removes it only after they
    are gone, so a PID whose pod UID is not there belongs to a pod that no longer exists.
    """
    try:
        with os.scandir(pods_dir) as entries:
            return frozenset(e.name for e in entries if e.is_dir())
    except OSError:
        return None


class ProcPodView:
    """``PodView`` over a ``/proc`` tree and a source of running pod UIDs (both injectable)."""

    def __init__(self, proc_root: Path | str = "/proc",
                 running_pods: Callable[[], frozenset[str] | None] | None = None,
                 kubelet_pods_dir: Path | str = "/var/lib/kubelet/pods") -> None:
        self.proc_root = Path(proc_root)
        pods_dir = Path(kubelet_pods_dir)
        self._running = running_pods or (lambda: kubelet_pod_uids(pods_dir))

    def running_pod_uids(self) -> frozenset[str] | None:
        return self._running()

    def pid_info(self, pid: int) -> PidInfo:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(errors="replace")
        except FileNotFoundError:
            return PidInfo(visible=False)
        except OSError:
            return PidInfo(visible=True)  # there, but unreadable: not enough to call it an orphan
        return PidInfo(visible=True, pod_uid=pod_uid_from_cgroup(text))


class SubprocessHostRunner:
    """``HostRunner`` for a real node: ``nvidia-smi`` and the configured hooks as subprocesses.

    - isolate: ``nvidia-smi drain -p <pci> -m 1`` (no new work lands on the GPU); release: ``-m 0``;
    - reset: ``nvidia-smi --gpu-reset -i <index>``;
    - kill: SIGKILL to the PID (the agent runs with ``hostPID``);
    - reboot: ``reboot_command`` (refused when not configured); health: ``health_command`` (optional).
    """

    def __init__(self, *, nvidia_smi: str = "nvidia-smi", reboot_command: Sequence[str] | None = None,
                 health_command: Sequence[str] | None = None, timeout_s: float = 300.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.reboot_command = list(reboot_command) if reboot_command else None
        self.health_command_argv = list(health_command) if health_command else None
        self.timeout_s = timeout_s

    async def _run(self, argv: Sequence[str]) -> RunResult:
        shown = " ".join(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except OSError as e:
            return RunResult(False, f"{shown}: {e}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return RunResult(False, f"{shown}: timed out after {self.timeout_s:g}s")
        tail = out.decode(errors="replace").strip()[-2000:]
        ok = proc.returncode == 0
        return RunResult(ok, f"{shown}: exit {proc.returncode}" + (f": {tail}" if tail else ""))

    async def isolate_gpu(self, gpu: GpuIdentity) -> RunResult:
        if not gpu.pci_bus_id:
            return RunResult(False, f"GPU {gpu.index} has no known PCI bus id; nvidia-smi drain needs one")
        return await self._run([self.nvidia_smi, "drain", "-p", gpu.pci_bus_id, "-m", "1"])

    async def release_gpu(self, gpu: GpuIdentity) -> RunResult:
        if not gpu.pci_bus_id:
            return RunResult(False, f"GPU {gpu.index} has no known PCI bus id; nvidia-smi drain needs one")
        return await self._run([self.nvidia_smi, "drain", "-p", gpu.pci_bus_id, "-m", "0"])

    async def reset_gpu(self, gpu: GpuIdentity) -> RunResult:
        return await self._run([self.nvidia_smi, "--gpu-reset", "-i", str(gpu.index)])

    async def kill_process(self, pid: int) -> RunResult:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return RunResult(True, f"pid {pid} already gone")
        except PermissionError as e:
            return RunResult(False, f"kill {pid}: {e}")
        return RunResult(True, f"sent SIGKILL to pid {pid}")

    async def reboot_node(self) -> RunResult | None:
        if not self.reboot_command:
            return None
        return await self._run(self.reboot_command)

    async def health_command(self) -> RunResult | None:
        if not self.health_command_argv:
            return None
        return await self._run(self.health_command_argv)
