"""``remediator bench storm``: a fatal-Xid storm through the real pipeline, without and with the breaker.

Where it sits: beside the service, never on its path (it loads ``chaos`` for the simulated cluster). It runs
what ``serve`` runs — JetStream (embedded ``nats-server``), the dispatcher with the real handlers, the
executor with the real playbooks and the real Kubernetes adapter (official client, rate limiter, retries) —
against the simulated Kubernetes API, which runs in a child process so it does not share the GIL.

``failing`` of ``nodes`` GPU nodes report a fatal Xid 79 (GPU fallen off the bus), one event each, spread
evenly over 30 s and published to FAULTS as the node agent would. Each must end tainted, cordoned and
drained (playbook ``gpu-lost``). A node's cordon latency is from its event's publish to the return of the
cordon PATCH that changed it.

Two runs, each on a fresh cluster and bus:

* ``no_breaker`` — breaker, budget and cooldown off and the client rate limit raised (what the pipeline can
  do): ``nodes, failing, cordoned, all_cordoned_s`` (first event to last cordon), ``p99_cordon_latency_s``,
  ``cordons_per_s`` (cordons over first-to-last-cordon time).
* ``with_breaker`` — the default guards: ``cordoned, breaker_tripped, threshold``. The breaker must stop the
  storm after ``threshold`` quarantines; the rest are blocked (recorded, nothing touched).

Targets (issue 5): every failing node cordoned within 45 s; p99 cordon latency ≤ 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remediator.contracts import FaultEvent, GpuRef, utcnow

SPREAD_S = 30.0
Progress = Callable[[str], None] | None


def _serve_sim(nodes: int, kubeconfig: str, ready: Any, stop: Any) -> None:  # pragma: no cover - child process
    from chaos.sim.cluster import seed_cluster
    from chaos.sim.kube_api import KubeApiServer

    state = seed_cluster(nodes)
    server = KubeApiServer(state).start()
    server.write_kubeconfig(kubeconfig)
    ready.set()
    stop.wait()
    server.stop()


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


async def _one_run(nodes: int, failing: int, *, breaker: bool, progress: Progress) -> dict[str, Any]:
    import handlers
    from playbooks.catalog import PlaybookCatalog
    from remediator import bus
    from remediator.adapters.agent import AgentClient
    from remediator.adapters.kube import AsyncKube, KubeAdapter
    from remediator.audit import AuditLog
    from remediator.contracts import Change
    from remediator.dispatch import Dispatcher
    from remediator.executor import Executor
    from remediator.natsd import EmbeddedNats
    from remediator.safety import LedgerStore
    from remediator.service import configured_registry
    from remediator.settings import Settings
    from remediator.subjects import STATE_BUCKET

    assert handlers
    say = progress or (lambda _m: None)
    label = "with_breaker" if breaker else "no_breaker"
    cordoned_at: dict[str, float] = {}
    lock = threading.Lock()

    class TimedKube(KubeAdapter):
        def cordon(self, node: str) -> Change:
            change = super().cordon(node)
            if change.changed:
                with lock:
                    cordoned_at.setdefault(node, time.monotonic())
            return change

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="remediator-storm-") as tmp, EmbeddedNats(secure=True) as server:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        ready, stop_sim = ctx.Event(), ctx.Event()
        child = ctx.Process(target=_serve_sim, args=(nodes, kubeconfig, ready, stop_sim), daemon=True)
        child.start()
        try:
            if not await asyncio.to_thread(ready.wait, 120):
                raise RuntimeError("the simulated cluster did not start")
            overrides: dict[str, Any] = {"nats_url": server.url, "kubeconfig": kubeconfig, "replica_id": "storm",
                                         "drain_grace_period_s": 0, "executor_concurrency": 96}
            if not breaker:
                overrides.update(guards_enabled="opt_out,dry_run,lock", kube_qps=5000.0, kube_burst=5000)
            settings = Settings(**overrides)
            def who(role: str) -> bus.Credentials:  # each part as its own role, the bus declared by admin
                return bus.Credentials(creds_file=server.creds(role))

            nc_a, js_a = await bus.connect(server.url, name="storm-provision", credentials=who("admin"))
            await bus.provision(js_a, settings)
            await nc_a.close()
            nc_d, js_d = await bus.connect(server.url, name="storm-dispatch", credentials=who("dispatcher"))
            nc_x, js_x = await bus.connect(server.url, name="storm-executor", credentials=who("executor"))
            nc_p, js_p = await bus.connect(server.url, name="storm-publisher",
                                           credentials=_fleet_of_agents(server, Path(tmp)))
            kube = AsyncKube(TimedKube.from_settings(settings, poll_interval_s=0.2),
                             max_workers=settings.executor_concurrency + 4)
            dispatcher = await Dispatcher.create(nc_d, js_d, settings, AuditLog(js_d, "storm-dispatch"),
                                                 registry=configured_registry(settings))
            executor = Executor(nc_x, js_x, settings, kube, AuditLog(js_x, "storm-executor"), PlaybookCatalog.load(),
                                AgentClient(nc_x))
            stop = asyncio.Event()
            tasks = [asyncio.create_task(dispatcher.run(stop)), asyncio.create_task(executor.run(stop))]
            victims = [f"gpu-node-{i}" for i in range(0, nodes, max(1, nodes // failing))][:failing]
            published: dict[str, float] = {}
            say(f"{label}: {failing} of {nodes} nodes report Xid 79 over {SPREAD_S:g}s")
            t0 = time.monotonic()
            for i, node in enumerate(victims):
                due = t0 + i * SPREAD_S / failing
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                published[node] = time.monotonic()
                await bus.publish_event(js_p, _event(node, utcnow()))
                if i and i % 100 == 0:
                    say(f"{label}: {i} events published, {len(cordoned_at)} nodes cordoned, "
                        f"{len(executor.results)} runs finished")
            deadline = time.monotonic() + 120.0
            while time.monotonic() < deadline:
                if len(executor.results) >= failing:
                    break
                await asyncio.sleep(0.2)
            say(f"{label}: {len(cordoned_at)} cordoned, {len(executor.results)} runs finished")
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            outcomes: dict[str, int] = {}
            for r in executor.results:
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
            kv = await js_x.key_value(STATE_BUCKET)
            tripped = False
            with contextlib.suppress(Exception):
                tripped = (await LedgerStore(kv).read()).breaker.open
            for nc in (nc_d, nc_x, nc_p):
                with contextlib.suppress(Exception):
                    await nc.drain()
            kube.close()
        finally:
            stop_sim.set()
            await asyncio.to_thread(child.join, 10)
            if child.is_alive():
                child.kill()
    lat = [cordoned_at[n] - published[n] for n in victims if n in cordoned_at]
    if breaker:
        return {"cordoned": len(cordoned_at), "breaker_tripped": tripped, "threshold": settings.breaker_threshold,
                "decisions_settled": len(executor.results), "outcomes": outcomes}
    first, last = (min(cordoned_at.values()), max(cordoned_at.values())) if cordoned_at else (t0, t0)
    return {
        "nodes": nodes,
        "failing": failing,
        "cordoned": len(cordoned_at),
        "all_cordoned_s": round(last - t0, 3) if len(cordoned_at) == failing else None,
        "p99_cordon_latency_s": round(_percentile(lat, 0.99), 3),
        "p50_cordon_latency_s": round(_percentile(lat, 0.50), 3),
        "cordons_per_s": round(len(cordoned_at) / max(last - first, 1e-9), 1),
        "outcomes": outcomes,
    }


async def run(nodes: int = 1500, failing: int = 750, progress: Progress = None) -> dict[str, Any]:
    """Both runs; returns ``{"no_breaker": {...}, "with_breaker": {...}}`` (see the module docstring)."""
    if not 0 < failing <= nodes:
        raise ValueError("need 0 < failing <= nodes")
    no_breaker = await _one_run(nodes, failing, breaker=False, progress=progress)
    with_breaker = await _one_run(nodes, failing, breaker=True, progress=progress)
    return {"no_breaker": no_breaker, "with_breaker": with_breaker}
