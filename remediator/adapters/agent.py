"""The request side of ``agent.<node>.cmd``: the executor asking a node agent to act on its node.

Where it sits: an adapter, beside the Kubernetes adapter (``remediator.adapters.kube``) and under the step
library (``playbooks.steps``), which calls it, typed against ``playbooks.ports.AgentPort``, for node-local
steps (isolate, release or reset a GPU, kill orphans, health check, reboot). The agent answers an
``AgentCommand`` with an ``AgentReply`` (``reply.change`` is the ``contracts.Change`` it made); a repeated
command id returns the first result, so a retried or resumed step never acts twice. This module retries
transport failures (no responder, timeout) with tenacity, bounded in attempts and time; a reply that says
``ok: false`` is the agent's answer and is returned, not retried. When no agent answers within that budget
the call raises ``AgentUnavailable``, a ``TemporaryError``: ``bus.settle`` naks the remediation for later.
"""

from __future__ import annotations

import hashlib
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential

from remediator.contracts import AgentCommand, AgentReply, AgentVerb, GpuRef
from remediator.errors import TemporaryError
from remediator.subjects import agent_cmd_subject

__all__ = ["AgentClient", "AgentUnavailable", "command_id"]


class AgentUnavailable(TemporaryError):
    """No agent answered on ``agent.<node>.cmd`` within the retry budget: try the remediation again later
    (after the consumer's configured delay)."""


def command_id(*parts: object) -> str:
    """A stable command id from its parts (incident, step, verb, probe number): the agent's idempotency key."""
    text = "|".join(str(p) for p in parts)
    return text if len(text) <= 200 else text[:120] + "|" + hashlib.sha256(text.encode()).hexdigest()[:32]


class AgentClient:
    """Sends ``AgentCommand``s; shared by every task of one process."""

    def __init__(self, nc: NATS, *, timeout_s: float = 10.0, attempts: int = 4, budget_s: float = 60.0) -> None:
        self._nc = nc
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.budget_s = budget_s

    async def call(self, node: str, verb: AgentVerb, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply:
        """Send one command and return the agent's reply; raises ``AgentUnavailable`` when none comes.

        ``command_id`` must be the same on every retry of the same intent (the agent deduplicates on it).
        """
        cmd = AgentCommand(id=command_id, verb=verb, gpu=gpu, params=params or {})
        data = cmd.model_dump_json().encode()
        subject = agent_cmd_subject(node)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.attempts) | stop_after_delay(self.budget_s),
                wait=wait_exponential(multiplier=0.2, max=5),
                retry=retry_if_exception_type((nats.errors.TimeoutError, nats.errors.NoRespondersError,
                                               TimeoutError)),
                reraise=True,
            ):
                with attempt:
                    msg = await self._nc.request(subject, data, timeout=timeout_s or self.timeout_s)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError) as err:
            raise AgentUnavailable(f"agent on {node} did not answer {verb} ({type(err).__name__})") from err
        reply = AgentReply.model_validate_json(msg.data)
        if reply.id != command_id:
            raise AgentUnavailable(f"agent on {node} answered command {reply.id!r}, not {command_id!r}")
        return reply
