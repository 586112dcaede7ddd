"""The agent's command subscription is on the server before the agent calls itself up.

``BusLink`` sets ``up`` after its on-connect callbacks; the command responder's is the subscription to
``agent.<node>.cmd``. A sender on another connection (the executor, a person's ``remediator agent`` call)
that sees the agent up and sends at once must find a responder: the only ``no responders`` left is
nats-server's own, rare and brief, which senders retry.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats
import nats.errors
import pytest

from chaos.sim.gpu_node import SimGpuNode
from remediator.agent.commands import CommandResponder
from remediator.agent.state import StateStore
from remediator.natsd import EmbeddedNats
from remediator.subjects import agent_cmd_subject

NODE = "gpu-node-0"


async def test_a_command_sent_from_another_connection_right_after_subscribing_finds_the_agent(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Without the flush about half of such requests found no responder (the SUB still in the agent's
    buffer); with it nats-server still answers about one in 300 "no responders" for a moment, which senders
    retry (``AgentClient``, ``agent_support.command``): so this counts, over 100 subscriptions, and allows a
    few."""
    sim = SimGpuNode(tmp_path / NODE, name=NODE, gpus=1)
    agent = await nats.connect(nats_server.url)
    sender = await nats.connect(nats_server.url)
    missed = 0
    try:
        for i in range(100):  # a node's agent starting, each for the first time on this connection
            node = f"gpu-node-{i}"
            responder = CommandResponder(node=node, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / node))
            await responder.subscribe(agent)
            try:  # unsigned, so refused; any reply at all says the subscription was there
                reply = await sender.request(agent_cmd_subject(node), b'{"version":1,"id":"x","verb":"status"}',
                                             timeout=5)
                assert reply.data
            except nats.errors.NoRespondersError:
                missed += 1
    finally:
        await sender.close()
        await agent.close()
    assert missed <= 5, f"{missed} of 100 requests sent right after subscribing found no responder"


async def test_a_flush_that_fails_keeps_the_subscription_and_says_so(
        nats_server: EmbeddedNats, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The server goes away between the SUB and its confirmation: the subscription is the client's to send
    again on reconnect, and the bus link that asked is not brought down by the failed flush."""
    sim = SimGpuNode(tmp_path / NODE, name=NODE, gpus=1)
    responder = CommandResponder(node=NODE, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / "agent"))
    agent = await nats.connect(nats_server.url, allow_reconnect=True, reconnect_time_wait=0.2,
                               max_reconnect_attempts=-1)
    try:
        nats_server.stop()  # the next PING finds no server: no PONG comes back
        with caplog.at_level(logging.WARNING, logger="remediator.agent.commands"):
            sub = await responder.subscribe(agent)
        assert sub.subject == agent_cmd_subject(NODE)
        assert "has not confirmed the command subscription" in caplog.text
        nats_server.start()
        sender = await nats.connect(nats_server.url)
        try:
            for _ in range(50):  # the client re-sends its subscriptions once reconnected
                try:
                    reply = await sender.request(agent_cmd_subject(NODE), b'{"version":1,"id":"y","verb":"status"}',
                                                 timeout=1)
                    break
                except nats.errors.NoRespondersError:
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError("the subscription never reached the restarted server")
            assert reply.data
        finally:
            await sender.close()
    finally:
        await agent.close()
