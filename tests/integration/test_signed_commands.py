"""Signed agent commands and replies, against a real nats-server and the real agent on a simulated GPU node:
whatever NATS lets through, the agent runs only commands the service signed for its node, unexpired and
never before, and counts every refusal; the executor's client accepts only replies its node's agent signed.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from chaos.sim.gpu_node import SimGpuNode, sim_agent
from remediator.adapters.agent import AgentClient, AgentReplyRejected, AgentUnavailable, sign_command
from remediator.agent.main import Agent
from remediator.contracts import AgentCommand, AgentReply, GpuRef, utcnow
from remediator.natsd import EmbeddedNats
from remediator.signing import Signer, generate_seed
from remediator.subjects import STATE_BUCKET, agent_cmd_subject, agent_key_key

from .agent_support import SERVICE_KEY, TRUST, command, provisioned, until

pytestmark = pytest.mark.timeout(90)

NODE, OTHER = "gpu-node-1", "gpu-node-2"


async def _raw(nc: NATS, node: str, wire: bytes) -> AgentReply:
    msg = await nc.request(agent_cmd_subject(node), wire, timeout=10)
    return AgentReply.model_validate_json(msg.data)


def _agent(sim: SimGpuNode, url: str, state: Path) -> Agent:
    return sim_agent(sim, nats_url=url, state_dir=state, trust_keys=TRUST, nvml_interval_s=0.5)


async def _announce(nc: NATS, node: str, key: str) -> None:
    """What the credentials issuer does: the node agent's public key in KV."""
    kv = await nc.jetstream().key_value(STATE_BUCKET)
    await kv.put(agent_key_key(node), json.dumps({"public_key": key, "issued_at": utcnow().isoformat(),
                                                  "expires_at": None}).encode())


async def test_the_agent_refuses_what_the_service_did_not_sign_for_it(nats_server: EmbeddedNats,
                                                                     tmp_path: Path) -> None:
    nc, _ = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "node", name=NODE, gpus=2)
    isolate = AgentCommand(id="iso-0", verb="isolate_gpu", gpu=GpuRef(index=0))
    async with _agent(sim, nats_server.url, tmp_path / "state") as agent:
        await until(lambda: agent.link.connected)
        now = utcnow()
        unsigned = await _raw(nc, NODE, isolate.model_copy(update={"node": NODE}).model_dump_json().encode())
        _, by_other = sign_command(Signer(generate_seed()), NODE, isolate, now=now, ttl_s=60)
        untrusted = await _raw(nc, NODE, by_other)
        _, wire = sign_command(SERVICE_KEY, NODE, isolate, now=now, ttl_s=60)
        tampered = json.loads(wire)
        tampered["verb"] = "reset_gpu"  # the signature no longer matches
        bad = await _raw(nc, NODE, json.dumps(tampered).encode())
        _, for_other = sign_command(SERVICE_KEY, OTHER, isolate, now=now, ttl_s=60)
        wrong_node = await _raw(nc, NODE, for_other)  # as if NATS permissions let it through
        _, old = sign_command(SERVICE_KEY, NODE, isolate, now=now - timedelta(hours=2), ttl_s=60)
        expired = await _raw(nc, NODE, old)
        garbage = await _raw(nc, NODE, b"{not json")
        for reply, reason in ((unsigned, "unsigned"), (untrusted, "untrusted"), (bad, "bad-signature"),
                              (wrong_node, "wrong-node"), (expired, "expired"), (garbage, "malformed")):
            assert not reply.ok and reply.detail.startswith("refused: ") and reply.after["refused"] == reason, reply
            assert reply.signer == agent.signer.public_key and reply.node == NODE  # refusals are signed too
        assert not sim.gpu_state(0)["isolated"]  # nothing acted
        # the same command, signed properly, runs; replayed byte for byte, it is refused
        done = await _raw(nc, NODE, wire)
        assert done.ok and done.changed and sim.gpu_state(0)["isolated"]
        replay = await _raw(nc, NODE, wire)
        assert not replay.ok and replay.after["refused"] == "replayed"
        # refusals are counted and visible: in the agent's stats and its status reply
        status = await command(nc, NODE, AgentCommand(id="s-1", verb="status"))
        counts = {"unsigned": 1, "untrusted": 1, "bad-signature": 1, "wrong-node": 1, "expired": 1, "malformed": 1,
                  "replayed": 1}
        assert status.after["refusals"] == counts and agent.stats()["refused_commands"] == counts
    # a restart keeps the nonces it has seen: the replay stays refused
    async with _agent(sim, nats_server.url, tmp_path / "state") as again:
        await until(lambda: again.link.connected)
        after_restart = await _raw(nc, NODE, wire)
        assert not after_restart.ok and after_restart.after["refused"] == "replayed"
    await nc.close()


async def test_the_executor_accepts_only_replies_its_agent_signed(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, _ = await provisioned(nats_server.url)
    fake_nc, _ = await provisioned(nats_server.url)
    client = AgentClient(nc, signer=SERVICE_KEY, timeout_s=1.0, attempts=2, budget_s=5)
    sim = SimGpuNode(tmp_path / "node", name=NODE, gpus=2)
    agent = _agent(sim, nats_server.url, tmp_path / "state")
    await _announce(nc, NODE, agent.signer.public_key)

    impostor_key = Signer(generate_seed())
    answered: list[str] = []

    async def impostor(msg: Msg) -> None:  # answers every command "ok", unsigned or with its own key
        cmd = json.loads(msg.data)
        answered.append(cmd["id"])
        reply = AgentReply(id=cmd["id"], ok=True, changed=True, detail="done", node=NODE, nonce=cmd.get("nonce"))
        body = json.loads(reply.model_dump_json())
        signed = impostor_key.sign_document(body) if len(answered) % 2 else body
        await msg.respond(json.dumps(signed).encode())

    sub = await fake_nc.subscribe(agent_cmd_subject(NODE), cb=impostor)
    with pytest.raises(AgentReplyRejected) as refused:
        await client.call(NODE, "reset_gpu", command_id="reset-0", gpu=GpuRef(index=0))
    assert "none signed by gpu-node-1's agent key" in str(refused.value)
    assert client.rejected_replies == len(answered) >= 2 and sim.gpu_state(0)["reset_count"] == 0
    # with the real agent up beside the impostor, the client takes the real, signed answer
    async with agent:
        await until(lambda: agent.link.connected)
        reply = await client.call(NODE, "status", command_id="status-0")
        assert reply.ok and reply.signer == agent.signer.public_key and reply.after["node"] == NODE
    await sub.unsubscribe()
    # a node with no agent key in KV: the client says how to fix it instead of trusting any reply
    with pytest.raises(AgentUnavailable) as unknown:
        await client.call(OTHER, "status", command_id="status-1")
    assert "bus creds --role agent --node gpu-node-2" in str(unknown.value)
    await fake_nc.close()
    await nc.close()


async def test_collect_bug_report_is_signed_and_verified_like_every_verb(nats_server: EmbeddedNats,
                                                                         tmp_path: Path) -> None:
    nc, _ = await provisioned(nats_server.url)
    sim = SimGpuNode(tmp_path / "node", name=NODE, gpus=1)
    report = AgentCommand(id="bug-0", verb="collect_bug_report")
    async with _agent(sim, nats_server.url, tmp_path / "state") as agent:
        await until(lambda: agent.link.connected)
        _, by_other = sign_command(Signer(generate_seed()), NODE, report, now=utcnow(), ttl_s=60)
        refused = await _raw(nc, NODE, by_other)
        assert not refused.ok and refused.after["refused"] == "untrusted" and sim.bug_reports == 0
        _, wire = sign_command(SERVICE_KEY, NODE, report, now=utcnow(), ttl_s=60)
        done = await _raw(nc, NODE, wire)
        assert done.ok and done.after["collected"] and sim.bug_reports == 1
        assert done.signer == agent.signer.public_key and done.node == NODE
    await nc.close()
