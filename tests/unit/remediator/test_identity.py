"""remediator.identity: NATS JWTs, creds files, the role table and the issuer, without a server."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from remediator.contracts import FaultEvent
from remediator.dispatch import subject_mismatch
from remediator.identity import creds, jwt, keys, roles
from remediator.identity.issuer import Issuer, agent_key_record, agent_template
from remediator.identity.keys import IdentityError
from remediator.identity.store import OperatorStore

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _issuer() -> tuple[Issuer, keys.KeyPair, keys.KeyPair, keys.KeyPair]:
    account, roles_key, agents_key = keys.create("account"), keys.create("account"), keys.create("account")
    return Issuer(account.public_key, roles_key, agents_key), account, roles_key, agents_key


def test_jwt_round_trip_and_tampering() -> None:
    op = keys.create("operator")
    token = jwt.encode({"iat": 1, "name": "x", "sub": op.public_key, "nats": {"type": "operator", "version": 2}}, op)
    claims = jwt.verify(token, {op.public_key}, now=2)
    assert claims["iss"] == op.public_key and claims["jti"]
    head, body, sig = token.split(".")
    forged = jwt._b64(jwt._unb64(body).replace(b'"x"', b'"y"'))
    assert not jwt.decode(f"{head}.{forged}.{sig}").verified
    with pytest.raises(IdentityError, match="not trusted"):
        jwt.verify(token, {keys.create("operator").public_key}, now=2)


def test_expired_jwt_is_refused() -> None:
    issuer, *_ = _issuer()
    issued = issuer.issue("auditor", now=NOW, ttl=timedelta(seconds=60))
    with pytest.raises(IdentityError, match="expired"):
        jwt.verify(issued.jwt, {issuer.roles_key.public_key}, now=(NOW + timedelta(seconds=61)).timestamp())


def test_role_jwt_carries_its_permissions_and_inbox() -> None:
    issuer, account, roles_key, _ = _issuer()
    issued = issuer.issue("auditor", now=NOW)
    d = jwt.decode(issued.jwt)
    assert d.verified and d.issuer == roles_key.public_key and d.nats["issuer_account"] == account.public_key
    assert "_INBOX.auditor.>" in d.nats["sub"]["allow"]
    assert not [s for s in d.nats["pub"]["allow"] if s.startswith(("faults.", "$KV.", "agent."))]
    # the state bucket (the fleet page's ledger and approvals) is readable, by message or direct get only
    # (the bucket answers reads by direct get): never a put, a purge or a consumer on it
    state = sorted(s for s in d.nats["pub"]["allow"] if "KV_remediator-state" in s)
    assert state == ["$JS.API.DIRECT.GET.KV_remediator-state.>", "$JS.API.STREAM.INFO.KV_remediator-state",
                     "$JS.API.STREAM.MSG.GET.KV_remediator-state"]


def test_agent_jwt_from_the_scoped_key_holds_only_its_tags() -> None:
    issuer, _, _, agents_key = _issuer()
    issued = issuer.issue("agent", node="gpu.node-1", now=NOW, ttl=timedelta(hours=1))
    d = jwt.decode(issued.jwt)
    assert d.issuer == agents_key.public_key
    assert d.nats["tags"] == ["role:agent", "node:gpu_node-1"]
    assert not {"pub", "sub", "resp", "subs", "data", "payload"} & set(d.nats)
    assert d.claims["exp"] == int((NOW + timedelta(hours=1)).timestamp())
    assert roles.identity_of_tags(d.nats["tags"]) == roles.Identity("agent", "gpu_node-1", tuple(d.nats["tags"]))


def test_agent_template_names_its_node_only() -> None:
    perms = agent_template("AKEY")["template"]
    assert perms["pub"]["allow"] == ["faults.agent.{{tag(node)}}"]
    assert sorted(perms["sub"]["allow"]) == ["_INBOX.agent.{{tag(node)}}.>", "agent.{{tag(node)}}.cmd"]
    assert perms["resp"]["max"] == 1
    concrete = roles.role("agent").permissions("gpu-node-3")
    assert concrete["pub"]["allow"] == ["faults.agent.gpu-node-3"]


@pytest.mark.parametrize(("role", "node", "error"), [
    ("agent", None, "needs a node"),
    ("auditor", "gpu-node-1", "not per node"),
    ("agent", "gpu-node-1.>", "not a Kubernetes node name"),
    ("agent", "GPU*", "not a Kubernetes node name"),
    ("root", None, "unknown role"),
], ids=["agent-without-node", "role-with-node", "wildcard-node", "bad-node", "unknown-role"])
def test_issuer_refuses(role: str, node: str | None, error: str) -> None:
    issuer, *_ = _issuer()
    with pytest.raises(ValueError, match=error):
        issuer.issue(role, node=node, now=NOW)


def test_creds_file_round_trip_mode_0600(tmp_path: Path) -> None:
    issuer, *_ = _issuer()
    issued = issuer.issue("agent", node="gpu-node-1", now=NOW)
    path = creds.write(tmp_path / "a.creds", issued.jwt, issued.user)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert creds.read_jwt(path) == issued.jwt
    assert creds.read_seed(path).public_key == issued.user.public_key
    assert issued.user.seed.decode() not in repr(issued) and issued.jwt not in repr(issued)
    (tmp_path / "bad.creds").write_text("hello")
    with pytest.raises(IdentityError, match=r"not a \.creds file"):
        creds.read_jwt(tmp_path / "bad.creds")


def test_agent_key_record() -> None:
    issuer, *_ = _issuer()
    issued = issuer.issue("agent", node="gpu-node-1", now=NOW, ttl=timedelta(minutes=5))
    key, value = agent_key_record(issued)
    assert key == "agentkey.gpu-node-1"
    assert value == (f'{{"public_key": "{issued.user.public_key}", "issued_at": "2026-12-01T12:00:00+00:00", '
                     '"expires_at": "2026-12-01T12:05:00+00:00"}').encode()


def test_operator_store_persists_and_is_private(tmp_path: Path) -> None:
    first = OperatorStore.open(tmp_path / "identity")
    again = OperatorStore.open(tmp_path / "identity")
    assert again.account.public_key == first.account.public_key
    assert stat.S_IMODE((tmp_path / "identity" / "keys.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "identity").stat().st_mode) == 0o700
    config = first.server_config(now=NOW)
    assert "resolver: MEMORY" in config and f"system_account: {first.system.public_key}" in config
    assert first.agents_key.seed.decode() not in config


def _event(source: str, node: str) -> FaultEvent:
    return FaultEvent(id="x", source=source, node=node, kind="xid", code=79, observed_at=NOW, received_at=NOW)


@pytest.mark.parametrize(("subject", "source", "node", "refused"), [
    ("faults.agent.gpu-node-1", "agent", "gpu-node-1", False),
    ("faults.agent.gpu-node-1", "agent", "gpu-node-2", True),
    ("faults.agent.gpu-node-1", "api", "gpu-node-1", True),
    ("faults.api.gpu-node-1", "agent", "gpu-node-1", True),
    ("faults.api.gpu-node-1", "api", "gpu-node-2", False),
    ("faults.agent.gpu_node-1", "agent", "gpu.node-1", False),
], ids=["own-node", "other-node", "other-source", "agent-off-its-subject", "not-an-agent", "dotted-node"])
def test_agent_event_subject_must_match_body(subject: str, source: str, node: str, refused: bool) -> None:
    assert (subject_mismatch(subject, _event(source, node)) is not None) is refused
