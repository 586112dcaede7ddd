"""Settings: every knob of the service, from ``REMEDIATOR_*`` environment variables, grouped by concern.

Where it sits: at the bottom of the layers. The CLI reads it once and hands it to the composition root
(``remediator.service``), which passes each part its own typed view: ``nats_view()``, ``kube_view()``,
``safety_view()``, ``handlers_view()``, ``executor_view()`` (frozen dataclasses, no pydantic). Nothing below
the CLI reads the environment.

Each field belongs to one section (``SECTIONS``, in the order the README lists them); the section is part of
the field's declaration (``json_schema_extra={"section": ...}``) and the README's configuration table, one
table per section, is generated from these declarations (``tools/settings_table.py``). Grouping is by
section only: every variable keeps its flat ``REMEDIATOR_<FIELD>`` name and every field its
``settings.<field>`` attribute.

The handler thresholds (section ``handlers``) default to the constants of the handler modules
(``handlers.xid``, ``handlers.ecc``, ``handlers.nccl``, ``handlers.memleak``); a unit test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SECTIONS: tuple[tuple[str, str], ...] = (
    ("nats", "NATS and JetStream: where the bus is and how its streams keep and redeliver messages"),
    ("service", "The replica: its name in the audit trail and where its traces go"),
    ("ingest", "The HTTP ingest API"),
    ("kube", "The Kubernetes API: client, rate limits and what the service writes on nodes"),
    ("handlers", "Handler thresholds (DESIGN.md §6): when a fault signal becomes a decision"),
    ("safety", "Safety rails: dry run, lock, cooldown, attempt limits, disruption budget, breaker, approval"),
    ("executor", "The executor: concurrency, verification and the hooks it calls"),
)
_SECTION_NAMES = frozenset(name for name, _ in SECTIONS)

# The safety guards by name, in evaluation order (``remediator.safety.guards.GUARD_NAMES``; a unit test holds
# the two equal). Settings cannot import the safety package, which is built on them.
KNOWN_GUARDS: tuple[str, ...] = ("opt_out", "dry_run", "cooldown", "lock", "budget", "breaker", "approval")


def _in(section: str, **kw: Any) -> Any:
    """A ``Field`` declared in ``section`` (kept in the field's JSON schema extras, read by ``section_of``)."""
    assert section in _SECTION_NAMES, section
    return Field(json_schema_extra={"section": section}, **kw)


# --- typed views, one per concern ------------------------------------------------------------------------


@dataclass(frozen=True)
class NatsSettings:
    """Where the bus is and how its streams behave (``bus.connect``, ``bus.provision``, ``bus.settle``)."""

    urls: tuple[str, ...]  # empty: start an embedded nats-server
    data_dir: str | None
    duplicate_window_s: int
    max_deliver: int
    nak_delay_s: float
    audit_max_age_days: int
    audit_max_bytes: int
    bus_replicas: int
    dispatch_ack_wait_s: float
    executor_ack_wait_s: float
    # who connects (bus.Credentials) and how agents get their credentials (remediator.identity.http)
    nats_creds_file: str | None = None
    nats_nkey_seed_file: str | None = None
    nats_tls_ca: str | None = None
    nats_tls_cert: str | None = None
    nats_tls_key: str | None = None
    nats_port: int | None = None
    nats_account: str | None = None
    nats_agent_signing_key: str | None = None
    identity_audience: str = ""
    identity_namespace: str = ""
    identity_daemonset: str = ""
    identity_ttl_s: int = 0


@dataclass(frozen=True)
class KubeSettings:
    """The Kubernetes adapter's client, limits and the taint it writes."""

    kubeconfig: str | None
    qps: float
    burst: int
    retry_budget_s: float
    taint_key: str
    drain_timeout_s: float
    drain_grace_period_s: int
    gpu_allocation: str = "auto"
    dra_driver: str = "gpu.nvidia.com"
    gpu_withdrawn_taint_key: str = "gpu-remediator/gpu-withdrawn"


@dataclass(frozen=True)
class HandlerSettings:
    """Every threshold of the handler families, in the settings' units (seconds, counts, bytes).

    ``handlers.HandlerPolicies.from_settings`` turns it into the handlers' policies.
    """

    incident_ttl_s: float
    xid_app_window_s: float
    xid_app_threshold: int
    xid_burst_quiet_s: float
    ecc_sbe_rate_per_min: float
    ecc_sbe_rate_window_s: float
    ecc_sbe_watch_s: float
    ecc_sbe_min_span_s: float
    ecc_retired_pages_limit: int
    nccl_window_s: float
    nccl_settle_s: float
    nccl_min_ranks: int
    nccl_early_seq: int
    nccl_peer_threshold: int
    memleak_min_used_bytes: int
    memleak_orphan_for_s: float
    memleak_growth_bytes_per_min: int
    memleak_growth_window_s: float
    memleak_growth_min_span_s: float
    memleak_growth_rising_fraction: float
    memleak_growth_factor: float = 1.3
    rules_file: str | None = None
    rules_poll_s: float = 5.0


@dataclass(frozen=True)
class SafetySettings:
    """The safety rails' limits (``remediator.safety``)."""

    dry_run: bool
    guards_enabled: frozenset[str]
    lock_ttl_s: int
    lock_wait_s: float
    cooldown_s: float
    attempt_window_s: float
    max_node_attempts: int
    max_gpu_attempts: int
    budget_max_node_fraction: float
    budget_max_nodes: int
    budget_max_gpu_fraction: float
    budget_max_gpus: int
    breaker_threshold: int
    breaker_window_s: float
    approval_wait_s: float
    reconcile_resync_s: float
    reconcile_watch_s: float


@dataclass(frozen=True)
class ExecutorSettings:
    """How the executor runs playbooks and whom it calls."""

    concurrency: int
    verify_hold_down_s: float | None
    verify_interval_s: float | None
    reboot_hook_url: str | None
    escalation_webhook_url: str | None
    reboot_provider: str | None
    reboot_timeout_s: float
    reboot_poll_s: float
    reboot_annotation: str
    reboot_annotation_as_label: bool
    reboot_job_manifest: str | None
    reboot_job_namespace: str
    gpu_operands: str
    gpu_operand_timeout_s: float


_NATS_IDENTITY_FIELDS = (
    "nats_creds_file",
    "nats_nkey_seed_file",
    "nats_tls_ca",
    "nats_tls_cert",
    "nats_tls_key",
    "nats_port",
    "nats_account",
    "nats_agent_signing_key",
    "identity_audience",
    "identity_namespace",
    "identity_daemonset",
    "identity_ttl_s",
)


class Settings(BaseSettings):
    """Configuration of ``serve``, ``agent``, ``demo`` and ``bench``."""

    model_config = SettingsConfigDict(env_prefix="REMEDIATOR_", extra="ignore")

    # --- nats -------------------------------------------------------------------------------------------
    nats_url: str | None = _in(
        "nats", default=None,
        description="NATS server URL(s), comma-separated. Unset: serve/demo/bench start an embedded nats-server.",
    )
    data_dir: str | None = _in(
        "nats", default=None, description="JetStream store of the embedded nats-server. Unset: a temporary directory."
    )
    nats_creds_file: str | None = _in(
        "nats", default=None,
        description="`.creds` file (user JWT and nkey seed, mode 0600) the service connects with; "
                    "`remediator bus creds` writes one. Never printed.",
    )
    nats_nkey_seed_file: str | None = _in(
        "nats", default=None, description="File holding a user nkey seed, for servers that list nkey users.",
    )
    nats_tls_ca: str | None = _in("nats", default=None, description="CA bundle that verifies the NATS servers.")
    nats_tls_cert: str | None = _in("nats", default=None, description="Client certificate for NATS TLS (mTLS).")
    nats_tls_key: str | None = _in("nats", default=None, description="Key of the NATS client certificate.")
    nats_port: int | None = _in(
        "nats", default=None, ge=1, le=65535, description="Port of the embedded nats-server. Unset: a free one.",
    )
    nats_account: str | None = _in(
        "nats", default=None,
        description="Public key (A…) of the production NATS account the agents' signing key belongs to.",
    )
    nats_agent_signing_key: str | None = _in(
        "nats", default=None,
        description="Seed file of the account's scoped agents signing key: serve then issues each agent its "
                    "node's credentials at POST /v1/identity/agent after a TokenReview. Never printed.",
    )
    identity_audience: str = _in(
        "nats", default="gpu-remediator", min_length=1, max_length=253,
        description="Audience the agents' projected ServiceAccount tokens must carry (TokenReview).",
    )
    identity_namespace: str = _in(
        "nats", default="gpu-remediator", min_length=1, max_length=63,
        description="Namespace of the agent DaemonSet whose pods may ask for agent credentials.",
    )
    identity_daemonset: str = _in(
        "nats", default="gpu-remediator-agent", min_length=1, max_length=253,
        description="Name of the agent DaemonSet: only its pods, on the node they run on, get that node's credentials.",
    )
    identity_ttl_s: int = _in(
        "nats", default=3600, ge=60, le=86_400, description="Lifetime of an agent's issued NATS credentials.",
    )
    duplicate_window_s: int = _in(
        "nats", default=1200, ge=600, description="JetStream duplicate window of FAULTS (covers Alertmanager retries)."
    )
    max_deliver: int = _in(
        "nats", default=5, ge=1, le=100, description="Deliveries of one message before dead-lettering."
    )
    nak_delay_s: float = _in("nats", default=2.0, ge=0, description="Redelivery delay after a temporary failure.")
    audit_max_age_days: int = _in("nats", default=365, ge=1, description="Retention of the AUDIT stream.")
    audit_max_bytes: int = _in("nats", default=-1, description="Size limit of the AUDIT stream (-1: unlimited).")
    bus_replicas: int = _in(
        "nats", default=1, ge=1, le=5,
        description="Replicas of every stream and KV bucket: 1 on one server, 3 on a production NATS cluster. "
                    "`bus init` creates them so; `serve` refuses a bus with fewer.",
    )
    dispatch_ack_wait_s: float = _in(
        "nats", default=60.0, ge=1,
        description="Ack wait `bus init` declares on the dispatch consumer (a decision takes seconds).",
    )
    executor_ack_wait_s: float = _in(
        "nats", default=60.0, ge=1,
        description="Ack wait `bus init` declares on the executor consumer. A running playbook sends in-progress "
                    "acks every min(lock_ttl_s/3, 10) s, so this bounds how long a dead replica's decision waits "
                    "before another replica takes it (with lock_ttl_s).",
    )

    # --- service ----------------------------------------------------------------------------------------
    replica_id: str = _in(
        "service", default="", description="Actor name of this replica in the audit trail (default: host-pid)."
    )
    otlp_endpoint: str | None = _in(
        "service", default=None,
        description="OTLP/HTTP collector that receives the service's trace spans (e.g. http://otel:4318). "
                    "Unset: spans carry the trace and are neither recorded nor exported.",
    )
    signing_seed_file: str | None = _in(
        "service", default=None,
        description="nkey seed (or .creds) file of the key that signs agent commands and audit records. Unset: "
                    "<data_dir>/identity/service.nk, generated once (mode 0600).",
    )
    audit_trust_keys: str = _in(
        "service", default="",
        description="Comma-separated public nkeys whose audit records and checkpoints `audit verify` trusts (the "
                    "replicas' and operators' keys; the data dir's service key is always trusted with --data-dir).",
    )
    audit_checkpoint_records: int = _in(
        "service", default=100, ge=0,
        description="A signed checkpoint of a chain's head at least every this many records (0: none).",
    )
    audit_checkpoint_interval_s: float = _in(
        "service", default=30.0, gt=0,
        description="A signed checkpoint of a chain's head at most this many seconds after its first "
                    "unanchored record.",
    )
    agent_command_ttl_s: float = _in(
        "service", default=60.0, gt=0, le=600,
        description="How long a signed agent command stays valid; the agent refuses it after (and replays before).",
    )
    agent_key_cache_s: float = _in(
        "service", default=30.0, ge=0,
        description="How long the executor caches an agent's public key read from KV (agentkey.<node>).",
    )

    startup_timeout_s: float = _in(
        "service", default=30.0, gt=0,
        description="How long serve/agent/CLI commands wait for NATS (and serve for the bus check) before "
                    "failing with one line naming the fix.",
    )
    shutdown_timeout_s: float = _in(
        "service", default=20.0, gt=0,
        description="SIGTERM/SIGINT: how long serve waits for running handlers and connections to drain before "
                    "it exits anyway (a second signal exits at once).",
    )
    readiness_interval_s: float = _in(
        "service", default=1.0, gt=0,
        description="How often /readyz's conditions (bus, consumers, Kubernetes) are probed.",
    )
    readiness_timeout_s: float = _in(
        "service", default=3.0, gt=0, description="A readiness probe that takes longer fails its condition."
    )

    # --- ingest -----------------------------------------------------------------------------------------
    http: str = _in("ingest", default="127.0.0.1:8080", description="HOST:PORT the HTTP ingest API listens on.")
    api_tokens: str = _in(
        "ingest", default="",
        description="Comma-separated bearer tokens accepted by /v1/*: TOKEN (every scope) or SCOPE:TOKEN "
                    "(alertmanager, events, auditor, admin). Empty: `serve` refuses to start without"
                    " --insecure-no-auth.",
    )
    max_body_bytes: int = _in(
        "ingest", default=1_048_576, ge=1024, description="Largest request body accepted (413 above)."
    )
    api_tokens_file: str | None = _in(
        "ingest", default=None,
        description="File of bearer tokens (one entry per line or comma-separated, `#` comments), added to "
                    "api_tokens. Each entry is TOKEN (every scope) or SCOPE:TOKEN, scopes alertmanager, events, "
                    "auditor, admin.",
    )
    insecure_no_auth: bool = _in(
        "ingest", default=False,
        description="Serve /v1/* without bearer tokens (development only; `serve` says so at every start and "
                    "in /readyz). Without it, `serve` refuses to start with no tokens.",
    )
    http_header_timeout_s: float = _in(
        "ingest", default=10.0, gt=0,
        description="A connection that has not sent a whole request head within this long is closed.",
    )
    http_body_timeout_s: float = _in(
        "ingest", default=10.0, gt=0, description="Longest time a request body may take to arrive (408 after)."
    )
    http_keep_alive_s: float = _in(
        "ingest", default=5.0, gt=0, description="An idle keep-alive connection is closed after this long."
    )

    # --- kube -------------------------------------------------------------------------------------------
    kubeconfig: str | None = _in(
        "kube", default=None,
        description="kubeconfig file of the cluster. Unset: in-cluster config, then ~/.kube/config.",
    )
    kube_qps: float = _in(
        "kube", default=20.0, gt=0, description="Client-side rate limit of Kubernetes calls (per second)."
    )
    kube_burst: int = _in("kube", default=40, ge=1, description="Burst allowed above the Kubernetes QPS limit.")
    kube_retry_budget_s: float = _in(
        "kube", default=60.0, gt=0, description="Total time a Kubernetes call may spend retrying."
    )
    taint_key: str = _in("kube", default="gpu-remediator/quarantine", description="Taint key the service adds.")
    drain_timeout_s: float = _in(
        "kube", default=300.0, gt=0, description="How long a drain waits on PDBs before failing."
    )
    drain_grace_period_s: int = _in(
        "kube", default=30, ge=0, description="Termination grace period for evicted pods."
    )
    gpu_allocation: Literal["auto", "dra", "device-plugin"] = _in(
        "kube", default="auto",
        description="How the cluster hands out GPUs, which decides how a withdrawn GPU is kept from the "
                    "scheduler: dra (a DeviceTaintRule on that one device), device-plugin (a NoSchedule node "
                    "taint; no per-device control exists) or auto (dra when resource.k8s.io serves "
                    "ResourceSlices of the DRA driver, read once at start).",
    )
    dra_driver: str = _in(
        "kube", default="gpu.nvidia.com", min_length=1, max_length=253,
        description="DRA driver whose ResourceSlices publish the GPUs (NVIDIA's k8s-dra-driver-gpu).",
    )
    gpu_withdrawn_taint_key: str = _in(
        "kube", default="gpu-remediator/gpu-withdrawn", min_length=1, max_length=316,
        description="Key of the device taint (DRA) or node taint (device plugin) that withdraws a GPU.",
    )

    # --- handlers ---------------------------------------------------------------------------------------
    incident_ttl_s: float = _in(
        "handlers", default=21_600.0, gt=0,
        description="An open incident without updates lapses after this long (a lost close never blocks a group).",
    )
    xid_app_window_s: int = _in(
        "handlers", default=86_400, gt=0,
        description="Window in which repeated application Xids across jobs mean hardware.",
    )
    xid_app_threshold: int = _in(
        "handlers", default=3, ge=2, description="Distinct jobs with an application Xid on one GPU."
    )
    xid_burst_quiet_s: float = _in(
        "handlers", default=180.0, gt=0,
        description="A gap this long between one GPU's Xids ends a burst (the Xid co-occurrence rules).",
    )
    ecc_sbe_rate_per_min: float = _in(
        "handlers", default=10.0, gt=0,
        description="Correctable (single-bit) ECC errors per minute that start a watch of the GPU.",
    )
    ecc_sbe_rate_window_s: float = _in(
        "handlers", default=3600.0, gt=0, description="Window over which the correctable ECC rate is measured."
    )
    ecc_sbe_watch_s: float = _in(
        "handlers", default=1800.0, ge=0,
        description="How long the correctable ECC rate must stay over the threshold before the GPU is isolated.",
    )
    ecc_sbe_min_span_s: float = _in(
        "handlers", default=60.0, gt=0, description="Shortest span of readings a correctable ECC rate is taken over."
    )
    ecc_retired_pages_limit: int = _in(
        "handlers", default=60, ge=1,
        description="Retired pages (DBE + SBE) at which a GPU is isolated for replacement.",
    )
    nccl_window_s: float = _in(
        "handlers", default=600.0, gt=0,
        description="Window in which NCCL reports and hardware signals of one job are correlated.",
    )
    nccl_settle_s: float = _in(
        "handlers", default=60.0, ge=0,
        description="After this long since a job's first NCCL report, a timeout with no suspect restarts the job.",
    )
    nccl_min_ranks: int = _in(
        "handlers", default=2, ge=1, description="Ranks that must report before a no-suspect NCCL decision."
    )
    nccl_early_seq: int = _in(
        "handlers", default=10, ge=0,
        description="A timeout within this many first collectives is a rank that never started, not a straggler.",
    )
    nccl_peer_threshold: int = _in(
        "handlers", default=2, ge=1, description="Network errors naming one peer that make its link the suspect."
    )
    memleak_min_used_bytes: int = _in(
        "handlers", default=1 << 30, ge=0,
        description="Framebuffer held (above the driver's reserve) that counts as held memory.",
    )
    memleak_orphan_for_s: float = _in(
        "handlers", default=600.0, gt=0,
        description="How long memory may stay held without an owner (pod gone, no process) before it is a leak.",
    )
    memleak_growth_bytes_per_min: int = _in(
        "handlers", default=64 << 20, ge=1, description="Per-process framebuffer growth (bytes/min) that is a leak."
    )
    memleak_growth_window_s: float = _in(
        "handlers", default=1800.0, gt=0, description="Window of the per-process growth samples."
    )
    memleak_growth_min_span_s: float = _in(
        "handlers", default=1200.0, gt=0,
        description="Shortest span of growth samples that makes a trend (at most the growth window).",
    )
    memleak_growth_rising_fraction: float = _in(
        "handlers", default=0.8, gt=0, le=1, description="Fraction of sample-to-sample steps that must rise."
    )
    memleak_growth_factor: float = _in(
        "handlers", default=1.3, gt=1,
        description="A process reported with its baseline (the agent's memory-trend watch) leaks at this many "
                    "times it, held for the growth min span.",
    )
    rules_file: str | None = _in(
        "handlers", default=None,
        description="Operator rules YAML (added signatures, decision overrides); serve and the agent reload it.",
    )
    rules_poll_s: float = _in(
        "handlers", default=5.0, gt=0, description="How often serve checks the rules file for changes."
    )

    # --- safety -----------------------------------------------------------------------------------------
    dry_run: bool = _in("safety", default=False, description="Record what each playbook would do and touch nothing.")
    guards_enabled: str = _in(
        "safety", default="opt_out,dry_run,cooldown,lock,budget,breaker,approval",
        description="Comma-separated safety guards in force (benchmarks turn some off; the lock is always on).",
    )
    lock_ttl_s: int = _in(
        "safety", default=300, ge=5, description="TTL of the per-node playbook lock (renewed while running)."
    )
    lock_wait_s: float = _in(
        "safety", default=30.0, ge=0,
        description="How long a decision waits for a node lock held elsewhere, then retries later.",
    )
    cooldown_s: float = _in(
        "safety", default=600.0, ge=0, description="A new remediation of a node/GPU within this time escalates instead."
    )
    attempt_window_s: float = _in(
        "safety", default=86_400.0, gt=0, description="Window of the per-node/per-GPU limits."
    )
    max_node_attempts: int = _in(
        "safety", default=3, ge=1, description="Remediations of one node per window, then escalate."
    )
    max_gpu_attempts: int = _in(
        "safety", default=2, ge=1, description="Remediations of one GPU per window, then escalate."
    )
    budget_max_node_fraction: float = _in(
        "safety", default=0.1, gt=0, le=1,
        description="Largest fraction of a pool's GPU nodes out of service at once (cordoned, tainted by us or "
                    "reserved; rounded down, never below one node).",
    )
    budget_max_nodes: int = _in(
        "safety", default=50, ge=1, description="Largest number of a pool's GPU nodes out of service at once."
    )
    budget_max_gpu_fraction: float = _in(
        "safety", default=0.1, gt=0, le=1,
        description="Largest fraction of a pool's GPUs isolated on their own (on nodes still in service; rounded "
                    "down, never below one). Whole nodes out count against the node budget only.",
    )
    budget_max_gpus: int = _in(
        "safety", default=400, ge=1, description="Largest number of a pool's GPUs isolated on their own at once."
    )
    breaker_threshold: int = _in(
        "safety", default=10, ge=1, description="Quarantines within the breaker window that trip it."
    )
    breaker_window_s: float = _in(
        "safety", default=300.0, gt=0, description="Window in which quarantines are counted."
    )
    approval_wait_s: float = _in(
        "safety", default=30.0, ge=0,
        description="How long a step waits for approval before the decision is retried later.",
    )
    reconcile_resync_s: float = _in(
        "safety", default=30.0, gt=0,
        description="Full resync of the reconciler (handovers, reservations, incidents of deleted nodes); between "
                    "resyncs it settles within seconds of each change to a node its ledger names.",
    )
    reconcile_watch_s: float = _in(
        "safety", default=10.0, gt=0,
        description="Longest single wait of the reconciler for a node change (then it reconciles and waits again).",
    )

    # --- executor ---------------------------------------------------------------------------------------
    executor_concurrency: int = _in(
        "executor", default=32, ge=1, description="Playbooks one executor runs at once (different nodes)."
    )
    verify_hold_down_s: float | None = _in(
        "executor", default=None, ge=0, description="Overrides every playbook's health hold-down time (drills, demo)."
    )
    verify_interval_s: float | None = _in(
        "executor", default=None, gt=0, description="Overrides every playbook's health probe interval (drills, demo)."
    )
    reboot_hook_url: str | None = _in(
        "executor", default=None,
        description="URL POSTed to reboot a node (power controller); unset: the node agent reboots.",
    )
    escalation_webhook_url: str | None = _in(
        "executor", default=None, description="URL POSTed on every escalation of a playbook with `webhook: true`."
    )
    reboot_provider: Literal["agent", "hook", "annotation", "job"] | None = _in(
        "executor", default=None,
        description="Who reboots a node for the `reboot_node` step: `agent` (the node agent runs its "
                    "`--reboot-command`), `hook` (POST to `reboot_hook_url`), `annotation` (set "
                    "`reboot_annotation` on the node for a controller such as a cloud node-repair or medik8s), "
                    "`job` (run the Job of `reboot_job_manifest` on the node). Unset: `hook` when "
                    "`reboot_hook_url` is set, else `agent`. Whichever it is, the step succeeds only when the "
                    "node's `status.nodeInfo.bootID` changed and it is Ready again within `reboot_timeout_s`.",
    )
    reboot_timeout_s: float = _in(
        "executor", default=900.0, gt=0, le=7200,
        description="How long the reboot step waits for the node's new boot id and Ready condition.",
    )
    reboot_poll_s: float = _in(
        "executor", default=2.0, gt=0, le=60, description="Interval of the reboot step's node reads.",
    )
    reboot_annotation: str = _in(
        "executor", default="gpu-remediator.io/reboot-requested", min_length=1, max_length=253,
        description="Annotation (or label, with `reboot_annotation_as_label`) the `annotation` provider sets "
                    "to the incident id; removed once the reboot is proven.",
    )
    reboot_annotation_as_label: bool = _in(
        "executor", default=False, description="The `annotation` provider sets a node label instead.",
    )
    reboot_job_manifest: str | None = _in(
        "executor", default=None,
        description="YAML file of the batch/v1 Job the `job` provider runs on the node (its pod is pinned "
                    "with `spec.nodeName`; the name is derived from the incident).",
    )
    reboot_job_namespace: str = _in(
        "executor", default="gpu-remediator", min_length=1, max_length=63,
        description="Namespace of the `job` provider's reboot Jobs.",
    )
    gpu_operands: str = _in(
        "executor", default="device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,mig-manager", max_length=512,
        description="GPU Operator operands moved off a node for a GPU reset, by their "
                    "`nvidia.com/gpu.deploy.<operand>` node labels (comma-separated; empty: none). Only labels "
                    "the node carries and that are not already `false` are changed, and each is restored.",
    )
    gpu_operand_timeout_s: float = _in(
        "executor", default=300.0, gt=0, le=3600,
        description="How long a GPU reset waits for the operands' pods to leave the node before it is refused (at "
                    "most half the reset step's timeout).",
    )

    @field_validator("http")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {v!r}")
        return v

    @field_validator("guards_enabled")
    @classmethod
    def _known_guards(cls, v: str) -> str:
        unknown = sorted({g.strip() for g in v.split(",") if g.strip()} - set(KNOWN_GUARDS))
        if unknown:
            raise ValueError(f"unknown guard name(s) {', '.join(unknown)} in REMEDIATOR_GUARDS_ENABLED; "
                             f"known guards: {', '.join(KNOWN_GUARDS)}")
        return v

    @model_validator(mode="after")
    def _growth_span_within_window(self) -> Settings:
        if self.memleak_growth_min_span_s > self.memleak_growth_window_s:
            raise ValueError("memleak_growth_min_span_s cannot exceed memleak_growth_window_s")
        return self

    @property
    def tokens(self) -> frozenset[str]:
        """The entries of ``api_tokens`` (``TOKEN`` or ``SCOPE:TOKEN``); ``remediator.ingest.auth`` reads
        ``api_tokens_file`` too and checks them."""
        return frozenset(t.strip() for t in self.api_tokens.split(",") if t.strip())

    @property
    def http_host(self) -> str:
        return self.http.rpartition(":")[0]

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])

    @property
    def nats_urls(self) -> tuple[str, ...]:
        """``nats_url`` split at commas (empty: start an embedded server)."""
        return tuple(u.strip() for u in (self.nats_url or "").split(",") if u.strip())

    # --- the typed views ------------------------------------------------------------------------------

    def nats_view(self) -> NatsSettings:
        return NatsSettings(self.nats_urls, self.data_dir, self.duplicate_window_s, self.max_deliver,
                            self.nak_delay_s, self.audit_max_age_days, self.audit_max_bytes, self.bus_replicas,
                            self.dispatch_ack_wait_s, self.executor_ack_wait_s,
                            **{name: getattr(self, name) for name in _NATS_IDENTITY_FIELDS})

    def kube_view(self) -> KubeSettings:
        return KubeSettings(self.kubeconfig, self.kube_qps, self.kube_burst, self.kube_retry_budget_s,
                            self.taint_key, self.drain_timeout_s, self.drain_grace_period_s,
                            self.gpu_allocation, self.dra_driver, self.gpu_withdrawn_taint_key)

    def handlers_view(self) -> HandlerSettings:
        return HandlerSettings(**{name: getattr(self, name) for name in HandlerSettings.__dataclass_fields__})

    def safety_view(self) -> SafetySettings:
        # The dry-run guard is always in force: a global --dry-run, or a playbook marked dry-run, can never
        # be defeated by a guard list that leaves it out.
        guards = frozenset(g.strip() for g in self.guards_enabled.split(",") if g.strip()) | {"dry_run"}
        return SafetySettings(
            self.dry_run, guards, self.lock_ttl_s, self.lock_wait_s, self.cooldown_s, self.attempt_window_s,
            self.max_node_attempts, self.max_gpu_attempts, self.budget_max_node_fraction, self.budget_max_nodes,
            self.budget_max_gpu_fraction, self.budget_max_gpus, self.breaker_threshold, self.breaker_window_s,
            self.approval_wait_s, self.reconcile_resync_s, self.reconcile_watch_s)

    def executor_view(self) -> ExecutorSettings:
        return ExecutorSettings(self.executor_concurrency, self.verify_hold_down_s, self.verify_interval_s,
                                self.reboot_hook_url, self.escalation_webhook_url, self.reboot_provider,
                                self.reboot_timeout_s, self.reboot_poll_s, self.reboot_annotation,
                                self.reboot_annotation_as_label, self.reboot_job_manifest, self.reboot_job_namespace,
                                self.gpu_operands, self.gpu_operand_timeout_s)


def section_of(name: str) -> str:
    """The section a ``Settings`` field is declared in."""
    extra = Settings.model_fields[name].json_schema_extra
    assert isinstance(extra, dict), name
    return str(extra["section"])


__all__ = ["KNOWN_GUARDS", "SECTIONS",
           "ExecutorSettings", "HandlerSettings", "KubeSettings", "NatsSettings", "SafetySettings",
           "Settings", "section_of"]
