"""Signatures: ed25519 nkeys that sign agent commands, agent replies, audit records and audit checkpoints.

Where it sits: at the bottom, beside ``contracts`` (no NATS, no settings). The executor signs each
``AgentCommand`` with the service's key and the agent signs each ``AgentReply`` with its own
(``remediator.adapters.agent``, ``remediator.agent.commands``); ``remediator.audit`` signs every record and
checkpoint with the writer's key and ``verify`` checks them against a ``TrustSet``.

Keys are NATS nkeys (the ``nkeys`` library): a seed ``S...`` signs, its public key ``U...`` (or ``A``/``O``/
``N``) verifies. What is signed is always the canonical JSON of a document (``canonical``: sorted keys, no
spaces) without its ``sig`` field; the signature is base64url without padding. A signature proves which key
wrote the bytes; whether that key may act is the ``TrustSet``'s question.

The service's own key: ``signing_seed_file`` when configured (a file holding one seed, mode 0600), else in
the embedded/dev mode a seed generated once into ``<data dir>/identity/service.nk`` (``service_signer``). A
seed is never printed or logged; ``Signer.__repr__`` shows the public key only.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

__all__ = [
    "SERVICE_KEY_FILE",
    "Signer",
    "SigningKeyError",
    "TrustSet",
    "canonical",
    "generate_seed",
    "load_signer",
    "local_signer",
    "public_key_bytes",
    "service_signer",
    "signed_fields",
    "verify",
    "verify_document",
]

SERVICE_KEY_FILE = "service.nk"
"""Where the embedded mode keeps the service's signing seed, under ``<data dir>/identity/``."""

_PUBLIC_PREFIXES = {nkeys.PREFIX_BYTE_USER, nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_OPERATOR,
                    nkeys.PREFIX_BYTE_SERVER}
_MAX_SEED_FILE_BYTES = 64 * 1024


class SigningKeyError(ValueError):
    """A seed or public key that cannot be used; the message names the file or value's role, never the seed."""


def canonical(doc: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: ``doc`` as JSON with sorted keys and no spaces (``default=str``)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()


def signed_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` without ``sig``: what a document's signature covers."""
    return {k: v for k, v in doc.items() if k != "sig"}


def _b64(sig: bytes) -> str:
    return base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_bytes(public_key: str) -> bytes:
    """The raw 32-byte ed25519 key of an encoded nkey public key; ``SigningKeyError`` when it is not one."""
    try:
        raw = base64.b32decode(public_key.strip().encode() + b"=" * (-len(public_key.strip()) % 8))
    except (binascii.Error, ValueError):
        raise SigningKeyError("not an nkey public key (base32)") from None
    if len(raw) != 35:
        raise SigningKeyError("not an nkey public key (wrong length)")
    if raw[0] not in _PUBLIC_PREFIXES:
        raise SigningKeyError("not an nkey public key (a seed or an unknown kind of key)")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if nkeys.crc16(bytearray(body)) != crc:
        raise SigningKeyError("not an nkey public key (bad checksum)")
    return bytes(body[1:])


_VERIFY_KEYS: dict[str, nacl.signing.VerifyKey] = {}


def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    key = _VERIFY_KEYS.get(public_key)
    if key is None:
        key = nacl.signing.VerifyKey(public_key_bytes(public_key))
        if len(_VERIFY_KEYS) < 4096:  # a bounded cache: decoding a key costs more than the signature check
            _VERIFY_KEYS[public_key] = key
    return key


def verify(public_key: str, data: bytes, sig: str) -> bool:
    """Whether ``sig`` is ``public_key``'s signature of ``data`` (False for malformed keys or signatures)."""
    try:
        _verify_key(public_key).verify(data, _unb64(sig))
    except (SigningKeyError, nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, binascii.Error,
            ValueError, TypeError):
        return False
    return True


def verify_document(doc: Mapping[str, Any], *, signer_field: str = "signer") -> bool:
    """Whether ``doc['sig']`` is ``doc[signer_field]``'s signature of ``canonical(signed_fields(doc))``."""
    signer, sig = doc.get(signer_field), doc.get("sig")
    if not isinstance(signer, str) or not isinstance(sig, str):
        return False
    return verify(signer, canonical(signed_fields(doc)), sig)


def generate_seed() -> bytes:
    """A fresh user nkey seed (``SU...``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


class Signer:
    """Signs with one nkey seed; ``public_key`` is what others put in their trust set."""

    def __init__(self, seed: bytes | str) -> None:
        raw = seed.encode() if isinstance(seed, str) else bytes(seed)
        try:
            self._kp = nkeys.from_seed(bytearray(raw.strip()))
            self.public_key: str = self._kp.public_key.decode()
        except (nkeys.NkeysError, binascii.Error, ValueError, TypeError):
            raise SigningKeyError("not an nkey seed (expected one line starting with 'S')") from None

    def sign(self, data: bytes) -> str:
        return _b64(self._kp.sign(data))

    def sign_document(self, doc: Mapping[str, Any], *, signer_field: str = "signer") -> dict[str, Any]:
        """``doc`` with ``signer_field`` set to this key and ``sig`` its signature of the rest."""
        body = {**signed_fields(doc), signer_field: self.public_key}
        return {**body, "sig": self.sign(canonical(body))}

    def __repr__(self) -> str:
        return f"Signer({self.public_key})"


def _seed_from_text(text: bytes) -> bytes:
    """The seed in ``text``: a bare seed line, or the ``NKEY SEED`` block of a ``.creds`` file."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, line in enumerate(lines):
        if "BEGIN USER NKEY SEED" in line.decode("ascii", "replace") and i + 1 < len(lines):
            return lines[i + 1]
    for line in lines:
        if line.startswith(b"S") and not line.startswith(b"-"):
            return line
    raise SigningKeyError("holds no nkey seed")


def load_signer(path: str | Path) -> Signer:
    """The signer of the seed in ``path`` (a file with one seed line, or a NATS ``.creds`` file).

    Raises ``SigningKeyError`` naming the file and the fix; never the seed.
    """
    p = Path(path)
    try:
        if p.stat().st_size > _MAX_SEED_FILE_BYTES:
            raise SigningKeyError(f"{p}: too large to be a seed file (> {_MAX_SEED_FILE_BYTES} bytes)")
        text = p.read_bytes()
    except OSError as e:
        raise SigningKeyError(f"cannot read the signing seed {p}: {e.strerror} (set signing_seed_file to a readable "
                        "file holding one nkey seed)") from None
    try:
        return Signer(_seed_from_text(text))
    except SigningKeyError as e:
        raise SigningKeyError(f"{p}: {e} (write one seed, e.g. from `nsc generate nkey --user`)") from None


def service_signer(data_dir: str | Path | None, seed_file: str | Path | None = None) -> Signer:
    """The service's signing key: ``seed_file`` when given, else ``<data_dir>/identity/service.nk``, made
    once (mode 0600) when it does not exist yet. With neither, a key for this process only."""
    if seed_file:
        return load_signer(seed_file)
    if data_dir is None:
        return Signer(generate_seed())
    return local_signer(Path(data_dir) / "identity" / SERVICE_KEY_FILE)


def local_signer(path: str | Path) -> Signer:
    """The signer of the seed file ``path``, generated there once (mode 0600, its folder 0700)."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        try:
            os.write(fd, generate_seed() + b"\n")
        finally:
            os.close(fd)
    return load_signer(path)


class TrustSet:
    """The public keys whose signatures count: the service replicas' and operators' keys for the audit,
    the service's keys for an agent. Built from keys, comma-separated lists or seed/creds files."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        good: set[str] = set()
        for key in keys:
            for part in key.split(","):
                k = part.strip()
                if not k:
                    continue
                public_key_bytes(k)  # raises SigningKeyError for a value that is no public key
                good.add(k)
        self.keys = frozenset(good)

    @classmethod
    def of(cls, keys: Iterable[str] = (), signers: Iterable[Signer] = ()) -> TrustSet:
        return cls([*keys, *(s.public_key for s in signers)])

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"TrustSet({sorted(self.keys)})"
