"""Announcing an agent's key: when a node's agent credentials are issued, its public user nkey is written to
KV ``remediator-state`` at ``agentkey.<node>`` (``{"public_key", "issued_at", "expires_at"}``).

Where it sits: beside ``issuer``; called by ``remediator bus creds --role agent``, the drill harness and the
agent-identity endpoint. The executor (``remediator.adapters.agent``) reads the key back to accept only
replies that node's agent signed with the seed of its ``.creds`` file.
"""

from __future__ import annotations

from nats.js.client import JetStreamContext

from remediator.identity.issuer import Issued, agent_key_record
from remediator.subjects import STATE_BUCKET


async def announce(js: JetStreamContext, issued: Issued) -> None:
    """Make ``issued`` the trusted key of its node's agent. A plain put, not compare-and-set: the newest
    issuance is the node's key by definition, and the one before it stops being trusted."""
    key, value = agent_key_record(issued)
    kv = await js.key_value(STATE_BUCKET)
    await kv.put(key, value)
