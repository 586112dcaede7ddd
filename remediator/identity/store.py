"""The embedded operator: operator, system account, the remediator account and its two signing keys,
kept in ``DATA_DIR/identity/`` (mode 0700, every file 0600), and the role credentials made from them.

Where it sits: under ``remediator.natsd`` (which configures the embedded ``nats-server`` in operator mode
from it: the operator JWT, the system account, and a memory resolver preloaded with both account JWTs) and
under ``remediator bus creds --data-dir``. The first use creates the keys; later uses (a restarted
``serve``, ``audit list --data-dir`` on the demo's store) load them, so credentials issued earlier stay
valid. The directory also has room for other identities of the service (signing keys of its own).

Files: ``keys.json`` (every seed, 0600), ``revocations.json`` (user public key → revoked before, seconds),
``creds/<role>.creds`` (0600).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from remediator.identity import creds, jwt, keys
from remediator.identity.issuer import Issued, Issuer, agent_template
from remediator.identity.keys import IdentityError, KeyPair

ACCOUNT_NAME = "REMEDIATOR"
SYSTEM_ACCOUNT_NAME = "SYS"
OPERATOR_NAME = "remediator-embedded"
_ENTRIES = ("operator", "system", "account", "roles", "agents")


@dataclass
class OperatorStore:
    """The operator's keys in ``root`` (``DATA_DIR/identity``)."""

    root: Path
    operator: KeyPair
    system: KeyPair
    account: KeyPair
    roles_key: KeyPair
    agents_key: KeyPair
    revocations: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path | str) -> OperatorStore:
        """Load the store in ``root``, creating it (new random keys) when it does not exist."""
        root = Path(root)
        path = root / "keys.json"
        if not path.exists():
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o700)
            made = {"operator": keys.create("operator"), "system": keys.create("account"),
                    "account": keys.create("account"), "roles": keys.create("account"),
                    "agents": keys.create("account")}
            keys.write_secret(path, json.dumps({k: v.seed.decode() for k, v in made.items()}))
        try:
            raw = json.loads(keys.read_secret(path))
            loaded = {k: keys.from_seed(raw[k], "operator" if k == "operator" else "account") for k in _ENTRIES}
        except (ValueError, KeyError, TypeError):
            raise IdentityError(f"{path} is damaged; move {root} away to make a new embedded operator "
                                "(credentials issued from it stop working)") from None
        revoked: dict[str, int] = {}
        rpath = root / "revocations.json"
        if rpath.exists():
            with_values = json.loads(keys.read_secret(rpath))
            revoked = {str(k): int(v) for k, v in with_values.items()}
        return cls(root, loaded["operator"], loaded["system"], loaded["account"], loaded["roles"],
                   loaded["agents"], revoked)

    def issuer(self) -> Issuer:
        return Issuer(self.account.public_key, self.roles_key, self.agents_key)

    # --- the JWTs the server trusts ---------------------------------------------------------------

    def operator_jwt(self, now: datetime) -> str:
        return jwt.encode(jwt.operator_claims(self.operator, name=OPERATOR_NAME,
                                              system_account=self.system.public_key, iat=int(now.timestamp())),
                          self.operator)

    def account_jwt(self, now: datetime) -> str:
        claims = jwt.account_claims(self.account.public_key, name=ACCOUNT_NAME, iat=int(now.timestamp()),
                                    jetstream=True,
                                    signing_keys=[self.roles_key.public_key,
                                                  agent_template(self.agents_key.public_key)],
                                    revocations=self.revocations)
        return jwt.encode(claims, self.operator)

    def system_jwt(self, now: datetime) -> str:
        return jwt.encode(jwt.account_claims(self.system.public_key, name=SYSTEM_ACCOUNT_NAME,
                                             iat=int(now.timestamp()), jetstream=False), self.operator)

    def auth_config(self, *, now: datetime) -> str:
        """The operator-mode part of a ``nats-server`` configuration: the operator JWT, the system account
        and ``resolver_preload`` with both account JWTs; no ``resolver`` line, so it can be included beside
        the resolver a deployment chooses (``remediator bus operator`` writes it for the chart's bundled
        NATS, whose full resolver is configured by the official chart). Public data only: no seed."""
        return "\n".join([
            f"operator: {json.dumps(self.operator_jwt(now))}",
            f"system_account: {self.system.public_key}",
            "resolver_preload: {",
            f"  {self.account.public_key}: {json.dumps(self.account_jwt(now))}",
            f"  {self.system.public_key}: {json.dumps(self.system_jwt(now))}",
            "}",
            "",
        ])

    def server_config(self, *, now: datetime) -> str:
        """The embedded ``nats-server`` configuration: ``auth_config`` with a memory resolver (listen
        address, port and store come from the command line)."""
        return "\n".join([
            self.auth_config(now=now).rstrip("\n"),
            "resolver: MEMORY",
            "logfile_size_limit: 10485760",  # the log (permission violations among others) stays bounded
            "",
        ])

    # --- credentials --------------------------------------------------------------------------------

    def creds_path(self, role: str, node: str | None = None) -> Path:
        return self.root / "creds" / (f"{role}-{node}.creds" if node else f"{role}.creds")

    def role_creds(self, role: str, *, now: datetime | None = None) -> Path:
        """The ``.creds`` file of ``role`` in this store, made on first use (no expiry; the store's own)."""
        path = self.creds_path(role)
        if not path.exists():
            issued = self.issuer().issue(role, now=now or datetime.now(UTC))
            assert issued.user is not None
            creds.write(path, issued.jwt, issued.user)
        return path

    def issue(self, role: str, *, node: str | None = None, now: datetime,
              ttl: timedelta | None = None) -> Issued:
        return self.issuer().issue(role, node=node, now=now, ttl=ttl)

    def system_creds(self, *, now: datetime) -> Path:
        """A ``.creds`` file of a user of the system account (made on first use, mode 0600, kept in this
        store only) that may do one thing: push account JWTs to the servers' full resolver
        (``$SYS.REQ.CLAIMS.UPDATE``, ``remediator bus operator --push``) and read the answer."""
        path = self.creds_path("system")
        if not path.exists():
            user = keys.create("user")
            claims = jwt.user_claims(user.public_key, name="remediator-claims-push", iat=int(now.timestamp()),
                                     exp=None, issuer_account=None,
                                     permissions={"pub": {"allow": ["$SYS.REQ.CLAIMS.UPDATE"]},
                                                  "sub": {"allow": ["_INBOX.>"]}}, tags=["role:system-push"])
            creds.write(path, jwt.encode(claims, self.system), user)
        return path

    def revoke(self, user_public_key: str, *, now: datetime) -> None:
        """Refuse every JWT of ``user_public_key`` issued before ``now`` (takes effect when the server
        loads the account JWT again: ``EmbeddedNats.reload``)."""
        if keys.public_kind(user_public_key) != "user":
            raise IdentityError("revoke takes a user public key (U…)")
        self.revocations[user_public_key] = int(now.timestamp()) + 1
        keys.write_secret(self.root / "revocations.json", json.dumps(self.revocations))
