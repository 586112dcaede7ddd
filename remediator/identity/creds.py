"""Standard NATS ``.creds`` files: a user JWT and its nkey seed, as ``nsc`` writes them and nats-py's
``user_credentials=`` reads them.

Where it sits: beside ``issuer`` (which makes the JWT) and under ``bus.connect`` (which reads a creds
file's identity to pick the reply inbox) and the agent (which signs its replies with the seed,
``read_seed``). Files are written with mode 0600; neither the JWT nor the seed is ever printed.
"""

from __future__ import annotations

import re
from pathlib import Path

from remediator.identity import keys
from remediator.identity.keys import IdentityError, KeyPair

_BLOCK = re.compile(r"-{3,}BEGIN ([A-Z ]+)-{3,}\s*\n(.*?)\n\s*-{3,}END \1-{3,}", re.S)

TEMPLATE = """-----BEGIN NATS USER JWT-----
{jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------

*************************************************************
"""


def render(jwt: str, user: KeyPair) -> str:
    """The ``.creds`` text of ``jwt`` and the seed of ``user``."""
    if user.kind != "user":
        raise IdentityError("a .creds file holds a user key")
    return TEMPLATE.format(jwt=jwt, seed=user.seed.decode())


def write(path: Path | str, jwt: str, user: KeyPair) -> Path:
    """Write the ``.creds`` file at ``path`` (mode 0600)."""
    p = Path(path)
    keys.write_secret(p, render(jwt, user))
    return p


def _blocks(text: str) -> dict[str, str]:
    return {m.group(1).strip(): m.group(2).strip() for m in _BLOCK.finditer(text)}


def jwt_of(text: str) -> str | None:
    return next((v for k, v in _blocks(text).items() if k.endswith("JWT")), None)


def seed_of(text: str) -> str | None:
    return next((v for k, v in _blocks(text).items() if k.endswith("NKEY SEED")), None)


def read_jwt(path: Path | str) -> str:
    """The user JWT of the ``.creds`` file at ``path``."""
    found = jwt_of(keys.read_secret(path))
    if not found:
        raise IdentityError(f"{path} holds no NATS USER JWT block: not a .creds file")
    return found


def read_seed(path: Path | str) -> KeyPair:
    """The user key pair (seed) of the ``.creds`` file at ``path``: what an agent signs its replies with."""
    found = seed_of(keys.read_secret(path))
    if not found:
        raise IdentityError(f"{path} holds no USER NKEY SEED block: not a .creds file")
    try:
        return keys.from_seed(found, "user")
    except IdentityError as e:
        raise IdentityError(f"{path}: {e}") from None
