"""Issuing user credentials: a role's (or one node's agent's) user JWT, signed by an account signing key.

Where it sits: under ``remediator bus creds`` (``remediator.cli.bus``), the embedded server's store
(``store``), and the agent-identity endpoint (``remediator.identity.http``), which issues a short-lived
agent JWT after the Kubernetes TokenReview said which pod, and so which node, asks. Two signers:

* the **roles key**, a plain signing key of the account: the service's roles, each with its permissions
  written into the user JWT (``roles.ROLES``);
* the **agents key**, a *scoped* signing key whose template is the agent role's permissions over the
  ``node`` tag: a JWT it signs carries only ``role:agent`` and ``node:<token>`` tags, and the servers
  apply the template, so this key can mint nothing but one node's agent, whatever it is asked.

Every agent credential issued is also announced as that node's public agent key (``agent_key_record``),
the trust anchor for the agent's signed replies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from remediator import subjects
from remediator.identity import jwt, keys, roles
from remediator.identity.keys import IdentityError, KeyPair

MAX_TTL_S = 366 * 86_400


@dataclass(frozen=True)
class Issued:
    """One issued credential: the JWT, its user key pair (seed: secret) and what it grants."""

    jwt: str
    user: KeyPair | None  # None when the holder made its key and sent only the public key
    public_key: str
    role: str
    node: str | None
    issued_at: datetime
    expires_at: datetime | None

    def __repr__(self) -> str:  # never the JWT or the seed
        return f"Issued({self.role}, {self.node}, {self.public_key})"


@dataclass(frozen=True)
class Issuer:
    """Signs user JWTs for ``account`` (its public key). ``roles_key`` signs the service roles, ``agents_key``
    (a scoped signing key) the agents; either may be None when this issuer may not sign that kind. A key
    equal to the account key itself signs with explicit permissions (no ``issuer_account``)."""

    account: str
    roles_key: KeyPair | None = None
    agents_key: KeyPair | None = None
    agents_key_scoped: bool = True

    def issue(self, role_name: str, *, node: str | None = None, now: datetime,
              ttl: timedelta | None = None, name: str | None = None, public_key: str | None = None) -> Issued:
        """A fresh user key and its JWT for ``role_name`` (``node`` for an agent, required then and refused
        otherwise); ``ttl`` None: no expiry. ``public_key``: the JWT is for that user key (its holder keeps
        the seed; nothing secret is made here)."""
        r = roles.role(role_name)
        if r.per_node and not node:
            raise IdentityError(f"role {role_name} needs a node (--node NAME)")
        if not r.per_node and node:
            raise IdentityError(f"role {role_name} is not per node; leave out --node")
        if ttl is not None and not (timedelta(0) < ttl <= timedelta(seconds=MAX_TTL_S)):
            raise IdentityError(f"a credential lives between 1 s and {MAX_TTL_S} s")
        if node is not None:
            _check_node(node)
        token = subjects.node_token(node) if node else None
        signer = self.agents_key if r.per_node else self.roles_key
        if signer is None:
            raise IdentityError(f"this issuer holds no signing key for role {role_name}")
        if public_key is not None and keys.public_kind(public_key) != "user":
            raise IdentityError("public_key must be a user nkey (U…)")
        user = keys.create("user") if public_key is None else None
        subject = public_key if public_key is not None else user.public_key if user is not None else ""
        scoped = r.per_node and self.agents_key_scoped and signer.public_key != self.account
        iat = int(now.timestamp())
        exp = int((now + ttl).timestamp()) if ttl is not None else None
        claims = jwt.user_claims(
            subject, name=name or (f"agent-{node}" if node else role_name), iat=iat, exp=exp,
            issuer_account=None if signer.public_key == self.account else self.account,
            permissions=None if scoped else r.permissions(token), tags=roles.tags_of(role_name, token))
        return Issued(jwt.encode(claims, signer), user, subject, role_name, node, now,
                      now + ttl if ttl is not None else None)


def agent_template(agents_key: str) -> dict[str, Any]:
    """The account's scoped signing key entry for the agents: the agent role's permissions over the
    ``node`` tag."""
    perms = roles.role("agent").permissions(None)
    return {"kind": "user_scope", "key": agents_key, "role": "agent",
            "description": "one node's agent: its faults subject and its command subject only",
            "template": {**perms, "subs": jwt.UNLIMITED, "data": jwt.UNLIMITED, "payload": jwt.UNLIMITED}}


def agent_key_record(issued: Issued) -> tuple[str, bytes]:
    """The KV key and value that announce ``issued``'s public key as its node's agent key:
    ``agentkey.<node>`` → ``{"public_key", "issued_at", "expires_at"}``."""
    assert issued.node is not None
    value = {"public_key": issued.public_key, "issued_at": issued.issued_at.astimezone(UTC).isoformat(),
             "expires_at": issued.expires_at.astimezone(UTC).isoformat() if issued.expires_at else None}
    return subjects.agent_key_key(issued.node), json.dumps(value).encode()


def _check_node(node: str) -> None:
    """A Kubernetes node name (RFC 1123 subdomain): anything else could widen a subject."""
    import re

    if len(node) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", node):
        raise IdentityError(f"{node!r} is not a Kubernetes node name (RFC 1123: lower case, digits, '-', '.')")
