"""remediator.signing: nkey signatures over canonical documents, seed files, the service key, trust sets."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from remediator.signing import (
    Signer,
    SigningKeyError,
    TrustSet,
    generate_seed,
    load_signer,
    public_key_bytes,
    service_signer,
    verify,
    verify_document,
)


def test_a_signed_document_verifies_and_any_change_breaks_it() -> None:
    key = Signer(generate_seed())
    doc = key.sign_document({"verb": "reset_gpu", "node": "gpu-node-1", "params": {"b": 2, "a": 1}})
    assert doc["signer"] == key.public_key and verify_document(doc)
    assert verify_document({**doc, "params": {"a": 1, "b": 2}})  # canonical: key order does not matter
    sig = doc["sig"]
    flipped = sig[:10] + ("B" if sig[10] != "B" else "C") + sig[11:]  # always a different signature
    for changed in ({"verb": "reboot_node"}, {"node": "gpu-node-2"}, {"signer": Signer(generate_seed()).public_key},
                    {"sig": flipped}):
        assert not verify_document({**doc, **changed})
    assert not verify_document({k: v for k, v in doc.items() if k != "sig"})


def test_malformed_keys_and_signatures_never_raise() -> None:
    key = Signer(generate_seed())
    assert not verify("not-a-key", b"x", key.sign(b"x"))
    assert not verify(key.public_key, b"x", "!!")
    with pytest.raises(SigningKeyError):
        public_key_bytes(generate_seed().decode())  # a seed is not a public key
    with pytest.raises(SigningKeyError):
        Signer(b"SUnot-a-seed")


def test_seed_files_and_creds_files_load_and_the_error_names_the_file_not_the_seed(tmp_path: Path) -> None:
    seed = generate_seed()
    plain = tmp_path / "service.nk"
    plain.write_bytes(seed + b"\n")
    creds = tmp_path / "agent.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\neyJ0eXAi.x.y\n------END NATS USER JWT------\n\n"
                     "-----BEGIN USER NKEY SEED-----\n" + seed.decode() + "\n------END USER NKEY SEED------\n")
    assert load_signer(plain).public_key == load_signer(creds).public_key == Signer(seed).public_key
    bad = tmp_path / "bad.nk"
    bad.write_text("hello\n")
    with pytest.raises(SigningKeyError, match=r"bad\.nk") as e:
        load_signer(bad)
    assert seed.decode() not in str(e.value) and seed.decode() not in repr(Signer(seed))


def test_the_service_key_is_made_once_with_mode_0600(tmp_path: Path) -> None:
    first = service_signer(tmp_path)
    path = tmp_path / "identity" / "service.nk"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert service_signer(tmp_path).public_key == first.public_key
    other = tmp_path / "other.nk"
    other.write_bytes(generate_seed())
    assert service_signer(tmp_path, other).public_key != first.public_key


def test_trust_sets_take_comma_lists_and_refuse_what_is_no_public_key() -> None:
    a, b = Signer(generate_seed()), Signer(generate_seed())
    trust = TrustSet([f"{a.public_key}, {b.public_key}", " , "])
    assert a.public_key in trust and b.public_key in trust and len(trust) == 2
    assert not TrustSet([" , "])
    with pytest.raises(SigningKeyError):
        TrustSet(["UNOTAKEY"])
