"""The request side of ``agent.<node>.cmd``: the executor asking a node agent to act on its node.

Where it sits: an adapter, beside the Kubernetes adapter (``remediator.adapters.kube``) and under the step
library (``playbooks.steps``), which calls it, typed against ``playbooks.ports.AgentPort``, for node-local
steps (isolate, release or reset a GPU, kill orphans, health check, reboot). The agent answers an
``AgentCommand`` with an ``AgentReply`` (``reply.change`` is the ``contracts.Change`` it made); a repeated
command id returns the first result, so a retried or resumed step never acts twice. This module retries
transport failures (no responder, timeout) with tenacity, bounded in attempts and time; a reply that says
``ok: false`` is the agent's answer and is returned, not retried. When no agent answers within that budget
the call raises ``AgentUnavailable``, a ``TemporaryError``: ``bus.settle`` naks the remediation for later.

Signed both ways (DESIGN.md §4). Every sending of a command is signed by the service's key
(``remediator.signing``) and names its ``node``, a fresh ``nonce`` (once-only: the agent keeps the nonces it
has seen until they expire) and ``issued_at``/``expires_at`` (``command_ttl_s``); the id stays the
idempotency key across retries. A reply counts only when it is signed by that node's agent key, names the
node and answers this sending's nonce and id: the key is the one the credentials issuer wrote to KV
``remediator-state`` at ``agentkey.<node>`` (``AgentKeys``, cached ``cache_s``). Any other reply (unsigned,
another key, a replayed reply to an earlier nonce) is rejected, counted (``rejected_replies``) and logged,
and the client keeps waiting for the real one; if none comes the call raises ``AgentReplyRejected``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential

from remediator.contracts import AgentCommand, AgentReply, AgentVerb, GpuRef, utcnow
from remediator.errors import TemporaryError
from remediator.signing import Signer, generate_seed, verify_document
from remediator.subjects import STATE_BUCKET, agent_cmd_subject, agent_key_key

__all__ = ["AgentClient", "AgentKeys", "AgentReplyRejected", "AgentUnavailable", "command_id", "sign_command"]

log = logging.getLogger(__name__)

_MAX_REPLY_BYTES = 4 * 1024 * 1024


class AgentUnavailable(TemporaryError):
    """No agent answered on ``agent.<node>.cmd`` within the retry budget: try the remediation again later
    (after the consumer's configured delay)."""


class AgentReplyRejected(AgentUnavailable):
    """Replies came, but none signed by the node's agent key for this command: an impostor, or an agent
    whose key changed (its credentials re-issued); tried again later like an unavailable agent."""


def command_id(*parts: object) -> str:
    """A stable command id from its parts (incident, step, verb, probe number): the agent's idempotency key."""
    text = "|".join(str(p) for p in parts)
    return text if len(text) <= 200 else text[:120] + "|" + hashlib.sha256(text.encode()).hexdigest()[:32]


def sign_command(signer: Signer, node: str, cmd: AgentCommand, *, now: datetime,
                 ttl_s: float) -> tuple[AgentCommand, bytes]:
    """``cmd`` for ``node``, with a fresh nonce, valid from ``now`` for ``ttl_s``, signed by ``signer``: the
    command and the exact bytes to send (the agent verifies the JSON it receives, so these are not
    re-serialised)."""
    unsigned = cmd.model_copy(update={"node": node, "nonce": secrets.token_hex(16), "issued_at": now,
                                      "expires_at": now + timedelta(seconds=ttl_s), "signer": None, "sig": None})
    doc = signer.sign_document(json.loads(unsigned.model_dump_json()))
    return AgentCommand.model_validate(doc), json.dumps(doc, separators=(",", ":")).encode()


class AgentKeys:
    """The public key of each node's agent, read from KV ``agentkey.<node>`` (``{"public_key",
    "issued_at", "expires_at"}``) and cached for ``cache_s``; an expired entry is no key."""

    def __init__(self, nc: NATS, *, cache_s: float = 30.0, clock: Callable[[], datetime] = utcnow) -> None:
        self._nc = nc
        self.cache_s = cache_s
        self._clock = clock
        self._kv: KeyValue | None = None
        self._cache: dict[str, tuple[float, str | None]] = {}

    async def key(self, node: str, *, fresh: bool = False) -> str | None:
        """``node``'s agent key, or None when none is issued (or it expired)."""
        cached = self._cache.get(node)
        now = time.monotonic()
        if cached is not None and not fresh and now - cached[0] < self.cache_s:
            return cached[1]
        value = await self._read(node)
        if len(self._cache) > 16_384:
            self._cache.clear()
        self._cache[node] = (now, value)
        return value

    async def _read(self, node: str) -> str | None:
        if self._kv is None:
            try:
                self._kv = await self._nc.jetstream().key_value(STATE_BUCKET)
            except (BucketNotFoundError, NotFoundError):
                return None
        try:
            entry = await self._kv.get(agent_key_key(node))
        except (KeyNotFoundError, KeyDeletedError, NotFoundError):
            return None
        try:
            doc = json.loads(entry.value or b"")
            key = doc["public_key"]
            expires = doc.get("expires_at")
        except (ValueError, KeyError, TypeError):
            log.warning("KV %s is not an agent key document; ignoring it", agent_key_key(node))
            return None
        if expires:
            try:
                if datetime.fromisoformat(str(expires).replace("Z", "+00:00")) < self._clock():
                    return None
            except ValueError:
                return None
        return str(key) if isinstance(key, str) else None


class AgentClient:
    """Sends signed ``AgentCommand``s and accepts only replies signed by the node's agent; shared by every
    task of one process.

    ``signer`` is the service's key (None: a key of this process only, which no agent trusts: for tests of
    the refusal); ``keys`` where the agents' keys come from (default: KV over ``nc``).
    """

    def __init__(self, nc: NATS, *, timeout_s: float = 10.0, attempts: int = 4, budget_s: float = 60.0,
                 signer: Signer | None = None, keys: AgentKeys | None = None, command_ttl_s: float = 60.0,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self._nc = nc
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.budget_s = budget_s
        self.signer = signer or Signer(generate_seed())
        self.keys = keys or AgentKeys(nc, clock=clock)
        self.command_ttl_s = command_ttl_s
        self._clock = clock
        self.rejected_replies = 0

    def sign(self, node: str, cmd: AgentCommand) -> tuple[AgentCommand, bytes]:
        """``cmd`` as sent to ``node`` once: a fresh nonce, valid for ``command_ttl_s``, signed."""
        return sign_command(self.signer, node, cmd, now=self._clock(), ttl_s=self.command_ttl_s)

    async def call(self, node: str, verb: AgentVerb, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply:
        """Send one command and return the agent's reply; raises ``AgentUnavailable`` when none comes.

        ``command_id`` must be the same on every retry of the same intent (the agent deduplicates on it).
        """
        cmd = AgentCommand(id=command_id, verb=verb, gpu=gpu, params=params or {})
        key = await self.keys.key(node)
        if key is None:
            raise AgentUnavailable(f"no agent key for {node} in KV {STATE_BUCKET} ({agent_key_key(node)}): its "
                                   f"replies cannot be verified; issue the agent's credentials "
                                   f"(`remediator bus creds --role agent --node {node}`)")
        rejected: list[str] = []
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.attempts) | stop_after_delay(self.budget_s),
                wait=wait_exponential(multiplier=0.2, max=5),
                retry=retry_if_exception_type((nats.errors.TimeoutError, nats.errors.NoRespondersError,
                                               TimeoutError)),
                reraise=True,
            ):
                with attempt:
                    return await self._exchange(node, *self.sign(node, cmd), timeout_s or self.timeout_s,
                                                rejected)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError) as err:
            if rejected:
                raise AgentReplyRejected(
                    f"agent.{node}.cmd: {len(rejected)} reply(ies) to {verb} {command_id!r} rejected, none signed "
                    f"by {node}'s agent key: {rejected[0]}") from err
            raise AgentUnavailable(f"agent on {node} did not answer {verb} ({type(err).__name__})") from err
        raise AssertionError("unreachable")  # pragma: no cover - AsyncRetrying either returns or raises

    async def _exchange(self, node: str, sent: AgentCommand, wire: bytes, wait_s: float,
                        rejected: list[str]) -> AgentReply:
        """Publish ``sent`` with a reply inbox of our own and wait for the first reply that verifies."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        try:
            await self._nc.publish(agent_cmd_subject(node), wire, reply=inbox)
            refreshed = False
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise nats.errors.TimeoutError
                msg = await sub.next_msg(timeout=remaining)
                if msg.headers and msg.headers.get("Status") == "503":
                    raise nats.errors.NoRespondersError
                problem = await self._problem(node, sent, msg.data, refreshed)
                if problem == "retry-key":  # the key may have been re-issued: read it again, once
                    refreshed = True
                    problem = await self._problem(node, sent, msg.data, refreshed)
                if not problem:
                    return AgentReply.model_validate_json(msg.data)
                self.rejected_replies += 1
                rejected.append(problem)
                log.warning("rejected a reply on agent.%s.cmd to %s %r: %s", node, sent.verb, sent.id, problem)
        finally:
            await sub.unsubscribe()

    async def _problem(self, node: str, sent: AgentCommand, data: bytes, fresh: bool) -> str:
        """'' when ``data`` is a valid reply to ``sent`` from ``node``'s agent; else what is wrong
        (``retry-key``: signed by another key, worth one fresh read of the agent's key)."""
        if len(data) > _MAX_REPLY_BYTES:
            return f"reply of {len(data)} bytes is over the limit"
        try:
            raw = json.loads(data)
            reply = AgentReply.model_validate(raw)
        except (ValueError, ValidationError) as e:
            return f"not an agent reply ({type(e).__name__})"
        if reply.sig is None or reply.signer is None:
            return "unsigned reply"
        key = await self.keys.key(node, fresh=fresh)
        if reply.signer != key:
            return "retry-key" if not fresh else f"signed by {reply.signer}, not by {node}'s agent key {key}"
        if not verify_document(raw):
            return "bad signature"
        if reply.node != node:
            return f"answers for node {reply.node!r}"
        if reply.nonce != sent.nonce or reply.id != sent.id:
            return "answers another command (replayed reply)"
        return ""
