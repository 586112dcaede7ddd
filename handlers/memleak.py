"""The memory-leak handler: framebuffer held without an owner, or growing in one process (gpu-faults.md §5).

Where it sits: dispatch calls ``decide`` for events of kind ``memory_leak`` (from the node agent, which sees
NVML and the host's processes) and ``cuda_oom`` (from job logs) with the node's history (KV ``node.<node>``).
Every decision names the ``memory-leak`` playbook on the GPU's group (``memory-leak-growth``, which restarts
the job, for a process's own growth); ``labels["cause"]`` tells the playbook
which case it is (``orphan``, ``pod_gone``, ``no_process``, ``growth``, ``oom_held_elsewhere``).

Event conventions:

``memory_leak`` (``gpu`` set; all labels optional, values as decimal strings):

* ``used_bytes``: framebuffer in use; ``reserved_bytes``: what the driver reserves (subtracted; the idle
  baseline is not zero).
* ``process_count``: compute processes NVML lists on the GPU, seen from the host.
* ``orphan_pids``: comma-separated PIDs holding memory on the GPU whose pod no longer exists (the agent maps
  ``/proc/<pid>/cgroup`` to pods).
* ``pod_gone``: ``"true"`` when the pod the GPU was allocated to is gone but memory is still held; ``pod``
  names it.
* ``pid`` + ``process_used_bytes``: one process's usage, a sample for the growth trend; or the agent's own
  trend as ``growth_bytes_per_min`` over ``growth_window_s``. With ``baseline_bytes`` too (the agent's
  memory-trend watch, ``remediator.agent.memtrend``, code ``process_growth``): the process has used at least
  its baseline x the agent's factor at every sample for ``growth_window_s``.
* ``host_view``: ``"false"`` when the observer could not see host PIDs (a container without ``hostPID``):
  an empty process list then means nothing (HAMi#700), so such events are recorded, never acted on.
* the workload, where known: ``origin`` (pod, namespace, the job from owner references) and the job labels
  that ``remediator.contracts.resolve_job`` reads; it is named in the decision, never needed for one.
* ``is_healthy=True`` (the agent's "orphans are gone"): recorded; it ends a no-owner run.

The node agent (``remediator.agent.orphans``) sends ``code="orphaned_memory"`` with ``orphan_pids``,
``used_bytes``, ``pod_uids`` and ``pod_gone="true"``, and a healthy event with ``orphan_pids=""`` when they
are gone; the other labels are for producers that report more (a growth trend, a process count).

``cuda_oom``: ``capacity_bytes``, ``free_bytes``, ``process_bytes`` (PyTorch's "this process has X in use"),
optional ``gpu_pods`` (pods allocated this GPU).

Rules:

1. ``host_view=false`` → recorded (PID-namespace case).
2. ``orphan_pids`` → ``memory-leak`` at once (cause ``orphan``).
3. Memory over ``min_used_bytes`` (after the reserve) with the owning pod gone, or with no process at all,
   seen continuously for ``orphan_for`` (10 min by default, the §5 heuristic) → ``memory-leak`` (cause
   ``pod_gone`` / ``no_process``). An event showing an owner, or memory back under the threshold, resets it.
4. One process (``pid``) growing by at least ``growth_bytes_per_min`` over at least ``growth_min_span`` of
   samples within ``growth_window``, rising at nearly every step; or, reported with its ``baseline_bytes``,
   using at least ``growth_factor`` x that baseline for at least ``growth_min_span`` → ``memory-leak-growth``
   (cause ``growth``: the job is restarted and its memory verified back; it is the application's memory,
   not the node's).
5. CUDA OOM where capacity - free - this process ≥ ``min_used_bytes`` and no other pod shares the GPU →
   ``memory-leak`` (cause ``oom_held_elsewhere``); any other OOM is the application's → recorded.

Configuration: a ``MemleakPolicy`` (defaults are the module constants), which ``decide`` takes as its fourth
argument; the registry binds one to ``DEFINITION`` (``handlers.build_registry``), the service from its
``memleak_*`` and ``incident_ttl_s`` settings.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from handlers.base import HandlerDefinition, History, Sighting, Verdict
from handlers.incidents import (
    INCIDENT_TTL,
    Proposal,
    evidence_of,
    evidence_of_sighting,
    expire_incidents,
    gpu_key_of,
    group_for,
    remember,
    settle,
)
from remediator.contracts import Evidence, FaultEvent, resolve_job

HANDLER = "memleak"
KINDS = ("memory_leak", "cuda_oom")

GIB = 1 << 30
MIB = 1 << 20
MIN_USED_BYTES = GIB
ORPHAN_FOR = timedelta(minutes=10)
GROWTH_BYTES_PER_MIN = 64 * MIB
GROWTH_WINDOW = timedelta(minutes=30)
GROWTH_MIN_SPAN = timedelta(minutes=20)
GROWTH_RISING_FRACTION = 0.8
GROWTH_FACTOR = 1.3  # use over the process's baseline that is a leak when sustained (issue 10: baseline x 1.3)

_NO_OWNER = "no_owner"
_OWNED = "owned"


@dataclass(frozen=True)
class MemleakPolicy:
    """The memory-leak handler's parameters; the defaults are the module constants (heuristics, §5)."""

    min_used_bytes: int = MIN_USED_BYTES
    orphan_for: timedelta = ORPHAN_FOR
    growth_bytes_per_min: int = GROWTH_BYTES_PER_MIN
    growth_window: timedelta = GROWTH_WINDOW
    growth_min_span: timedelta = GROWTH_MIN_SPAN
    growth_rising_fraction: float = GROWTH_RISING_FRACTION
    growth_factor: float = GROWTH_FACTOR
    incident_ttl: timedelta = INCIDENT_TTL

    def __post_init__(self) -> None:
        if self.growth_min_span > self.growth_window:
            raise ValueError("growth_min_span cannot exceed growth_window")

    @property
    def keep(self) -> timedelta:
        return max(self.growth_window, self.orphan_for, timedelta(hours=1))


def decide(event: FaultEvent, history: History, now: datetime, policy: MemleakPolicy) -> Verdict:
    """Decide on one memory-leak or CUDA-OOM event under ``policy``: pure, ``now`` is the only clock."""
    history = expire_incidents(history, now, policy.incident_ttl)
    gpu = gpu_key_of(event)
    where = f"GPU {gpu or '?'} on {event.node}"
    if event.kind == "cuda_oom":
        return _oom(event, history, now, policy, gpu, where)
    labels = event.labels
    if labels.get("host_view", "").strip().lower() == "false":
        h = _remember(history, _sighting(event, now, gpu, "pidns"), policy, now)
        return Verdict(None, h, f"memory on {where} seen without host PIDs (container PID namespace); an empty "
                                "process list there is not a leak, recorded until confirmed from the host")
    if not gpu:
        h = _remember(history, _sighting(event, now, gpu, "nogpu"), policy, now)
        return Verdict(None, h, f"memory report on {event.node} names no GPU; recorded")
    if event.is_healthy:
        h = _remember(history, _sighting(event, now, gpu, _OWNED), policy, now)
        return Verdict(None, h, f"memory on {where} reported clear (orphans gone); recorded")

    used = _int(labels.get("used_bytes")) or 0
    held = used - (_int(labels.get("reserved_bytes")) or 0)
    orphans = [p.strip() for p in labels.get("orphan_pids", "").split(",") if p.strip()]
    if orphans:
        h = _remember(history, _sighting(event, now, gpu, _NO_OWNER), policy, now)
        return _propose(event, h, now, "orphan",
                        f"{len(orphans)} process(es) ({', '.join(orphans)}) hold {_gib(held)} on {where} after "
                        "their pod is gone",
                        (evidence_of(event, f"orphan_pids={','.join(orphans)}, used_bytes={used}"),),
                        {"orphan_pids": ",".join(orphans)})

    if "pid" in labels or "growth_bytes_per_min" in labels:
        return _growth(event, history, now, policy, gpu, where)

    pod_gone = labels.get("pod_gone", "").strip().lower() == "true"
    no_process = _int(labels.get("process_count")) == 0
    if held >= policy.min_used_bytes and (pod_gone or no_process):
        cause = "pod_gone" if pod_gone else "no_process"
        h = _remember(history, _sighting(event, now, gpu, _NO_OWNER), policy, now)
        since = _no_owner_since(h, gpu)
        lasted = now - since.at
        what = (f"pod {labels.get('pod', '?')} is gone" if pod_gone else "no process owns it")
        if lasted < policy.orphan_for:
            return Verdict(None, h, f"{_gib(held)} held on {where} while {what}; watching ("
                                    f"{_minutes(lasted)} of {_minutes(policy.orphan_for)} min)")
        return _propose(event, h, now, cause,
                        f"{_gib(held)} has been held on {where} for {lasted.total_seconds() / 60:g} min while "
                        f"{what}",
                        (evidence_of(event, f"used_bytes={used}, held={held}, {cause}"),
                         evidence_of_sighting(since, "first seen without an owner")), {})
    h = _remember(history, _sighting(event, now, gpu, _OWNED), policy, now)
    return Verdict(None, h, f"memory on {where} ({_gib(held)} held) has an owner or is under "
                            f"{_gib(policy.min_used_bytes)}; recorded")


evaluate = decide  # the name tests and tools have called it by

DEFINITION = HandlerDefinition(HANDLER, frozenset(KINDS), decide, MemleakPolicy)


def _growth(event: FaultEvent, history: History, now: datetime, policy: MemleakPolicy, gpu: str,
            where: str) -> Verdict:
    labels = event.labels
    pid = labels.get("pid", "").strip() or "?"
    reported = _int(labels.get("growth_bytes_per_min"))
    if reported is not None:
        window_s = _int(labels.get("growth_window_s")) or 0
        h = _remember(history, _sighting(event, now, gpu, f"growth={reported}", job=pid), policy, now)
        baseline, used = _int(labels.get("baseline_bytes")), _int(labels.get("process_used_bytes"))
        if baseline and used is not None:
            ratio = used / baseline
            shown = (f"{_gib(used)}, {ratio:.2f} x its baseline {_gib(baseline)} for {window_s // 60} min "
                     f"({_mib(reported)}/min)")
            if ratio >= policy.growth_factor and window_s >= policy.growth_min_span.total_seconds():
                return _propose(event, h, now, "growth", f"process {pid} on {where} uses {shown}, a leak in the job",
                                (evidence_of(event, f"process_used_bytes={used}, baseline_bytes={baseline}, "
                                                    f"window_s={window_s}"),), {"pid": pid})
            return Verdict(None, h, f"process {pid} on {where} uses {shown}; under {policy.growth_factor:g} x or "
                                    f"not yet {_minutes(policy.growth_min_span)} min, recorded")
        if reported >= policy.growth_bytes_per_min and window_s >= policy.growth_min_span.total_seconds():
            return _propose(event, h, now, "growth",
                            f"process {pid} on {where} grew by {_mib(reported)}/min over {window_s // 60} min",
                            (evidence_of(event, f"growth_bytes_per_min={reported}, window_s={window_s}"),),
                            {"pid": pid})
        return Verdict(None, h, f"process {pid} on {where} grows {_mib(reported)}/min over {window_s // 60} min; "
                                "under the trend threshold, recorded")
    sample = _int(labels.get("process_used_bytes"))
    if sample is None:
        h = _remember(history, _sighting(event, now, gpu, "proc=?", job=pid), policy, now)
        return Verdict(None, h, f"process {pid} on {where} reported without process_used_bytes; recorded")
    h = _remember(history, _sighting(event, now, gpu, f"proc={sample}", job=pid), policy, now)
    points = sorted(((s.at, _int(s.detail.removeprefix("proc=")) or 0) for s in h.sightings
                     if s.kind == "memory_leak" and s.gpu == gpu and s.job == pid and s.detail.startswith("proc=")
                     and s.detail != "proc=?" and now - s.at <= policy.growth_window), key=lambda p: p[0])
    span = points[-1][0] - points[0][0] if points else timedelta(0)
    if len(points) < 3 or span < policy.growth_min_span:
        return Verdict(None, h, f"process {pid} on {where} uses {_gib(sample)}; {len(points)} sample(s) "
                                f"over {_minutes(span)} min, not enough for a trend")
    per_min = (points[-1][1] - points[0][1]) / (span.total_seconds() / 60)
    steps = list(itertools.pairwise(points))
    rising = sum(1 for a, b in steps if b[1] >= a[1]) / len(steps)
    shown = (f"{len(points)} samples over {span.total_seconds() / 60:g} min, {_mib(int(per_min))}/min, "
             f"{rising:.0%} of steps rising")
    if per_min >= policy.growth_bytes_per_min and rising >= policy.growth_rising_fraction:
        return _propose(event, h, now, "growth",
                        f"process {pid} on {where} keeps growing ({shown}), a leak in the job",
                        (evidence_of(event, f"process_used_bytes={sample}; {shown}"),), {"pid": pid})
    return Verdict(None, h, f"process {pid} on {where} recorded; no leak trend ({shown})")


def _oom(event: FaultEvent, history: History, now: datetime, policy: MemleakPolicy, gpu: str,
         where: str) -> Verdict:
    labels = event.labels
    h = _remember(history, _sighting(event, now, gpu, "oom"), policy, now)
    capacity, free, mine = (_int(labels.get(k)) for k in ("capacity_bytes", "free_bytes", "process_bytes"))
    if capacity is None or free is None or mine is None or not gpu:
        return Verdict(None, h, f"CUDA out of memory on {where} in job {_job(event)}; the job's own "
                                "problem as far as the message tells, recorded")
    elsewhere = capacity - free - mine
    pods = _int(labels.get("gpu_pods"))
    shown = f"capacity={capacity}, free={free}, process={mine}, held elsewhere={elsewhere}"
    if elsewhere >= policy.min_used_bytes and (pods is None or pods <= 1):
        return _propose(event, h, now, "oom_held_elsewhere",
                        f"CUDA out of memory on {where} while {_gib(elsewhere)} is held by something other than "
                        "the failing process and no other pod shares the GPU",
                        (evidence_of(event, shown),), {})
    why = "another pod shares the GPU" if pods is not None and pods > 1 else "the process itself holds the memory"
    return Verdict(None, h, f"CUDA out of memory on {where} in job {_job(event)}: {why} ({shown}); "
                            "the job owner's to fix, recorded")


def _propose(event: FaultEvent, h: History, now: datetime, cause: str, reason: str,
             evidence: tuple[Evidence, ...], labels: dict[str, str]) -> Verdict:
    playbook = "memory-leak-growth" if cause == "growth" else "memory-leak"
    return settle(event, h, now, Proposal(
        HANDLER, playbook, event.node, event.gpu, group_for("memory-leak", event.node, event.gpu), reason,
        evidence, resolve_job(event.origin, event.labels), {"cause": cause, **labels}))


def _job(event: FaultEvent) -> str:
    return resolve_job(event.origin, event.labels) or "?"


def _no_owner_since(h: History, gpu: str) -> Sighting:
    """The first no-owner sighting of the current run (after the last one that showed an owner)."""
    run: list[Sighting] = []
    for s in h.sightings:
        if s.kind != "memory_leak" or s.gpu != gpu or s.detail not in (_NO_OWNER, _OWNED):
            continue
        run = [*run, s] if s.detail == _NO_OWNER else []
    return run[0]


def _sighting(event: FaultEvent, now: datetime, gpu: str, detail: str, *, job: str = "") -> Sighting:
    return Sighting(event.id, event.kind, event.code, gpu, now, job, detail)


def _remember(history: History, s: Sighting, policy: MemleakPolicy, now: datetime) -> History:
    return remember(history, s, now, policy.keep, KINDS)


def _int(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _minutes(d: timedelta) -> str:
    return f"{d.total_seconds() / 60:g}"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


__all__ = ["DEFINITION", "HANDLER", "KINDS", "MemleakPolicy", "decide", "evaluate"]
