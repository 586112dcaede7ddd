"""The agent's command subscription is on the server before the agent calls itself up.

``BusLink`` sets ``up`` after its on-connect callbacks; the command responder's is the subscription to
``agent.<node>.cmd``. A sender on another connection (the executor, a person's ``remediator agent`` call)
that sees the agent up and sends at once must find a responder, never ``no responders``.
"""

from __future__ import annotations

from pathlib import Path

import nats

from chaos.sim.gpu_node import SimGpuNode
from remediator.agent.commands import CommandResponder
from remediator.agent.state import StateStore
from remediator.natsd import EmbeddedNats
from remediator.subjects import agent_cmd_subject

NODE = "gpu-node-0"


async def test_a_command_sent_from_another_connection_right_after_subscribing_finds_the_agent(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    sim = SimGpuNode(tmp_path / NODE, name=NODE, gpus=1)
    responder = CommandResponder(node=NODE, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / "agent"))
    agent = await nats.connect(nats_server.url)
    sender = await nats.connect(nats_server.url)
    try:
        for _ in range(40):
            sub = await responder.subscribe(agent)
            # unsigned, so refused; any reply at all says the subscription was there
            reply = await sender.request(agent_cmd_subject(NODE), b'{"version":1,"id":"x","verb":"status"}',
                                         timeout=5)
            assert reply.data
            await sub.unsubscribe()
            await agent.flush()
    finally:
        await sender.close()
        await agent.close()
