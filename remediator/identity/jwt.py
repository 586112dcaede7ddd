"""NATS JWTs (version 2): encode, sign and verify the operator, account and user claims.

Where it sits: under ``remediator.identity.store`` (the embedded operator and account), ``issuer`` (user
JWTs for roles and agents) and ``creds``. The format is the NATS JWT v2 one that ``nats-server`` and ``nsc``
use: ``base64url(header) . base64url(claims) . base64url(ed25519 signature)``, header
``{"typ": "JWT", "alg": "ed25519-nkey"}``, claims ``jti`` (the base32 SHA-512/256 of the claims without it),
``iat``, ``exp`` (optional), ``iss`` (the signing public key), ``sub`` (the subject's public key), ``name``,
and ``nats`` (the type-specific body with ``type`` and ``version: 2``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from remediator.identity import keys
from remediator.identity.keys import IdentityError, KeyPair

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
MAX_JWT_BYTES = 32 * 1024  # an account JWT with signing keys and revocations stays well under this


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict[str, Any], signer: KeyPair) -> str:
    """``claims`` (without ``jti``/``iss``) signed by ``signer``: the JWT text."""
    body = {k: v for k, v in claims.items() if k != "jti"}
    body["iss"] = signer.public_key
    digest = hashlib.new("sha512_256", json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).digest()
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    signing_input = _b64(json.dumps(HEADER, separators=(",", ":")).encode()) + "." + _b64(
        json.dumps(body, separators=(",", ":")).encode())
    return signing_input + "." + _b64(signer.sign(signing_input.encode()))


@dataclass(frozen=True)
class Decoded:
    """A JWT's claims, and whether its signature matched its ``iss``."""

    claims: dict[str, Any]
    verified: bool

    @property
    def issuer(self) -> str:
        return str(self.claims.get("iss", ""))

    @property
    def subject(self) -> str:
        return str(self.claims.get("sub", ""))

    @property
    def nats(self) -> dict[str, Any]:
        body = self.claims.get("nats")
        return body if isinstance(body, dict) else {}


def decode(token: str) -> Decoded:
    """Parse ``token`` and check its signature against its own ``iss``; raises ``IdentityError`` when it is
    not a NATS JWT at all. Whether ``iss`` is trusted is the caller's question."""
    if len(token) > MAX_JWT_BYTES:
        raise IdentityError(f"JWT longer than {MAX_JWT_BYTES} bytes")
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise IdentityError("not a JWT (three dot-separated parts expected)")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except ValueError:
        raise IdentityError("not a JWT (bad base64url or JSON)") from None
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"] or not isinstance(claims, dict):
        raise IdentityError("not a NATS JWT (alg ed25519-nkey expected)")
    issuer = claims.get("iss")
    verified = isinstance(issuer, str) and keys.verify(issuer, (parts[0] + "." + parts[1]).encode(), signature)
    return Decoded(claims, verified)


def verify(token: str, trusted_issuers: set[str], *, now: float) -> dict[str, Any]:
    """The claims of ``token`` when it is signed by one of ``trusted_issuers`` and not expired at ``now``
    (seconds since the epoch); otherwise ``IdentityError`` saying which check failed."""
    d = decode(token)
    if not d.verified:
        raise IdentityError("JWT signature does not match its issuer")
    if d.issuer not in trusted_issuers:
        raise IdentityError("JWT issuer is not trusted")
    exp = d.claims.get("exp")
    if isinstance(exp, int) and exp <= now:
        raise IdentityError("JWT expired")
    return d.claims


# --- the claims of each kind ------------------------------------------------------------------------------

UNLIMITED = -1


def operator_claims(operator: KeyPair, *, name: str, system_account: str, iat: int,
                    signing_keys: list[str] | None = None) -> dict[str, Any]:
    return {"iat": iat, "name": name, "sub": operator.public_key,
            "nats": {"type": "operator", "version": 2, "system_account": system_account,
                     "signing_keys": signing_keys or []}}


def account_claims(account: str, *, name: str, iat: int, jetstream: bool,
                   signing_keys: list[Any] | None = None,
                   revocations: dict[str, int] | None = None) -> dict[str, Any]:
    """An account's claims: unlimited connections and data; JetStream enabled (unlimited storage) when
    ``jetstream``; ``signing_keys`` plain public keys or scoped ``{"kind": "user_scope", ...}`` objects;
    ``revocations`` user public key → the time before which that user's JWTs are no longer accepted."""
    limits: dict[str, Any] = {"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
                              "imports": UNLIMITED, "exports": UNLIMITED, "wildcards": True,
                              "conn": UNLIMITED, "leaf": UNLIMITED}
    if jetstream:
        limits.update({"mem_storage": UNLIMITED, "disk_storage": UNLIMITED, "streams": UNLIMITED,
                       "consumer": UNLIMITED, "max_ack_pending": UNLIMITED,
                       "mem_max_stream_bytes": 0, "disk_max_stream_bytes": 0, "max_bytes_required": False})
    body: dict[str, Any] = {"type": "account", "version": 2, "limits": limits,
                            # a user JWT without permissions of its own (a plain key signed it with none): nothing
                            "default_permissions": {"pub": {"deny": [">"]}, "sub": {"deny": [">"]}}}
    if signing_keys:
        body["signing_keys"] = signing_keys
    if revocations:
        body["revocations"] = dict(revocations)
    return {"iat": iat, "name": name, "sub": account, "nats": body}


def user_claims(user: str, *, name: str, iat: int, exp: int | None, issuer_account: str | None,
                permissions: dict[str, Any] | None, tags: list[str]) -> dict[str, Any]:
    """A user's claims. ``permissions`` (``pub``/``sub``/``resp``) are left out for a user signed by a
    scoped signing key, whose template the server applies instead; ``issuer_account`` is the account when
    a signing key (not the account key itself) signs."""
    body: dict[str, Any] = {"type": "user", "version": 2, "tags": tags}
    if permissions:  # a scoped user may carry neither permissions nor limits: the template holds both
        body.update({"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED, **permissions})
    if issuer_account:
        body["issuer_account"] = issuer_account
    claims: dict[str, Any] = {"iat": iat, "name": name, "sub": user, "nats": body}
    if exp is not None:
        claims["exp"] = exp
    return claims
