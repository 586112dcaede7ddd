"""Chaos drills: YAML scenarios with expected outcomes, run against the simulated cluster (DESIGN.md §11).

Where it sits: chaos tooling on top of everything, beside ``chaos.demo``; ``remediator drill list|run``
(``remediator.commands.drill``) is its command line. The machinery (environment, injectors, chaos actions,
checks, following the audit trail) is ``chaos.scenario``'s; this module holds the drill schema, the catalog
of shipped drills (``chaos/drills/*.yaml``) and the runner that plays a drill's timeline and judges its
expectations.

A drill (``Drill``) is validated at load, and an invalid one is refused with the path of the field:

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
    ``alert_replay``, ``agent_xid``, ``agent_ecc``, ``agent_orphan``, ``nccl_ranks``; ``nodes:`` fans one
    fault out over several nodes, named ``<name>@<node>``) or takes an ``action`` (``nats_restart``,
    ``kube_api_errors``, ``kube_latency``, ``kill_service``, ``agent_disconnect``, ``manual_uncordon``,
    ``opt_out``, ``block_pdb``). Actions that last (``nats_restart``, ``agent_disconnect``, ``kube_latency``
    with ``for_s``) run in the background while the timeline goes on.
``expect``
    ``deadline_s`` for every fault to come to rest; per fault the playbook, the acceptable outcomes, the
    steps it ran, checks of the cluster and GPUs (``chaos.scenario.CHECKS``) and its own deadline; outcome
    counts across faults; cluster facts at the end (``tainted``, ``cordoned``, ``drained``,
    ``isolated_gpus``, ``restarted_jobs``, ``breaker``); audit records that must (or must not) exist; and
    what must never have happened (``max_nodes_out`` at any moment, ``untouched`` nodes,
    ``no_second_remediation``, ``no_step_repeated``, ``audit_chains_verify``).

``run_drill`` returns a ``DrillReport``: one verdict per expectation (and per timeline action), passed only
when all pass. Drills run against the simulated cluster only; ``--kubeconfig`` against a real cluster is
not implemented.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chaos import scenario as sc
from chaos.scenario import ExtraJob, Fault, FaultResult, Progress, World
from remediator.audit import verify_chains
from remediator.contracts import PLAYBOOK_NAMES, AuditRecord, AuditWhat
from remediator.settings import Settings

DRILLS_DIR = Path(__file__).resolve().parent / "drills"
NAME_RE = r"^[a-z0-9][a-z0-9-]*$"
OUTCOMES = ("completed", "escalated", "rolled-back", "dry-run", "blocked", "cancelled", "node-gone")
# Settings the harness sets for every replica; a drill may not override them.
HARNESS_SETTINGS = frozenset({"nats_url", "data_dir", "http", "api_tokens", "kubeconfig", "replica_id"})


class DrillError(ValueError):
    """A drill that cannot be loaded: the message names the file and the field."""


# --- the schema ----------------------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExtraJobSpec(_Spec):
    name: str = Field(pattern=NAME_RE)
    node: str
    gpus: int = Field(2, ge=1, le=16)


class ClusterSpec(_Spec):
    nodes: int = Field(8, ge=1, le=64)
    pools: int = Field(1, ge=1, le=8)
    gpus_per_node: int = Field(8, ge=1, le=16)
    agents: Literal["all"] | list[str] = "all"
    jobs: list[ExtraJobSpec] = Field(default_factory=list)

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
    """Xid alert(s) POSTed to the Alertmanager webhook (``times`` copies of one notification)."""

    type: Literal["webhook_xid"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    times: int = Field(1, ge=1, le=20)


class AlertReplaySpec(_FaultSpec):
    """One notification as an HA pair and its retries deliver it (``chaos.scenario.alert_replay``)."""

    type: Literal["alert_replay"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    times: int = Field(3, ge=1, le=20)
    concurrent: int = Field(2, ge=1, le=4)
    resolved: Literal["never", "early", "first"] = "never"


class AgentXidSpec(_FaultSpec):
    """An Xid line in the node's kernel log, read by its agent."""

    type: Literal["agent_xid"]
    code: int = Field(ge=0)
    gpu: int = Field(ge=0)
    text: str | None = None


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


class AgentOrphanSpec(_FaultSpec):
    """A process holding GPU memory whose pod is gone."""

    type: Literal["agent_orphan"]
    gpu: int = Field(ge=0)


class NcclRanksSpec(_FaultSpec):
    """Every rank of a PyTorchJob logs the NCCL watchdog timeout; ``lagging`` names the stuck rank."""

    type: Literal["nccl_ranks"]
    job: str = Field(pattern=NAME_RE)
    lagging: int | None = Field(None, ge=0)


FaultSpec = Annotated[WebhookXidSpec | AlertReplaySpec | AgentXidSpec | AgentEccSpec | AgentOrphanSpec
                      | NcclRanksSpec, Field(discriminator="type")]


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
    namespace: str = "training"
    blocked: bool = True


ActionSpec = Annotated[NatsRestartSpec | KubeApiErrorsSpec | KubeLatencySpec | KillServiceSpec
                       | AgentDisconnectSpec | ManualUncordonSpec | OptOutSpec | BlockPdbSpec,
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
            if c not in sc.CHECKS:
                raise ValueError(f"{c!r} is not a check; one of {', '.join(sc.CHECKS)}")
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
        names: list[str] = []
        spec_names: list[str] = []
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

    def named_nodes(self) -> set[str]:
        """Nodes a fault or an action of the timeline names."""
        out: set[str] = set()
        for e in self.timeline:
            if e.fault is not None:
                out |= set(e.fault.targets())
            if e.action is not None and hasattr(e.action, "node"):
                out.add(e.action.node)
        return out


# --- loading -------------------------------------------------------------------------------------------


def _where(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc)


def parse_drill(text: str, source: str = "<drill>", *, stem: str | None = None) -> Drill:
    """Validate one drill's YAML; raises ``DrillError`` naming ``source`` and the failing field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DrillError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise DrillError(f"{source}: a drill is a YAML mapping (name, description, cluster, settings, timeline, "
                         "expect)")
    try:
        drill = Drill.model_validate(raw)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            msg = str(err["msg"]).removeprefix("Value error, ")
            where = _where(err["loc"])
            msgs.append(f"{where}: {msg}" if where else msg)
        raise DrillError(f"{source}: " + "; ".join(msgs)) from None
    if stem is not None and drill.name != stem:
        raise DrillError(f"{source}: name: {drill.name!r} must be the file name without .yaml ({stem!r})")
    return drill


def load_drill(path: Path) -> Drill:
    return parse_drill(path.read_text(), str(path), stem=path.stem)


def drill_paths(directory: Path = DRILLS_DIR) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def list_drills(directory: Path = DRILLS_DIR) -> list[Drill]:
    return [load_drill(p) for p in drill_paths(directory)]


def get_drill(name: str, directory: Path = DRILLS_DIR) -> Drill:
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in drill_paths(directory))
        raise DrillError(f"no drill named {name!r} (known: {known})")
    return load_drill(path)


# --- the report ----------------------------------------------------------------------------------------


@dataclass
class Verdict:
    what: str
    passed: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "passed": self.passed, "detail": self.detail}


@dataclass
class DrillReport:
    name: str
    seconds: float
    expectations: list[Verdict] = field(default_factory=list)
    results: list[FaultResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.expectations) and all(v.passed for v in self.expectations)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "seconds": round(self.seconds, 2),
                "expectations": [v.to_json() for v in self.expectations]}


# --- building faults -----------------------------------------------------------------------------------


def _fault(spec: FaultSpec, node: str, expect: FaultExpect) -> Fault:
    checks = [sc.CHECKS[c] for c in expect.check]

    def check(world: World, f: Fault) -> list[str]:
        return [p for c in checks for p in c(world, f)]

    name = spec.fault_name(node)
    outcomes = tuple(expect.outcomes)
    if isinstance(spec, WebhookXidSpec):
        return Fault(name, "webhook", "xid", spec.code, node, spec.gpu, expect.playbook, outcomes,
                     sc.webhook_xid(times=spec.times), check)
    if isinstance(spec, AlertReplaySpec):
        return Fault(name, "webhook", "xid", spec.code, node, spec.gpu, expect.playbook, outcomes,
                     sc.alert_replay(spec.times, spec.concurrent, spec.resolved), check)
    if isinstance(spec, AgentXidSpec):
        return Fault(name, "agent", "xid", spec.code, node, spec.gpu, expect.playbook, outcomes,
                     sc.agent_xid(spec.text), check)
    if isinstance(spec, AgentEccSpec):
        code = "dbe_volatile" if spec.dbe is not None else "row_remap_pending"
        return Fault(name, "agent", "ecc", code, node, spec.gpu, expect.playbook, outcomes,
                     sc.agent_ecc(dbe=spec.dbe, remap_pending=spec.remap_pending), check)
    if isinstance(spec, AgentOrphanSpec):
        return Fault(name, "agent", "memory_leak", "orphaned_memory", node, spec.gpu, expect.playbook, outcomes,
                     sc.agent_orphan, check)
    return Fault(name, "agent", "nccl_timeout", "watchdog_timeout", node, None, expect.playbook, outcomes,
                 sc.nccl_ranks(spec.job, spec.lagging), check)


def build_faults(drill: Drill) -> dict[str, list[Fault]]:
    """The faults of the timeline, by the name their spec gives (a fanned-out spec makes several)."""
    out: dict[str, list[Fault]] = {}
    for entry in drill.timeline:
        if entry.fault is not None:
            spec = entry.fault
            out[spec.name] = [_fault(spec, n, drill.expect.faults[spec.name]) for n in spec.targets()]
    return out


# --- running -------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """What the runner keeps while a drill plays."""

    world: World
    drill: Drill
    progress: Progress
    faults: dict[str, list[Fault]]
    results: dict[str, FaultResult]
    t0: float = 0.0
    timeline: list[Verdict] = field(default_factory=list)
    background: list[tuple[str, asyncio.Task[str]]] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


async def run_drill(drill: Drill, progress: Progress) -> DrillReport:
    """Start the environment the drill describes, play its timeline, follow its faults to rest and judge
    every expectation. Never raises for a failing drill: a crash of the harness is a failed verdict."""
    t0 = time.monotonic()
    report = DrillReport(drill.name, 0.0)
    faults = build_faults(drill)
    agents = None if drill.cluster.agents == "all" else list(drill.cluster.agents)
    jobs = [ExtraJob(j.name, j.node, j.gpus) for j in drill.cluster.jobs]
    try:
        async with sc.environment(progress, nodes=drill.cluster.nodes, pools=drill.cluster.pools,
                                  gpus=drill.cluster.gpus_per_node, settings=drill.settings, agents=agents,
                                  jobs=jobs, label="drill", crashable=bool(drill.crashes()),
                                  kubelet=True) as world:
            world.faults = [f for fs in faults.values() for f in fs]
            run = _Run(world, drill, progress, faults, {f.name: FaultResult(f) for f in world.faults})
            try:
                await _play(run)
            finally:
                for _what, task in run.background:
                    task.cancel()
            report.results = list(run.results.values())
            report.expectations = run.timeline + await _judge(run)
    except Exception as e:  # the harness itself failed: a failed drill, with the reason
        report.expectations.append(Verdict("the drill ran to its end", False, f"{type(e).__name__}: {e}"))
    report.seconds = time.monotonic() - t0
    return report


async def _play(run: _Run) -> None:
    world, drill = run.world, run.drill
    crashes = drill.crashes()
    if crashes:
        await sc.set_redelivery(world, min(c.redeliver_after_s for c in crashes))
    run.t0 = time.monotonic()
    for entry in drill.timeline:
        await asyncio.sleep(max(0.0, run.t0 + entry.at_s - time.monotonic()))
        kind = entry.fault.type if entry.fault is not None else entry.action.type if entry.action else ""
        label = f"{entry.at_s:g}s {kind}"
        if entry.when is not None:
            met = await _step_running(world, entry.when)
            if met is None:
                run.timeline.append(Verdict(f"timeline {label}: when {entry.when.step_running} runs on "
                                            f"{entry.when.node}", False,
                                            f"the step was not seen running within {entry.when.within_s:g}s"))
                continue
            await asyncio.sleep(entry.when.plus_s)
            label += f" (while {entry.when.step_running} ran on {entry.when.node})"
        try:
            if entry.fault is not None:
                for f in run.faults[entry.fault.name]:
                    await sc.inject_fault(world, f, run.results[f.name], run.progress)
            else:
                assert entry.action is not None
                await _act(run, entry.action, label)
        except Exception as e:
            run.timeline.append(Verdict(f"timeline {label}", False, f"{type(e).__name__}: {e}"))
    deadline = run.t0 + drill.expect.deadline_s
    results = list(run.results.values())
    settled = await sc.settle_faults(world, results, run.progress, max(0.0, deadline - time.monotonic()),
                                     poll_s=0.25)
    for what, task in run.background:
        try:
            detail = await asyncio.wait_for(task, timeout=max(5.0, deadline - time.monotonic()))
            run.timeline.append(Verdict(f"timeline {what}", True, detail))
        except Exception as e:
            run.timeline.append(Verdict(f"timeline {what}", False, f"{type(e).__name__}: {e}"))
    run.background.clear()
    await asyncio.sleep(drill.expect.quiet_s)  # late duplicates or second remediations would show by now
    records = await _records(world)
    for res in results:  # refresh from the final trail (actions, outcome)
        sc.follow(records, world, res.fault, res)
    sc.judge(world, results, settled, drill.expect.deadline_s)


async def _act(run: _Run, action: ActionSpec, label: str) -> None:
    world = run.world

    def done(detail: str) -> None:
        run.progress(f"⚡ {label}: {detail}")
        run.timeline.append(Verdict(f"timeline {label}", True, detail))

    def later(coro: Any, what: str) -> None:
        run.progress(f"⚡ {label}: {what}")
        run.background.append((label, asyncio.create_task(coro)))

    if isinstance(action, NatsRestartSpec):
        later(sc.nats_restart(world, action.down_s), f"stopping nats-server for {action.down_s:g}s")
    elif isinstance(action, KubeApiErrorsSpec):
        sc.kube_api_errors(world, action.status, count=action.count, method=action.method, path=action.path,
                           retry_after=action.retry_after)
        run.progress(f"⚡ {label}: the next {action.count} {action.method} {action.path} requests answer "
                     f"{action.status}" + (f" (Retry-After {action.retry_after})" if action.retry_after else ""))
    elif isinstance(action, KubeLatencySpec):
        task = sc.kube_latency(world, action.seconds, method=action.method, path=action.path, for_s=action.for_s)
        if action.for_s is None:
            done(await task)
        else:
            later(task, f"+{action.seconds:g}s on {action.method} {action.path} for {action.for_s:g}s")
    elif isinstance(action, KillServiceSpec):
        old = world.replica.actor
        new = await sc.kill_replica(world)
        done(f"{old} killed (no graceful drain); {new.actor} started on the same bus")
    elif isinstance(action, AgentDisconnectSpec):
        later(sc.agent_disconnect(world, action.node, action.down_s),
              f"agent of {action.node} stopped for {action.down_s:g}s")
    elif isinstance(action, ManualUncordonSpec):
        done(sc.manual_uncordon(world, action.node, remove_taint=action.remove_taint))
    elif isinstance(action, OptOutSpec):
        done(sc.opt_out(world, action.node))
    else:
        assert isinstance(action, BlockPdbSpec)
        done(sc.block_pdb(world, action.namespace, action.name, action.blocked))


async def _records(world: World, attempts: int = 20) -> list[AuditRecord]:
    for _ in range(attempts):
        records = await world.records()
        if records is not None:
            return records
        await asyncio.sleep(0.5)
    raise RuntimeError("the audit trail could not be read")


def _step_of(r: AuditRecord) -> str:
    return r.why.split(":")[0]


async def _step_running(world: World, when: When) -> str | None:
    """Wait until step ``when.step_running`` has started on ``when.node`` and not yet ended."""
    deadline = time.monotonic() + when.within_s
    while time.monotonic() < deadline:
        records = await world.records() or []
        started = [i for i, r in enumerate(records) if r.what == "step_started" and r.node == when.node
                   and _step_of(r) == when.step_running]
        if started:
            i = started[-1]
            ended = any(r.incident == records[i].incident and _step_of(r) == when.step_running
                        and r.what in ("step_succeeded", "step_failed", "step_skipped") for r in records[i + 1:])
            if not ended:
                return records[i].incident
        await asyncio.sleep(0.1)
    return None


# --- judging -------------------------------------------------------------------------------------------


async def _judge(run: _Run) -> list[Verdict]:
    world, drill = run.world, run.drill
    records = await _records(world)
    out = _fault_verdicts(run)
    if drill.expect.outcomes:
        out.append(_outcome_counts(run))
    for fault in world.kube_faults:
        what = (f"Kubernetes API {fault.status or f'+{fault.latency_s:g}s'} on {fault.method} {fault.path.pattern} "
                "was served")
        if fault.status is not None:
            ok = fault.remaining == 0
            out.append(Verdict(what, ok, f"{fault.hits} served"
                               + ("" if ok else f", {fault.remaining} never asked for")))
        else:
            out.append(Verdict(what, fault.hits > 0, f"{fault.hits} requests delayed"))
    out += _outage_verdicts(run, records)
    out += await _cluster_verdicts(run)
    out += [_audit_verdict(run, records, a) for a in drill.expect.audit]
    out += _never_verdicts(run, records)
    return out


def _fault_verdicts(run: _Run) -> list[Verdict]:
    out = []
    exp = run.drill.expect
    for spec_name, faults in run.faults.items():
        fe = exp.faults[spec_name]
        within = fe.within_s or exp.deadline_s
        for f in faults:
            res = run.results[f.name]
            what = (f"fault {f.name}: " + (f"{fe.playbook} → {' or '.join(fe.outcomes)}" if fe.playbook
                                           else "recorded, no remediation") + f" within {within:g}s")
            problems = list(res.problems)
            if fe.actions is not None and res.actions != fe.actions:
                problems.append(f"expected steps {fe.actions}, ran {res.actions}")
            rest = res.rest_s
            if rest is not None and rest > within:
                problems.append(f"came to rest after {rest:.1f}s")
            detail = (f"{res.playbook or 'no playbook'} → {res.outcome}"
                      + (f" in {rest:.1f}s" if rest is not None else "")
                      + (f" [{', '.join(res.actions)}]" if res.actions else ""))
            out.append(Verdict(what, not problems, "; ".join(problems) if problems else detail))
            for step, least in fe.min_step_s.items():
                out.append(_step_duration(res, step, least))
    return out


def _step_duration(res: FaultResult, step: str, least: float) -> Verdict:
    """How long step ``step`` of the fault's run took, from its (last) start to its success."""
    what = f"fault {res.fault.name}: step {step} took at least {least:g}s"
    started = [r.time for r in res.timeline if r.what == "step_started" and _step_of(r) == step]
    done = [r.time for r in res.timeline if r.what == "step_succeeded" and _step_of(r) == step]
    if not started or not done:
        return Verdict(what, False, f"step {step} did not run to success")
    took = (done[-1] - started[-1]).total_seconds()
    return Verdict(what, took >= least, f"{took:.2f}s")


def _outage_verdicts(run: _Run, records: list[AuditRecord]) -> list[Verdict]:
    """A fault injected while a chaos action had the bus (or its node's agent) down must have reached the
    service only after it came back: proof the drill exercised the outage, not just the fault."""
    out = []
    for res in run.results.values():
        f = res.fault
        if res.injected_at is None:
            continue
        for o in run.world.outages:
            if not o.covers(res.injected_at, f.node):
                continue
            ids = sc.match_events(records, run.world, f)
            accepted = [r.time for r in records if r.what == "event_accepted" and r.event_id in ids]
            ok = bool(accepted) and o.end is not None and min(accepted) >= o.end
            detail = (f"injected {(res.injected_at - o.start).total_seconds():.1f}s into the outage"
                      + (f", accepted {(min(accepted) - o.end).total_seconds():.1f}s after it ended"
                         if accepted and o.end is not None else ", never accepted"))
            out.append(Verdict(f"fault {f.name}: injected while {o.what} was down, handled after it came back",
                               ok, detail))
    return out


def _outcome_counts(run: _Run) -> Verdict:
    want = run.drill.expect.outcomes
    got = Counter(r.outcome for r in run.results.values())
    what = "outcomes: " + ", ".join(f"{n} {o}" for o, n in want.items())
    ok = all(got.get(o, 0) == n for o, n in want.items())
    return Verdict(what, ok, ", ".join(f"{n} {o}" for o, n in sorted(got.items())))


def _exact(what: str, want: Sequence[str], got: Sequence[str]) -> Verdict:
    ok = sorted(want) == sorted(got)
    return Verdict(what, ok, f"{sorted(got) or 'none'}" + ("" if ok else f" (expected {sorted(want) or 'none'})"))


async def _cluster_verdicts(run: _Run) -> list[Verdict]:
    world, c = run.world, run.drill.expect.cluster
    names = world.cluster.node_names()
    tainted = [n for n in names if world.tainted(n)]
    cordoned = [n for n in names if world.cluster.is_cordoned(n)]
    out = []
    if c.tainted is not None:
        out.append(_exact(f"cluster: exactly {c.tainted or 'no nodes'} carry the quarantine taint", c.tainted,
                          tainted))
    if c.cordoned is not None:
        out.append(_exact(f"cluster: exactly {c.cordoned or 'no nodes'} are cordoned", c.cordoned, cordoned))
    if c.tainted_count is not None:
        out.append(Verdict(f"cluster: {c.tainted_count} nodes carry the quarantine taint",
                           len(tainted) == c.tainted_count, f"{len(tainted)}: {tainted}"))
    if c.cordoned_count is not None:
        out.append(Verdict(f"cluster: {c.cordoned_count} nodes are cordoned", len(cordoned) == c.cordoned_count,
                           f"{len(cordoned)}: {cordoned}"))
    for node in c.drained:
        seeded = {p["metadata"]["uid"] for p in world.seeded_pods[node]}
        left = [p["metadata"]["name"] for p in world.training_pods(node) if p["metadata"]["uid"] in seeded]
        daemons = [p for p in world.cluster.pods_on(node) if p["metadata"]["namespace"] != "training"]
        problems = ([f"training pods left: {left}"] if left else []) + (
            ["DaemonSet pods were evicted"] if len(daemons) < 2 else [])
        out.append(Verdict(f"cluster: {node} drained (DaemonSet pods stay)", not problems,
                           "; ".join(problems) or "no training pod of the start left"))
    if c.isolated_gpus is not None:
        isolated = [f"{n}/{i}" for n in names for i in range(world.sim(n).gpu_count())
                    if world.sim(n).gpu_state(i).get("isolated")]
        out.append(_exact(f"cluster: exactly {c.isolated_gpus or 'no GPUs'} isolated", c.isolated_gpus, isolated))
    if c.restarted_jobs is not None:
        restarted = []
        for kind, plural in (("Job", "jobs"), ("PyTorchJob", "pytorchjobs")):
            for obj in world.cluster.list_objects(plural, "training"):
                if world.cluster.job_restarts(kind, "training", obj["metadata"]["name"]) > 0:
                    restarted.append(f"{kind}/{obj['metadata']['name']}")
        out.append(_exact(f"cluster: exactly {c.restarted_jobs or 'no jobs'} restarted", c.restarted_jobs, restarted))
    if c.breaker is not None:
        from remediator.commands.operator import breaker_status  # what `remediator breaker status` shows

        status = await breaker_status(world.nats_url)
        state = "open" if status["open"] else "closed"
        since = f" since {status['tripped_at']}: {status['reason']}" if status["open"] else ""
        out.append(Verdict(f"`remediator breaker status`: {c.breaker}", state == c.breaker, state + since))
    return out


def _fault_scope(run: _Run, records: list[AuditRecord], spec_name: str) -> tuple[set[str], set[str]]:
    """Event ids and incidents of every fault made from the spec ``spec_name``."""
    ids: set[str] = set()
    incidents: set[str] = set()
    for f in run.faults[spec_name]:
        fids = sc.match_events(records, run.world, f)
        ids |= fids
        incidents |= {r.incident for r in records if r.what == "decision" and r.event_id in fids
                      and "handler" in r.after and r.incident}
    return ids, incidents


def _audit_verdict(run: _Run, records: list[AuditRecord], a: AuditExpect) -> Verdict:
    picked = [r for r in records if r.what == a.what and r.time >= run.world.started]
    filters = [f"{a.what}"]
    if a.node is not None:
        picked = [r for r in picked if r.node == a.node]
        filters.append(f"on {a.node}")
    if a.fault is not None:
        ids, incidents = _fault_scope(run, records, a.fault)
        picked = [r for r in picked if r.event_id in ids or r.incident in incidents]
        filters.append(f"of fault {a.fault}")
    if a.guard is not None:
        picked = [r for r in picked if r.after.get("guard") == a.guard]
        filters.append(f"guard {a.guard}")
    if a.allowed is not None:
        picked = [r for r in picked if r.after.get("allowed") is a.allowed]
        filters.append("allowed" if a.allowed else "refused")
    if a.contains is not None:
        picked = [r for r in picked if a.contains in r.why]
        filters.append(f"saying {a.contains!r}")
    if a.actor is not None:
        picked = [r for r in picked if r.actor == a.actor]
        filters.append(f"by {a.actor}")
    n = len(picked)
    if a.count is not None:
        ok, want = n == a.count, f"exactly {a.count}"
    else:
        lo = a.min if a.min is not None else (1 if a.max is None else 0)
        ok = n >= lo and (a.max is None or n <= a.max)
        want = f"{lo}…{a.max}" if a.max is not None else f"at least {lo}"
    sample = f"; e.g. #{picked[0].seq} {picked[0].why[:100]}" if picked else ""
    return Verdict(f"audit: {want} {' '.join(filters)}", ok, f"{n} found{sample}")


def _node_out(node: dict[str, Any], taint_key: str) -> bool:
    spec = node.get("spec", {})
    return bool(spec.get("unschedulable")) or any(t.get("key") == taint_key for t in spec.get("taints") or [])


def _history(run: _Run) -> tuple[int, dict[str, list[str]]]:
    """From the API server's change history since the start: the most nodes out of service at any moment,
    and for each node what was done to it (taints, cordon, annotations, pods deleted or evicted)."""
    world = run.world
    key = world.settings.taint_key
    events = world.cluster.events_since(world.start_rv)
    out: set[str] = set()
    seen: set[str] = set()
    touched: dict[str, list[str]] = {}
    for n in world.cluster.node_names():
        first = next((e for e in events if e.plural == "nodes" and e.obj["metadata"]["name"] == n), None)
        before = first.prev if first is not None and first.prev is not None else world.cluster.node(n)
        if _node_out(before, key):
            out.add(n)
    peak = len(out)
    for e in events:
        if e.plural == "nodes":
            name = e.obj["metadata"]["name"]
            now = _node_out(e.obj, key)
            (out.add if now else out.discard)(name)
            peak = max(peak, len(out))
            prev = e.prev or {}
            for what, get in (("taints", lambda o: o.get("spec", {}).get("taints") or []),
                              ("cordon", lambda o: bool(o.get("spec", {}).get("unschedulable"))),
                              ("annotations", lambda o: o.get("metadata", {}).get("annotations") or {})):
                if get(prev) != get(e.obj) and what not in touched.get(name, []):
                    touched.setdefault(name, []).append(what)
        elif e.plural == "pods":
            node = e.obj.get("spec", {}).get("nodeName")
            uid = e.obj["metadata"]["uid"]
            if node and uid not in seen and (e.type == "DELETED" or e.obj["metadata"].get("deletionTimestamp")):
                seen.add(uid)
                touched.setdefault(node, []).append(f"pod {e.obj['metadata']['name']} deleted")
    return peak, touched


def _never_verdicts(run: _Run, records: list[AuditRecord]) -> list[Verdict]:
    world, nv = run.world, run.drill.expect.never
    out: list[Verdict] = []
    peak, touched = _history(run)
    if nv.max_nodes_out is not None:
        out.append(Verdict(f"never: more than {nv.max_nodes_out} nodes out of service at once",
                           peak <= nv.max_nodes_out, f"at most {peak} out at once"))
    untouched = ([n for n in world.cluster.node_names() if n not in run.drill.named_nodes()]
                 if nv.untouched == "others" else nv.untouched)
    if untouched:
        problems = []
        for n in untouched:
            reasons = list(touched.get(n, []))
            sim = world.sim(n)
            reasons += [f"GPU {i} isolated or reset" for i in range(sim.gpu_count())
                        if sim.gpu_state(i).get("isolated") or sim.gpu_state(i).get("reset_count")]
            if reasons:
                problems.append(f"{n}: {', '.join(reasons)}")
        label = "the other nodes" if nv.untouched == "others" else ", ".join(untouched)
        out.append(Verdict(f"never: {label} touched", not problems,
                           "; ".join(problems) or f"{len(untouched)} nodes untouched"))
    if nv.no_second_remediation:
        problems = _second_remediations(run, records)
        out.append(Verdict("never: a second incident or remediation for one fault", not problems,
                           "; ".join(problems) or "one incident and one run per fault"))
    if nv.no_step_repeated:
        problems = _repeated_steps(records, world)
        out.append(Verdict("never: a completed step run again", not problems,
                           "; ".join(problems) or "every completed step ran once"))
    if nv.audit_chains_verify:
        reports = verify_chains(records)
        bad = [f"{r.chain}: {r.problem}" for r in reports if not r.ok]
        out.append(Verdict("the audit chains verify", not bad,
                           "; ".join(bad) or f"{len(reports)} chains, {len(records)} records"))
    return out


def _runs(records: list[AuditRecord]) -> list[AuditRecord]:
    """The executor's first ``decision`` record of each run (not the dispatcher's, not a resume)."""
    return [r for r in records if r.what == "decision" and "handler" not in r.after and not r.after.get("resumed")]


def _second_remediations(run: _Run, records: list[AuditRecord]) -> list[str]:
    problems = []
    for inc, n in Counter(r.incident for r in _runs(records)).items():
        if n > 1:
            problems.append(f"incident {inc} was started {n} times")
    for inc, n in Counter(r.incident for r in records if r.what == "playbook_finished").items():
        if n > 1:
            problems.append(f"incident {inc} finished {n} times")
    for name, res in run.results.items():
        ids = sc.match_events(records, run.world, res.fault)
        incidents = {r.incident for r in records if r.what == "decision" and "handler" in r.after
                     and r.event_id in ids}
        if len(incidents) > 1:
            problems.append(f"fault {name} opened {len(incidents)} incidents: {sorted(i or '' for i in incidents)}")
    return problems


def _repeated_steps(records: list[AuditRecord], world: World) -> list[str]:
    problems = []
    done: dict[tuple[str, str], str] = {}
    for r in records:
        if r.incident is None or r.time < world.started:
            continue
        key = (r.incident, _step_of(r))
        if r.what == "step_succeeded":
            if key in done:
                problems.append(f"{r.incident}: step {key[1]} succeeded twice ({done[key]}, then {r.actor})")
            done[key] = r.actor
        elif r.what == "step_started" and key in done:
            problems.append(f"{r.incident}: step {key[1]} started again by {r.actor} after {done[key]} completed it")
    return problems


# --- for the command line ------------------------------------------------------------------------------


def describe(drill: Drill) -> str:
    """The description's first sentence, on one line."""
    text = " ".join(drill.description.split())
    return text.split(". ")[0].rstrip(".") + "."

