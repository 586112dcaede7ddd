"""Settings: every knob of the service, from ``REMEDIATOR_*`` environment variables.

Where it sits: read once by the CLI (the composition root) and passed down; nothing below the CLI reads the
environment. The README's configuration table is generated from these field descriptions.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration of ``serve``, ``agent``, ``demo`` and ``bench``."""

    model_config = SettingsConfigDict(env_prefix="REMEDIATOR_", extra="ignore")

    nats_url: str | None = Field(
        default=None,
        description="NATS server URL(s), comma-separated. Unset: serve/demo/bench start an embedded nats-server.",
    )
    data_dir: str | None = Field(
        default=None, description="JetStream store of the embedded nats-server. Unset: a temporary directory."
    )
    http: str = Field(default="127.0.0.1:8080", description="HOST:PORT the HTTP ingest API listens on.")
    api_tokens: str = Field(
        default="",
        description="Comma-separated bearer tokens accepted by /v1/*. Empty: no authentication (development only).",
    )
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Largest request body accepted (413 above).")
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file of the cluster. Unset: in-cluster config, then ~/.kube/config."
    )
    dry_run: bool = Field(default=False, description="Record what each playbook would do and touch nothing.")
    replica_id: str = Field(
        default="", description="Actor name of this replica in the audit trail (default: host-pid)."
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector the service exports its trace spans to (e.g. http://otel-collector:4318; "
                    "/v1/traces is added when the URL has no path). Unset: no export.",
    )
    duplicate_window_s: int = Field(
        default=1200, ge=600, description="JetStream duplicate window of FAULTS (covers Alertmanager retries)."
    )
    max_deliver: int = Field(default=5, ge=1, le=100, description="Deliveries of one message before dead-lettering.")
    nak_delay_s: float = Field(default=2.0, ge=0, description="Redelivery delay after a temporary failure.")
    audit_max_age_days: int = Field(default=365, ge=1, description="Retention of the AUDIT stream.")
    audit_max_bytes: int = Field(default=-1, description="Size limit of the AUDIT stream (-1: unlimited).")
    lock_ttl_s: int = Field(default=300, ge=5, description="TTL of the per-node playbook lock (renewed while running).")
    drain_timeout_s: float = Field(default=300.0, gt=0, description="How long a drain waits on PDBs before failing.")
    drain_grace_period_s: int = Field(default=30, ge=0, description="Termination grace period for evicted pods.")
    kube_qps: float = Field(default=20.0, gt=0, description="Client-side rate limit of Kubernetes calls (per second).")
    kube_burst: int = Field(default=40, ge=1, description="Burst allowed above the Kubernetes QPS limit.")
    kube_retry_budget_s: float = Field(
        default=60.0, gt=0, description="Total time a Kubernetes call may spend retrying."
    )
    taint_key: str = Field(default="gpu-remediator/quarantine", description="Taint key the service adds.")
    xid_app_window_s: int = Field(
        default=86_400, gt=0, description="Window in which repeated application Xids across jobs mean hardware."
    )
    xid_app_threshold: int = Field(default=3, ge=2, description="Distinct jobs with an application Xid on one GPU.")
    # --- executor and safety rails (remediator.executor, remediator.safety) ---
    executor_concurrency: int = Field(
        default=32, ge=1, description="Playbooks one executor runs at once (different nodes)."
    )
    lock_wait_s: float = Field(
        default=30.0, ge=0, description="How long a decision waits for a node lock held elsewhere, then retries later."
    )
    cooldown_s: float = Field(
        default=600.0, ge=0, description="A new remediation of a node/GPU within this time escalates instead."
    )
    attempt_window_s: float = Field(default=86_400.0, gt=0, description="Window of the per-node/per-GPU limits.")
    max_node_attempts: int = Field(default=3, ge=1, description="Remediations of one node per window, then escalate.")
    max_gpu_attempts: int = Field(default=2, ge=1, description="Remediations of one GPU per window, then escalate.")
    budget_max_node_fraction: float = Field(
        default=0.1, gt=0, le=1, description="Largest fraction of a pool's GPU nodes out of service at once."
    )
    budget_max_nodes: int = Field(default=50, ge=1, description="Largest number of a pool's GPU nodes out of service.")
    budget_max_gpu_fraction: float = Field(
        default=0.1, gt=0, le=1, description="Largest fraction of a pool's GPUs out of service at once."
    )
    budget_max_gpus: int = Field(default=400, ge=1, description="Largest number of a pool's GPUs out of service.")
    breaker_threshold: int = Field(default=10, ge=1, description="Quarantines within the breaker window that trip it.")
    breaker_window_s: float = Field(default=300.0, gt=0, description="Window in which quarantines are counted.")
    guards_enabled: str = Field(
        default="opt_out,dry_run,cooldown,lock,budget,breaker,approval",
        description="Comma-separated safety guards in force (benchmarks turn some off; the lock is always on).",
    )
    approval_wait_s: float = Field(
        default=30.0, ge=0, description="How long a step waits for approval before the decision is retried later."
    )
    verify_hold_down_s: float | None = Field(
        default=None, ge=0, description="Overrides every playbook's health hold-down time (drills, demo)."
    )
    verify_interval_s: float | None = Field(
        default=None, gt=0, description="Overrides every playbook's health probe interval (drills, demo)."
    )
    reboot_hook_url: str | None = Field(
        default=None, description="URL POSTed to reboot a node (power controller); unset: the node agent reboots."
    )
    escalation_webhook_url: str | None = Field(
        default=None, description="URL POSTed on every escalation of a playbook with `webhook: true`."
    )

    @field_validator("http")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {v!r}")
        return v

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.api_tokens.split(",") if t.strip())

    @property
    def http_host(self) -> str:
        return self.http.rpartition(":")[0]

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])
