"""NATS nkeys: operator, account and user key pairs (ed25519), and the files that hold their seeds.

Where it sits: at the bottom of ``remediator.identity``; ``jwt`` signs with these keys, ``store`` keeps the
embedded operator's keys in the data directory, ``creds`` writes a user's seed into its ``.creds`` file.
A seed is a secret: it is only ever written to files of mode 0600 (``write_secret``) and never printed,
logged or put into an exception message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nkeys

KeyKind = Literal["operator", "account", "user"]

_PREFIX: dict[KeyKind, int] = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
_LETTER: dict[KeyKind, str] = {"operator": "O", "account": "A", "user": "U"}
MAX_SEED_FILE_BYTES = 64 * 1024  # a seed file, or a .creds file, is a few hundred bytes


class IdentityError(ValueError):
    """A key or seed that cannot be used; the message names the file and the fix, never the secret."""


@dataclass(frozen=True)
class KeyPair:
    """One nkey: its public key (``O…``, ``A…``, ``U…``) and the seed that signs for it."""

    kind: KeyKind
    public_key: str
    seed: bytes  # b"SO…", b"SA…", b"SU…": secret

    def __repr__(self) -> str:  # never the seed
        return f"KeyPair({self.kind}, {self.public_key})"

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(bytearray(self.seed)).sign(data))


def create(kind: KeyKind) -> KeyPair:
    """A fresh random key pair of ``kind``."""
    seed = bytes(nkeys.encode_seed(os.urandom(32), _PREFIX[kind]))
    return from_seed(seed, kind)


def from_seed(seed: bytes | str, kind: KeyKind | None = None) -> KeyPair:
    """The key pair of ``seed``; ``kind`` (when given) must be the seed's kind."""
    raw = seed.encode() if isinstance(seed, str) else bytes(seed)
    raw = raw.strip()
    try:
        kp = nkeys.from_seed(bytearray(raw))
        public = bytes(kp.public_key).decode()
    except Exception as e:  # nkeys raises its own error types, or binascii's, for a malformed seed
        raise IdentityError("not a valid nkey seed") from e
    letter = public[:1]
    found = next((k for k, v in _LETTER.items() if v == letter), None)
    if found is None or (kind is not None and found != kind):
        raise IdentityError(f"the seed is not {'an' if (kind or 'x')[0] in 'aeiou' else 'a'} {kind or 'known'} key")
    return KeyPair(found, public, raw)


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """True when ``signature`` over ``data`` was made by ``public_key``'s seed."""
    import nacl.exceptions
    import nacl.signing

    try:
        raw = _decode_public(public_key)
        nacl.signing.VerifyKey(raw).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, ValueError):
        return False
    return True


def public_kind(public_key: str) -> KeyKind | None:
    """The kind a public key names (by its letter and checksum), or None when it is not one."""
    try:
        _decode_public(public_key)
    except ValueError:
        return None
    return next((k for k, v in _LETTER.items() if v == public_key[:1]), None)


def _decode_public(public_key: str) -> bytes:
    import base64

    try:
        raw = base64.b32decode(public_key.encode() + b"=" * (-len(public_key) % 8))
    except Exception as e:
        raise ValueError("not base32") from e
    if len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0]):
        raise ValueError("not an nkey public key")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if nkeys.crc16(bytearray(body)) != crc:
        raise ValueError("checksum")
    return bytes(body[1:])


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically, whatever was there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_secret(path: Path | str) -> str:
    """The text of a secret file (a seed or a ``.creds`` file), bounded; the error names the file only."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_SEED_FILE_BYTES + 1)
    except OSError as e:
        raise IdentityError(f"cannot read {p}: {e.strerror}") from None
    if len(data) > MAX_SEED_FILE_BYTES:
        raise IdentityError(f"{p} is larger than {MAX_SEED_FILE_BYTES} bytes: not a seed or .creds file")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise IdentityError(f"{p} is not text: not a seed or .creds file") from None


def read_seed_file(path: Path | str, kind: KeyKind | None = None) -> KeyPair:
    """The key pair of the seed file at ``path`` (the seed alone, or a ``.creds`` file's seed block)."""
    text = read_secret(path)
    from remediator.identity.creds import seed_of

    seed = seed_of(text) or text.strip()
    try:
        return from_seed(seed, kind)
    except IdentityError as e:
        raise IdentityError(f"{path}: {e}") from None
