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
  process, the reboot command, the configured health and bug-report commands).
- ``GpuControl``: what the reset needs besides ``nvidia-smi``: a GPU's persistence mode (read and set) and
  who answers at a PCI address after the reset (``NvmlBackend`` and the simulated node implement it).
- ``PodView``: which pods the kubelet runs and which pod a PID belongs to (for orphan detection).
- ``PodResourcesView``: which pods (namespace, name, UID, container) the kubelet gave a GPU to (device
  plugin or DRA), for ``isolate_gpu``/``status`` replies and so for the service's per-GPU eviction. On a
  real node and a simulated one alike it is ``remediator.agent.holders.KubeletHolders``: the kubelet's
  PodResources gRPC socket joined with the GPU backend; without a socket there is none and the agent says
  it cannot tell.
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
    "DEFAULT_BUG_REPORT_COMMAND",
    "THROTTLE_HW_POWER_BRAKE",
    "THROTTLE_HW_SLOWDOWN",
    "THROTTLE_HW_THERMAL",
    "THROTTLE_SW_THERMAL",
    "EccCounts",
    "GpuBackend",
    "GpuControl",
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
    "gpu_reset_target",
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

    async def bug_report(self) -> RunResult | None:
        """Run the configured bug-report collection (``nvidia-bug-report.sh``); None when none is configured."""
        ...


@runtime_checkable
class GpuControl(Protocol):
    """Persistence mode and identity by PCI address: what a safe reset reads and changes besides the reset.

    Blocking (NVML calls); the agent calls them from a worker thread.
    """

    def persistence_mode(self, index: int) -> bool | None:
        """Whether persistence mode is on for GPU ``index``; None when it cannot be read."""
        ...

    def set_persistence_mode(self, index: int, enabled: bool) -> str | None:
        """Turn persistence mode on or off; None when done, else why not (one line)."""
        ...

    def identity_at(self, pci_bus_id: str) -> GpuIdentity | None:
        """The GPU answering at ``pci_bus_id`` now, read afresh (its UUID after a reset); None when no GPU
        answers there (lost, or gone from the bus)."""
        ...


def gpu_reset_target(gpu: GpuIdentity) -> str | None:
    """What ``nvidia-smi --gpu-reset -i`` is given for ``gpu``: its UUID, else its PCI bus id; never the
    index, which can name another GPU once a drain or a reset renumbered them. None when neither is known."""
    return gpu.uuid or gpu.pci_bus_id


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
    """Which containers hold which GPU, as the kubelet allocated them. An implementation may also offer
    ``holder_map(identities)`` (every GPU's holders from one question to the kubelet), which the command
    responder prefers for a reply naming several GPUs."""

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

# What the agent runs to collect NVIDIA's bug report after a failed reset (``--bug-report-command``): the
# driver's own script, which writes nvidia-bug-report.log.gz into the working directory (the state directory).
DEFAULT_BUG_REPORT_COMMAND: tuple[str, ...] = ("nvidia-bug-report.sh",)

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

    def device_openers(self, device: str, *, limit: int = 64, max_pids: int = 100_000) -> list[int]:
        """PIDs (other than this process) with ``device`` (e.g. ``/dev/nvidia3``) open: each
        ``/proc/<pid>/fd/*`` link is read. NVML lists compute processes only; the GPU Operator's device
        plugin and DCGM hold the device node open without one, and ``nvidia-smi --gpu-reset`` refuses while
        anything does. Bounded: at most ``limit`` PIDs found, ``max_pids`` processes looked at; processes that
        vanish or cannot be read are skipped."""
        found: list[int] = []
        me = os.getpid()
        try:
            entries = os.scandir(self.proc_root)
        except OSError:
            return found
        with entries:
            for n, entry in enumerate(entries):
                if n >= max_pids or len(found) >= limit:
                    break
                if not entry.name.isdigit() or int(entry.name) == me:
                    continue
                try:
                    with os.scandir(Path(entry.path) / "fd") as fds:
                        if any(_link(fd.path) == device for fd in fds):
                            found.append(int(entry.name))
                except OSError:
                    continue
        return sorted(found)


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


@runtime_checkable
class DeviceOpeners(Protocol):
    """Who holds a device node open (``ProcPodView`` on a real node)."""

    def device_openers(self, device: str) -> list[int]: ...


class SubprocessHostRunner:
    """``HostRunner`` for a real node: ``nvidia-smi`` and the configured hooks as subprocesses.

    - isolate: ``nvidia-smi drain -p <pci> -m 1`` (no new work lands on the GPU); release: ``-m 0``;
    - reset: ``nvidia-smi --gpu-reset -i <uuid>`` (the PCI bus id when the UUID is unknown; never the index);
    - kill: SIGKILL to the PID (the agent runs with ``hostPID``);
    - reboot: ``reboot_command`` (refused when not configured); health: ``health_command`` (optional);
    - bug report: ``bug_report_command`` (``nvidia-bug-report.sh`` by default; None turns it off), run for at
      most ``bug_report_timeout_s``; like every command here, only the last 2,000 characters of its output
      are kept.
    """

    def __init__(self, *, nvidia_smi: str = "nvidia-smi", reboot_command: Sequence[str] | None = None,
                 health_command: Sequence[str] | None = None, timeout_s: float = 300.0,
                 bug_report_command: Sequence[str] | None = DEFAULT_BUG_REPORT_COMMAND,
                 bug_report_timeout_s: float = 600.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.reboot_command = list(reboot_command) if reboot_command else None
        self.health_command_argv = list(health_command) if health_command else None
        self.bug_report_argv = list(bug_report_command) if bug_report_command else None
        self.timeout_s = timeout_s
        self.bug_report_timeout_s = bug_report_timeout_s

    async def _run(self, argv: Sequence[str], timeout_s: float | None = None) -> RunResult:
        limit = self.timeout_s if timeout_s is None else timeout_s
        shown = " ".join(argv)
        try:
            # a session of its own: on a timeout the whole process group goes (nvidia-bug-report.sh forks)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            return RunResult(False, f"{shown}: {e}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return RunResult(False, f"{shown}: timed out after {limit:g}s")
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
        target = gpu_reset_target(gpu)
        if target is None:
            return RunResult(False, f"GPU {gpu.index} has neither a known UUID nor a PCI bus id; a reset by "
                                    "index could reach another GPU, so none is attempted")
        return await self._run([self.nvidia_smi, "--gpu-reset", "-i", target])

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

    async def bug_report(self) -> RunResult | None:
        if not self.bug_report_argv:
            return None
        return await self._run(self.bug_report_argv, self.bug_report_timeout_s)
