"""``remediator agent --check``: what the agent can see on this node, and one line per missing source.

Where it sits: beside the agent's composition (``remediator.cli.agent`` builds the same host parts as for a
run, then calls ``check_sources`` instead of starting the agent). It reads each source once, bounded, and
changes nothing: NVML (or the simulated GPUs), the kernel log (``--kmsg``/``--journal``), the kubelet's
PodResources socket (one ``List``, joined with the GPUs as the holder view joins it), the container-log and
kubelet pod directories, and NATS with the agent's credentials (connect, then close).

Each source is reported as ``{"ok": true|false|null, ..., "detail": "..."}``: ``null`` where the agent is not
configured to use it and does not need it. Every ``false`` is also a line of ``problems`` that names the fix;
the command exits 1 when there is any. The keys are listed in ARCHITECTURE.md ("The node agent").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remediator.agent.holders import PodUids, join
from remediator.errors import RemediatorError
from remediator.gpu import GpuBackend, GpuIdentity

__all__ = ["CHECK_KEYS", "check_sources", "render"]

CHECK_KEYS = ("node", "ok", "gpus", "kernel_log", "pod_resources", "pod_logs", "kubelet_pods", "nats", "problems")
NATS_TIMEOUT_S = 3.0
JOURNAL_TIMEOUT_S = 5.0


def _gpus(backend: GpuBackend | None, source: str | None, error: str | None) -> tuple[dict[str, Any],
                                                                                       list[GpuIdentity]]:
    if error is not None:
        return {"ok": False, "source": source, "count": 0, "driver_version": None, "gpus": [], "detail": error}, []
    if backend is None:
        return {"ok": None, "source": None, "count": 0, "driver_version": None, "gpus": [],
                "detail": "no GPU backend (--nvml or --sim-gpus N)"}, []
    idents = [backend.snapshot(i).identity for i in range(backend.gpu_count())]
    version = getattr(backend, "driver_version", None)
    minor = getattr(backend, "minor_number", None)
    rows = [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
             "minor": minor(g.index) if callable(minor) else None} for g in idents]
    ok = bool(idents)
    return {"ok": ok, "source": source, "count": len(idents),
            "driver_version": version() if callable(version) else None, "gpus": rows,
            "detail": f"{len(idents)} GPU(s)" if ok else "NVML sees no GPU: run the agent with the NVIDIA runtime "
                                                          "class or NVIDIA_VISIBLE_DEVICES=all"}, idents


def _kmsg(path: str) -> tuple[bool, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return False, (f"--kmsg {path}: {e.strerror}; mount the host's /dev/kmsg read-only (privileged "
                       "container) or use --journal")
    try:
        try:
            os.read(fd, 8192)
        except BlockingIOError:
            pass  # /dev/kmsg with nothing new: readable
        except OSError as e:
            return False, f"--kmsg {path}: {e.strerror}; the container needs privileged mode to read /dev/kmsg"
    finally:
        os.close(fd)
    return True, f"{path} readable"


async def _journal(command: str = "journalctl") -> tuple[bool, str]:
    exe = shutil.which(command)
    if exe is None:
        return False, f"--journal: {command} is not installed in the agent's image"
    try:
        proc = await asyncio.create_subprocess_exec(exe, "-k", "-n", "1", "-o", "json", "--no-pager", "-q",
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), JOURNAL_TIMEOUT_S)
    except (OSError, TimeoutError) as e:
        return False, f"--journal: {command} did not answer ({type(e).__name__}); mount /var/log/journal"
    if proc.returncode != 0 or not out.strip():
        why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no kernel messages"]
        return False, (f"--journal: {command} -k read nothing ({why[0][:160]}); mount /var/log/journal, "
                       "/run/log/journal and /etc/machine-id read-only")
    return True, "journalctl -k readable"


def _dir(path: Path | None, what: str, fix: str, required: bool) -> dict[str, Any]:
    if path is None:
        return {"ok": None, "dir": None, "pods": 0, "detail": f"no {what} configured"}
    try:
        with os.scandir(path) as entries:
            n = sum(1 for e in entries if e.is_dir())
    except OSError as e:
        ok: bool | None = False if required else None
        return {"ok": ok, "dir": str(path), "pods": 0, "detail": f"{what} {path}: {e.strerror}; {fix}"}
    return {"ok": True, "dir": str(path), "pods": n, "detail": f"{n} pod director{'y' if n == 1 else 'ies'}"}


def _pod_resources(socket: str | None, explicit: bool, required: bool, idents: list[GpuIdentity],
                   uids: PodUids, minor: Callable[[GpuIdentity], int | None], timeout_s: float) -> dict[str, Any]:
    base: dict[str, Any] = {"ok": None, "socket": socket, "pods": 0, "holders": {}, "unknown_devices": []}
    if socket is None:
        return {**base, "ok": False if required else None,
                "detail": "no kubelet pod-resources socket: which pods hold a GPU is unknown; mount "
                          "/var/lib/kubelet/pod-resources (the chart does) or pass --pod-resources SOCKET"}
    from remediator.adapters.podresources import PodResourcesClient

    try:
        with PodResourcesClient(socket, timeout_s=timeout_s) as client:
            pods = client.list()
    except RemediatorError as e:
        return {**base, "ok": False if (required or explicit) else None, "detail": str(e)}
    found = join(pods, idents, uid=uids.table(), minor=minor)
    by_gpu = {g.uuid or g.key: [f"{h.namespace}/{h.name}" + (f" ({h.uid})" if h.uid else " (uid unknown)")
                                for h in found.of(g)] for g in idents if found.of(g)}
    return {**base, "ok": True, "pods": len(pods), "holders": by_gpu, "unknown_devices": list(found.unknown),
            "detail": f"{len(pods)} pod(s), {len(by_gpu)} GPU(s) held"}


async def _nats(url: str, creds_file: str | None, node: str) -> dict[str, Any]:
    from remediator import bus
    from remediator.bus import redact_url
    from remediator.subjects import FAULTS_STREAM, faults_subject

    shown = redact_url(url)
    out: dict[str, Any] = {"ok": False, "url": shown, "creds": creds_file}
    try:
        credentials = bus.Credentials(creds_file=creds_file) if creds_file else None
        nc, _ = await bus.connect_within(url, NATS_TIMEOUT_S, name="remediator-agent-check", quiet=True,
                                         credentials=credentials, allow_reconnect=False,
                                         max_reconnect_attempts=0)
    except (RemediatorError, ValueError, OSError) as e:
        fix = "" if creds_file else " (and this node's --creds FILE or --identity-url)"
        return {**out, "detail": f"{' '.join(str(e).split())[:300]}{fix}"}
    except Exception as e:  # an authorization violation and the like: name it, in one line
        return {**out, "detail": f"NATS at {shown} refused the agent ({type(e).__name__}: {e}); check --creds "
                                 "FILE (remediator bus creds --role agent --node NAME)"}
    # the bus must also store this node's events: the agent's own start-up check (nothing stored, no right
    # beyond publishing its faults subject)
    subject = faults_subject("agent", node)
    try:
        problem = await bus.verify_capture(nc.jetstream(), subject, FAULTS_STREAM, timeout=NATS_TIMEOUT_S)
    finally:
        with contextlib.suppress(Exception):  # closing a connection we only opened to test it
            await nc.close()
    connected = f"connected to {shown}" + (" with its credentials" if creds_file else "")
    if problem:
        return {**out, "detail": f"{connected}, but the bus cannot store this node's events: {problem}"}
    return {**out, "ok": True, "detail": f"{connected}; {FAULTS_STREAM} stores {subject}"}


async def check_sources(*, node: str, gpus: GpuBackend | None, gpu_source: str | None, gpu_error: str | None,
                        kmsg_path: str | None, journal: bool, pod_resources_socket: str | None,
                        pod_resources_explicit: bool, pod_logs_dir: str | None, pod_log_root: str,
                        kubelet_pods_dir: str, nats_url: str, creds_file: str | None,
                        timeout_s: float = 5.0) -> dict[str, Any]:
    """Every source the agent reads, checked once (see the module docstring); the report as a dict."""
    gpu_report, idents = await asyncio.to_thread(_gpus, gpus, gpu_source, gpu_error)
    with_gpus = gpus is not None or gpu_error is not None
    kernel: dict[str, Any] = {"ok": None, "kmsg": kmsg_path, "journal": journal, "detail": "no kernel log "
                              "configured (--kmsg /dev/kmsg or --journal): Xids come from NVML events only"}
    lines: list[str] = []
    if kmsg_path:
        ok, why = _kmsg(kmsg_path)
        lines.append(why)
        kernel["ok"] = ok
    if journal:
        ok, why = await _journal()
        lines.append(why)
        kernel["ok"] = ok if kernel["ok"] is None else kernel["ok"] and ok
    if lines:
        kernel["detail"] = "; ".join(lines)
    minor_fn = getattr(gpus, "minor_number", None)

    def minor(g: GpuIdentity) -> int | None:
        return minor_fn(g.index) if callable(minor_fn) else None

    logs = Path(pod_logs_dir or pod_log_root)
    report: dict[str, Any] = {
        "node": node,
        "gpus": gpu_report,
        "kernel_log": kernel,
        "pod_resources": await asyncio.to_thread(
            _pod_resources, pod_resources_socket, pod_resources_explicit, with_gpus, idents,
            PodUids(logs, kubelet_pods_dir), minor, timeout_s),
        "pod_logs": _dir(logs, "container log directory", "mount the host's /var/log/pods read-only (--pod-logs)",
                         pod_logs_dir is not None),
        "kubelet_pods": _dir(Path(kubelet_pods_dir), "kubelet pods directory",
                             "mount the host's /var/lib/kubelet/pods read-only (orphans and pod UIDs need it)",
                             with_gpus),
        "nats": await _nats(nats_url, creds_file, node),
    }
    problems = [f"{key}: {v['detail']}" for key, v in report.items() if isinstance(v, dict) and v.get("ok") is False]
    if not (kmsg_path or journal or gpus is not None or gpu_error or pod_logs_dir):
        problems.append("nothing to watch: pass --kmsg PATH, --journal, --nvml, --pod-logs DIR or --sim-gpus N")
    report["problems"] = problems
    report["ok"] = not problems
    return {k: report[k] for k in CHECK_KEYS}


def render(report: dict[str, Any]) -> str:
    """The report for a person: one line per source."""
    mark = {True: "ok  ", False: "FAIL", None: "-   "}
    out = [f"agent check for node {report['node']}: {'everything it needs is there' if report['ok'] else 'problems'}"]
    for key in CHECK_KEYS[2:-1]:
        v = report[key]
        out.append(f"  {mark[v['ok']]} {key:<14} {v['detail']}")
        if key == "gpus":
            out += [f"         GPU {g['index']}: {g['uuid']} {g['pci_bus_id']}" for g in v["gpus"]]
            if v.get("driver_version"):
                out.append(f"         driver {v['driver_version']}")
        if key == "pod_resources":
            out += [f"         {gpu}: {', '.join(pods)}" for gpu, pods in v["holders"].items()]
    return "\n".join(out)
