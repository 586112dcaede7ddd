"""Helpers of the executor integration tests: a wired executor over a real nats-server and the simulated
Kubernetes API, and a minimal node-agent responder backed by the simulator's GPU health.

The responder answers ``agent.<node>.cmd`` the way the node agent's contract says (idempotent per command
id; ``reset_gpu`` refused while a pod holds the GPU); it stands in for the agent helper's implementation so
these tests exercise the executor, not the agent. It is no kinder than the agent: every command goes through
the agent's own ``CommandVerifier`` (signed by the rig's service key, for that node, unexpired, never
replayed) and every reply is signed with that node's key, which the rig writes to KV ``agentkey.<node>`` as
the credentials issuer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from remediator.agent.commands import CommandVerifier
from remediator.audit import AuditLog, iter_records
from remediator.contracts import AgentCommand, AgentReply, AuditRecord, Decision, GpuRef
from remediator.executor import Executor
from remediator.settings import Settings
from remediator.signing import Signer, TrustSet, generate_seed, service_signer
from remediator.subjects import STATE_BUCKET, agent_key_key

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
    trust: TrustSet = field(default_factory=TrustSet)
    seen: dict[str, AgentReply] = field(default_factory=dict)
    calls: list[AgentCommand] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    healthy: bool = True
    keys: dict[str, Signer] = field(default_factory=dict)
    verifiers: dict[str, CommandVerifier] = field(default_factory=dict)

    async def start(self) -> None:
        """Give each node an agent key, publish it in KV (as the issuer does), and answer."""
        kv = await self.nc.jetstream().key_value(STATE_BUCKET)
        for node in self.sim.node_names():
            signer = self.keys.setdefault(node, Signer(generate_seed()))
            self.verifiers[node] = CommandVerifier(node, self.trust)
            await kv.put(agent_key_key(node), json.dumps(
                {"public_key": signer.public_key, "issued_at": T0.isoformat(), "expires_at": None}).encode())
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
        if cmd.verb == "reboot_node":  # the node's host reboots: a new boot id, NotReady, then Ready again
            self.sim.reboot_node(node)
            return AgentReply(id=cmd.id, ok=True, changed=True, detail=f"{node}: reboot command ran")
        if cmd.verb == "health_check":
            return AgentReply(id=cmd.id, ok=self.healthy, detail="healthy" if self.healthy else "unhealthy",
                              after={"checks": cmd.params.get("checks", [])})
        return AgentReply(id=cmd.id, ok=True, changed=False, detail=f"{cmd.verb} done")

    async def _on(self, msg: Msg) -> None:
        node = msg.subject.split(".")[1].replace("_", ".")
        raw = json.loads(msg.data)
        cmd = AgentCommand.model_validate(raw)
        refused = self.verifiers[node].check(cmd, raw)
        if refused is not None:
            self.refused.append((node, refused[0]))
            reply = AgentReply(id=cmd.id, ok=False, detail=f"refused: {refused[1]}", after={"refused": refused[0]})
        else:
            self.calls.append(cmd)
            seen = self.seen.get(cmd.id)
            if seen is None:
                seen = self.seen[cmd.id] = await asyncio.to_thread(self._answer, node, cmd)
            reply = seen
        body = json.loads(reply.model_copy(update={"node": node, "nonce": cmd.nonce}).model_dump_json())
        await msg.respond(json.dumps(self.keys[node].sign_document(body)).encode())


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
    signer: Signer

    def agent_client(self, **kw: Any) -> AgentClient:
        """An agent client signing with the rig's service key (the one the simulated agents trust)."""
        return AgentClient(self.nc, signer=self.signer, **{"timeout_s": 2.0, **kw})

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
    signer = service_signer(tmp)  # tmp/identity/service.nk: also what a worker process loads (signing_seed_file)
    s = fast_settings(nats_url, kubeconfig=str(kubeconfig),
                      **{"signing_seed_file": str(tmp / "identity" / "service.nk"), **settings})
    nc, js = await bus.connect(nats_url)
    port: AsyncKube | None = None
    try:
        await bus.provision(js, s)
        kube = KubeAdapter.from_settings(s, poll_interval_s=0.05)
        audit = AuditLog(js, "test-executor", signer=signer)
        agents = SimAgents(nc, sim, TrustSet.of(signers=[signer]))
        await agents.start()
        port = AsyncKube(kube, max_workers=s.executor_concurrency + 4)
        ex = Executor(nc, js, s, port, audit, PlaybookCatalog.load(), AgentClient(nc, timeout_s=2.0, signer=signer))
        yield Rig(nc, js, sim, api, kube, audit, ex, agents, s, kubeconfig, signer)
    finally:
        await nc.drain()
        if port is not None:
            port.close()
        api.stop()
