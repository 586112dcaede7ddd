"""The drill file's schema: what a drill (``chaos/drills/*.yaml``, and the demo's ``chaos/demo.yaml``) may say.

Where it sits: under the drill catalog (``chaos.catalog``, which loads and validates files against it) and
the runner (``chaos.runner``, which plays what it describes); a fault spec builds its injector
(``chaos.injectors``), a check name must be one of ``chaos.checks.CHECKS``. A drill is validated at load,
and an invalid one is refused with the path of the field:

``name`` / ``description``
    the name is the file's stem.
``cluster``
    ``nodes``, ``pools``, ``gpus_per_node``, which nodes run an agent (``agents``: ``all`` or a list), extra
    single-pod Jobs pinned to a node (``jobs``).
``settings``
    overrides of the service's ``Settings`` (guards and timings); the harness owns the bus, the HTTP port,
    the kubeconfig, the tokens and the replica id.
``timeline``
    entries run in order, each at ``at_s`` seconds from the start (non-decreasing), optionally only
    ``when`` a playbook step is running on a node. An entry injects a ``fault`` (``webhook_xid``,
    ``alert_replay``, ``agent_xid``, ``agent_ecc``, ``agent_orphan``, ``agent_memory_growth``, ``nccl_ranks``;
    ``nodes:`` fans one fault out over several nodes, named ``<name>@<node>``) or takes an ``action`` (``nats_restart``,
    ``kube_api_errors``, ``kube_latency``, ``kill_service``, ``agent_disconnect``, ``manual_uncordon``,
    ``opt_out``, ``block_pdb``). Actions that last (``nats_restart``, ``agent_disconnect``, ``kube_latency``
    with ``for_s``) run in the background while the timeline goes on. A fault's kind and code are never
    written: its injector declares them (an ``agent_ecc`` with ``dbe`` is ``ecc``/``dbe_volatile``).
``expect``
    ``deadline_s`` for every fault to come to rest; per fault the playbook, the acceptable outcomes, the
    steps it ran, checks of the cluster and GPUs and its own deadline; outcome counts across faults;
    cluster facts at the end (``tainted``, ``cordoned``, ``drained``, ``isolated_gpus``,
    ``restarted_jobs``, ``breaker``); audit records that must (or must not) exist; and what must never
    have happened (``max_nodes_out`` at any moment, ``untouched`` nodes, ``no_second_remediation``,
    ``no_step_repeated``, ``audit_chains_verify``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos.checks import CHECKS
from chaos.injectors import AgentEcc, AgentMemoryGrowth, AgentOrphan, AgentXid, AlertReplay, NcclRanks, WebhookXid
from chaos.sim import TRAINING_NAMESPACE
from remediator.contracts import PLAYBOOK_NAMES, AuditWhat
from remediator.settings import Settings

NAME_RE = r"^[a-z0-9][a-z0-9-]*$"
OUTCOMES = ("completed", "escalated", "rolled-back", "dry-run", "blocked", "cancelled", "node-gone")
# Settings the harness sets for every replica; a drill may not override them.
HARNESS_SETTINGS = frozenset({"nats_url", "data_dir", "http", "api_tokens", "kubeconfig", "replica_id"})


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExtraJobSpec(_Spec):
    name: str = Field(pattern=NAME_RE)
    node: str
    gpus: int = Field(2, ge=1, le=16)


class GpuConditionSpec(_Spec):
    """How a simulated node's GPU reset or reboot behaves (``SimGpuNode.set_reset_outcome`` /
    ``set_reboot_outcome``): a reset that fails, brings back another UUID or leaves retirement pending; a
    reboot command that runs and never reboots."""

    node: str
    gpu: int | None = Field(None, ge=0)
    reset: Literal["fail", "new_uuid", "retired_pending"] | None = None
    reboot: Literal["ignored"] | None = None

    @model_validator(mode="after")
    def _coherent(self) -> GpuConditionSpec:
        if self.reset is not None and self.gpu is None:
            raise ValueError("a reset condition names its gpu")
        if self.reset is None and self.reboot is None:
            raise ValueError("give reset or reboot")
        return self


class ClusterSpec(_Spec):
    nodes: int = Field(8, ge=1, le=64)
    pools: int = Field(1, ge=1, le=8)
    gpus_per_node: int = Field(8, ge=1, le=16)
    agents: Literal["all"] | list[str] = "all"
    jobs: list[ExtraJobSpec] = Field(default_factory=list)
    # the GPU Operator's operands (chaos.sim.gpu_operator), holding every GPU open and following the
    # nvidia.com/gpu.deploy.* labels; unmanaged_operands ignore the labels (a standalone install)
    gpu_operator: bool = False
    unmanaged_operands: list[Literal["device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm"]] = \
        Field(default_factory=list)
    gpu_conditions: list[GpuConditionSpec] = Field(default_factory=list)
    replicas: int = Field(1, ge=1, le=3)  # service replicas sharing the bus from the start
    nats_servers: Literal[1, 3] = 1  # 3: a real three-server NATS cluster, every stream and bucket R3
    # how the simulated cluster hands out GPUs (chaos.sim.dra for dra), and M single-pod Jobs per node, each
    # holding gpus_per_node / M GPUs, instead of the seeded training layout (remediator sim's flags)
    gpu_allocation: Literal["device-plugin", "dra"] = "device-plugin"
    gpu_pods_per_node: int | None = Field(None, ge=1, le=16)

    @model_validator(mode="after")
    def _pods_divide_gpus(self) -> ClusterSpec:
        if self.gpu_pods_per_node is not None and self.gpus_per_node % self.gpu_pods_per_node:
            raise ValueError("gpu_pods_per_node must divide gpus_per_node")
        if self.gpu_allocation == "dra" and self.jobs:
            raise ValueError("extra jobs request nvidia.com/gpu: none in a dra cluster")
        return self

    def node_names(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.nodes)]

    def agent_nodes(self) -> list[str]:
        return self.node_names() if self.agents == "all" else list(self.agents)


class _FaultSpec(_Spec):
    name: str = Field(pattern=NAME_RE)
    node: str | None = None
    nodes: list[str] | None = Field(None, min_length=1)
    gpu: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_target(self) -> _FaultSpec:
        if (self.node is None) == (self.nodes is None):
            raise ValueError("give exactly one of node (one fault) or nodes (the same fault on each)")
        return self

    def targets(self) -> list[str]:
        return [self.node] if self.node is not None else list(self.nodes or [])

    def fault_name(self, node: str) -> str:
        return self.name if self.node is not None else f"{self.name}@{node}"


class WebhookXidSpec(_FaultSpec):
    """Xid alert(s) POSTed to the Alertmanager webhook (``times`` copies of one notification; ``jobs``: one
    alert per job, naming its pod on the node)."""

    type: Literal["webhook_xid"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    times: int = Field(1, ge=1, le=20)
    jobs: list[Annotated[str, Field(pattern=NAME_RE)]] = Field(default_factory=list, max_length=20)

    def injector(self) -> WebhookXid:
        return WebhookXid(self.code, times=self.times, jobs=tuple(self.jobs))


class AlertReplaySpec(_FaultSpec):
    """One notification as an HA pair and its retries deliver it (``chaos.scenario.alert_replay``)."""

    type: Literal["alert_replay"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    times: int = Field(3, ge=1, le=20)
    concurrent: int = Field(2, ge=1, le=4)
    resolved: Literal["never", "early", "first"] = "never"

    def injector(self) -> AlertReplay:
        return AlertReplay(self.code, times=self.times, concurrent=self.concurrent, resolved=self.resolved)


class AgentXidSpec(_FaultSpec):
    """An Xid line in the node's kernel log, read by its agent."""

    type: Literal["agent_xid"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    text: str | None = None

    def injector(self) -> AgentXid:
        return AgentXid(self.code, text=self.text)


class AgentEccSpec(_FaultSpec):
    """ECC counters the agent's NVML poller reads: a double-bit error count or a pending row remap."""

    type: Literal["agent_ecc"]
    gpu: int = Field(ge=0)
    dbe: int | None = Field(None, ge=1)
    remap_pending: bool | None = None

    @model_validator(mode="after")
    def _something(self) -> AgentEccSpec:
        if self.dbe is None and not self.remap_pending:
            raise ValueError("agent_ecc needs dbe (a count) or remap_pending: true")
        return self

    def injector(self) -> AgentEcc:
        return AgentEcc(dbe=self.dbe, remap_pending=self.remap_pending)


class AgentOrphanSpec(_FaultSpec):
    """A process holding GPU memory whose pod is gone."""

    type: Literal["agent_orphan"]
    gpu: int = Field(ge=0)

    def injector(self) -> AgentOrphan:
        return AgentOrphan()


class AgentMemoryGrowthSpec(_FaultSpec):
    """The process of the training pod on ``gpu`` leaks GPU memory until its job is restarted."""

    type: Literal["agent_memory_growth"]
    gpu: int = Field(ge=0)
    mib_per_s: int = Field(2048, ge=1, le=65536)

    def injector(self) -> AgentMemoryGrowth:
        return AgentMemoryGrowth(mib_per_s=self.mib_per_s)


class NcclRanksSpec(_FaultSpec):
    """Every rank of a PyTorchJob logs the NCCL watchdog timeout; ``lagging`` names the stuck rank."""

    type: Literal["nccl_ranks"]
    gpu: None = None  # the events are the job's, found by job
    job: str = Field(pattern=NAME_RE)
    lagging: int | None = Field(None, ge=0)

    def injector(self) -> NcclRanks:
        return NcclRanks(self.job, lagging=self.lagging)


FaultSpec = Annotated[WebhookXidSpec | AlertReplaySpec | AgentXidSpec | AgentEccSpec | AgentOrphanSpec
                      | AgentMemoryGrowthSpec | NcclRanksSpec, Field(discriminator="type")]


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"not a regular expression: {e}") from None
    return v


class NatsRestartSpec(_Spec):
    """Stop the nats-server for ``down_s`` seconds, then start it on the same port and store."""

    type: Literal["nats_restart"]
    down_s: float = Field(gt=0, le=30)


class KubeApiErrorsSpec(_Spec):
    """The next ``count`` matching Kubernetes API requests fail with ``status`` (and ``Retry-After``)."""

    type: Literal["kube_api_errors"]
    status: Literal[429, 500, 502, 503, 504]
    count: int = Field(ge=1, le=100)
    method: Literal["*", "GET", "POST", "PATCH", "PUT", "DELETE"] = "*"
    path: str = ".*"
    retry_after: int | None = Field(None, ge=0, le=30)

    @field_validator("path")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _regex(v)


class KubeLatencySpec(_Spec):
    """Matching Kubernetes API requests take ``seconds`` longer, for ``for_s`` seconds (or to the end)."""

    type: Literal["kube_latency"]
    seconds: float = Field(gt=0, le=10)
    method: Literal["*", "GET", "POST", "PATCH", "PUT", "DELETE"] = "*"
    path: str = ".*"
    for_s: float | None = Field(None, gt=0, le=60)

    @field_validator("path")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _regex(v)


class KillServiceSpec(_Spec):
    """The service replica dies abruptly; a fresh one starts on the same bus. ``redeliver_after_s`` is the
    executor consumer's ack wait for the drill (production: minutes)."""

    type: Literal["kill_service"]
    redeliver_after_s: float = Field(3.0, ge=1, le=30)


class ReplicaLossSpec(_Spec):
    """The replica running a playbook step on ``node`` dies like a SIGKILLed process (no drain, no nak, its
    node lock kept); no replica is started in its place: the others take the run over once the executor
    consumer's ack wait (``executor_ack_wait_s``) and the lock TTL (``lock_ttl_s``) run out."""

    type: Literal["replica_loss"]
    node: str


class NatsServerKillSpec(_Spec):
    """SIGKILL one server of the NATS cluster (``server``: its index, or ``faults_leader`` for the one leading
    the FAULTS stream's Raft group); it stays down ``down_s`` seconds, or to the end of the drill."""

    type: Literal["nats_server_kill"]
    server: Literal["faults_leader", 0, 1, 2] = "faults_leader"
    down_s: float | None = Field(None, gt=0, le=60)


class AgentDisconnectSpec(_Spec):
    """Stop one node's agent for ``down_s`` seconds, then restart it."""

    type: Literal["agent_disconnect"]
    node: str
    down_s: float = Field(gt=0, le=30)


class ManualUncordonSpec(_Spec):
    """A person uncordons the node (and, with ``remove_taint``, removes the quarantine taint)."""

    type: Literal["manual_uncordon"]
    node: str
    remove_taint: bool = False


class OptOutSpec(_Spec):
    """A person labels the node ``gpu-remediator.io/opt-out=true``."""

    type: Literal["opt_out"]
    node: str


class BlockPdbSpec(_Spec):
    """A PodDisruptionBudget refuses every eviction (``blocked: false``: allows them again)."""

    type: Literal["block_pdb"]
    name: str
    namespace: str = TRAINING_NAMESPACE
    blocked: bool = True


class HostileClientSpec(_Spec):
    """A hostile client attacks ``node``'s agent (unsigned, foreign-key, expired, replayed, tampered commands
    and one captured for ``other``) and the ingest (another producer's source or ids, no token, wrong
    Content-Type); every attempt must be refused (``chaos.hostile``)."""

    type: Literal["hostile_client"]
    node: str
    other: str


ActionSpec = Annotated[NatsRestartSpec | KubeApiErrorsSpec | KubeLatencySpec | KillServiceSpec
                       | ReplicaLossSpec | NatsServerKillSpec | AgentDisconnectSpec | ManualUncordonSpec
                       | OptOutSpec | BlockPdbSpec | HostileClientSpec,
                       Field(discriminator="type")]


class When(_Spec):
    """Hold a timeline entry until playbook step ``step_running`` is running on ``node`` (at most
    ``within_s`` seconds), then ``plus_s`` seconds more."""

    step_running: str
    node: str
    plus_s: float = Field(0.0, ge=0, le=10)
    within_s: float = Field(20.0, gt=0, le=60)


class TimelineEntry(_Spec):
    at_s: float = Field(ge=0, le=60)
    fault: FaultSpec | None = None
    action: ActionSpec | None = None
    when: When | None = None

    @model_validator(mode="after")
    def _one(self) -> TimelineEntry:
        if (self.fault is None) == (self.action is None):
            raise ValueError("a timeline entry is exactly one of fault or action")
        return self


def _outcomes(v: list[str]) -> list[str]:
    for o in v:
        if o not in OUTCOMES:
            raise ValueError(f"{o!r} is not an outcome; one of {', '.join(OUTCOMES)}")
    return v


class FaultExpect(_Spec):
    playbook: str | None
    outcomes: list[str] = Field(default_factory=list)
    actions: list[str] | None = None
    check: list[str] = Field(default_factory=list)
    within_s: float | None = Field(None, gt=0)
    min_step_s: dict[str, float] = Field(default_factory=dict)  # step id -> it took at least this long

    @field_validator("outcomes")
    @classmethod
    def _known_outcomes(cls, v: list[str]) -> list[str]:
        return _outcomes(v)

    @field_validator("check")
    @classmethod
    def _known_checks(cls, v: list[str]) -> list[str]:
        for c in v:
            if c not in CHECKS:
                raise ValueError(f"{c!r} is not a check; one of {', '.join(CHECKS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FaultExpect:
        if self.playbook is not None and self.playbook not in PLAYBOOK_NAMES:
            raise ValueError(f"playbook {self.playbook!r} is not one of {', '.join(PLAYBOOK_NAMES)}")
        if self.playbook is not None and not self.outcomes:
            raise ValueError("outcomes: say which outcomes of the playbook are acceptable")
        if self.playbook is None and self.outcomes:
            raise ValueError("outcomes: a fault with playbook null is only recorded; it has no outcome")
        return self


class ClusterExpect(_Spec):
    tainted: list[str] | None = None
    cordoned: list[str] | None = None
    tainted_count: int | None = Field(None, ge=0)
    cordoned_count: int | None = Field(None, ge=0)
    drained: list[str] = Field(default_factory=list)
    isolated_gpus: list[Annotated[str, Field(pattern=r"^gpu-node-\d+/\d+$")]] | None = None
    restarted_jobs: list[Annotated[str, Field(pattern=r"^(Job|PyTorchJob)/[a-z0-9][a-z0-9-]*$")]] | None = None
    breaker: Literal["open", "closed"] | None = None


class AuditExpect(_Spec):
    """Records of kind ``what`` matching every given filter; ``count`` (exact), else ``min``/``max``
    (``min`` defaults to 1)."""

    what: AuditWhat
    node: str | None = None
    fault: str | None = None
    contains: str | None = None
    actor: str | None = None
    guard: str | None = None
    allowed: bool | None = None
    count: int | None = Field(None, ge=0)
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AuditExpect:
        if self.count is not None and (self.min is not None or self.max is not None):
            raise ValueError("give count, or min/max, not both")
        return self


class NeverExpect(_Spec):
    max_nodes_out: int | None = Field(None, ge=0)
    untouched: list[str] | Literal["others"] = Field(default_factory=list)
    no_second_remediation: bool = False
    no_step_repeated: bool = False
    audit_chains_verify: bool = True


class Expectations(_Spec):
    deadline_s: float = Field(25.0, gt=0, le=120)
    quiet_s: float = Field(1.0, ge=0, le=10)
    faults: dict[str, FaultExpect]
    outcomes: dict[str, int] = Field(default_factory=dict)
    cluster: ClusterExpect = Field(default_factory=ClusterExpect)
    audit: list[AuditExpect] = Field(default_factory=list)
    never: NeverExpect = Field(default_factory=NeverExpect)

    @field_validator("outcomes")
    @classmethod
    def _known_outcomes(cls, v: dict[str, int]) -> dict[str, int]:
        _outcomes(list(v))
        return v


class Drill(_Spec):
    """One chaos drill (see the module docstring)."""

    version: Literal[1] = 1
    name: str = Field(pattern=NAME_RE)
    description: str = Field(min_length=10)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    settings: dict[str, Any] = Field(default_factory=dict)
    timeline: list[TimelineEntry] = Field(min_length=1)
    expect: Expectations

    @field_validator("settings")
    @classmethod
    def _settings(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in HARNESS_SETTINGS:
                raise ValueError(f"{key}: set by the drill harness, not by a drill")
            if key not in Settings.model_fields:
                raise ValueError(f"{key}: not a setting (see remediator.settings.Settings)")
        try:
            Settings(**v)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
        return v

    @model_validator(mode="after")
    def _coherent(self) -> Drill:
        problems: list[str] = []
        nodes = set(self.cluster.node_names())
        agents = set(self.cluster.agent_nodes())

        def node_ok(where: str, node: str) -> None:
            if node not in nodes:
                problems.append(f"{where}: {node!r} is not a node of this {self.cluster.nodes}-node cluster "
                                f"(gpu-node-0 … gpu-node-{self.cluster.nodes - 1})")

        if self.cluster.agents != "all":
            for i, n in enumerate(self.cluster.agents):
                node_ok(f"cluster.agents.{i}", n)
        for i, job in enumerate(self.cluster.jobs):
            node_ok(f"cluster.jobs.{i}.node", job.node)
        for i, cond in enumerate(self.cluster.gpu_conditions):
            node_ok(f"cluster.gpu_conditions.{i}.node", cond.node)
        if self.cluster.unmanaged_operands and not self.cluster.gpu_operator:
            problems.append("cluster.unmanaged_operands: needs gpu_operator: true")
        names: list[str] = []
        spec_names: list[str] = []
        types: dict[str, str] = {}
        last = 0.0
        for i, entry in enumerate(self.timeline):
            where = f"timeline.{i}"
            if entry.at_s < last:
                problems.append(f"{where}.at_s: {entry.at_s:g} comes before the previous entry's {last:g}")
            last = entry.at_s
            if entry.when is not None:
                node_ok(f"{where}.when.node", entry.when.node)
            if entry.fault is not None:
                f = entry.fault
                spec_names.append(f.name)
                types[f.name] = f.type
                for j, n in enumerate(f.targets()):
                    node_ok(f"{where}.fault.{'node' if f.node else f'nodes.{j}'}", n)
                    names.append(f.fault_name(n))
                    if f.type.startswith("agent_") and n in nodes and n not in agents:
                        problems.append(f"{where}.fault: {f.type} on {n}, which runs no agent (cluster.agents)")
                if f.gpu is not None and f.gpu >= self.cluster.gpus_per_node:
                    problems.append(f"{where}.fault.gpu: {f.gpu} is not a GPU of a "
                                    f"{self.cluster.gpus_per_node}-GPU node")
            action = entry.action
            if action is not None and hasattr(action, "node"):
                node_ok(f"{where}.action.node", action.node)
                if isinstance(action, AgentDisconnectSpec) and action.node not in agents:
                    problems.append(f"{where}.action: {action.node} runs no agent to disconnect")
        for dup in sorted(n for n, c in Counter(names).items() if c > 1):
            problems.append(f"timeline: two faults are named {dup!r}")
        for name in self.expect.faults:
            if name not in spec_names:
                problems.append(f"expect.faults.{name}: no fault of the timeline has this name")
        for name in spec_names:
            if name not in self.expect.faults:
                problems.append(f"expect.faults: fault {name!r} of the timeline has no expectation")
        for name, fe in self.expect.faults.items():
            if "job_restarted" in fe.check and types.get(name, "nccl_ranks") != "nccl_ranks":
                problems.append(f"expect.faults.{name}.check: job_restarted judges the job of an nccl_ranks fault")
        c = self.expect.cluster
        for key, listed in (("tainted", c.tainted), ("cordoned", c.cordoned), ("drained", c.drained)):
            for i, n in enumerate(listed or []):
                node_ok(f"expect.cluster.{key}.{i}", n)
        for i, g in enumerate(c.isolated_gpus or []):
            node_ok(f"expect.cluster.isolated_gpus.{i}", g.split("/")[0])
        for i, a in enumerate(self.expect.audit):
            if a.node is not None:
                node_ok(f"expect.audit.{i}.node", a.node)
            if a.fault is not None and a.fault not in spec_names:
                problems.append(f"expect.audit.{i}.fault: no fault of the timeline is named {a.fault!r}")
        if self.expect.never.untouched != "others":
            for i, n in enumerate(self.expect.never.untouched):
                node_ok(f"expect.never.untouched.{i}", n)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def crashes(self) -> list[KillServiceSpec]:
        return [e.action for e in self.timeline if isinstance(e.action, KillServiceSpec)]

    def replica_losses(self) -> list[ReplicaLossSpec]:
        return [e.action for e in self.timeline if isinstance(e.action, ReplicaLossSpec)]

    def named_nodes(self) -> set[str]:
        """Nodes a fault or an action of the timeline names."""
        out: set[str] = set()
        for e in self.timeline:
            if e.fault is not None:
                out |= set(e.fault.targets())
            if e.action is not None and hasattr(e.action, "node"):
                out.add(e.action.node)
        return out


