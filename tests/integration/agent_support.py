"""Helpers for the node-agent integration tests: a provisioned bus, reading FAULTS, the agent CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from remediator import bus
from remediator.adapters.agent import sign_command
from remediator.contracts import AgentCommand, AgentReply, FaultEvent, utcnow
from remediator.settings import Settings
from remediator.signing import Signer, generate_seed, verify_document
from remediator.subjects import FAULTS_STREAM, agent_cmd_subject, faults_subject

REPO = Path(__file__).resolve().parents[2]


async def provisioned(url: str) -> tuple[NATS, JetStreamContext]:
    nc, js = await bus.connect(url, name="agent-test")
    await bus.provision(js, Settings())
    return nc, js


async def fault_events(js: JetStreamContext, node: str) -> list[FaultEvent]:
    """Every event stored in FAULTS for ``faults.agent.<node>``, in stream order."""
    info = await js.stream_info(FAULTS_STREAM)
    subject = faults_subject("agent", node)
    out = []
    for seq in range(info.state.first_seq or 1, info.state.last_seq + 1):
        msg = await js.get_msg(FAULTS_STREAM, seq)
        if msg.subject == subject and "Remediator-Report" not in (msg.headers or {}):  # events, not reports
            out.append(FaultEvent.model_validate_json(msg.data or b""))
    return out


async def wait_for_events(js: JetStreamContext, node: str, done: Callable[[list[FaultEvent]], bool], *,
                          within: float = 30.0, settle: float = 0.0) -> list[FaultEvent]:
    """Poll FAULTS until ``done(events)``; then wait ``settle`` seconds more and read again (late extras)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    events: list[FaultEvent] = []
    while loop.time() < deadline:
        events = await fault_events(js, node)
        if done(events):
            if settle:
                await asyncio.sleep(settle)
                events = await fault_events(js, node)
            return events
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {within}s; {len(events)} event(s): "
                         + ", ".join(f"{e.kind}/{e.code}" for e in events[-20:]))


SERVICE_KEY = Signer(generate_seed())
"""The service key these tests sign commands with; the agents they start trust it (``TRUST``)."""
TRUST: tuple[str, ...] = (SERVICE_KEY.public_key,)


async def command(nc: NATS, node: str, cmd: AgentCommand, within: float = 10.0) -> AgentReply:
    """Send ``cmd`` to ``node``'s agent signed by ``SERVICE_KEY`` (as the executor does); the reply must be
    signed by the agent and answer this sending."""
    sent, wire = sign_command(SERVICE_KEY, node, cmd, now=utcnow(), ttl_s=60)
    # "No responders" is retried, as the executor's AgentClient retries it: even after the agent's SUB was
    # confirmed by a PONG, nats-server now and then (about 1 request in 300 here) answers a request from
    # another connection with no responders for a moment (test_agent_command_subscription.py).
    for attempt in range(10):
        try:
            msg = await nc.request(agent_cmd_subject(node), wire, timeout=within)
            break
        except nats.errors.NoRespondersError:
            if attempt == 9:
                raise
            await asyncio.sleep(0.1)
    reply = AgentReply.model_validate_json(msg.data)
    assert verify_document(json.loads(msg.data)) and reply.node == node and reply.nonce == sent.nonce, reply
    return reply


async def until(condition: Callable[[], bool], within: float = 30.0) -> None:
    """Wait until ``condition()`` holds (polled every 50 ms); fail after ``within`` seconds."""
    for _ in range(int(within / 0.05) + 1):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {within}s")


def append_text(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def agent_cli(args: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None
              ) -> subprocess.Popen[bytes]:
    """``remediator agent ARGS`` as a child process (stderr to ``log``)."""
    full_env = {**os.environ, **(env or {})}
    argv = [sys.executable, "-c", "from remediator.cli import main; main()", "agent", *args]
    if log is None:
        return subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    with open(log, "ab") as stderr:  # the child keeps its own descriptor
        return subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=stderr)


def build_nvml_stub(out_dir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc is needed to build the NVML stub"
    out = out_dir / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(out), str(REPO / "chaos/native/nvml_stub.c"),
                    "-lpthread"], check=True, capture_output=True, timeout=120)
    return out
