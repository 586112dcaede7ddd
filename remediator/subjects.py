"""Names on the bus: streams, subjects, KV buckets and keys (DESIGN.md §4), in one place.

Where it sits: used by every producer and consumer; nothing here talks to NATS.
"""

from __future__ import annotations

import re
import zlib

FAULTS_STREAM = "FAULTS"
REMEDIATIONS_STREAM = "REMEDIATIONS"
AUDIT_STREAM = "AUDIT"
DEAD_LETTER_STREAM = "DEADLETTER"

STATE_BUCKET = "remediator-state"
LOCKS_BUCKET = "remediator-locks"

FAULTS_WILDCARD = "faults.>"
REMEDIATIONS_WILDCARD = "remediation.>"
AUDIT_WILDCARD = "audit.>"
DEAD_LETTER_WILDCARD = "deadletter.>"

CLUSTER_TOKEN = "_cluster"


def node_token(node: str) -> str:
    """A node name as one subject token: ``.`` → ``_`` (reversible, RFC 1123 names have no ``_``)."""
    return node.replace(".", "_")


def node_from_token(token: str) -> str:
    return token.replace("_", ".") if token != CLUSTER_TOKEN else token


def faults_subject(source: str, node: str) -> str:
    return f"faults.{source}.{node_token(node)}"


def remediation_subject(node: str) -> str:
    return f"remediation.{node_token(node)}"


def audit_subject(node: str | None) -> str:
    return f"audit.{node_token(node) if node else CLUSTER_TOKEN}"


def dead_letter_subject(stream: str, node: str) -> str:
    return f"deadletter.{stream.lower()}.{node_token(node)}"


def agent_cmd_subject(node: str) -> str:
    return f"agent.{node_token(node)}.cmd"


def node_key(node: str) -> str:
    """KV key of a node's state or lock (KV keys allow ``.``; we keep the token form for symmetry)."""
    return f"node.{node_token(node)}"


def gpu_key(uuid: str) -> str:
    return f"gpu.{uuid}"


# --- more keys of the state bucket (DESIGN.md §4) ----------------------------------------------------

LEDGER_KEY = "safety.ledger"
"""The safety ledger: budget reservations and the circuit breaker, one document shared by every replica."""

HANDOVER_SHARDS = 16
"""How many documents the ledger's handovers are spread over (``handover_shard_key``)."""
HANDOVER_SHARD_KEYS = tuple(f"safety.handovers.{i:02x}" for i in range(HANDOVER_SHARDS))


def handover_shard_key(reservation: str) -> str:
    """KV key of the handover shard that holds the handover of ``reservation`` (``<node>|<gpu>``):
    ``safety.handovers.<00-0f>`` by CRC-32, so no one document grows with the fleet (a NATS message, and so
    a KV value, is at most 1 MB by default: about 4,000 handovers)."""
    return HANDOVER_SHARD_KEYS[zlib.crc32(reservation.encode()) % HANDOVER_SHARDS]

_JOB_TOKEN_RE = re.compile(r"[^A-Za-z0-9_-]")


def job_key(namespace: str, job: str) -> str:
    """KV key of a training job's history (NCCL correlation across nodes): ``job.<namespace>.<job>``, each
    part with every character outside ``[A-Za-z0-9_-]`` replaced by ``_`` (an empty namespace is
    ``default``)."""
    return f"job.{_JOB_TOKEN_RE.sub('_', namespace.strip() or 'default')}.{_JOB_TOKEN_RE.sub('_', job)}"


def pod_key(namespace: str, pod: str) -> str:
    """KV key of one pod's history when no job is known (its ranks correlated with each other only):
    ``pod.<namespace>.<pod>``, tokenised as ``job_key`` does."""
    return f"pod.{_JOB_TOKEN_RE.sub('_', namespace.strip() or 'default')}.{_JOB_TOKEN_RE.sub('_', pod)}"


def decision_key(incident: str) -> str:
    """Where dispatch stores a decision before the history that records it: ``decision.<incident>``."""
    return f"decision.{incident}"


def run_key(incident: str) -> str:
    """The executor's persisted progress of one incident's run: ``run.<incident>``."""
    return f"run.{incident}"


def attempts_key(node: str) -> str:
    """Recent remediations of one node (cooldown and max attempts): ``attempts.<node>``."""
    return f"attempts.{node_token(node)}"


def approval_key(incident: str) -> str:
    """A person's approval of an incident's gated steps: ``approval.<incident>``."""
    return f"approval.{incident}"


def agent_key_key(node: str) -> str:
    """The public user nkey a node's agent holds, written whenever its credentials are issued (the trust
    anchor the executor verifies that agent's signed replies with): ``agentkey.<node token>``."""
    return f"agentkey.{node_token(node)}"


# --- audit checkpoints (DESIGN.md §8) ----------------------------------------------------------------

AUDIT_CHECKPOINT_STREAM = "AUDITCP"
"""Signed checkpoints of every audit chain's head, in a stream of their own: purging AUDIT leaves them."""
AUDIT_CHECKPOINT_WILDCARD = "auditcp.>"


def audit_checkpoint_subject(node: str | None) -> str:
    """Where the checkpoints of ``node``'s audit chain go (the cluster chain when None): ``auditcp.<token>``."""
    return f"auditcp.{node_token(node) if node else CLUSTER_TOKEN}"
