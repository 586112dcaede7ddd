"""A hostile client inside the drill's world (issue 9): what a token holder or a client on the bus tries.

Where it sits: a chaos action (``hostile_client`` in a drill's timeline, ``chaos.runner``), beside
``chaos.actions``. ``attack`` sends a node's agent, over the harness's own connection (standing in for NATS
permissions that let a client through), every command it must refuse — unsigned, signed by a stranger's
key, captured for another node, captured long ago, replayed — and posts to the ingest what a token holder
must not get accepted (another producer's source and id space, no token, the wrong Content-Type). Each
attempt must be refused, with its reason; one that is not raises ``AssertionError`` (the drill fails). The
drill file then checks that no node was touched.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from nats.aio.client import Client as NATS

from chaos.world import World
from remediator import bus
from remediator.adapters.agent import sign_command
from remediator.contracts import AgentCommand, AgentReply, GpuRef, utcnow
from remediator.signing import Signer, generate_seed, load_signer
from remediator.subjects import agent_cmd_subject

__all__ = ["attack"]


async def _send(nc: NATS, node: str, wire: bytes) -> AgentReply:
    msg = await nc.request(agent_cmd_subject(node), wire, timeout=10)
    return AgentReply.model_validate_json(msg.data)


async def attack(world: World, node: str, other: str) -> str:
    """Every attack on ``node`` (and, through ``other``'s captured command, across nodes); returns one line.

    The commands go out on a connection of the service's NATS identity (the one identity NATS lets request
    ``agent.*.cmd``): what a client gets when permissions are misconfigured or a service credential leaks."""
    creds = world.nats_server.creds("service") if world.nats_server is not None and world.nats_server.secure \
        else None
    nc, _ = await bus.connect(world.nats_url, name="hostile-client",
                              credentials=bus.Credentials(creds_file=creds) if creds else None)
    try:
        return await _attack(world, nc, node, other)
    finally:
        await nc.close()


async def _attack(world: World, nc: NATS, node: str, other: str) -> str:
    service = load_signer(world.overrides["signing_seed_file"])  # stands in for commands captured on the wire
    stranger = Signer(generate_seed())
    reset = AgentCommand(id="hostile-reset", verb="reset_gpu", gpu=GpuRef(index=0))
    isolate = AgentCommand(id="hostile-isolate", verb="isolate_gpu", gpu=GpuRef(index=1))
    now = utcnow()
    refusals: dict[str, str] = {}

    async def expect(name: str, wire: bytes, reason: str) -> None:
        reply = await _send(nc, node, wire)
        got = reply.after.get("refused")
        assert not reply.ok and got == reason, f"{name}: the agent of {node} answered {reply.detail!r}"
        refusals[name] = reason

    await expect("unsigned", reset.model_copy(update={"node": node}).model_dump_json().encode(), "unsigned")
    await expect("stranger", sign_command(stranger, node, reset, now=now, ttl_s=60)[1], "untrusted")
    await expect("other-node", sign_command(service, other, isolate, now=now, ttl_s=60)[1], "wrong-node")
    await expect("expired", sign_command(service, node, isolate, now=now - timedelta(hours=1), ttl_s=60)[1],
                 "expired")
    status = AgentCommand(id="hostile-status", verb="status")
    _, captured = sign_command(service, node, status, now=now, ttl_s=60)
    first = await _send(nc, node, captured)  # the legitimate sending (a read-only verb)
    assert first.ok, first.detail
    await expect("replayed", captured, "replayed")
    tampered: dict[str, Any] = json.loads(sign_command(service, node, status, now=now, ttl_s=60)[1])
    tampered.update(verb="reboot_node")
    await expect("tampered", json.dumps(tampered).encode(), "bad-signature")

    token = {"Authorization": f"Bearer {world.settings.api_tokens.split(',')[0].split(':')[-1]}"}
    url = f"{world.base_url}/v1/events"
    event = {"id": "api|hostile", "node": node, "kind": "xid", "code": 79}
    http: dict[str, int] = {}
    for name, body, headers, want in (
        ("claims-alertmanager", [{**event, "source": "alertmanager"}], token, 422),
        ("claims-alert-id", [{**event, "id": "alertmanager|fp|firing|2026-01-01T00:00:00+00:00"}], token, 422),
        ("claims-agent-id", [{**event, "id": f"agent|{node}|boot|1"}], token, 422),
        ("no-token", [event], {}, 401),
    ):
        r = await world.http.post(url, json=body, headers=headers)
        assert r.status_code == want, f"{name}: /v1/events answered {r.status_code}, not {want}"
        http[name] = r.status_code
    r = await world.http.post(url, content=json.dumps([event]), headers={**token, "Content-Type": "text/plain"})
    assert r.status_code == 415, f"wrong Content-Type: /v1/events answered {r.status_code}"
    http["text/plain"] = 415
    counted = world.fleet.agents[node].stats()["refused_commands"]
    assert sum(counted.values()) >= len(refusals), f"the agent of {node} counted {counted}"
    agent_side = ", ".join(f"{k}: {v}" for k, v in refusals.items())
    ingest_side = ", ".join(f"{k}: {v}" for k, v in http.items())
    return (f"{len(refusals)} commands refused by {node}'s agent ({agent_side}); "
            f"{len(http)} requests refused by ingest ({ingest_side})")
