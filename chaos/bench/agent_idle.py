"""The node agent's own cost: resident memory and CPU of ``remediator agent --sim-gpus 8`` at idle.

Where it sits: a benchmark beside the agent. ``run`` starts an embedded nats-server with the streams
provisioned, starts the agent as its own process on a simulated node with 8 GPUs (one training pod with a
GPU process per GPU, so the container-log scanner follows 8 files and the orphan check has work),
waits ``warmup_s``, and then samples ``/proc/<pid>`` over ``seconds``: CPU as user+system time over wall
time (percent of one core) and VmRSS / VmHWM. The agent runs with its production defaults (GPU poll every
5 s, kernel log polled every 0.25 s, container logs every 0.5 s). Targets: <= 60 MB and <= 2 % of a core.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET_RSS_MB = 60.0
TARGET_CPU_PERCENT = 2.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run(seconds: float = 20.0, *, gpus: int = 8, warmup_s: float = 5.0,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the idle agent; the returned figures are ``rss_mb``, ``cpu_percent`` and friends."""
    from chaos.sim.gpu_node import GIB, SimGpuNode
    from remediator import bus
    from remediator.natsd import EmbeddedNats
    from remediator.settings import Settings

    say = progress or (lambda _m: None)
    with EmbeddedNats(secure=True) as nats_server, tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        asyncio.run(bus.provision_at(nats_server.url, Settings(), name="bench-agent-idle",
                                     credentials=bus.Credentials(creds_file=nats_server.creds("admin"))))
        agent_creds = nats_server.agent_creds("bench-node", Path(tmp) / "bench-node.creds")  # its own identity
        state = Path(tmp) / "state"
        sim = SimGpuNode(state / "sim", name="bench-node", gpus=gpus)
        for i in range(gpus):
            uid = sim.add_pod(f"llama-worker-{i}", namespace="train", job="llama", rank=i)
            sim.add_process(i, 10_000 + i, 40 * GIB, uid)
            sim.pod_log(f"llama-worker-{i}", f"rank {i} initialised")
        argv = [sys.executable, "-c", "from remediator.cli import main; main()", "agent", "--node", "bench-node",
                "--nats", nats_server.url, "--creds", agent_creds, "--sim-gpus", str(gpus), "--state", str(state),
                "--log-level", "WARNING"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            say(f"agent pid {proc.pid}: warming up {warmup_s:g}s")
            time.sleep(warmup_s)
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
            say(f"measuring {seconds:g}s")
            time.sleep(seconds)
            cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
            rss_kb = _status_kb(proc.pid, "VmRSS")
            hwm_kb = _status_kb(proc.pid, "VmHWM")
            threads = _status_kb(proc.pid, "Threads")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
    cpu_percent = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    rss_mb = rss_kb / 1024
    return {
        "rss_mb": round(rss_mb, 1),
        "rss_peak_mb": round(hwm_kb / 1024, 1),
        "cpu_percent": round(cpu_percent, 2),
        "cpu_seconds": round(cpu1 - cpu0, 3),
        "seconds": round(t1 - t0, 1),
        "gpus": gpus,
        "threads": threads,
        "target_rss_mb": TARGET_RSS_MB,
        "target_cpu_percent": TARGET_CPU_PERCENT,
        "passed": rss_mb <= TARGET_RSS_MB and cpu_percent <= TARGET_CPU_PERCENT,
    }


if __name__ == "__main__":  # pragma: no cover - manual use: python -m chaos.bench.agent_idle [SECONDS]
    import json

    print(json.dumps(run(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0,
                         progress=lambda m: print(m, file=sys.stderr)), indent=2))
