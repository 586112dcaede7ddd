"""The NCCL handler: timeouts and collective errors correlated across the ranks of one job (gpu-faults.md §4.4).

Where it sits: dispatch calls ``decide`` for events of kind ``nccl_timeout``, ``nccl_error`` and
``job_failure``, and for hardware events (``xid``, ``ecc``, ``gpu_lost``, ``cuda_error``) that belong to a
job, with the history of the *job*, not of a node: ``history_key(event)`` is ``job.<namespace>.<job>``
(``remediator.subjects.job_key``: anything outside ``[A-Za-z0-9_-]`` turned into ``_``), so the ranks of
one job on many nodes meet in one history. The job is ``remediator.contracts.resolve_job`` (the pod's owner
reference, then the Kubeflow, JobSet and batch labels), its namespace ``origin.namespace`` or the
``namespace`` label. An NCCL event whose job is unknown is correlated by its pod's own identity instead
(``Correlation``: ``pod.<namespace>.<pod>``, ``subjects.pod_key``; group ``pod:<namespace>/<pod>``), never
merged with other pods; one with neither keys by its node (``node.<node>``) and correlates with nothing.
Decisions are grouped on ``job:<namespace>/<job>`` (or the pod's group) and carry
``labels["history_key"]``, the KV key whose incident the executor must close
(``handlers.incidents.close_incident``) when the playbook ends.

Event conventions (labels as the NCCL/PyTorch parsers in ``handlers.signatures`` emit them; all optional):
``rank`` (global rank), ``seq`` (the collective's SeqNum), ``op_type`` (``ALLREDUCE``, ...),
``lagging_ranks`` (comma-separated ranks named by a desync report), ``peer`` (the IP named in an IB/socket
error), ``peer_node`` (that peer's node, when the producer could resolve it), ``cuda_error`` (the CUDA error
number surfaced by the watchdog: 214 uncorrectable ECC, 220 uncorrectable NVLink); the workload as
``origin`` (pod, namespace, job) or the job labels above and ``namespace``/``pod``. The event's ``node`` and
``gpu`` say where the reporting rank runs.

Who is the suspect (first that applies; all evidence within ``window``, 10 minutes by default, inclusive):

1. A concurrent hardware signal on a node running ranks of this job: an actionable Xid, an uncorrectable or
   remap ECC value, a lost GPU, or a watchdog exception carrying CUDA error 214/220 (or its text), or a
   "watchdog got stuck" hang → that node/GPU (the earliest such signal).
2. Lagging ranks: those named by desync reports, else the minority that reported a lower SeqNum than the
   rest. When every lagging rank has reported and all run on one node (and GPU) → that node (GPU). Not
   when the ranks disagree on the operation (a program-order bug) or the timeout is in the first ``early_seq``
   collectives (a rank that never started).
3. IB/socket errors: one ``peer`` named by ``peer_threshold`` errors from different reporters → the link to
   that peer (its node when ``peer_node`` is known); every error from one node, naming different peers →
   that node's NIC path.

A suspect → ``nccl-timeout-suspect`` on the suspect node (taint it out, restart the job). No suspect →
``nccl-timeout-no-suspect`` (restart the job only), but only once the picture is settled: a ``job_failure``
event, ``min_ranks`` different ranks reporting (and every rank named as lagging heard from), or ``settle``
since the first report. Before that the event is recorded ("correlating"). The handler has no timer: the
settle time is noticed by the next event of the job. A suspect found after a no-suspect decision supersedes it.

Configuration: an ``NcclPolicy`` (``window``, ``settle``, ``min_ranks``, ``early_seq``, ``peer_threshold``,
the incident TTL; defaults are the module constants), which ``decide`` takes as its fourth argument; the
registry binds one to ``DEFINITION`` (``handlers.build_registry``), the service from its ``nccl_*`` and
``incident_ttl_s`` settings.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from handlers.base import HandlerDefinition, History, Sighting, Verdict
from handlers.catalog import CATALOG
from handlers.ecc import canonical_code
from handlers.incidents import (
    INCIDENT_TTL,
    Proposal,
    evidence_of_sighting,
    expire_incidents,
    gpu_key_of,
    gpu_ref_from_key,
    job_group,
    remember,
    settle,
)
from remediator.contracts import Evidence, FaultEvent, resolve_job
from remediator.subjects import job_key, node_key, pod_key

HANDLER = "nccl"
NCCL_KINDS = ("nccl_timeout", "nccl_error", "job_failure")
HARDWARE_KINDS = ("xid", "ecc", "gpu_lost", "cuda_error")
KINDS = NCCL_KINDS + HARDWARE_KINDS

WINDOW = timedelta(minutes=10)
SETTLE = timedelta(seconds=60)
MIN_RANKS = 2
EARLY_SEQ = 10
PEER_THRESHOLD = 2

_HW_ECC = frozenset({"dbe_volatile", "dbe_aggregate", "row_remap_failure", "retirement_failure",
                     "sram_threshold_exceeded"})
_HW_CUDA = {214: "uncorrectable ECC error", 220: "uncorrectable NVLink error"}
_HW_TEXT_RE = re.compile(r"uncorrectable\s+(ECC|NVLink)\s+error|GPU\s+is\s+lost|fallen\s+off\s+the\s+bus",
                         re.IGNORECASE)
_HANG_RE = re.compile(r"watchdog\s+got\s+stuck|Heartbeat\s+monitor\s+timed\s+out", re.IGNORECASE)


@dataclass(frozen=True)
class NcclPolicy:
    """The NCCL handler's parameters; the defaults are the module constants."""

    window: timedelta = WINDOW
    settle: timedelta = SETTLE
    min_ranks: int = MIN_RANKS
    early_seq: int = EARLY_SEQ
    peer_threshold: int = PEER_THRESHOLD
    incident_ttl: timedelta = INCIDENT_TTL

    @property
    def keep(self) -> timedelta:
        return max(self.window, self.settle, timedelta(hours=1))


@dataclass(frozen=True)
class Correlation:
    """What an NCCL event is correlated under: its job, or else the pod's own identity.

    ``kind="job"``: ``remediator.contracts.resolve_job`` knows the job (owner reference, then the Kubeflow,
    JobSet and batch labels), so the ranks of the job on every node meet in one history, ``job.<ns>.<job>``,
    and the decision's group is ``job:<ns>/<job>``. ``kind="pod"``: no job is known, only the pod the
    reporting ranks run in; its reports are correlated with each other (the ranks of one multi-GPU pod) and
    with nothing else, in ``pod.<ns>.<pod>`` and group ``pod:<ns>/<pod>``. A pod's name is never taken for a
    job: two unrelated single-pod jobs are never merged into one.
    """

    kind: Literal["job", "pod"]
    namespace: str
    name: str

    @property
    def job(self) -> str | None:
        """The job's name, or None when correlating by pod."""
        return self.name if self.kind == "job" else None

    @property
    def history_key(self) -> str:
        return job_key(self.namespace, self.name) if self.kind == "job" else pod_key(self.namespace, self.name)

    @property
    def group(self) -> str:
        return job_group(self.namespace, self.name) if self.kind == "job" else f"pod:{self.namespace}/{self.name}"

    @property
    def tag(self) -> str:
        """What the history's sightings carry in ``Sighting.job``: the job's name, or ``pod/<name>``."""
        return self.name if self.kind == "job" else f"pod/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def namespace_of(event: FaultEvent) -> str:
    """The event's namespace: ``origin.namespace``, else the ``namespace`` label, else ``default``."""
    return (event.origin.namespace or event.labels.get("namespace", "")).strip() or "default"


def correlation_of(event: FaultEvent) -> Correlation | None:
    """The job (``resolve_job``) the event belongs to, else its pod (``origin.pod``, else the ``pod`` label),
    else None (nothing to correlate with)."""
    job = resolve_job(event.origin, event.labels)
    if job:
        return Correlation("job", namespace_of(event), job)
    pod = (event.origin.pod or event.labels.get("pod", "")).strip()
    if pod:
        return Correlation("pod", namespace_of(event), pod)
    return None


def history_key(event: FaultEvent) -> str:
    """KV key of the history this handler decides over: ``Correlation.history_key`` (``job.<ns>.<job>`` or
    ``pod.<ns>.<pod>``), else ``node.<node>``."""
    corr = correlation_of(event)
    return corr.history_key if corr is not None else node_key(event.node)


def matches(event: FaultEvent) -> bool:
    """NCCL kinds always; hardware kinds only when they belong to a job (``resolve_job``) to correlate with."""
    return event.kind in NCCL_KINDS or resolve_job(event.origin, event.labels) is not None


# --- facts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fact:
    """What one remembered event says, decoded from its sighting."""

    sighting: Sighting
    node: str
    rank: int | None = None
    seq: int | None = None
    op: str = ""
    lagging: tuple[int, ...] = ()
    peer: str = ""
    peer_node: str = ""
    hardware: str = ""  # why this event is a hardware signal, "" if it is not

    @property
    def gpu(self) -> str:
        return self.sighting.gpu


def _int(raw: str | None) -> int | None:
    try:
        return int((raw or "").strip())
    except ValueError:
        return None


def _hardware(event: FaultEvent) -> str:
    if event.is_healthy:
        return ""
    if event.kind == "gpu_lost":
        return "GPU lost"
    if event.kind == "xid" and isinstance(event.code, int):
        info = CATALOG.get(event.code)
        if info is None or (info.actionable and info.playbook != "unknown-xid") or info.is_fatal:
            return f"Xid {event.code}"
        return ""
    if event.kind == "ecc":
        code = canonical_code(event.code)
        value = _int(event.labels.get("value"))
        return f"ECC {code}" if code in _HW_ECC and (value is None or value > 0) else ""
    cuda = _int(event.labels.get("cuda_error"))
    if cuda in _HW_CUDA:
        return f"CUDA error {cuda} ({_HW_CUDA[cuda]})"
    m = _HW_TEXT_RE.search(event.message)
    if m:
        return m.group(0)
    if _HANG_RE.search(event.message):
        return "NCCL watchdog hang (CUDA/driver hang)"
    return ""


def _detail(event: FaultEvent) -> str:
    labels = event.labels
    d: dict[str, Any] = {"node": event.node}
    for key, name in (("rank", "rank"), ("seq", "seq")):
        value = _int(labels.get(name))
        if value is not None:
            d[key] = value
    if labels.get("op_type"):
        d["op"] = labels["op_type"].strip()
    lag = [r for r in (_int(x) for x in labels.get("lagging_ranks", "").split(",")) if r is not None]
    if lag:
        d["lag"] = lag
    for key in ("peer", "peer_node"):
        if labels.get(key, "").strip():
            d[key] = labels[key].strip()
    hw = _hardware(event)
    if hw:
        d["hw"] = hw
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _fact(s: Sighting) -> _Fact:
    try:
        d = json.loads(s.detail)
    except ValueError:
        d = {}
    if not isinstance(d, dict):
        d = {}
    return _Fact(s, str(d.get("node", "")), d.get("rank"), d.get("seq"), str(d.get("op", "")),
                 tuple(d.get("lag", ())), str(d.get("peer", "")), str(d.get("peer_node", "")),
                 str(d.get("hw", "")))


# --- decision -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Suspect:
    node: str
    gpu: str
    cause: str
    reason: str
    evidence: tuple[Evidence, ...]


def decide(event: FaultEvent, history: History, now: datetime, policy: NcclPolicy) -> Verdict:
    """Decide on one NCCL/job event, or remember a hardware event, under ``policy``: pure, ``now`` is the
    only clock."""
    history = expire_incidents(history, now, policy.incident_ttl)
    corr = correlation_of(event)
    tag = corr.tag if corr is not None else ""
    s = Sighting(event.id, event.kind, event.code, gpu_key_of(event), now, tag, _detail(event))
    h = remember(history, s, now, policy.keep, KINDS)
    if corr is None:
        return Verdict(None, h, f"{event.kind} on {event.node} names no job or pod; nothing to correlate, recorded")
    facts = [_fact(x) for x in h.sightings
             if x.kind in KINDS and x.job == tag and now - x.at <= policy.window]
    comm = [f for f in facts if f.sighting.kind in NCCL_KINDS]
    if event.kind in HARDWARE_KINDS and not _fact(s).hardware:
        return Verdict(None, h, f"{event.kind} {event.code} on {event.node} recorded for {corr}; "
                                "not a hardware signal")
    if not comm:
        return Verdict(None, h, f"hardware signal on {event.node} recorded for {corr}; no NCCL "
                                "failure of it to correlate yet")

    labels = {corr.kind: corr.name, "namespace": corr.namespace, "history_key": corr.history_key}
    suspect = _hardware_suspect(facts) or _lagging_suspect(comm, policy) or _link_suspect(comm, policy)
    if isinstance(suspect, _Suspect):
        target = gpu_ref_from_key(suspect.gpu)
        return settle(event, h, now, Proposal(
            HANDLER, "nccl-timeout-suspect", suspect.node, target, corr.group,
            f"{corr}: {suspect.reason}", suspect.evidence, corr.job,
            {**labels, "suspect_node": suspect.node, "suspect_gpu": suspect.gpu, "cause": suspect.cause}))

    ranks = sorted({f.rank for f in comm if f.rank is not None})
    first = min(f.sighting.at for f in comm)
    unheard = _unlocated_lagging(comm)
    ready = (any(f.sighting.kind == "job_failure" for f in comm) or now - first >= policy.settle
             or (len(ranks) >= policy.min_ranks and not unheard))
    summary = f"{len(comm)} report(s) from {len(ranks)} rank(s) on {len({f.node for f in comm})} node(s)"
    if not ready:
        waiting = f", waiting for lagging rank(s) {','.join(map(str, unheard))}" if unheard else ""
        return Verdict(None, h, f"{corr}: {event.kind} recorded, correlating ({summary}{waiting})")
    why = _no_suspect_why(comm, policy)
    peer = _top_peer(comm)
    if peer:
        labels["suspect_peer"] = peer
    evidence = tuple(evidence_of_sighting(f.sighting, f"rank {f.rank if f.rank is not None else '?'} on "
                                                      f"{f.node}, seq {f.seq if f.seq is not None else '?'}")
                     for f in comm[-8:])
    return settle(event, h, now, Proposal(
        HANDLER, "nccl-timeout-no-suspect", event.node, None, corr.group,
        f"{corr} failed in NCCL with no node or GPU to blame ({summary}{why}), so only the job "
        "is restarted", evidence, corr.job, labels))


evaluate = decide  # the name tests and tools have called it by

DEFINITION = HandlerDefinition(HANDLER, frozenset(KINDS), decide, NcclPolicy, matches=matches,
                               history_key=history_key)


def _hardware_suspect(facts: list[_Fact]) -> _Suspect | None:
    hw = sorted((f for f in facts if f.hardware and f.node), key=lambda f: f.sighting.at)
    if not hw:
        return None
    first = hw[0]
    others = sorted({f.node for f in hw} - {first.node})
    also = f" (also on {', '.join(others)})" if others else ""
    return _Suspect(first.node, first.gpu, "hardware",
                    f"{first.hardware} on {first.node} while its ranks failed in NCCL{also}; the other ranks' "
                    "timeouts are collateral",
                    (evidence_of_sighting(first.sighting, f"hardware signal: {first.hardware}"),))


def _lagging_suspect(comm: list[_Fact], policy: NcclPolicy) -> _Suspect | None:
    if _desync(comm) or _early(comm, policy):
        return None
    lagging = sorted({r for f in comm for r in f.lagging})
    how = "named by the desync report"
    if not lagging:
        lagging, how = _lower_seq_ranks(comm), "behind the others' SeqNum"
    if not lagging:
        return None
    where = _rank_locations(comm)
    if any(r not in where for r in lagging):
        return None  # a lagging rank we have not heard from may run anywhere
    known = [where[r] for r in lagging]
    nodes = {n for n, _ in known}
    if len(nodes) != 1:
        return None
    node = next(iter(nodes))
    gpus = {g for _, g in known}
    gpu = next(iter(gpus)) if len(gpus) == 1 else ""
    ranks = ",".join(map(str, lagging))
    evidence = tuple(evidence_of_sighting(f.sighting, f"rank {f.rank} seq {f.seq}") for f in comm
                     if f.rank in lagging or f.lagging)[:8]
    return _Suspect(node, gpu, "lagging_ranks",
                    f"lagging rank(s) {ranks} ({how}) all run on {node}" + (f" GPU {gpu}" if gpu else ""),
                    evidence or (evidence_of_sighting(comm[-1].sighting, f"lagging ranks {ranks}"),))


def _link_suspect(comm: list[_Fact], policy: NcclPolicy) -> _Suspect | None:
    errors = [f for f in comm if f.peer]
    if len(errors) < policy.peer_threshold:
        return None
    by_peer: dict[str, list[_Fact]] = {}
    for f in errors:
        by_peer.setdefault(f.peer, []).append(f)
    for peer, fs in sorted(by_peer.items(), key=lambda kv: -len(kv[1])):
        reporters = {(f.node, f.rank) for f in fs}
        peer_node = next((f.peer_node for f in fs if f.peer_node), "")
        if len(fs) >= policy.peer_threshold and len(reporters) >= 2 and peer_node:
            return _Suspect(peer_node, "", "peer_link",
                            f"{len(fs)} network errors from {len(reporters)} ranks name peer {peer} on {peer_node}",
                            tuple(evidence_of_sighting(f.sighting, f"error naming peer {peer}") for f in fs[:8]))
    local = {f.node for f in errors}
    peers = {f.peer for f in errors}
    if len(local) == 1 and len(peers) >= 2:
        node = next(iter(local))
        return _Suspect(node, "", "local_nic",
                        f"all {len(errors)} network errors come from {node}, naming {len(peers)} different peers, "
                        "which points at its own NIC path",
                        tuple(evidence_of_sighting(f.sighting, f"error naming peer {f.peer}") for f in errors[:8]))
    return None


def _rank_locations(comm: list[_Fact]) -> dict[int, tuple[str, str]]:
    return {f.rank: (f.node, f.gpu) for f in comm if f.rank is not None and f.node}


def _unlocated_lagging(comm: list[_Fact]) -> list[int]:
    where = _rank_locations(comm)
    return sorted({r for f in comm for r in f.lagging if r not in where})


def _lower_seq_ranks(comm: list[_Fact]) -> list[int]:
    seq_of: dict[int, int] = {}
    for f in comm:
        if f.rank is not None and f.seq is not None and f.sighting.kind == "nccl_timeout":
            seq_of[f.rank] = max(seq_of.get(f.rank, f.seq), f.seq)
    if len(set(seq_of.values())) < 2:
        return []
    low = min(seq_of.values())
    behind = [r for r, s in seq_of.items() if s == low]
    return sorted(behind) if len(behind) < len(seq_of) - len(behind) else []


def _desync(comm: list[_Fact]) -> bool:
    """Ranks at the same SeqNum disagreeing on the operation: a program-order bug, not hardware."""
    ops: dict[int, set[str]] = {}
    for f in comm:
        if f.seq is not None and f.op:
            ops.setdefault(f.seq, set()).add(f.op)
    return any(len(v) > 1 for v in ops.values())


def _early(comm: list[_Fact], policy: NcclPolicy) -> bool:
    seqs = [f.seq for f in comm if f.seq is not None]
    return bool(seqs) and max(seqs) < policy.early_seq


def _no_suspect_why(comm: list[_Fact], policy: NcclPolicy) -> str:
    if _desync(comm):
        return "; ranks disagree on the operation, a program-order bug"
    if _early(comm, policy):
        return f"; it failed within the first {policy.early_seq} collectives, so a rank never started"
    peer = _top_peer(comm)
    if peer:
        return f"; errors name peer {peer}, whose node is unknown"
    return ""


def _top_peer(comm: list[_Fact]) -> str:
    counts = Counter(f.peer for f in comm if f.peer)
    return counts.most_common(1)[0][0] if counts else ""


__all__ = ["DEFINITION", "HANDLER", "KINDS", "Correlation", "NcclPolicy", "correlation_of", "decide", "evaluate",
           "history_key", "matches", "namespace_of"]
