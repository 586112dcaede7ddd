"""Bearer tokens of the HTTP API and their scopes (DESIGN.md §5).

Where it sits: under the ingest app (``remediator.ingest.app``) and the audit API, which ask
``ApiTokens.authorize(header, scope)`` before anything else of a request is read. Tokens come from
``api_tokens`` (comma-separated) and the file ``api_tokens_file`` (one entry per line or comma-separated,
``#`` comments); each entry is ``TOKEN`` (every scope, today's meaning) or ``SCOPE:TOKEN``:

=================  ================================================================
scope              may
=================  ================================================================
``alertmanager``   ``POST /v1/alertmanager`` only
``events``         ``POST /v1/events`` only
``auditor``        the read-only audit API (``GET /v1/audit/...``) only
``admin``          everything
=================  ================================================================

A list that parses to nothing (``" , "``) or names an unknown scope is a ``TokenConfigError`` naming the
fix, never an open API. Tokens are held as SHA-256 digests and compared with ``hmac.compare_digest``
against every entry (no early exit), so neither the time taken nor an error says which token matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["SCOPES", "ApiTokens", "Scope", "TokenConfigError", "TokenRefused"]

Scope = Literal["alertmanager", "events", "auditor", "admin"]
SCOPES: tuple[Scope, ...] = ("alertmanager", "events", "auditor", "admin")
_MAX_TOKENS_FILE_BYTES = 1 << 20
_MAX_TOKEN_BYTES = 4096


class TokenConfigError(ValueError):
    """The configured token list cannot be used; the message names the setting and the fix (not a token)."""


class TokenRefused(Exception):
    """A request's credentials do not allow it: ``status`` 401 (none or unknown) or 403 (wrong scope)."""

    def __init__(self, status: int, error: str, challenge: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.challenge = challenge


def _entries(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        out += [part.strip() for part in line.split(",") if part.strip()]
    return out


@dataclass(frozen=True)
class ApiTokens:
    """The accepted tokens (as digests) with their scopes; empty means authentication is off."""

    entries: tuple[tuple[bytes, frozenset[Scope]], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> ApiTokens:
        parsed: dict[bytes, set[Scope]] = {}
        for entry in entries:
            scope, sep, token = entry.partition(":")
            scopes: frozenset[Scope]
            if sep and scope in SCOPES:
                scopes = frozenset({scope})
            elif sep and scope and " " not in scope:
                raise TokenConfigError(f"unknown token scope {scope!r}: write SCOPE:TOKEN with a scope of "
                                       f"{', '.join(SCOPES)}, or a bare TOKEN for every scope")
            else:
                token, scopes = entry, frozenset(SCOPES)
            token = token.strip()
            if not token:
                raise TokenConfigError(f"a {scope or 'token'} entry has an empty token")
            if len(token.encode()) > _MAX_TOKEN_BYTES:
                raise TokenConfigError(f"a token is longer than {_MAX_TOKEN_BYTES} bytes")
            parsed.setdefault(hashlib.sha256(token.encode()).digest(), set()).update(scopes)
        return cls(tuple((d, frozenset(s)) for d, s in sorted(parsed.items())))

    @classmethod
    def from_settings(cls, api_tokens: str, api_tokens_file: str | None = None) -> ApiTokens:
        """The tokens of ``REMEDIATOR_API_TOKENS`` and ``REMEDIATOR_API_TOKENS_FILE``.

        Raises ``TokenConfigError`` for a list that is set but holds no token, an unreadable or empty file,
        or an unknown scope."""
        entries = _entries(api_tokens)
        if api_tokens.strip() and not entries:
            raise TokenConfigError(f"REMEDIATOR_API_TOKENS={api_tokens!r} holds no token: give one or more "
                                   "comma-separated TOKEN or SCOPE:TOKEN entries, or unset it")
        if api_tokens_file:
            path = Path(api_tokens_file)
            try:
                if path.stat().st_size > _MAX_TOKENS_FILE_BYTES:
                    raise TokenConfigError(f"api_tokens_file {path} is larger than {_MAX_TOKENS_FILE_BYTES} bytes")
                text = path.read_text()
            except OSError as e:
                raise TokenConfigError(f"cannot read api_tokens_file {path}: {e.strerror}") from None
            from_file = _entries(text)
            if not from_file:
                raise TokenConfigError(f"api_tokens_file {path} holds no token (one TOKEN or SCOPE:TOKEN per line)")
            entries += from_file
        return cls.parse(entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def scopes_of(self, token: bytes) -> frozenset[Scope]:
        """The scopes ``token`` holds (empty: not a configured token); constant time in which one matched."""
        given = hashlib.sha256(token).digest()
        found: set[Scope] = set()
        for digest, scopes in self.entries:  # no early exit
            if hmac.compare_digest(given, digest):
                found |= scopes
        return frozenset(found)

    def authorize(self, header: bytes | None, scope: Scope) -> None:
        """Raise ``TokenRefused`` unless ``header`` (``Authorization``) is a bearer token holding ``scope``
        (or ``admin``); a no-op while no token is configured (``--insecure-no-auth``)."""
        if not self.entries:
            return
        kind, _, token = (header or b"").partition(b" ")
        token = token.strip()
        if kind.lower() != b"bearer" or not token:
            raise TokenRefused(401, "a bearer token is required", 'Bearer realm="remediator"')
        held = self.scopes_of(token)
        if not held:
            raise TokenRefused(401, "invalid bearer token", 'Bearer realm="remediator", error="invalid_token"')
        if scope not in held and "admin" not in held:
            raise TokenRefused(403, f"this token may not use this endpoint (it needs the {scope} scope)",
                               f'Bearer realm="remediator", error="insufficient_scope", scope="{scope}"')
