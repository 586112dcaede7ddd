"""``remediator bench dispatch``: how many agent events a dispatcher replica handles per second, and at what CPU.

Where it sits: beside the service, never on its path. It runs what ``serve`` runs for FAULTS — JetStream
(embedded ``nats-server`` with auth), the durable ``dispatch`` consumer, the real handlers with their state
in KV by compare-and-set, the audit trail, decisions published to REMEDIATIONS — with no executor (the
decisions wait in their stream).

``events`` realistic agent events over ``nodes`` nodes are published first, as a backlog, by a bench-only
identity that speaks for every node's agent (as ``bench storm`` does): mostly informational (health checks
that pass, single-bit ECC counts under the rate threshold, application Xids 13/31/43, thermal readings,
NCCL warnings), ``FATAL_SHARE`` of them fatal (Xid 79 and 48), each node's events in time order. Then
``replicas`` dispatchers, each in a process of its own sharing the durable consumer, drain the backlog; the
clock runs from the moment they are told to go to the moment the consumer has nothing pending or unacked.

Top-level keys: ``events_per_s``, ``cpu_ms_per_event`` (CPU of the replicas' processes over the drain, per
event), ``nats_cpu_ms_per_event`` (the server's), ``replicas``, and ``events``, ``nodes``, ``drain_s``,
``decisions`` (published to REMEDIATIONS), ``cpu_ms_per_event_by_replica``, ``cas_lost`` (compare-and-sets
of a history another replica won, each re-read and decided again), ``audit_records`` (``appended``, and
``relinked``: appends refused because the other replica had appended to that node's chain first, each
re-linked after its record), ``cores_busy`` (the CPU of replicas and
server over the drain, in cores) beside ``cpus`` (the machine's), ``rss_mb`` (replicas, server),
``event_loop`` (the loops the replicas ran on: ``serve``'s, ``remediator.eventloop``), ``load_average``,
``audit`` (the audit mode below).
On a 2-core machine two replicas and the server share two cores: ``cores_busy`` near ``cpus`` says the
cores, not the replicas, are the limit; compare the CPU per event, not only the rate. The figures are
noisy on a shared machine.

``audit`` is the replicas' audit trail (``chaos.bench.audit_modes``: ``full`` as ``serve`` writes it, ``unsigned``,
or ``off``); the difference between two modes' ``cpu_ms_per_event`` is what that part of the trail costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from chaos.bench.audit_modes import AUDIT_MODES, bench_audit
from chaos.bench.storm import _cpu_s, _fleet_of_agents, _rss_mb
from remediator import eventloop, heap
from remediator.contracts import FaultEvent, GpuRef, utcnow

FATAL_SHARE = 0.03
Progress = Callable[[str], None] | None


def mixed_events(count: int, nodes: int, *, seed: int = 0) -> list[FaultEvent]:
    """``count`` agent events over ``nodes`` nodes: mostly informational, ``FATAL_SHARE`` fatal."""
    rng = random.Random(seed)
    start = utcnow() - timedelta(minutes=10)
    out: list[FaultEvent] = []
    for i in range(count):
        node = f"gpu-node-{rng.randrange(nodes)}"
        gpu_index = rng.randrange(8)
        gpu = GpuRef(index=gpu_index, pci_bus_id=f"0000:{0x18 + gpu_index * 0x10:02x}:00.0")
        at = start + timedelta(milliseconds=i)
        common: dict[str, Any] = {"id": f"agent|{node}|bench|{i}", "source": "agent", "node": node,
                                  "observed_at": at, "received_at": at}
        roll = rng.random()
        if roll < FATAL_SHARE:
            code = rng.choice((79, 48))
            out.append(FaultEvent(**common, gpu=gpu, kind="xid", code=code, is_fatal=True,
                                  message=f"NVRM: Xid (PCI:{gpu.pci_bus_id}): {code}, pid=0, fatal"))
        elif roll < 0.40:
            out.append(FaultEvent(**common, gpu=gpu, kind="health_check", code="nvml", is_healthy=True,
                                  message="GPU health check passed"))
        elif roll < 0.60:
            out.append(FaultEvent(**common, gpu=gpu, kind="ecc", code="sbe_volatile",
                                  labels={"value": str(rng.randrange(1, 3))}, message="single-bit ECC errors"))
        elif roll < 0.75:
            code = rng.choice((13, 31, 43))
            out.append(FaultEvent(**common, gpu=gpu, kind="xid", code=code,
                                  message=f"NVRM: Xid (PCI:{gpu.pci_bus_id}): {code}, pid={rng.randrange(9999)}, "
                                          "application error"))
        elif roll < 0.90:
            out.append(FaultEvent(**common, gpu=gpu, kind="thermal", code="temperature",
                                  labels={"value": str(rng.randrange(60, 80))}, message="GPU temperature"))
        else:
            out.append(FaultEvent(**common, gpu=gpu, kind="nccl_error", code="ncclRemoteError",
                                  message="NCCL WARN NET/IB : Got completion with error 12, opcode 0"))
    return out


def _replica(url: str, creds: str, index: int, ready: Any, go: Any, stop: Any, report: Any,
             audit_mode: str) -> None:  # pragma: no cover - child process
    eventloop.run(_replica_main(url, creds, index, ready, go, stop, report, audit_mode))  # serve's loop


async def _replica_main(url: str, creds: str, index: int, ready: Any, go: Any, stop: Any, report: Any,
                        audit_mode: str) -> None:
    import handlers
    from remediator import bus, telemetry
    from remediator.dispatch import Dispatcher
    from remediator.metrics import ServiceMetrics
    from remediator.service import configured_registry
    from remediator.settings import Settings
    from remediator.signing import Signer, generate_seed

    assert handlers
    settings = Settings(nats_url=url, replica_id=f"bench-dispatch-{index}")
    nc, js = await bus.connect(url, name=f"bench-dispatch-{index}", credentials=bus.Credentials(creds_file=creds))
    telemetry.setup()  # serve's tracer provider and audit log (signed, checkpointed, counted for /metrics)
    audit = bench_audit(audit_mode, js, settings, f"bench-dispatch-{index}", Signer(generate_seed()),
                        observers=[ServiceMetrics().observe])
    dispatcher = await Dispatcher.create(nc, js, settings, audit, registry=configured_registry(settings))
    heap.settle()  # as serve does once started
    ready.set()
    await asyncio.to_thread(go.wait)
    cpu0 = time.process_time()
    halt = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(halt))
    await asyncio.to_thread(stop.wait)
    cpu = time.process_time() - cpu0
    halt.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 15)
    report.put({"index": index, "cpu_s": cpu, "events": dispatcher.stats.events,
                "cas_lost": dispatcher.stats.cas_lost,
                "audit_appended": audit.appended, "audit_relinked": audit.relinked,
                "rss_mb": _rss_mb(os.getpid(), peak=True), "event_loop": eventloop.current()})
    with contextlib.suppress(Exception):
        await nc.close()


async def run(events: int = 20_000, nodes: int = 2000, replicas: int = 1, progress: Progress = None, *,
              audit: str = "full") -> dict[str, Any]:
    """Publish the backlog, drain it with ``replicas`` processes whose audit trail is ``audit`` (one of
    ``AUDIT_MODES``); the figures of the module docstring."""
    from remediator import bus
    from remediator.natsd import EmbeddedNats
    from remediator.settings import Settings
    from remediator.subjects import FAULTS_STREAM, REMEDIATIONS_STREAM

    if events < 1 or nodes < 1 or replicas < 1:
        raise ValueError("events, nodes and replicas must be at least 1")
    if audit not in AUDIT_MODES:
        raise ValueError(f"audit must be one of {', '.join(AUDIT_MODES)} (got {audit!r})")
    say = progress or (lambda _m: None)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="remediator-dispatch-") as tmp, EmbeddedNats(secure=True) as server:
        settings = Settings(nats_url=server.url)
        nc_a, js_a = await bus.connect(server.url, name="bench-admin",
                                       credentials=bus.Credentials(creds_file=server.creds("admin")))
        try:
            await bus.provision(js_a, settings)
            nc_p, js_p = await bus.connect(server.url, name="bench-agents",
                                           credentials=_fleet_of_agents(server, Path(tmp)))
            backlog = mixed_events(events, nodes)
            say(f"dispatch: publishing {events} agent events over {nodes} nodes as a backlog")
            for i in range(0, events, 500):
                await asyncio.gather(*(bus.publish_event(js_p, e, timeout=30) for e in backlog[i:i + 500]))
            await nc_p.close()
            ready = [ctx.Event() for _ in range(replicas)]
            go, stop, report = ctx.Event(), ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=_replica, args=(server.url, server.creds("dispatcher"), i, ready[i], go, stop,
                                                        report, audit), daemon=True) for i in range(replicas)]
            for p in procs:
                p.start()
            try:
                for r in ready:
                    if not await asyncio.to_thread(r.wait, 120):
                        raise RuntimeError("a dispatcher replica did not start")
                say(f"dispatch: {replicas} replica(s) draining (audit {audit})")
                nats_cpu0 = _cpu_s(server.proc.pid) if server.proc else None
                t0 = time.monotonic()
                go.set()
                deadline = t0 + max(120.0, events / 50)
                while time.monotonic() < deadline:
                    info = await js_a.consumer_info(FAULTS_STREAM, bus.DISPATCH_CONSUMER)
                    if info.num_pending == 0 and info.num_ack_pending == 0:
                        break
                    await asyncio.sleep(0.05)
                drain_s = time.monotonic() - t0
                nats_cpu1 = _cpu_s(server.proc.pid) if server.proc else None
                stop.set()
                reports = [await asyncio.to_thread(report.get, True, 60) for _ in procs]
            finally:
                stop.set()
                for p in procs:
                    await asyncio.to_thread(p.join, 20)
                    if p.is_alive():
                        p.kill()
            decisions = (await js_a.stream_info(REMEDIATIONS_STREAM)).state.messages
            nats_rss = _rss_mb(server.proc.pid, peak=True) if server.proc else None
        finally:
            await nc_a.close()
    cpu = sum(r["cpu_s"] for r in reports)
    nats_cpu = nats_cpu1 - nats_cpu0 if nats_cpu0 is not None and nats_cpu1 is not None else None
    return {
        "events_per_s": round(events / drain_s, 1),
        "cpu_ms_per_event": round(1000 * cpu / events, 3),
        "nats_cpu_ms_per_event": round(1000 * nats_cpu / events, 3) if nats_cpu is not None else None,
        "replicas": replicas,
        "events": events,
        "nodes": nodes,
        "drain_s": round(drain_s, 3),
        "decisions": decisions,
        "handled_by_replica": [r["events"] for r in sorted(reports, key=lambda r: r["index"])],
        "cas_lost": sum(r["cas_lost"] for r in reports),
        "audit_records": {"appended": sum(r["audit_appended"] for r in reports),
                          "relinked": sum(r["audit_relinked"] for r in reports)},
        "cores_busy": round((cpu + (nats_cpu or 0.0)) / drain_s, 2),
        "cpus": os.cpu_count(),
        "cpu_ms_per_event_by_replica": [round(1000 * r["cpu_s"] / max(1, r["events"]), 3)
                                        for r in sorted(reports, key=lambda r: r["index"])],
        "rss_mb": {"replicas": [r["rss_mb"] for r in sorted(reports, key=lambda r: r["index"])],
                   "nats_server": nats_rss},
        "event_loop": sorted({r["event_loop"] for r in reports}),  # the replicas', serve's: ["uvloop"]
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "audit": audit,
    }
