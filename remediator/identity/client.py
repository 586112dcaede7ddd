"""The agent's side of the identity exchange: its NATS credentials from the service, kept fresh.

Where it sits: under ``remediator agent`` (``--identity-url``/``--identity-token-file``, what the chart's
DaemonSet sets). The agent's user nkey is the seed file ``<state>/identity/agent.nk`` (made once, mode 0600;
the same key signs its replies, ``remediator.signing.local_signer``) and never leaves the node: the agent
posts its public key with the projected ServiceAccount token the kubelet mounts, gets back a short-lived
user JWT for its node (``remediator.identity.http``), and writes ``<state>/identity/nats.creds`` (0600).
nats-py reads the creds file on every (re)connect, so ``keep_fresh`` rewriting it before the JWT expires
is enough: when the servers close the connection of an expired JWT, the reconnect presents the new one.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from remediator.identity import creds, keys
from remediator.identity.keys import IdentityError, KeyPair

log = logging.getLogger(__name__)

KEY_FILE = "agent.nk"
CREDS_FILE = "nats.creds"
MAX_ANSWER_BYTES = 64 * 1024


def agent_key(state_dir: Path | str) -> KeyPair:
    """The agent's user key pair, made once in ``<state>/identity/agent.nk``."""
    path = Path(state_dir) / "identity" / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        keys.write_secret(path, keys.create("user").seed.decode() + "\n")
    return keys.read_seed_file(path, "user")


async def fetch(url: str, token_file: Path | str, node: str, state_dir: Path | str, *,
                timeout_s: float = 10.0) -> tuple[Path, datetime | None]:
    """Ask the service at ``url`` for ``node``'s credentials with the token in ``token_file`` (read anew
    each time: the kubelet rotates it); write ``<state>/identity/nats.creds``; return it and its expiry.
    ``IdentityError`` with the service's one-line reason when refused."""
    user = agent_key(state_dir)
    token = keys.read_secret(token_file).strip()
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        answer = await http.post(url.rstrip("/") + "/v1/identity/agent",
                                 json={"node": node, "public_key": user.public_key},
                                 headers={"Authorization": f"Bearer {token}"})
    if len(answer.content) > MAX_ANSWER_BYTES:
        raise IdentityError("the identity endpoint answered more than 64 KiB")
    doc: Any = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
    if answer.status_code != 200 or not isinstance(doc, dict) or not isinstance(doc.get("jwt"), str):
        reason = doc.get("error") if isinstance(doc, dict) else None
        raise IdentityError(f"agent credentials refused ({answer.status_code}): {reason or 'no reason given'}")
    if doc.get("public_key") != user.public_key:
        raise IdentityError("the identity endpoint issued a JWT for another key")
    path = creds.write(Path(state_dir) / "identity" / CREDS_FILE, doc["jwt"], user)
    expires = doc.get("expires_at")
    return path, datetime.fromisoformat(expires) if isinstance(expires, str) else None


async def keep_fresh(url: str, token_file: Path | str, node: str, state_dir: Path | str,
                     expires_at: datetime | None, stop: asyncio.Event) -> None:
    """Fetch again at two thirds of each JWT's remaining life (retrying every 5 to 60 s on failure) until
    ``stop``."""
    backoff = 5.0
    while not stop.is_set() and expires_at is not None:
        wait = max(5.0, (expires_at - datetime.now(UTC)).total_seconds() * 2 / 3)
        try:
            await asyncio.wait_for(stop.wait(), wait)
            return
        except TimeoutError:
            pass
        try:
            _, expires_at = await fetch(url, token_file, node, state_dir)
            backoff = 5.0
            log.info("agent credentials for %s renewed (until %s)", node, expires_at)
        except (IdentityError, httpx.HTTPError, ValueError) as e:
            log.warning("renewing agent credentials failed: %s; retrying in %gs", e, backoff)
            expires_at = datetime.now(UTC)  # try again after the backoff
            await asyncio.sleep(backoff)
            backoff = min(60.0, backoff * 2)
