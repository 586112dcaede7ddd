"""Chaos actions: the machinery around the faults breaks while a drill runs.

Where it sits: beside the fault injectors (``chaos.injectors``), called by the drill runner
(``chaos.runner``) for a timeline's ``action`` entries, acting on the world (``chaos.world.World``). They
break the bus (``nats_restart``), the Kubernetes API (``kube_api_errors``, ``kube_latency``), the service
(``kill_replica``, ``lose_replica``), one server of a NATS cluster (``nats_server_kill``), an agent
(``agent_disconnect``) and they play the people around the system
(``manual_uncordon``, ``opt_out``, ``block_pdb``). Each returns (or its task returns) one line saying
what it did, for the drill's report; an outage it causes is recorded on the world (``World.outages``) so
the runner can prove a fault injected meanwhile was handled only after it ended.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from chaos import replica as replicas
from chaos.replica import Replica
from chaos.sim.cluster import InjectedFault
from chaos.sim.gpu_node import sim_agent
from chaos.world import Outage, World, start_replica
from remediator.bus import DISPATCH_CONSUMER, EXECUTOR_CONSUMER
from remediator.contracts import OPT_OUT_LABEL
from remediator.subjects import FAULTS_STREAM, REMEDIATIONS_STREAM


async def nats_restart(world: World, down_s: float) -> str:
    """Stop the nats-server (SIGTERM, as a pod eviction would), keep it down ``down_s`` seconds, start it
    again on the same port with the same store. Returns what happened, for the report."""
    assert world.nats_server is not None
    t0 = time.monotonic()
    await asyncio.to_thread(world.nats_server.stop)
    stopped = time.monotonic()
    outage = Outage("nats-server", None, datetime.now(UTC))
    world.outages.append(outage)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(world.nats_server.start)
    outage.end = datetime.now(UTC)
    return (f"nats-server down {time.monotonic() - stopped:.1f}s (stopping took {stopped - t0:.1f}s), "
            f"back on {world.nats_server.url}")


def kube_api_errors(world: World, status: int, *, count: int, method: str = "*", path: str = ".*",
                    retry_after: int | None = None) -> InjectedFault:
    """The next ``count`` matching Kubernetes API requests are answered with ``status`` (``Retry-After``)."""
    fault = world.cluster.inject_error(status, method=method, path=path, count=count, retry_after=retry_after)
    world.kube_faults.append(fault)
    return fault


async def kube_latency(world: World, seconds: float, *, method: str = "*", path: str = ".*",
                       for_s: float | None = None) -> str:
    """Delay matching Kubernetes API requests by ``seconds``, for ``for_s`` seconds (None: until the end)."""
    fault = world.cluster.add_latency(seconds, method=method, path=path)
    world.kube_faults.append(fault)
    if for_s is None:
        return f"{seconds:g}s added to {method} {path}"
    await asyncio.sleep(for_s)
    world.cluster.remove_fault(fault)
    return f"{seconds:g}s added to {fault.hits} requests ({method} {path}) for {for_s:g}s"


async def kill_replica(world: World) -> Replica:
    """The serving replica's process dies mid-flight (``chaos.replica.crash``: no graceful drain), and a
    fresh replica starts on the same bus. Returns the new replica."""
    await replicas.crash(world.replica)
    return await start_replica(world)


async def lose_replica(world: World, node: str) -> str:
    """The replica that runs ``node``'s playbook step now dies as a SIGKILLed process would
    (``chaos.replica.crash``: no graceful drain, no nak, its node lock kept), and none replaces it: another
    replica of the world finishes the run. Which replica runs it is the actor of the node's last
    ``step_started`` record."""
    records = await world.records() or []
    actor = next((r.actor for r in reversed(records) if r.what == "step_started" and r.node == node), None)
    victim = next((r for r in world.replicas if r.alive and r.actor == actor), None)
    if victim is None:
        raise RuntimeError(f"no live replica runs a step on {node} (last actor {actor!r})")
    await replicas.crash(victim)
    world.crash_times.append(time.monotonic())
    alive = [r for r in world.replicas if r.alive]
    if not alive:
        raise RuntimeError("no replica left alive")
    world.base_url = alive[-1].service.http_url
    return f"{actor} killed mid-step (no drain, no nak, lock kept); {', '.join(r.actor for r in alive)} carry on"


async def nats_server_kill(world: World, server: int | str, down_s: float | None) -> tuple[str, Any]:
    """SIGKILL one server of the world's NATS cluster (``faults_leader``: the FAULTS stream's leader), keep it
    down ``down_s`` seconds (None: to the end), then start it again on the same ports and store. No outage
    is recorded: the cluster keeps serving, and faults injected meanwhile must be handled as ever.

    Returns what was done and, when the server stays down, a coroutine that follows the cluster until every
    stream and durable consumer the killed server led has a new leader (``new_leaders``), for the timeline:
    how long the elections took is what a slow drill is read by."""
    cluster = world.nats_cluster
    if cluster is None:
        raise RuntimeError("nats_server_kill needs a NATS cluster (cluster.nats_servers: 3)")
    assert world.js is not None
    led = await _leaders(world)
    if server == "faults_leader":
        leader = led.get(FAULTS_STREAM)
        if not leader:
            raise RuntimeError("the FAULTS stream has no leader")
        index = int(leader.rsplit("-", 1)[1])
    else:
        index = int(server)
    victim = f"{cluster.name}-{index}"
    await asyncio.to_thread(cluster.kill, index)
    killed_at = time.monotonic()
    killed = f"nats-server {index} ({victim}) SIGKILLed"
    if down_s is None:
        return killed + ", stays down", new_leaders(world, [a for a, who in led.items() if who == victim],
                                                    victim, killed_at)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(cluster.start_server, index)
    return killed + f", back after {down_s:g}s", None


_CONSUMERS = ((FAULTS_STREAM, DISPATCH_CONSUMER), (REMEDIATIONS_STREAM, EXECUTOR_CONSUMER))


async def _leaders(world: World) -> dict[str, str | None]:
    """The Raft leader of every stream and of the two durable consumers: ``{"FAULTS": "<server>", ...,
    "FAULTS > dispatch": ...}`` (None: no leader now). Listing the streams needs the meta leader."""
    assert world.js is not None
    out: dict[str, str | None] = {}
    for info in await world.js.streams_info():
        out[info.config.name or "?"] = info.cluster.leader if info.cluster is not None else None
    for stream, durable in _CONSUMERS:
        c = await world.js.consumer_info(stream, durable)
        out[f"{stream} > {durable}"] = c.cluster.leader if c.cluster is not None else None
    return out


async def _leader_of(world: World, asset: str) -> str | None:
    """Who leads one stream or ``stream > consumer`` now, asked of it alone (its leader answers; no meta
    leader needed); None while nobody answers."""
    assert world.nc is not None
    js = world.nc.jetstream(timeout=0.5)  # a leaderless stream's info request times out: ask often
    stream, _, durable = asset.partition(" > ")
    try:
        info: Any = await (js.consumer_info(stream, durable) if durable else js.stream_info(stream))
    except Exception:  # no leader answers yet, or the observer is reconnecting
        return None
    return info.cluster.leader if info.cluster is not None else None


async def new_leaders(world: World, assets: list[str], victim: str, since: float, *,
                      timeout_s: float = 60.0) -> str:
    """Wait until each of ``assets`` (streams, ``stream > consumer``) is led by a server other than ``victim``;
    say who leads each and after how long. Raises naming the ones still leaderless after ``timeout_s``."""
    elected: dict[str, str] = {}
    while True:
        for asset in assets:
            if asset not in elected:
                who = await _leader_of(world, asset)
                if who and who != victim:
                    elected[asset] = f"{asset} → {who} after {time.monotonic() - since:.1f}s"
        waiting = [a for a in assets if a not in elected]
        if not waiting:
            return "new Raft leaders: " + ("; ".join(elected[a] for a in assets) or "none needed")
        if time.monotonic() - since > timeout_s:
            raise RuntimeError(f"no new leader {timeout_s:g}s after {victim} was killed for: {', '.join(waiting)}"
                               + (f" (elected: {'; '.join(elected.values())})" if elected else ""))
        await asyncio.sleep(0.25)


async def agent_disconnect(world: World, node: str, down_s: float) -> str:
    """Stop ``node``'s agent, keep it down ``down_s`` seconds (what the node logs meanwhile waits in its
    kernel log), then start a fresh agent on the same state directory."""
    await world.fleet.agents[node].stop()
    outage = Outage(f"the agent of {node}", node, datetime.now(UTC))
    world.outages.append(outage)
    await asyncio.sleep(down_s)
    agent = sim_agent(world.sim(node), nats_url=world.nats_url, **world.agent_config(node))
    world.fleet.agents[node] = agent
    await agent.start()
    outage.end = datetime.now(UTC)
    return f"agent of {node} down {down_s:g}s, restarted"


def manual_uncordon(world: World, node: str, *, remove_taint: bool = False) -> str:
    """A person runs ``kubectl uncordon`` (and, with ``remove_taint``, removes the quarantine taint)."""
    patch: dict[str, Any] = {"spec": {"unschedulable": None}}
    if remove_taint:
        patch["spec"]["taints"] = [t for t in world.cluster.taints(node) if t.get("key") != world.settings.taint_key]
    world.cluster.patch("nodes", node, patch)
    return f"a person uncordoned {node}" + (" and removed the quarantine taint" if remove_taint else "")


def opt_out(world: World, node: str) -> str:
    """A person labels ``node`` ``gpu-remediator.io/opt-out=true``."""
    world.cluster.patch("nodes", node, {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}})
    return f"{node} labelled {OPT_OUT_LABEL}=true"


def block_pdb(world: World, namespace: str, name: str, blocked: bool = True) -> str:
    """A PodDisruptionBudget refuses every eviction (``blocked`` False: allows them again)."""
    world.cluster.block_pdb(namespace, name, blocked)
    return f"PodDisruptionBudget {namespace}/{name} {'refuses' if blocked else 'allows'} evictions"


async def set_redelivery(world: World, ack_wait_s: float) -> None:
    """Shorten the executor consumer's ack wait, so a crashed replica's decision comes back in seconds (the
    production ack wait is minutes). Replicas started later must not re-provision the bus."""
    assert world.js is not None
    info = await world.js.consumer_info(REMEDIATIONS_STREAM, EXECUTOR_CONSUMER)
    config = info.config
    config.ack_wait = ack_wait_s
    await world.js.add_consumer(REMEDIATIONS_STREAM, config)

