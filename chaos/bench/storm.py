"""``remediator bench storm``: a fatal-Xid storm through the real pipeline, without and with the breaker; and
``remediator bench webhook`` (``webhook``): Alertmanager POST to cordon, one alert at a time.

Where it sits: beside the service, never on its path (it loads ``chaos`` for the simulated cluster). Both run
what ``serve`` runs (``_pipeline``) — JetStream (embedded ``nats-server``), the dispatcher with the real
handlers and owner resolution, the executor with the real playbooks and the real Kubernetes adapter (official
client, rate limiter with its lanes, node cache, retries) — against the simulated Kubernetes API, which runs
in a child process so it does not share the GIL.

``failing`` of ``nodes`` GPU nodes report a fatal Xid 79 (GPU fallen off the bus), one event each, spread
evenly over 30 s (``burst``: all at once) and published to FAULTS as the node agent would. Each must end
tainted, cordoned and drained (playbook ``gpu-lost``). A node's cordon latency is from its event's publish
to the return of the request that cordoned it (the quarantine PATCH, which taints and cordons in one).

The main run (its figures are the top-level keys): breaker, budget and cooldown off; with ``default_limits``
the shipped client rate limit (``kube_qps``/``kube_burst``) and every guard but the breaker and the budget,
else the client limit raised to 5,000/s (what the pipeline itself can do). Keys: ``nodes, failing,
cordoned, finished, all_cordoned_s`` (first event to last cordon), ``cordons_per_s`` (cordons over
first-event-to-last-cordon time), ``p50_cordon_latency_s``, ``p99_cordon_latency_s``, ``all_finished_s`` (first
event to last run finished, when all did), ``cpu_ms_per_incident`` (CPU of this process — dispatcher,
executor, adapter and the publisher — over the run, per incident), ``api_requests_per_incident`` (requests
the adapter sent, watches included, per incident), ``api_requests_by_lane``, ``rss_mb`` (``service``,
``simulator``, ``nats_server``: peak resident memory), ``nats_cpu_ms_per_incident``, ``sim_seed_s``,
``load_average``, ``unfinished`` (nodes whose run did not finish within ``wait_s``), ``outcomes``, ``failed_steps``
(steps that failed, by step id: a drain a PodDisruptionBudget held past its timeout shows here), ``gc_pauses``
(``service`` over the run and ``simulator`` over its serving: the cyclic collector's ``passes``, ``full``
passes, ``total_ms`` and ``max_ms``; both processes freeze their start-up heap first, as ``serve`` does),
``audit_records`` (``written``, ``signed``: every one, as a replica signs; ``checkpoints`` written, the
stop's included), ``audit_flush`` (what ``serve`` does as it stops, after the runs: the ``chains`` written
since their last checkpoint and the ``s`` it took to anchor them), ``event_loop`` (the loop it ran on:
``serve``'s, ``remediator.eventloop``), ``audit`` (``--audit``: the service's audit trail as ``serve`` writes
it, ``unsigned`` or ``off``, ``chaos.bench.audit_modes``; the difference in ``cpu_ms_per_incident`` is what
that part of the trail costs an incident).

``with_breaker`` (unless ``breaker_run`` is off): the default guards, ``cordoned, breaker_tripped,
threshold``. The breaker must stop the storm after ``threshold`` quarantines; the rest are blocked
(recorded, nothing touched).

Targets (issue 14): burst 750 of 1,500 all cordoned within 3 s; with the default limits at least 10 cordons/s.
The figures are noisy on a shared machine: compare runs side by side, with the load average.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing as mp
import os
import resource
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remediator import eventloop, heap
from remediator.contracts import FaultEvent, GpuRef, utcnow
from remediator.errors import SetupError

SPREAD_S = 30.0
Progress = Callable[[str], None] | None
_BREAKER_LESS = "opt_out,dry_run,cooldown,lock,approval"  # --default-limits: every guard but breaker/budget


class GcPauses:
    """How long the cyclic garbage collector stopped this process, while installed (``gc.callbacks``): every
    thread waits for a pass, the event loop and an API server's handlers alike."""

    def __init__(self) -> None:
        self.passes = self.full = 0
        self.total_s = self.max_s = 0.0
        self._started = 0.0

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.passes += 1
        self.full += info.get("generation") == 2
        self.total_s += took
        self.max_s = max(self.max_s, took)

    def start(self) -> GcPauses:
        gc.callbacks.append(self._observe)
        return self

    def stop(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def __enter__(self) -> GcPauses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        return {"passes": self.passes, "full": self.full, "total_ms": round(1000 * self.total_s, 1),
                "max_ms": round(1000 * self.max_s, 1)}


def _serve_sim(nodes: int, kubeconfig: str, ready: Any, stop: Any, info: Any) -> None:  # pragma: no cover
    """The simulated cluster in a child process, served until ``stop`` (the read end of a pipe) says so or
    ends: the parent closing its end, or dying, stops it."""
    from chaos.sim.cluster import freeze_heap, seed_cluster
    from chaos.sim.kube_api import KubeApiServer

    t0 = time.monotonic()
    state = seed_cluster(nodes)
    info["seed_s"] = round(time.monotonic() - t0, 3)
    freeze_heap()
    info["seed_rss_mb"] = _rss_mb(os.getpid())
    server = KubeApiServer(state).start()
    server.write_kubeconfig(kubeconfig)
    with GcPauses() as pauses:
        ready.set()
        with contextlib.suppress(EOFError, OSError):
            stop.recv()
    info["gc_pauses"] = pauses.summary()
    info["peak_rss_mb"] = _rss_mb(os.getpid(), peak=True)
    server.stop()


def _rss_mb(pid: int, *, peak: bool = False) -> float | None:
    """Resident memory of ``pid`` in MB from /proc (``VmHWM``, the peak, with ``peak``), None elsewhere."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` from /proc/<pid>/stat, None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def _fleet_of_agents(server: Any, root: Path) -> Any:
    """One connection that speaks for every node's agent (``faults.agent.*``): the storm's stand-in for a
    fleet of agents, a bench-only identity signed by the embedded operator's roles key (no role of
    ``remediator.identity.roles`` may do this; each real agent names its own node only)."""
    from datetime import UTC, datetime

    from remediator import bus
    from remediator.identity import creds, jwt, keys

    store = server.store
    user = keys.create("user")
    claims = jwt.user_claims(user.public_key, name="storm-agent-fleet", iat=int(datetime.now(UTC).timestamp()),
                             exp=None, issuer_account=store.account.public_key, tags=[],
                             permissions={"pub": {"allow": ["faults.agent.*"]}, "sub": {"allow": ["_INBOX.>"]}})
    path = creds.write(root / "storm-fleet.creds", jwt.encode(claims, store.roles_key), user)
    return bus.Credentials(creds_file=str(path))


def _event(node: str, now_iso: Any) -> FaultEvent:
    return FaultEvent(id=f"storm|{node}|79", source="agent", node=node,
                      gpu=GpuRef(index=0, pci_bus_id="0000:3b:00.0"), kind="xid", code=79, is_fatal=True,
                      message="NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
                      observed_at=now_iso, received_at=now_iso)


class SimulatorDied(SetupError):
    """The simulated cluster's process ended while a benchmark used it: nothing it measured after is true."""


@dataclass
class ClusterChild:
    """What ``simulated_cluster`` yields: whether its child died. The benchmarks' waiting loops stop on it, as
    the cancel it sends may be swallowed (a NATS publish whose ack came with it: 3.11's ``wait_for``)."""

    died: bool = False


async def _death(child: Any, nodes: int) -> str:
    await asyncio.to_thread(child.join, 5)  # its end is known once it was reaped: the sentinel may come first
    code = child.exitcode
    how = f"exit status {code}"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            how = f"killed by {signal.Signals(-code).name}"
    hint = "; out of memory? The kernel's OOM killer sends SIGKILL (see dmesg)" if code == -signal.SIGKILL else ""
    return f"the simulated cluster of {nodes:,} nodes died ({how}{hint}); nothing after that was measured"


@dataclass
class _Pipeline:
    """What one benchmark run holds: the bus, the settings, the adapter and the running service parts."""

    server: Any
    settings: Any
    adapter: Any
    kube: Any
    executor: Any
    js_x: Any
    js_p: Any
    root: Path
    cordoned_at: dict[str, float]
    sim_info: dict[str, Any] = field(default_factory=dict)
    nc_x: Any = None  # the service connection (the dispatcher's, the executor's, the webhook ingest's)
    audit: Any = None  # the audit log they share
    audit_records: dict[str, int] = field(default_factory=dict)  # records it wrote: written, signed
    cluster: ClusterChild = field(default_factory=ClusterChild)  # the simulated cluster's child: died?


@contextlib.asynccontextmanager
async def simulated_cluster(nodes: int, kubeconfig: str, info: dict[str, Any]) -> AsyncIterator[ClusterChild]:
    """The simulated cluster of ``nodes`` GPU nodes served by a child process (its kubeconfig written to
    ``kubeconfig``) for as long as the context lasts; ``info`` receives what the child measured (seeding
    time, RSS, collector pauses), or what it had written before it died.

    A child that dies (killed, out of memory) while starting or while the context lasts cancels the task
    that entered it at once and sets the yielded ``ClusterChild.died``, and the context ends with
    ``SimulatorDied`` naming how it died: a benchmark
    whose API server is gone measures nothing (it once waited out its runs, printed a result of nothing, and
    started its next run).

    The child is stopped by closing a pipe, not by setting an Event: a multiprocessing Event's ``set()`` waits
    for every waiter to wake, so a simulator that had died hung the benchmark at its end, past SIGTERM, for
    good. A child that did not stop within 30 s is killed.
    """
    loop = asyncio.get_running_loop()
    owner = asyncio.current_task()
    assert owner is not None
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        ready, shared = ctx.Event(), manager.dict()
        stop_rx, stop_tx = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_serve_sim, args=(nodes, kubeconfig, ready, stop_rx, shared), daemon=True)
        child.start()
        stop_rx.close()
        handle = ClusterChild()
        watching = [True]

        def on_exit() -> None:  # the child's sentinel became readable: it ended
            loop.remove_reader(child.sentinel)
            if watching[0]:
                handle.died = True
                owner.cancel()

        loop.add_reader(child.sentinel, on_exit)
        try:
            try:
                started = time.monotonic()
                while not await asyncio.to_thread(ready.wait, 0.5):  # never a thread blocked past the child
                    if time.monotonic() - started > 600:
                        raise RuntimeError("the simulated cluster did not start within 600 s")
                yield handle
            except asyncio.CancelledError:
                if handle.died:
                    owner.uncancel()
                    raise SimulatorDied(await _death(child, nodes)) from None
                raise
            except Exception as e:
                if handle.died:
                    raise SimulatorDied(await _death(child, nodes)) from e
                raise
            if handle.died:  # the body ended on its own after the child died (it took the cancel for an error)
                raise SimulatorDied(await _death(child, nodes))
        finally:
            watching[0] = False
            with contextlib.suppress(Exception):
                loop.remove_reader(child.sentinel)
            stop_tx.close()
            await asyncio.to_thread(child.join, 30)
            if child.is_alive():
                child.kill()
            with contextlib.suppress(Exception):  # a child that died wrote what it had; the rest is missing
                info.update(dict(shared))


@contextlib.asynccontextmanager
async def _pipeline(nodes: int, overrides: dict[str, Any], *, label: str,
                    on_cordon: Callable[[str], None] | None = None,
                    audit_mode: str = "full") -> AsyncIterator[_Pipeline]:
    """What ``serve`` runs (dispatcher with the real handlers, executor with the real playbooks and the real
    Kubernetes adapter) on an embedded secure NATS, against the simulated cluster of ``nodes`` GPU nodes in a
    child process. ``overrides`` go into ``Settings``; ``on_cordon(node)`` is called (from an adapter thread)
    when a request cordons a node, whose time lands in ``cordoned_at``. ``sim_info`` is filled on exit.
    ``audit_mode``: the trail the service writes (``chaos.bench.audit_modes``; ``full`` is serve's)."""
    import handlers
    from chaos.bench.audit_modes import bench_audit
    from playbooks.catalog import PlaybookCatalog
    from remediator import bus, telemetry
    from remediator.adapters.agent import AgentClient
    from remediator.adapters.kube import AsyncKube, KubeAdapter
    from remediator.contracts import Change
    from remediator.dispatch import Dispatcher
    from remediator.executor import Executor
    from remediator.metrics import ServiceMetrics
    from remediator.natsd import EmbeddedNats
    from remediator.owners import OwnerResolver
    from remediator.service import configured_registry
    from remediator.settings import Settings
    from remediator.signing import Signer, generate_seed

    assert handlers
    cordoned_at: dict[str, float] = {}
    lock = threading.Lock()

    def mark(node: str, change: Change) -> None:
        if change.changed and change.after.get("unschedulable"):
            with lock:
                first = node not in cordoned_at
                cordoned_at.setdefault(node, time.monotonic())
            if first and on_cordon is not None:
                on_cordon(node)

    class TimedKube(KubeAdapter):
        def cordon(self, node: str) -> Change:
            change = super().cordon(node)
            mark(node, change)
            return change

        def quarantine(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> tuple[Change, Change]:
            taint, cordon = super().quarantine(node, key, value, effect)
            mark(node, cordon)
            return taint, cordon

    with tempfile.TemporaryDirectory(prefix="remediator-storm-") as tmp, EmbeddedNats(secure=True) as server:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        sim_info: dict[str, Any] = {}
        async with simulated_cluster(nodes, kubeconfig, sim_info) as cluster:
            settings = Settings(**{"nats_url": server.url, "kubeconfig": kubeconfig, "replica_id": label,
                                   "drain_grace_period_s": 0, "executor_concurrency": 96, **overrides})

            def who(role: str) -> bus.Credentials:  # each part as its own role, the bus declared by admin
                return bus.Credentials(creds_file=server.creds(role))

            nc_a, js_a = await bus.connect(server.url, name="storm-provision", credentials=who("admin"))
            await bus.provision(js_a, settings)
            await nc_a.close()
            # One connection as the service identity and one audit log for the dispatcher and the executor (and
            # the webhook's ingest), as a ``serve`` replica has them: they share the chains' heads.
            nc_x, js_x = await bus.connect(server.url, name="storm-service", credentials=who("service"))
            # serve's audit log (signed, checkpointed, counted for /metrics) and its tracer provider
            telemetry.setup()
            signer = Signer(generate_seed())
            records = {"written": 0, "signed": 0}  # what the pipeline wrote to the trail: all signed, as serve's

            def tally(r: Any) -> None:
                records["written"] += 1
                records["signed"] += r.sig is not None

            audit = bench_audit(audit_mode, js_x, settings, label, signer,
                                observers=[ServiceMetrics().observe, tally])
            nc_p, js_p = await bus.connect(server.url, name="storm-publisher",
                                           credentials=_fleet_of_agents(server, Path(tmp)))
            adapter = TimedKube.from_settings(settings, poll_interval_s=0.2)
            kube = AsyncKube(adapter, max_workers=settings.executor_concurrency + 4)
            await kube.start(wait_s=120.0)
            dispatcher = await Dispatcher.create(nc_x, js_x, settings, audit,
                                                 registry=configured_registry(settings),
                                                 origins=OwnerResolver(kube))  # as serve has it
            executor = Executor(nc_x, js_x, settings, kube, audit, PlaybookCatalog.load(),
                                AgentClient(nc_x, signer=signer),
                                keep_results=nodes)  # every run's result: one per node at most
            # What serve does once started and its node cache synced: that heap out of the collector's way,
            # and the collector's thresholds.
            heap.settle()
            stop = asyncio.Event()
            tasks = [asyncio.create_task(dispatcher.run(stop)), asyncio.create_task(executor.run(stop))]
            pipe = _Pipeline(server, settings, adapter, kube, executor, js_x, js_p, Path(tmp), cordoned_at, sim_info,
                             nc_x=nc_x, audit=audit, audit_records=records, cluster=cluster)
            try:
                yield pipe
            finally:
                if cluster.died:  # the runs' calls fail now, not after retrying a dead API server until stopped
                    kube.close()
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                with contextlib.suppress(Exception):  # as serve stops: the heads anchored, their timers gone
                    await asyncio.wait_for(audit.flush(), 60)
                for nc in (nc_x, nc_p):
                    with contextlib.suppress(Exception):
                        await nc.drain()
                kube.close()


async def _one_run(nodes: int, failing: int, *, breaker: bool, progress: Progress, burst: bool = False,
                   default_limits: bool = False, wait_s: float = 120.0, audit: str = "full") -> dict[str, Any]:
    from remediator import bus
    from remediator.safety import LedgerStore
    from remediator.subjects import STATE_BUCKET

    say = progress or (lambda _m: None)
    label = "with_breaker" if breaker else "storm"
    overrides: dict[str, Any] = {}
    if not breaker:
        overrides["guards_enabled"] = _BREAKER_LESS if default_limits else "opt_out,dry_run,lock"
        if not default_limits:
            overrides.update(kube_qps=5000.0, kube_burst=5000)
    unfinished: list[dict[str, Any]] = []
    async with _pipeline(nodes, overrides, label=label, audit_mode=audit) as pipe:
        server, settings, adapter, executor = pipe.server, pipe.settings, pipe.adapter, pipe.executor
        cordoned_at = pipe.cordoned_at
        victims = [f"gpu-node-{i}" for i in range(0, nodes, max(1, nodes // failing))][:failing]
        published: dict[str, float] = {}
        spread = 0.0 if burst else SPREAD_S
        say(f"{label}: {failing} of {nodes} nodes report Xid 79 " + ("at once" if burst else f"over {spread:g}s"))
        requests0 = adapter.limiter.taken()
        cpu0, nats_cpu0 = time.process_time(), _cpu_s(server.proc.pid) if server.proc else None
        pauses = GcPauses().start()
        t0 = time.monotonic()
        events = [_event(node, utcnow()) for node in victims] if burst else []
        for i, node in enumerate(victims):
            due = t0 + i * spread / failing
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            published[node] = time.monotonic()
            await bus.publish_event(pipe.js_p, events[i] if burst else _event(node, utcnow()))
            if i and i % 100 == 0 and not burst:
                say(f"{label}: {i} events published, {len(cordoned_at)} nodes cordoned, "
                    f"{len(executor.results)} runs finished")
        deadline = time.monotonic() + wait_s
        last_say = time.monotonic()
        finished_at = None
        while time.monotonic() < deadline and not pipe.cluster.died:
            if len(executor.results) >= failing:
                finished_at = time.monotonic()
                break
            if time.monotonic() - last_say > 10:
                last_say = time.monotonic()
                say(f"{label}: {len(cordoned_at)} cordoned, {len(executor.results)} runs finished, "
                    f"limiter queue {adapter.limiter.queued()}")
            await asyncio.sleep(0.05)
        cpu = time.process_time() - cpu0
        pauses.stop()
        nats_cpu1 = _cpu_s(server.proc.pid) if server.proc else None
        requests = {lane: n - requests0.get(lane, 0) for lane, n in adapter.limiter.taken().items()}
        say(f"{label}: {len(cordoned_at)} cordoned, {len(executor.results)} runs finished")
        # what serve does as it stops (Service._flush_audit): every chain head since its checkpoint anchored
        flush_chains, flush_t0 = pipe.audit.unanchored_chains, time.monotonic()
        await pipe.audit.flush()
        audit_flush = {"chains": flush_chains, "s": round(time.monotonic() - flush_t0, 3)}
        outcomes: dict[str, int] = {}
        failed_steps: dict[str, int] = {}
        for r in executor.results:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
            for a in r.actions:
                if a.status == "failed":
                    failed_steps[a.step] = failed_steps.get(a.step, 0) + 1
        done = {r.node for r in executor.results}
        for node in victims:
            if node not in done:
                unfinished.append({"node": node, "cordoned": node in cordoned_at})
        tripped = False
        with contextlib.suppress(Exception):
            tripped = (await LedgerStore(await pipe.js_x.key_value(STATE_BUCKET)).read()).breaker.open
        rss = {"service": _rss_mb(os.getpid(), peak=True) or round(
                   resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "nats_server": _rss_mb(server.proc.pid, peak=True) if server.proc else None}
    sim_info = pipe.sim_info
    lat = [cordoned_at[n] - published[n] for n in victims if n in cordoned_at]
    if breaker:
        return {"cordoned": len(cordoned_at), "breaker_tripped": tripped, "threshold": settings.breaker_threshold,
                "decisions_settled": len(executor.results), "outcomes": outcomes}
    last = max(cordoned_at.values()) if cordoned_at else t0
    rss["simulator"] = sim_info.get("peak_rss_mb")
    total_requests = sum(requests.values())
    return {
        "nodes": nodes,
        "failing": failing,
        "burst": burst,
        "default_limits": default_limits,
        "kube_qps": settings.kube_qps,
        "cordoned": len(cordoned_at),
        "finished": len(executor.results),
        "all_cordoned_s": round(last - t0, 3) if len(cordoned_at) == failing else None,
        "cordons_per_s": round(len(cordoned_at) / max(last - t0, 1e-9), 1),
        "p50_cordon_latency_s": round(_percentile(lat, 0.50), 3),
        "p99_cordon_latency_s": round(_percentile(lat, 0.99), 3),
        "all_finished_s": round(finished_at - t0, 3) if finished_at is not None else None,
        "cpu_ms_per_incident": round(1000 * cpu / failing, 2),
        "nats_cpu_ms_per_incident": (round(1000 * (nats_cpu1 - nats_cpu0) / failing, 2)
                                     if nats_cpu0 is not None and nats_cpu1 is not None else None),
        "api_requests_per_incident": round(total_requests / failing, 2),
        "api_requests_by_lane": requests,
        "audit_records": {**pipe.audit_records, "checkpoints": pipe.audit.checkpoints_written},
        "audit_flush": audit_flush,
        "rss_mb": rss,
        "gc_pauses": {"service": pauses.summary(), "simulator": sim_info.get("gc_pauses")},
        "sim_seed_s": sim_info.get("seed_s"),
        "sim_seed_rss_mb": sim_info.get("seed_rss_mb"),
        "event_loop": eventloop.current(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "unfinished": unfinished[:20],
        "outcomes": outcomes,
        "failed_steps": failed_steps,
    }


WEBHOOK_TOKEN = "storm-webhook-token-0123456789abcdef"


def _alert_body(node: str, n: int) -> bytes:
    """One dcgm-exporter Xid 79 alert for ``node`` in Alertmanager's webhook payload, fingerprint ``n``."""
    import json

    from chaos.bench.ingest import _payload_template

    payload = json.loads(_payload_template())
    alert = payload["alerts"][0]
    alert["labels"] = {**alert["labels"], "Hostname": node}
    alert["fingerprint"] = f"{n:016x}"
    payload["commonLabels"] = alert["labels"]
    return json.dumps(payload, separators=(",", ":")).encode()


async def _post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, body: bytes) -> int:
    """POST ``body`` to ``/v1/alertmanager`` on a keep-alive connection; the answer's status."""
    writer.write(b"POST /v1/alertmanager HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, WEBHOOK_TOKEN.encode(), len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


HOPS = ("post_to_dispatch", "dispatch_to_run", "run_to_quarantine", "quarantine")


def webhook_hops(posted_ns: dict[str, int], cordoned_ns: dict[str, int], spans: Any) -> dict[str, list[float]]:
    """Each alert's latency cut at the spans on its path, in ms, one list per hop of ``HOPS`` (an alert whose
    trace lacks a span is left out): the POST written to the ``dispatch`` span's start (ingest, its JetStream
    publish, FAULTS' delivery); to the ``executor.run`` span's start (the history, the owner, the decision
    stored and published, REMEDIATIONS' delivery); to the first step span's start (lock, guard verdicts, the
    run record, ``step_started``); to the return of the quarantine PATCH. The four add up to the alert's
    cordon latency. ``spans``: finished OpenTelemetry spans (``start_time`` in ns of wall time, as
    ``time.time_ns``); the times in ``posted_ns``/``cordoned_ns`` are on the same clock."""
    by_trace: dict[int, list[Any]] = {}
    for s in spans:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    for trace in by_trace.values():
        named = {s.name: s for s in sorted(trace, key=lambda s: -s.start_time)}  # the earliest of each name
        run, dispatch = named.get("executor.run"), named.get("dispatch")
        steps = [s for s in trace if s.name.startswith("step ")]
        node = run.attributes.get("remediator.node") if run is not None and run.attributes else None
        if dispatch is None or run is None or not steps or node not in posted_ns or node not in cordoned_ns:
            continue
        first_step = min(s.start_time for s in steps)
        cut = (posted_ns[node], dispatch.start_time, run.start_time, first_step, cordoned_ns[node])
        for hop, a, b in zip(HOPS, cut, cut[1:], strict=False):
            hops[hop].append((b - a) / 1e6)
    return hops


async def webhook(nodes: int = 1500, alerts: int = 100, progress: Progress = None) -> dict[str, Any]:
    """Alertmanager POST to cordon, one alert at a time, through what ``serve`` runs.

    The ingest app (``create_app``, bearer token, audit) under uvicorn in the service's event loop, as
    ``serve`` has it, then FAULTS, the dispatcher, REMEDIATIONS, the executor and the quarantine PATCH to the
    simulated API server (a child process). Each alert names another node; the next is posted once the run
    before it has finished and the client limit has refilled the tokens that run took (its requests at
    ``kube_qps``), so every alert meets an idle service; ``limiter_wait_ms_per_incident`` shows what waiting
    for tokens remained. A latency is from just before the POST is
    written to the return of the request that cordoned its node (``*_cordon_ms``); ``*_answer_ms`` is the
    webhook's own answer (after JetStream's ack). Shipped client limit and guards but breaker and budget.
    ``hops_ms``: each latency cut at the spans the replica records (``webhook_hops``), per hop its ``p50``,
    ``p99`` and ``max`` over the ``alerts`` it could cut; ``gc_pauses``: the collector's passes meanwhile
    (``GcPauses``). Together they say where a slow alert lost its time. ``event_loop``: the loop it ran on.
    """
    import uvicorn
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from remediator import telemetry
    from remediator.ingest.app import create_app
    from remediator.natsd import free_port
    from remediator.service import _EmbeddedServer

    if not 0 < alerts <= nodes:
        raise ValueError("need 0 < alerts <= nodes")
    say = progress or (lambda _m: None)
    loop = asyncio.get_running_loop()
    cordoned: dict[str, asyncio.Event] = {}
    service: list[Any] = []  # the service connection, once the pipeline holds one
    sent_at_cordon: dict[str, int] = {}
    posted_ns: dict[str, int] = {}  # wall clock, as the spans' (``webhook_hops``)
    cordoned_ns: dict[str, int] = {}
    spans = InMemorySpanExporter()
    pauses = GcPauses()  # the collector's passes while the alerts ran

    def on_cordon(node: str) -> None:
        event = cordoned.get(node)
        if event is not None:
            cordoned_ns.setdefault(node, time.time_ns())
            if service:  # what the replica had sent when the cordon returned (read from the adapter thread)
                sent_at_cordon[node] = int(service[0].stats["out_msgs"])
            loop.call_soon_threadsafe(event.set)

    overrides = {"guards_enabled": _BREAKER_LESS, "api_tokens": f"alertmanager:{WEBHOOK_TOKEN}"}
    answer_ms: list[float] = []
    cordon_ms: list[float] = []
    sent_before_cordon: list[int] = []
    statuses: dict[int, int] = {}
    async with _pipeline(nodes, overrides, label="webhook", on_cordon=on_cordon) as pipe:
        service.append(pipe.nc_x)
        telemetry.setup(span_exporter=spans)  # the spans the replica records, kept to cut each latency at
        # the replica's own connection and audit log, as serve hands them to create_app
        app = create_app(settings=pipe.settings, nc=pipe.nc_x, js=pipe.js_x, audit=pipe.audit)
        port = free_port()
        http = _EmbeddedServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                              access_log=False, lifespan="off"))
        serving = asyncio.create_task(http.serve())
        try:
            while not http.started:
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.02)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            victims = [f"gpu-node-{i}" for i in range(0, nodes, max(1, nodes // alerts))][:alerts]
            say(f"webhook: {alerts} alerts, one at a time, each for another of {nodes} nodes")
            requests0 = taken_before = pipe.adapter.limiter.taken()
            waited0 = pipe.adapter.limiter.waited()
            pauses.start()
            for n, node in enumerate(victims):
                if pipe.cluster.died:
                    break
                cordoned[node] = asyncio.Event()
                body = _alert_body(node, n + 1)
                sent0 = int(pipe.nc_x.stats["out_msgs"])
                posted_ns[node] = time.time_ns()
                t0 = time.monotonic()
                status = await _post(reader, writer, port, body)
                answer_ms.append(1000 * (time.monotonic() - t0))
                statuses[status] = statuses.get(status, 0) + 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cordoned[node].wait(), 30)
                if node in pipe.cordoned_at:
                    cordon_ms.append(1000 * (pipe.cordoned_at[node] - t0))
                if node in sent_at_cordon:
                    sent_before_cordon.append(sent_at_cordon[node] - sent0)
                deadline = time.monotonic() + 30
                while (len(pipe.executor.results) <= n and time.monotonic() < deadline  # noqa: ASYNC110 - a list
                       and not pipe.cluster.died):
                    await asyncio.sleep(0.01)
                # idle means the client limit's tokens are back too: the run's requests, refilled at kube_qps
                used = sum(pipe.adapter.limiter.taken().values()) - sum(taken_before.values())
                await asyncio.sleep(used / pipe.settings.kube_qps)
                taken_before = pipe.adapter.limiter.taken()
                if n and n % 25 == 0:
                    say(f"webhook: {n} alerts, {len(cordon_ms)} cordoned")
            requests = sum(v - requests0.get(k, 0) for k, v in pipe.adapter.limiter.taken().items())
            waited = sum(v - waited0.get(k, 0.0) for k, v in pipe.adapter.limiter.waited().items())
            writer.close()
        finally:
            pauses.stop()
            http.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 10)
            telemetry.setup()  # the exporter's spans stay with this run
    hops = webhook_hops(posted_ns, cordoned_ns, spans.get_finished_spans())
    return {
        "nodes": nodes,
        "alerts": alerts,
        "answers": {str(k): v for k, v in sorted(statuses.items())},
        "cordoned": len(cordon_ms),
        "p50_cordon_ms": round(_percentile(cordon_ms, 0.50), 2),
        "p99_cordon_ms": round(_percentile(cordon_ms, 0.99), 2),
        "max_cordon_ms": round(max(cordon_ms), 2) if cordon_ms else None,
        "p50_answer_ms": round(_percentile(answer_ms, 0.50), 2),
        "p99_answer_ms": round(_percentile(answer_ms, 0.99), 2),
        "api_requests_per_incident": round(requests / alerts, 2),
        "nats_messages_before_cordon": statistics.median(sent_before_cordon) if sent_before_cordon else None,
        "limiter_wait_ms_per_incident": round(1000 * waited / alerts, 2),
        "hops_ms": {hop: {"alerts": len(v), "p50": round(_percentile(v, 0.50), 2),
                          "p99": round(_percentile(v, 0.99), 2), "max": round(max(v), 2) if v else None}
                    for hop, v in hops.items()},
        "gc_pauses": pauses.summary(),
        "event_loop": eventloop.current(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


async def run(nodes: int = 1500, failing: int = 750, progress: Progress = None, *, burst: bool = False,
              default_limits: bool = False, breaker_run: bool = True, wait_s: float = 120.0,
              audit: str = "full") -> dict[str, Any]:
    """The main run's figures as top-level keys, and ``with_breaker`` (see the module docstring); ``audit``:
    the service's audit trail in both (``chaos.bench.audit_modes``), reported under ``audit``."""
    from chaos.bench.audit_modes import AUDIT_MODES

    if not 0 < failing <= nodes:
        raise ValueError("need 0 < failing <= nodes")
    if audit not in AUDIT_MODES:
        raise ValueError(f"audit must be one of {', '.join(AUDIT_MODES)} (got {audit!r})")
    main = await _one_run(nodes, failing, breaker=False, progress=progress, burst=burst,
                          default_limits=default_limits, wait_s=wait_s, audit=audit)
    if breaker_run:
        main["with_breaker"] = await _one_run(nodes, failing, breaker=True, progress=progress, burst=burst,
                                              wait_s=min(wait_s, 120.0), audit=audit)
    main["audit"] = audit
    return main
