"""Helpers of the executor integration tests: a wired executor over a real nats-server and the simulated
Kubernetes API, and a minimal node-agent responder backed by the simulator's GPU health.

The responder answers ``agent.<node>.cmd`` the way the node agent's contract says (idempotent per command
id; ``reset_gpu`` refused while a pod holds the GPU); it stands in for the agent helper's implementation so
these tests exercise the executor, not the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from chaos.sim.cluster import ClusterState, seed_cluster
from chaos.sim.kube_api import KubeApiServer
from playbooks.catalog import PlaybookCatalog
from remediator import bus
from remediator.adapters.agent import AgentClient
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.audit import AuditLog, iter_records
from remediator.contracts import AgentCommand, AgentReply, AuditRecord, Decision, GpuRef
from remediator.executor import Executor
from remediator.settings import Settings

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def decision(node: str, playbook: str, *, gpu: int | None = None, incident: str | None = None,
             job: str | None = None, group: str | None = None, labels: dict[str, str] | None = None) -> Decision:
    inc = incident or f"inc-{playbook}-{node}-{gpu}"
    return Decision(incident_id=inc, handler="test", playbook=playbook, node=node,
                    gpu=GpuRef(index=gpu, uuid=f"GPU-{node}-{gpu}") if gpu is not None else None,
                    group=group or f"{playbook}:{gpu}", reason=f"test {playbook}", event_id=f"ev-{inc}",
                    kind="xid", code=79, decided_at=T0, job=job, labels=labels or {})


@dataclass
class SimAgents:
    """Answers agent commands for every node of ``sim`` from one NATS subscription."""

    nc: NATS
    sim: ClusterState
    seen: dict[str, AgentReply] = field(default_factory=dict)
    calls: list[AgentCommand] = field(default_factory=list)
    healthy: bool = True

    async def start(self) -> None:
        await self.nc.subscribe("agent.*.cmd", cb=self._on)

    def _answer(self, node: str, cmd: AgentCommand) -> AgentReply:
        idx = cmd.gpu.index if cmd.gpu is not None else None
        unhealthy = self.sim.unhealthy_gpus(node)
        before: dict[str, Any] = {"isolated": sorted(unhealthy)}
        if cmd.verb == "isolate_gpu" and idx is not None:
            changed = idx not in unhealthy
            self.sim.set_gpu_health(node, idx, False)
            return AgentReply(id=cmd.id, ok=True, changed=changed, detail=f"GPU {idx} isolated", before=before,
                              after={"isolated": sorted(self.sim.unhealthy_gpus(node))})
        if cmd.verb == "release_gpu" and idx is not None:
            changed = idx in unhealthy
            self.sim.set_gpu_health(node, idx, True)
            return AgentReply(id=cmd.id, ok=True, changed=changed, detail=f"GPU {idx} released", before=before,
                              after={"isolated": sorted(self.sim.unhealthy_gpus(node))})
        if cmd.verb == "reset_gpu":
            holders = {i: p for i, p in self.sim.gpus_in_use(node).items() if i == idx}
            if holders:
                return AgentReply(id=cmd.id, ok=False, detail=f"GPU {idx} is held by {next(iter(holders.values()))}")
            return AgentReply(id=cmd.id, ok=True, changed=True, detail=f"GPU {idx} reset")
        if cmd.verb == "status" and idx is not None:  # the GPU's holders: the simulated kubelet's allocation
            held = [h.to_dict() for h in self.sim.gpu_allocation(node).get(idx, [])]
            return AgentReply(id=cmd.id, ok=True, detail=f"GPU {idx} held by {len(held)} container(s)",
                              after={"holders": held, "holders_known": True})
        if cmd.verb == "health_check":
            return AgentReply(id=cmd.id, ok=self.healthy, detail="healthy" if self.healthy else "unhealthy",
                              after={"checks": cmd.params.get("checks", [])})
        return AgentReply(id=cmd.id, ok=True, changed=False, detail=f"{cmd.verb} done")

    async def _on(self, msg: Msg) -> None:
        node = msg.subject.split(".")[1].replace("_", ".")
        cmd = AgentCommand.model_validate_json(msg.data)
        self.calls.append(cmd)
        reply = self.seen.get(cmd.id)
        if reply is None:
            reply = await asyncio.to_thread(self._answer, node, cmd)
            self.seen[cmd.id] = reply
        await msg.respond(reply.model_dump_json().encode())


@dataclass
class Rig:
    nc: NATS
    js: JetStreamContext
    sim: ClusterState
    api: KubeApiServer
    kube: KubeAdapter
    audit: AuditLog
    executor: Executor
    agents: SimAgents
    settings: Settings
    kubeconfig: Path

    async def audit_records(self, node: str) -> list[AuditRecord]:
        return [r async for r in iter_records(self.js, node)]

    async def whats(self, node: str, incident: str) -> list[str]:
        return [r.what for r in await self.audit_records(node) if r.incident == incident]


def fast_settings(url: str, **over: Any) -> Settings:
    base: dict[str, Any] = {"nats_url": url, "lock_ttl_s": 5, "verify_hold_down_s": 0.0, "verify_interval_s": 0.1,
                            "drain_grace_period_s": 0, "nak_delay_s": 0.2, "lock_wait_s": 2.0,
                            "approval_wait_s": 0.5, "replica_id": "test-executor"}
    base.update(over)
    return Settings(**base)


@contextlib.asynccontextmanager
async def rig(nats_url: str, tmp: Path, *, nodes: int = 4, **settings: Any) -> AsyncIterator[Rig]:
    sim = seed_cluster(nodes)
    api = KubeApiServer(sim).start()
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    s = fast_settings(nats_url, kubeconfig=str(kubeconfig), **settings)
    nc, js = await bus.connect(nats_url)
    port: AsyncKube | None = None
    try:
        await bus.provision(js, s)
        kube = KubeAdapter.from_settings(s, poll_interval_s=0.05)
        audit = AuditLog(js, "test-executor")
        agents = SimAgents(nc, sim)
        await agents.start()
        port = AsyncKube(kube, max_workers=s.executor_concurrency + 4)
        ex = Executor(nc, js, s, port, audit, PlaybookCatalog.load(), AgentClient(nc, timeout_s=2.0))
        yield Rig(nc, js, sim, api, kube, audit, ex, agents, s, kubeconfig)
    finally:
        await nc.drain()
        if port is not None:
            port.close()
        api.stop()
