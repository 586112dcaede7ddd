"""Who may do what on the bus: the NATS permissions of each role (DESIGN.md §4), as data.

Where it sits: under ``remediator.identity.issuer`` (which signs them into user JWTs) and ``store`` (which
puts the agent template on the account's scoped signing key). Every subject comes from
``remediator.subjects``. Each role has its own reply inbox (``_INBOX.<role>.…``, and
``_INBOX.agent.<node>.…`` for an agent), so no identity can read another's request replies, JetStream API
answers or KV reads; ``bus.connect`` sets the matching ``inbox_prefix`` from the credentials.

============  ==================================================================================
role          may
============  ==================================================================================
ingest        publish ``faults.alertmanager.>``, ``faults.api.>``, ``faults.chaos.>``; FAULTS info
dispatcher    consume FAULTS through ``dispatch``; read/write KV state; publish REMEDIATIONS, AUDIT (and
              its checkpoints ``auditcp.>``), DEADLETTER; read the audit chain heads it appends to
executor      consume REMEDIATIONS through ``executor``; read/write KV state and locks; request
              ``agent.*.cmd``; publish AUDIT and DEADLETTER
service       the union of ingest, dispatcher, executor and auditor: one ``serve`` replica runs them all
operator      read/write KV state (ledger, approvals); append to AUDIT (and its checkpoints) and read it
auditor       read AUDIT and AUDITCP (stream info, direct get, ephemeral consumers), and read the KV state
              bucket by message get (the fleet page's ledger and approvals); nothing else, no write
agent         publish ``faults.agent.<its node>``; receive ``agent.<its node>.cmd`` and answer each
              request once (``allow_responses``); nothing else: no KV, no audit, no other node
bench         ``remediator bench``'s own ``bench.>`` subjects (its floor and raw-publish phases)
admin         the whole JetStream API and KV (``remediator bus init``: declare streams, consumers and
              buckets; ``bus creds --data-dir``: announce an agent's key); no FAULTS, AUDIT or agent subject
============  ==================================================================================

The agent's permissions are a template over the user's ``node:<token>`` tag (``{{tag(node)}}``), carried
by the account's scoped signing key: one key signs every node's agent, the servers learn nothing per node,
and a user JWT signed by that key can hold no other permission whatever its claims say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remediator import subjects as S

NODE_TAG = "node"
ROLE_TAG = "role"
NODE_TEMPLATE = "{{tag(" + NODE_TAG + ")}}"
RESPONSE_TTL_NS = 15 * 60 * 1_000_000_000  # an agent may answer a command within 15 min (a reset is slow)
INBOX = "_INBOX"


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    responses: bool = False
    per_node: bool = False

    def inbox(self, node_token: str | None = None) -> str:
        """This role's reply inbox prefix (for an agent: its node's, ``node_token`` in subject form)."""
        if self.per_node:
            return f"{INBOX}.{self.name}.{node_token if node_token is not None else NODE_TEMPLATE}"
        return f"{INBOX}.{self.name}"

    def permissions(self, node_token: str | None = None) -> dict[str, Any]:
        """The JWT ``pub``/``sub``/``resp`` of this role; an agent's with its node in place of the tag
        template (``node_token`` None: the template itself, for the scoped signing key)."""
        def fill(subject: str) -> str:
            return subject.replace(NODE_TEMPLATE, node_token) if node_token is not None else subject

        perms: dict[str, Any] = {
            "pub": {"allow": sorted({fill(s) for s in self.publish})},
            "sub": {"allow": sorted({fill(s) for s in (*self.subscribe, self.inbox(node_token) + ".>")})},
        }
        if self.responses:
            perms["resp"] = {"max": 1, "ttl": RESPONSE_TTL_NS}
        return perms


def _read_stream(stream: str) -> tuple[str, ...]:
    """Read a stream: its info, direct and API gets, ephemeral consumers and their acks/flow control."""
    return (f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
            f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.>", f"$JS.API.CONSUMER.DELETE.{stream}.>",
            f"$JS.API.CONSUMER.INFO.{stream}.>", f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
            f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>")


def _kv(bucket: str) -> tuple[str, ...]:
    """Read and write (compare-and-set) one KV bucket, and watch it."""
    return (*_read_stream(f"KV_{bucket}"), f"$KV.{bucket}.>")


def _durable(stream: str, durable: str) -> tuple[str, ...]:
    """Pull from one provisioned durable consumer and ack its messages; never create or delete one."""
    return (f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", f"$JS.ACK.{stream}.{durable}.>")


_ACCOUNT_INFO = ("$JS.API.INFO",)
# The signed checkpoints of the audit chain heads: subjects auditcp.<node> on the stream AUDITCP (audit.py).
_CHECKPOINTS, _CHECKPOINT_STREAM = "auditcp.>", "AUDITCP"
_AUDIT_APPEND = (S.AUDIT_WILDCARD, f"$JS.API.STREAM.INFO.{S.AUDIT_STREAM}", f"$JS.API.DIRECT.GET.{S.AUDIT_STREAM}",
                 f"$JS.API.DIRECT.GET.{S.AUDIT_STREAM}.>", f"$JS.API.STREAM.MSG.GET.{S.AUDIT_STREAM}",
                 _CHECKPOINTS, *(_read_stream(_CHECKPOINT_STREAM)))

# What ``bus.verify`` reads at a replica's start: every stream's and durable consumer's configuration.
_VERIFY = (*(f"$JS.API.STREAM.INFO.{n}" for n in (S.FAULTS_STREAM, S.REMEDIATIONS_STREAM, S.AUDIT_STREAM,
                                                  S.DEAD_LETTER_STREAM, _CHECKPOINT_STREAM,
                                                  f"KV_{S.STATE_BUCKET}", f"KV_{S.LOCKS_BUCKET}")),
           f"$JS.API.CONSUMER.INFO.{S.FAULTS_STREAM}.dispatch",
           f"$JS.API.CONSUMER.INFO.{S.REMEDIATIONS_STREAM}.executor")

_INGEST = (S.faults_subject("alertmanager", "*"), S.faults_subject("api", "*"), S.faults_subject("chaos", "*"),
           f"$JS.API.STREAM.INFO.{S.FAULTS_STREAM}", *_ACCOUNT_INFO)
_DISPATCHER = (*_VERIFY, *_durable(S.FAULTS_STREAM, "dispatch"), *_kv(S.STATE_BUCKET), S.REMEDIATIONS_WILDCARD,
               *_AUDIT_APPEND, S.DEAD_LETTER_WILDCARD, f"$JS.API.STREAM.INFO.{S.REMEDIATIONS_STREAM}",
               *_ACCOUNT_INFO)
_EXECUTOR = (*_VERIFY, *_durable(S.REMEDIATIONS_STREAM, "executor"), *_kv(S.STATE_BUCKET), *_kv(S.LOCKS_BUCKET),
             "agent.*.cmd", *_AUDIT_APPEND, S.DEAD_LETTER_WILDCARD, *_ACCOUNT_INFO)
# The auditor also reads, and only reads, the state bucket (the fleet page's safety ledger and approvals):
# stream info and message get of KV_remediator-state; no $KV publish, so no write.
_STATE_FOR_REVIEW = (f"$JS.API.STREAM.INFO.KV_{S.STATE_BUCKET}", f"$JS.API.STREAM.MSG.GET.KV_{S.STATE_BUCKET}",
                     f"$JS.API.DIRECT.GET.KV_{S.STATE_BUCKET}.>")  # the bucket answers reads by direct get
_AUDITOR = (*_read_stream(S.AUDIT_STREAM), *_read_stream(_CHECKPOINT_STREAM), *_STATE_FOR_REVIEW, *_ACCOUNT_INFO)
_OPERATOR = (*_kv(S.STATE_BUCKET), *_AUDIT_APPEND, *_read_stream(S.AUDIT_STREAM), *_ACCOUNT_INFO)

ROLES: dict[str, Role] = {r.name: r for r in (
    Role("ingest", "HTTP ingest: publishes Alertmanager and API events onto FAULTS", _INGEST),
    Role("dispatcher", "handlers: FAULTS → decisions", _DISPATCHER),
    Role("executor", "playbooks: decisions → Kubernetes and agent commands", _EXECUTOR),
    Role("service", "one serve replica: ingest, dispatcher, executor and the audit API",
         (*_INGEST, *_DISPATCHER, *_EXECUTOR, *_AUDITOR)),
    Role("operator", "a person: breaker reset, approvals, budget release", _OPERATOR),
    Role("auditor", "audit review, read-only", _AUDITOR),
    Role("agent", "one node's agent", (S.faults_subject("agent", NODE_TEMPLATE),),
         (S.agent_cmd_subject(NODE_TEMPLATE),), responses=True, per_node=True),
    Role("bench", "remediator bench: its own bench.> subjects and BENCH stream, nothing of the service's",
         ("bench.>", "$JS.API.STREAM.INFO.BENCH", *_ACCOUNT_INFO)),
    Role("admin", "bus provisioning (remediator bus init) and announcing agent keys",
         ("$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>")),
)}


def role(name: str) -> Role:
    """The role called ``name``; ``ValueError`` listing the roles otherwise."""
    found = ROLES.get(name)
    if found is None:
        raise ValueError(f"unknown role {name!r}: one of {', '.join(ROLES)}")
    return found


@dataclass(frozen=True)
class Identity:
    """Who a set of credentials says it is: its role and, for an agent, its node (subject token form)."""

    role: str
    node_token: str | None = None
    tags: tuple[str, ...] = field(default=())

    @property
    def inbox(self) -> str:
        return role(self.role).inbox(self.node_token)


def tags_of(role_name: str, node_token: str | None) -> list[str]:
    tags = [f"{ROLE_TAG}:{role_name}"]
    if node_token is not None:
        tags.append(f"{NODE_TAG}:{node_token}")
    return tags


def identity_of_tags(tags: list[Any]) -> Identity | None:
    """The role and node that ``tags`` (a user JWT's) name, or None when they name no role of ours."""
    values = {str(t).split(":", 1)[0]: str(t).split(":", 1)[1] for t in tags if isinstance(t, str) and ":" in t}
    name = values.get(ROLE_TAG)
    if name not in ROLES:
        return None
    return Identity(name, values.get(NODE_TAG) if ROLES[name].per_node else None, tuple(str(t) for t in tags))
