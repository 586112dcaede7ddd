"""What a verbose NCCL job log costs the node agent's container-log scanner.

Where it sits: a benchmark beside the agent's ``podlogs.PodLogScanner``. The log is what ``NCCL_DEBUG=INFO``
training jobs write: CRI-format lines, about 60 % ``NCCL INFO`` chatter (which passes the signature
prefilter, so every one of those is parsed), 35 % training progress, and one watchdog timeout, one NCCL
WARN and one CUDA OOM per ``signal_every`` lines.

Two figures:

- ``scan``: the scanner in this process over ``lines`` lines of such a log in 8 pod log files; CPU time per
  line and the share of one core that ``rate`` lines/s would take, and a check that exactly the injected
  signals were found;
- ``agent`` (``seconds`` > 0): ``remediator agent --pod-logs DIR`` as its own process while this process
  appends ``rate`` lines/s to those files; the agent's CPU (user+system over wall time) is the end-to-end
  cost, file polling and publishing included.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PODS = 8
UID_PREFIX = "7c0c9e2a-1111-2222-3333-"


def _pod_dir(root: Path, i: int) -> Path:
    return root / f"train_llama-worker-{i}_{UID_PREFIX}{i:012d}" / "trainer"


def _line(rng: random.Random, n: int, rank: int, signal_every: int) -> str:
    ts = f"2025-03-01T12:{n // 60000 % 60:02d}:{n // 1000 % 60:02d}.{n % 1000:03d}000000Z"
    k = n % signal_every
    if k == signal_every - 1:
        body = (f"[rank{rank}]:[E0301 12:00:00.000000 2161 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
                f"collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1048576, "
                f"NumelOut=1048576, Timeout(ms)=600000) ran for 600015 milliseconds before timing out.")
    elif k == signal_every - 2:
        body = (f"gpu-node-3:{4000 + rank}:{4100 + rank} [{rank}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got "
                f"completion from peer 10.0.3.{rank}<54321> with status=12 opcode=0 len=0 vendor err 129 (Recv)")
    elif k == signal_every - 3:
        body = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                "of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB "
                "memory in use.")
    else:
        r = rng.random()
        if r < 0.6:
            peer = (rank + 1) % 8
            choice = n % 3
            if choice == 0:
                body = (f"gpu-node-3:{4000 + rank}:{4100 + rank} [{rank}] NCCL INFO Channel {n % 32:02d}/0 : "
                        f"{rank}[{rank}] -> {peer}[{peer}] via P2P/IPC/read")
            elif choice == 1:
                body = (f"gpu-node-3:{4000 + rank}:{4100 + rank} [{rank}] NCCL INFO comm 0x5581d1e0 rank {rank} "
                        f"nranks 64 cudaDev {rank} nvmlDev {rank} busId 3b000 commId 0x1 - Init COMPLETE")
            else:
                body = (f"gpu-node-3:{4000 + rank}:{4100 + rank} [{rank}] NCCL INFO Connected all trees, "
                        f"{rank} -> {peer} [receive] via NET/IB/{rank}/GDRDMA")
        elif r < 0.95:
            body = (f" iteration {n:8d}/ 500000 | consumed samples: {n * 1024:12d} | elapsed time per iteration "
                    f"(ms): {rng.uniform(900, 1400):.1f} | learning rate: {rng.uniform(1e-5, 3e-4):.3E} | "
                    f"lm loss: {rng.uniform(1.5, 3.5):.6E} |")
        else:
            body = f"INFO:root:saved checkpoint step {n} in {rng.uniform(1, 30):.2f}s"
    return f"{ts} stderr F {body}\n"


def _write_logs(root: Path, lines: int, signal_every: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    files = []
    for i in range(PODS):
        d = _pod_dir(root, i)
        d.mkdir(parents=True, exist_ok=True)
        files.append(open(d / "0.log", "a"))  # noqa: SIM115 - closed below
    try:
        for n in range(lines):
            files[n % PODS].write(_line(rng, n, n % PODS, signal_every))
    finally:
        for f in files:
            f.close()
    return sum(os.path.getsize(_pod_dir(root, i) / "0.log") for i in range(PODS))


class _NullSink:
    async def submit(self, events: object) -> None:
        return None


def scan(lines: int = 200_000, *, rate: float = 2000.0, signal_every: int = 10_000) -> dict[str, Any]:
    """The scanner alone over ``lines`` lines: CPU µs per line and the core share ``rate`` lines/s takes."""
    from remediator.agent.podlogs import PodLogScanner
    from remediator.agent.state import StateStore

    with tempfile.TemporaryDirectory(prefix="bench-logscan-") as tmp:
        root = Path(tmp) / "pods"
        size = _write_logs(root, lines, signal_every)
        scanner = PodLogScanner(root, node="bench-node", sink=_NullSink(), state=StateStore(Path(tmp) / "state"),
                                clock=lambda: datetime(2025, 3, 1, tzinfo=UTC))
        scanner.discover()
        found = []
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(100_000):
            got = scanner.scan_once()
            found += got
            if not got and not scanner.behind:
                break
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    expected = 3 * (lines // signal_every)
    us_per_line = cpu / lines * 1e6
    return {
        "lines": lines,
        "bytes": size,
        "signals_expected": expected,
        "signals_found": len(found),
        "kinds": sorted({e.kind for e in found}),
        "cpu_seconds": round(cpu, 3),
        "us_per_line": round(us_per_line, 2),
        "lines_per_second": round(lines / cpu) if cpu else None,
        "mb_per_second": round(size / cpu / 1e6, 1) if cpu else None,
        "rate_lines_per_second": rate,
        "percent_of_core_at_rate": round(us_per_line * rate / 1e4, 2),
        "wall_seconds": round(wall, 3),
    }


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent(seconds: float = 20.0, *, rate: float = 2000.0, signal_every: int = 10_000) -> dict[str, Any]:
    """The agent process following 8 pod logs while ``rate`` lines/s are appended for ``seconds``."""
    from remediator import bus
    from remediator.natsd import EmbeddedNats
    from remediator.settings import Settings

    with EmbeddedNats(secure=True) as nats_server, tempfile.TemporaryDirectory(prefix="bench-logscan-") as tmp:
        asyncio.run(bus.provision_at(nats_server.url, Settings(), name="bench-agent-logscan",
                                     credentials=bus.Credentials(creds_file=nats_server.creds("admin"))))
        agent_creds = nats_server.agent_creds("bench-node", Path(tmp) / "bench-node.creds")  # its own identity
        root = Path(tmp) / "pods"
        _write_logs(root, PODS, signal_every)
        argv = [sys.executable, "-c", "from remediator.cli import main; main()", "agent", "--node", "bench-node",
                "--nats", nats_server.url, "--creds", agent_creds, "--pod-logs", str(root),
                "--state", str(Path(tmp) / "state"),
                "--log-level", "WARNING"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rng = random.Random(11)
        files = [open(_pod_dir(root, i) / "0.log", "a", buffering=1) for i in range(PODS)]  # noqa: SIM115
        try:
            time.sleep(4.0)
            cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
            n = 0
            tick = 0.05
            per_tick = rate * tick
            next_t = t0
            while time.monotonic() - t0 < seconds:
                for _ in range(int(per_tick)):
                    files[n % PODS].write(_line(rng, n, n % PODS, signal_every))
                    n += 1
                next_t += tick
                time.sleep(max(0.0, next_t - time.monotonic()))
            time.sleep(1.0)  # let it catch up on the last tick
            cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        finally:
            for f in files:
                f.close()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {
        "lines_written": n,
        "rate_lines_per_second": round(n / (t1 - t0 - 1.0)),
        "agent_cpu_percent": round(100.0 * (cpu1 - cpu0) / (t1 - t0), 2),
        "seconds": round(t1 - t0, 1),
    }


def run(lines: int = 200_000, seconds: float = 20.0, *, rate: float = 2000.0,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda _m: None)
    say(f"scanner over {lines} lines")
    out: dict[str, Any] = {"scan": scan(lines, rate=rate)}
    if seconds > 0:
        say(f"agent process following 8 logs at {rate:g} lines/s for {seconds:g}s")
        out["agent"] = agent(seconds, rate=rate)
    return out


if __name__ == "__main__":  # pragma: no cover - python -m chaos.bench.agent_logscan [LINES] [SECONDS]
    import json

    args = [float(a) for a in sys.argv[1:]]
    print(json.dumps(run(int(args[0]) if args else 200_000, args[1] if len(args) > 1 else 20.0,
                         progress=lambda m: print(m, file=sys.stderr)), indent=2))
