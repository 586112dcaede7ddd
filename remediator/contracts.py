"""Wire contracts: every model that crosses a process boundary, in one module.

Where it sits: everything. Ingest turns Alertmanager payloads into ``FaultEvent``s, the agent publishes
``FaultEvent``s, handlers turn a ``FaultEvent`` and its history into a ``Decision``, the executor runs the
decision's playbook as ``StepRecord``s, and every fact becomes an ``AuditRecord``. DESIGN.md §3, §7 and §8
are the binding text; this module is its code form.

What we emit is frozen and ``extra="forbid"``; what we read from outside (Alertmanager, other producers on
``/v1/events``) is validated but tolerant of extra fields.

Two frozen dataclasses live here because every layer speaks them: ``Change`` (what an action changed: the
Kubernetes adapter's mutations, the agent's ``AgentReply``, a playbook step's result, recorded as a
``StepRecord``'s before/after/detail) and ``JobRef`` (the controller of a job, as the adapter finds it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EVENT_VERSION = 1

Kind = Literal[
    "xid",
    "sxid",
    "gpu_lost",
    "ecc",
    "nccl_timeout",
    "nccl_error",
    "cuda_oom",
    "cuda_error",
    "memory_leak",
    "job_failure",
    "thermal",
    "health_check",
]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]

Source = Literal["alertmanager", "agent", "api", "chaos"]

# The playbook vocabulary shared by handlers (which name a playbook in a Decision) and playbooks/ (which
# define one YAML file per name). Neither package imports the other; both import this tuple.
PLAYBOOK_NAMES: tuple[str, ...] = (
    "gpu-lost",                    # Xid 79, fallen off the bus, NVML GPU_IS_LOST: taint+cordon+drain, power cycle
    "gpu-memory-fatal",            # Xid 48/95/140, DBE: isolate GPU, evict its pods, reset when idle, verify
    "row-remap-pending",           # Xid 63, remap pending: drain the GPU, reset, verify
    "memory-retirement-failure",   # Xid 64, row-remap failure: isolate, escalate for replacement
    "nvlink",                      # Xid 74/144-150: cordon+drain, reset or reboot, escalate on recurrence
    "gsp-hang",                    # Xid 119/120/62/109/143: isolate, reset, fall back to reboot
    "gpu-reset",                   # catalog RESET_GPU / Xid 154 "Drain and Reset": isolate, reset, verify
    "node-reboot",                 # catalog RESTART_BM / Xid 154 "Node Reboot Required": drain, reboot, verify
    "app-xid-hardware-suspect",    # repeated 13/31/43/45 across jobs on one GPU: isolate + health check
    "ecc-correctable-rate",        # single-bit ECC rate over threshold after a watch period: isolate + reset
    "nccl-timeout-suspect",        # NCCL timeout with a suspect node/GPU: taint it out, restart the job
    "nccl-timeout-no-suspect",     # NCCL timeout, no suspect: restart the job only
    "memory-leak",                 # orphaned/leaked framebuffer: kill orphans, verify, else isolate + reset
    "memory-leak-growth",          # one process's memory over its baseline x 1.3, sustained: restart the job
    "unknown-xid",                 # unknown code or no catalog action: escalate to a person
)

# Node label that names a node's pool for the blast-radius budget (DESIGN.md §7).
POOL_LABEL = "gpu-remediator.io/pool"
# Node label that opts a node out of automatic remediation ("true").
OPT_OUT_LABEL = "gpu-remediator.io/opt-out"
# Node label by which an operator allows `remediator drill run --kubeconfig` to act on a real node ("allowed").
DRILLS_LABEL = "gpu-remediator.io/drills"

_RFC1123 = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?$"
)


@functools.lru_cache(maxsize=4096)
def normalize_pci_bus_id(raw: str) -> str:
    """Return ``raw`` as ``DDDD:BB:DD.F`` in lower case.

    Accepts what kernels, NVML and dcgm-exporter print: ``0000:3B:00``, ``00000000:3B:00.0`` (NVML's
    eight-digit domain), ``3b:00.0`` (no domain). Raises ``ValueError`` for anything else (not cached).
    Memoised, bounded: a fleet has a few PCI addresses per node model and an event names one two or three
    times on its way in (the signature, the ``GpuRef``).
    """
    text = raw.strip()
    if text.upper().startswith("PCI:"):
        text = text[4:]
    m = _PCI_RE.match(text)
    if m is None:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range: {raw!r}")
    fn = m.group("fn") or "0"
    return f"{domain:04x}:{m.group('bus').lower()}:{m.group('dev').lower()}.{fn}"


def utcnow() -> datetime:
    """The wall clock, for edges only (ingest stamps, audit stamps); decisions take an injected clock."""
    return datetime.now(UTC)


class _Emitted(BaseModel):
    """Base of what we emit: frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuRef(_Emitted):
    """One GPU on a node; any of the three identities may be unknown."""

    index: int | None = Field(default=None, ge=0, description="NVML/nvidia-smi index on the node")
    uuid: str | None = Field(default=None, description="GPU-xxxxxxxx-... as NVML reports it")
    pci_bus_id: str | None = Field(default=None, description="DDDD:BB:DD.F, lower case")

    @field_validator("pci_bus_id")
    @classmethod
    def _normalise_pci(cls, v: str | None) -> str | None:
        return None if v is None else normalize_pci_bus_id(v)

    @property
    def key(self) -> str:
        """The most stable identity we have: uuid, else PCI id, else index, else ``?``."""
        if self.uuid:
            return self.uuid
        if self.pci_bus_id:
            return self.pci_bus_id
        if self.index is not None:
            return f"index-{self.index}"
        return "?"


# Pod labels that name a pod's job, in the order ``resolve_job`` reads them (after the owner reference).
JOB_LABELS: tuple[str, ...] = (
    "training.kubeflow.org/job-name",  # Kubeflow training operator (PyTorchJob, ...)
    "jobset.sigs.k8s.io/jobset-name",  # JobSet
    "batch.kubernetes.io/job-name",    # batch/v1 Job (Kubernetes >= 1.27)
    "job-name",                        # batch/v1 Job (older label, still set)
)


class Origin(_Emitted):
    """Typed provenance of an event (and of the decision made on it): set once where the event is made --
    ingest for alerts, the agent for what it saw -- and never parsed out of ids or labels again.

    ``job`` is the name of the pod's controlling workload (in ``namespace``) when whoever made the event
    knew it from the pod's owner references (the service's Kubernetes adapter does; the agent supplies only
    namespace, pod name and UID). ``history_key`` is the KV key of the history a decision was made over
    (set by dispatch on the ``Decision``, never on an event).
    """

    fingerprint: str | None = Field(default=None, max_length=128, description="Alertmanager alert fingerprint")
    pod: str | None = Field(default=None, max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    pod_uid: str | None = Field(default=None, max_length=64)
    container: str | None = Field(default=None, max_length=253)
    job: str | None = Field(default=None, max_length=253, description="job name, from owner references")
    history_key: str | None = Field(default=None, max_length=512)


def resolve_job(origin: Origin | None, labels: Mapping[str, str]) -> str | None:
    """The one job resolver: which job an event or decision belongs to, or None.

    Precedence: the job resolved from the pod's owner reference (``origin.job``) when known; then the
    Kubeflow, JobSet and batch/v1 pod labels (``JOB_LABELS``, in that order). Never the pod's name: two
    single-pod Jobs are never merged into one. The job's namespace is ``origin.namespace``.
    """
    if origin is not None and origin.job:
        return origin.job
    for name in JOB_LABELS:
        value = labels.get(name, "").strip()
        if value:
            return value
    return None


@dataclass(frozen=True)
class JobRef:
    """The controller that owns a pod's gang, as the Kubernetes adapter's job discovery finds it
    (``find_job``, ``job_of_pod``): PyTorchJob, Job, JobSet, StatefulSet, Deployment, ReplicaSet, or
    ``kind="Pod"`` for a bare pod that nothing recreates."""

    kind: str
    name: str
    namespace: str
    api_version: str
    uid: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


# Size limits of what an event carries (bounded state: every event fits the bus and a node's history).
LABEL_KEY_MAX = 128
LABEL_VALUE_MAX = 1024
LABELS_MAX = 128
CODE_MAX = 128
MESSAGE_MAX = 8192
TRUNCATED_MARKER = "…[truncated]"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending with ``TRUNCATED_MARKER`` when it was cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(TRUNCATED_MARKER))] + TRUNCATED_MARKER


def bounded_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` within the event limits: each value cut to ``LABEL_VALUE_MAX`` with the marker, keys
    longer than ``LABEL_KEY_MAX`` dropped, at most ``LABELS_MAX`` labels kept (in sorted key order); what was
    cut or dropped is named under ``gpu-remediator.io/truncated`` (a comma-separated list of label keys)."""
    if len(labels) < LABELS_MAX and all(len(k) <= LABEL_KEY_MAX and type(v) is str and len(v) <= LABEL_VALUE_MAX
                                        for k, v in labels.items()):
        return {key: labels[key] for key in sorted(labels)}  # nothing to cut: the common case, one pass
    out: dict[str, str] = {}
    cut: list[str] = []
    for key in sorted(labels):
        value = str(labels[key])
        if len(key) > LABEL_KEY_MAX or len(out) >= LABELS_MAX - 1:
            cut.append(truncate(key, 64))
            continue
        if len(value) > LABEL_VALUE_MAX:
            cut.append(key)
            value = truncate(value, LABEL_VALUE_MAX)
        out[key] = value
    if cut:
        out[TRUNCATED_LABEL] = truncate(",".join(cut), LABEL_VALUE_MAX)
    return out


TRUNCATED_LABEL = "gpu-remediator.io/truncated"


class FaultEvent(_Emitted):
    """FaultEvent v1 (DESIGN.md §3). Field names have NVSentinel HealthEvent counterparts."""

    version: Literal[1] = 1
    id: str = Field(min_length=1, max_length=512, description="stable idempotency key, sent as Nats-Msg-Id")
    source: Source
    node: str = Field(min_length=1, max_length=253)
    gpu: GpuRef | None = None
    kind: Kind
    code: int | str | None = None
    is_fatal: bool = False
    is_healthy: bool = False
    message: str = Field(default="", max_length=MESSAGE_MAX)
    observed_at: datetime
    received_at: datetime
    labels: dict[str, str] = Field(default_factory=dict, description="at most LABELS_MAX labels, keys up to "
                                   "LABEL_KEY_MAX and values up to LABEL_VALUE_MAX characters")
    origin: Origin = Field(default_factory=Origin, description="typed provenance, set where the event is made")
    recommended_action: str | None = Field(default=None, max_length=256)

    @field_validator("code")
    @classmethod
    def _bounded_code(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, str) and len(v) > CODE_MAX:
            raise ValueError(f"a code is at most {CODE_MAX} characters")
        return v

    @field_validator("labels")
    @classmethod
    def _bounded_labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > LABELS_MAX:
            raise ValueError(f"at most {LABELS_MAX} labels, got {len(v)}")
        for key, value in v.items():
            if len(key) > LABEL_KEY_MAX:
                raise ValueError(f"label key {truncate(key, 64)!r} is longer than {LABEL_KEY_MAX} characters")
            if len(value) > LABEL_VALUE_MAX:
                raise ValueError(f"label {key!r} is longer than {LABEL_VALUE_MAX} characters")
        return v

    @field_validator("node")
    @classmethod
    def _rfc1123(cls, v: str) -> str:
        if not _RFC1123.fullmatch(v):
            raise ValueError(f"node {v!r} is not an RFC 1123 name")
        return v

    @field_validator("observed_at", "received_at")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return v if v.tzinfo else v.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _xid_has_int_code(self) -> FaultEvent:
        if self.kind == "xid" and not isinstance(self.code, int):
            raise ValueError("an event of kind 'xid' needs an integer code")
        return self


class InboundEvent(BaseModel):
    """A ``FaultEvent`` as another producer posts it to ``/v1/events``: extra fields tolerated.

    ``received_at`` is stamped by ingest; ``version`` must be 1 when given.
    """

    model_config = ConfigDict(extra="ignore")

    version: Literal[1] = 1
    id: str = Field(min_length=1, max_length=512)
    source: Source = "api"
    node: str
    gpu: dict[str, Any] | None = None
    kind: Kind
    code: int | str | None = None
    is_fatal: bool = False
    is_healthy: bool = False
    message: str = ""
    observed_at: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    origin: dict[str, Any] | None = Field(default=None, description="pod, namespace, pod_uid, container, job")
    recommended_action: str | None = None

    def to_event(self, received_at: datetime) -> FaultEvent:
        """The event as emitted; unknown ``origin`` keys are dropped (ingest refuses ``fingerprint`` and
        ``history_key`` before this: they are Alertmanager's and dispatch's)."""
        data = self.model_dump()
        data["message"] = truncate(self.message, MESSAGE_MAX)  # bounded with a marker, never refused
        data["labels"] = bounded_labels(self.labels)
        if self.recommended_action is not None:
            data["recommended_action"] = truncate(self.recommended_action, 256)
        data["observed_at"] = self.observed_at or received_at
        data["received_at"] = received_at
        data["gpu"] = GpuRef(**self.gpu) if self.gpu else None
        data["origin"] = Origin(**{k: v for k, v in (self.origin or {}).items() if k in Origin.model_fields})
        return FaultEvent(**data)


# --- Alertmanager webhook payload v4 (read from outside: tolerant) -----------------------------------


class AlertmanagerAlert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime  # Alertmanager's field name
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(min_length=1)


class AlertmanagerPayload(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: str
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertmanagerAlert]

    @field_validator("version")
    @classmethod
    def _v4(cls, v: str) -> str:
        if v != "4":
            raise ValueError(f"only Alertmanager webhook payload version 4 is supported, got {v!r}")
        return v


# --- Decisions, steps, incidents ---------------------------------------------------------------------


class Evidence(_Emitted):
    """One piece of what a decision rests on: an event, a value, a count."""

    event_id: str | None = None
    kind: str | None = None
    code: int | str | None = None
    at: datetime | None = None
    detail: str = ""


class Decision(_Emitted):
    """What a handler proposes (DESIGN.md §6). The safety rails may still block it."""

    version: Literal[1] = 1
    incident_id: str
    handler: str = Field(description="the handler family that decided: xid, ecc, nccl, memleak, ...")
    playbook: str = Field(description="playbook name, as `remediator playbooks list` shows it")
    node: str
    gpu: GpuRef | None = None
    group: str = Field(description="equivalence group: at most one running remediation per group")
    reason: str = Field(description="one sentence saying why")
    evidence: tuple[Evidence, ...] = ()
    event_id: str
    kind: str
    code: int | str | None = None
    decided_at: datetime
    job: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    origin: Origin = Field(default_factory=Origin, description="the event's provenance, plus the history key")


@dataclass(frozen=True)
class Change:
    """What one action changed: the one value type of the Kubernetes adapter's mutations, the node agent's
    replies (``AgentReply.change``) and the playbook steps' results, which the executor records as a
    ``StepRecord``'s ``before``/``after``/``detail``.

    ``changed`` is False when the action found the state already as wanted (check before act);
    ``before``/``after`` are the relevant state as plain JSON-able dicts; ``detail`` says it in one line.
    """

    changed: bool
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


StepStatus = Literal["pending", "running", "succeeded", "failed", "skipped", "blocked"]


class StepRecord(_Emitted):
    """One step of a running playbook, as persisted and audited."""

    name: str
    status: StepStatus
    params: dict[str, Any] = Field(default_factory=dict)
    before: dict[str, Any] = Field(default_factory=dict)
    after: dict[str, Any] = Field(default_factory=dict)
    detail: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None


# --- Audit -------------------------------------------------------------------------------------------

AuditWhat = Literal[
    "event_accepted",
    "duplicate_ignored",
    "event_ignored",
    "decision",
    "incident_updated",
    "guard_verdict",
    "step_started",
    "step_succeeded",
    "step_failed",
    "step_skipped",
    "playbook_finished",
    "approval_requested",
    "approval",
    "override",
    "breaker_trip",
    "breaker_reset",
    "dead_letter",
    "escalated",
    "settled",  # a reservation, handover or incident settled by the reconciler or an operator
    "command_refused",  # commands a node's agent refused, from its signed refusal report
]


class AuditRecord(_Emitted):
    """One fact in the hash-chained audit trail (DESIGN.md §8).

    ``hash`` = SHA-256 over the canonical JSON of every other field (``prev_hash`` included). ``seq`` is the
    position in the chain of this record's subject, so a chain can be verified without the stream.
    """

    version: Literal[1] = 1
    seq: int = Field(ge=1)
    time: datetime
    incident: str | None = None
    node: str
    gpu: str | None = None
    actor: str
    what: AuditWhat
    why: str = ""
    before: dict[str, Any] = Field(default_factory=dict)
    after: dict[str, Any] = Field(default_factory=dict)
    trace_id: str | None = None
    event_id: str | None = None
    job: str | None = None
    fingerprint: str | None = None
    prev_hash: str
    hash: str
    signer: str | None = Field(default=None, max_length=64, description="the writer's public nkey")
    sig: str | None = Field(default=None, max_length=128, description="signer's ed25519 signature of ``hash``")

    @staticmethod
    def digest(fields: dict[str, Any]) -> str:
        """SHA-256 of the canonical JSON (sorted keys, no spaces) of ``fields`` without ``hash`` and ``sig``
        (``signer`` is covered; an unsigned record's ``signer: null`` is left out, so records written before
        signing keep their hashes)."""
        body = {k: v for k, v in fields.items()
                if k not in ("hash", "sig") and not (k == "signer" and v is None)}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def verify(self) -> bool:
        return self.digest(self.model_dump(mode="json")) == self.hash


GENESIS_HASH = "0" * 64


class AuditCheckpoint(_Emitted):
    """A signed statement that chain ``chain`` had head ``seq``/``hash`` (written ``head_time``) at ``at``
    (DESIGN.md §8): ``verify`` finds a removed tail, a purged chain or a purged stream from it."""

    version: Literal[1] = 1
    chain: str = Field(max_length=253, description="the chain's node, or _cluster")
    seq: int = Field(ge=1)
    hash: str = Field(max_length=64)
    head_time: datetime
    at: datetime
    signer: str = Field(max_length=64)
    sig: str = Field(max_length=128)


# --- Node agent commands (core request/reply on agent.<node>.cmd) -------------------------------------

AgentVerb = Literal["isolate_gpu", "release_gpu", "reset_gpu", "kill_orphans", "health_check", "reboot_node",
                    "status", "collect_bug_report"]


class AgentCommand(_Emitted):
    """One node-local step asked of ``node``'s agent. On the wire it is signed (``remediator.adapters.agent``):
    ``signer``/``sig`` over the canonical JSON of the other fields, ``nonce`` once-only per sending, valid from
    ``issued_at`` to ``expires_at``; the agent refuses it otherwise (``remediator.agent.commands``)."""

    version: Literal[1] = 1
    id: str = Field(max_length=512, description="idempotency key: a repeated id returns the first result")
    verb: AgentVerb
    gpu: GpuRef | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    node: str | None = Field(default=None, max_length=253, description="the node it is meant for")
    nonce: str | None = Field(default=None, max_length=64, description="once-only id of this sending")
    issued_at: datetime | None = None
    expires_at: datetime | None = None
    signer: str | None = Field(default=None, max_length=64, description="the executor's public nkey")
    sig: str | None = Field(default=None, max_length=128)


class AgentReply(_Emitted):
    """The agent's answer to one ``AgentCommand``: whether it did what was asked (``ok``) and the ``Change``
    it made, flattened onto the wire as ``changed``/``detail``/``before``/``after``."""

    version: Literal[1] = 1
    id: str
    ok: bool
    changed: bool = False
    detail: str = ""
    before: dict[str, Any] = Field(default_factory=dict)
    after: dict[str, Any] = Field(default_factory=dict)
    node: str | None = Field(default=None, max_length=253, description="the node whose agent answered")
    nonce: str | None = Field(default=None, max_length=64, description="the command's nonce it answers")
    signer: str | None = Field(default=None, max_length=64, description="the agent's public nkey")
    sig: str | None = Field(default=None, max_length=128)

    @classmethod
    def of(cls, id: str, ok: bool, change: Change) -> AgentReply:
        """The reply to command ``id`` that carries ``change``."""
        return cls(id=id, ok=ok, changed=change.changed, detail=change.detail, before=dict(change.before),
                   after=dict(change.after))

    @property
    def change(self) -> Change:
        """What the agent changed, as the ``Change`` every step reports."""
        return Change(self.changed, dict(self.before), dict(self.after), self.detail)
