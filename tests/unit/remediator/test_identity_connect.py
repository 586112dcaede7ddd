"""bus.Credentials: what a client connects with, chosen from its creds file; failures name the file, never
the secret; URLs are printed without their user:password."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from remediator import bus
from remediator.identity import creds, keys
from remediator.identity.issuer import Issuer

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _creds(tmp_path: Path, role: str, node: str | None = None) -> Path:
    account, signer = keys.create("account"), keys.create("account")
    issued = Issuer(account.public_key, signer, signer).issue(role, node=node, now=NOW)
    assert issued.user is not None
    return creds.write(tmp_path / f"{role}.creds", issued.jwt, issued.user)


@pytest.mark.parametrize(("role", "node", "inbox"), [
    ("service", None, "_INBOX.service"),
    ("auditor", None, "_INBOX.auditor"),
    ("agent", "gpu.node-1", "_INBOX.agent.gpu_node-1"),
], ids=["service", "auditor", "agent"])
def test_the_creds_file_picks_the_reply_inbox(tmp_path: Path, role: str, node: str | None, inbox: str) -> None:
    path = _creds(tmp_path, role, node)
    opts = bus.Credentials(creds_file=str(path)).options()
    assert opts == {"user_credentials": str(path), "inbox_prefix": inbox}


def test_unusable_files_are_one_line_without_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        bus.Credentials(creds_file=str(tmp_path / "missing.creds")).options()
    seed = keys.create("user").seed.decode()
    (tmp_path / "seed-only").write_text(seed)
    with pytest.raises(ValueError, match=r"not a \.creds file") as err:
        bus.Credentials(creds_file=str(tmp_path / "seed-only")).options()
    assert seed not in str(err.value)
    assert bus.Credentials(nkey_seed_file=str(tmp_path / "seed-only")).options() == {
        "nkeys_seed": str(tmp_path / "seed-only")}
    with pytest.raises(ValueError, match="REMEDIATOR_NATS_TLS"):
        bus.Credentials(tls_ca=str(tmp_path / "no-ca.pem")).options()
    with pytest.raises(ValueError, match="needs its key"):
        bus.Credentials(tls_cert=str(tmp_path / "cert.pem")).options()


@pytest.mark.parametrize(("url", "shown"), [
    ("nats://user:s3cret@nats-0:4222", "nats://nats-0:4222"),
    ("nats://tok3n@a:4222, tls://u:p@b:4222", "nats://a:4222,tls://b:4222"),
    ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
], ids=["user-password", "token-and-list", "plain"])
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert bus.redact_url(url) == shown
