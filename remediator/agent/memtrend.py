"""GPU memory trends: per-process growth past a baseline, and framebuffer held with no owning process.

Where it sits: the agent's GPU-state path, beside the NVML poller and the orphan check, on the same
``GpuSnapshot``s (NVML's running compute processes with their used memory, and each GPU's framebuffer use).
Every ``interval`` it takes one sample per process and per GPU and feeds them to ``observe``, a pure function
of (state, samples, now, policy) → (state, findings); ``MemoryTrend`` turns findings into ``memory_leak``
events for ``handlers.memleak`` and keeps the state in the agent's state directory.

Rules (``TrendPolicy``; the threshold is the issue's "baseline x 1.3, sustained"):

* **Baseline per process.** A process is watched from its first sample; its baseline is its use once it has
  run for ``warmup`` (a job allocates its working set at start). A process of a container whose earlier
  process already set a baseline (the same namespace, pod name and container: a restarted PyTorchJob,
  JobSet or StatefulSet pod keeps its name) starts with that **container baseline** at once, so a restarted
  job is judged against what it used before it leaked.
* **Growth.** A process is over when its use is at least ``baseline x factor`` and at least
  ``min_growth_bytes`` above the baseline (a small process growing by a third is not a leak); when it has
  been over at every sample for ``window`` it is reported (``memory_leak`` / ``process_growth`` with ``pid``,
  ``process_used_bytes``, ``baseline_bytes``, ``growth_factor``, ``growth_bytes_per_min`` and
  ``growth_window_s``, the sustained span), with the pod that owns it (UID from the process's cgroup; namespace,
  name and container from the kubelet's allocation where the agent has it). It is reported again only when it
  has grown by another ``factor`` since the last report.
* **No owner.** A GPU whose process list NVML answers empty while its framebuffer use (less what the driver
  reserves) is at least ``no_owner_bytes`` is reported (``memory_leak`` / ``fb_no_owner`` with
  ``used_bytes``, ``reserved_bytes``, ``process_count=0``) from the second such sample on, then every
  ``repeat`` while it lasts (the handler acts once it has lasted its ``orphan_for``), and cleared with a healthy
  event when an owner appears or the memory is freed. A GPU whose process list cannot be read is not judged.
* **Bounded.** At most ``max_processes`` processes and ``max_containers`` container baselines are kept; a new
  process beyond the cap is not watched (counted in ``untracked``), the oldest container baseline goes first.

Restart-safe: the state (baselines, the time each process went over, what was reported) is saved in the
agent's state directory (``memtrend.json``) after each sample that was handed on, so an agent restart neither
loses a baseline nor reports a process twice. A new boot id drops the processes (their PIDs mean nothing
after a reboot) and keeps the container baselines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from remediator.agent.events import Clock, make_event
from remediator.agent.host import GpuHolder, GpuIdentity, GpuSnapshot, PodResourcesView, PodView
from remediator.agent.orphans import find_orphans
from remediator.agent.state import StateStore
from remediator.contracts import FaultEvent, GpuRef, Origin, utcnow

log = logging.getLogger(__name__)

STATE_NAME = "memtrend"
MIB = 1 << 20
GIB = 1 << 30

__all__ = [
    "Finding",
    "GpuMemory",
    "MemoryTrend",
    "ProcessSample",
    "Tracked",
    "TrendPolicy",
    "TrendState",
    "observe",
]


@dataclass(frozen=True)
class TrendPolicy:
    """When growth or ownerless memory is reported. Times are ``timedelta``s; defaults suit a 30 s sample."""

    factor: float = 1.3
    window: timedelta = timedelta(minutes=20)
    warmup: timedelta = timedelta(minutes=2)
    min_growth_bytes: int = 256 * MIB
    no_owner_bytes: int = GIB
    repeat: timedelta = timedelta(minutes=1)
    max_processes: int = 1024
    max_containers: int = 1024

    def __post_init__(self) -> None:
        if self.factor <= 1.0:
            raise ValueError("the growth factor must be above 1")
        if self.window <= timedelta(0) or self.warmup < timedelta(0) or self.repeat <= timedelta(0):
            raise ValueError("window and repeat must be positive, warmup not negative")
        if self.max_processes < 1 or self.max_containers < 0:
            raise ValueError("max_processes must be at least 1")


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process's use of one GPU at one sample, with the pod that owns it where known."""

    gpu: GpuIdentity
    pid: int
    used_bytes: int
    pod_uid: str | None = None
    holder: GpuHolder | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu.key}|{self.pid}|{self.pod_uid or '-'}"

    @property
    def container(self) -> str | None:
        """The container baseline's key: namespace/pod name/container, known only with a holder."""
        h = self.holder
        return f"{h.namespace}/{h.name}/{h.container}" if h is not None and h.container else None


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One GPU's framebuffer at one sample. ``process_count`` None: NVML could not list its processes."""

    gpu: GpuIdentity
    used_bytes: int | None
    reserved_bytes: int = 0
    process_count: int | None = None


@dataclass(frozen=True, slots=True)
class Tracked:
    """What is known of one watched process."""

    gpu: str
    pid: int
    first_at: datetime
    last_at: datetime
    used: int
    baseline: int | None = None
    baseline_at: datetime | None = None
    over_since: datetime | None = None
    reported_bytes: int | None = None  # use at the last report; None: never reported
    container: str | None = None
    pod_uid: str | None = None

    def threshold(self, policy: TrendPolicy) -> int | None:
        if self.baseline is None:
            return None
        return max(int(self.baseline * policy.factor), self.baseline + policy.min_growth_bytes)


@dataclass(frozen=True)
class TrendState:
    """Everything ``observe`` carries from one sample to the next (and to disk)."""

    processes: Mapping[str, Tracked] = field(default_factory=dict)
    containers: Mapping[str, int] = field(default_factory=dict)  # insertion order = age (oldest first)
    no_owner_since: Mapping[str, datetime] = field(default_factory=dict)  # gpu key -> first empty-but-held
    no_owner_reported: Mapping[str, datetime] = field(default_factory=dict)  # gpu key -> last report
    untracked: int = 0


@dataclass(frozen=True, slots=True)
class Finding:
    """Something to publish: a process past its baseline, or ownerless memory (or its end)."""

    what: Literal["growth", "no_owner", "no_owner_cleared"]
    gpu: GpuIdentity
    at: datetime
    used_bytes: int
    pid: int | None = None
    baseline_bytes: int | None = None
    since: datetime | None = None
    per_min: int = 0
    reserved_bytes: int = 0
    sample: ProcessSample | None = None
    count: int = 0  # reports of this process / GPU so far (for the event id)


def observe(state: TrendState, gpus: Sequence[GpuMemory], samples: Sequence[ProcessSample], now: datetime,
            policy: TrendPolicy) -> tuple[TrendState, list[Finding]]:
    """One sample of every GPU and process: the new state and what to publish. Pure; ``now`` is the clock.

    A process missing from a GPU whose process list was read has ended and is forgotten; the processes of a
    GPU whose list could not be read (``process_count`` None) are kept as they were.
    """
    listed = {g.gpu.key for g in gpus if g.process_count is not None}
    seen = {s.key for s in samples}
    procs = {k: t for k, t in state.processes.items() if k in seen or t.gpu not in listed}
    containers = dict(state.containers)
    untracked = state.untracked
    findings: list[Finding] = []
    for s in samples:
        t = procs.get(s.key)
        if t is None:
            if len(procs) >= policy.max_processes:
                untracked += 1
                continue
            inherited = containers.get(s.container) if s.container else None
            t = Tracked(gpu=s.gpu.key, pid=s.pid, first_at=now, last_at=now, used=s.used_bytes,
                        baseline=inherited, baseline_at=now if inherited is not None else None,
                        container=s.container, pod_uid=s.pod_uid)
        else:
            t = replace(t, last_at=now, used=s.used_bytes, container=t.container or s.container)
        if t.baseline is None and now - t.first_at >= policy.warmup:
            t = replace(t, baseline=s.used_bytes, baseline_at=now)
            if t.container and t.container not in containers and policy.max_containers:
                while len(containers) >= policy.max_containers:
                    containers.pop(next(iter(containers)))
                containers[t.container] = s.used_bytes
        limit = t.threshold(policy)
        over = limit is not None and s.used_bytes >= limit
        t = replace(t, over_since=(t.over_since or now) if over else None)
        if over and t.over_since is not None and now - t.over_since >= policy.window and (
                t.reported_bytes is None or s.used_bytes >= t.reported_bytes * policy.factor):
            assert t.baseline is not None and t.baseline_at is not None
            minutes = max((now - t.baseline_at).total_seconds() / 60, 1 / 60)
            findings.append(Finding("growth", s.gpu, now, s.used_bytes, pid=s.pid, baseline_bytes=t.baseline,
                                    since=t.over_since, per_min=int((s.used_bytes - t.baseline) / minutes),
                                    sample=s))
            t = replace(t, reported_bytes=s.used_bytes)
        procs[s.key] = t

    since = dict(state.no_owner_since)
    reported = dict(state.no_owner_reported)
    for g in gpus:
        key = g.gpu.key
        if g.process_count is None or g.used_bytes is None:
            continue  # not judged: neither started nor cleared
        held = g.used_bytes - g.reserved_bytes
        if g.process_count == 0 and held >= policy.no_owner_bytes:
            first = since.setdefault(key, now)
            last = reported.get(key)
            if first < now and (last is None or now - last >= policy.repeat):
                findings.append(Finding("no_owner", g.gpu, now, g.used_bytes, since=first,
                                        reserved_bytes=g.reserved_bytes))
                reported[key] = now
            continue
        since.pop(key, None)
        if reported.pop(key, None) is not None:
            findings.append(Finding("no_owner_cleared", g.gpu, now, g.used_bytes, reserved_bytes=g.reserved_bytes))
    return TrendState(procs, containers, since, reported, untracked), findings


def over_baseline(state: TrendState, gpu: GpuIdentity, policy: TrendPolicy) -> list[str]:
    """Why ``gpu``'s memory is not back: processes over their baseline x factor, or memory held by no one."""
    out = []
    for t in state.processes.values():
        limit = t.threshold(policy)
        if t.gpu == gpu.key and limit is not None and t.used >= limit:
            out.append(f"pid {t.pid} uses {_mib(t.used)}, over {policy.factor:g} x its baseline "
                       f"{_mib(t.baseline or 0)}")
    if gpu.key in state.no_owner_since:
        out.append("framebuffer memory is held by no process")
    return out


# --- the agent's side ----------------------------------------------------------------------------------


def samples_of(snapshots: Sequence[GpuSnapshot], pods: PodView | None,
               holders: Callable[[GpuIdentity], tuple[GpuHolder, ...] | None] | None
               ) -> tuple[list[GpuMemory], list[ProcessSample]]:
    """Per-GPU framebuffer and per-process samples from one poll's snapshots. A process's pod UID comes
    from its cgroup (``PodView.pid_info``); its namespace, name and container from the kubelet's allocation
    of that GPU, when exactly one container of that pod holds it."""
    gpus: list[GpuMemory] = []
    procs: list[ProcessSample] = []
    for snap in snapshots:
        if snap.lost:
            continue
        gpus.append(GpuMemory(snap.identity, snap.memory_used, snap.memory_reserved or 0,
                              None if snap.processes is None else len(snap.processes)))
        if not snap.processes:
            continue
        by_uid: dict[str, list[GpuHolder]] = {}
        if holders is not None:
            for h in holders(snap.identity) or ():
                if h.uid:
                    by_uid.setdefault(h.uid, []).append(h)
        for p in snap.processes:
            if p.used_bytes is None:
                continue  # NVML cannot tell this process's use (e.g. under MIG without privileges)
            uid = pods.pid_info(p.pid).pod_uid if pods is not None else None
            mine = by_uid.get(uid or "", [])
            procs.append(ProcessSample(snap.identity, p.pid, p.used_bytes, uid, mine[0] if len(mine) == 1 else None))
    return gpus, procs


class MemoryTrend:
    """Samples the agent's snapshots every ``interval_s`` and turns findings into ``memory_leak`` events.

    ``sample`` returns the events (call ``commit`` once they are handed on: the state is then saved);
    ``check`` is the health check's ``memory`` verdict on one GPU's fresh snapshot.
    """

    def __init__(self, *, node: str, state: StateStore, boot_id: Callable[[], str], pods: PodView | None,
                 pod_resources: PodResourcesView | None, policy: TrendPolicy | None = None,
                 interval_s: float = 30.0, clock: Clock = utcnow) -> None:
        self.node = node
        self.store = state
        self.boot_id = boot_id
        self.pods = pods
        self.pod_resources = pod_resources
        self.policy = policy or TrendPolicy()
        self.interval = timedelta(seconds=interval_s)
        self.clock = clock
        self.samples = 0
        self._last: datetime | None = None
        self._pending: TrendState | None = None
        self._counts: dict[str, int] = {}
        self.state = self._load()

    def due(self) -> bool:
        return self._last is None or self.clock() - self._last >= self.interval

    def sample(self, snapshots: Sequence[GpuSnapshot]) -> list[FaultEvent]:
        """Events for this poll's snapshots when a sample is due (none otherwise)."""
        if not self.due():
            return []
        now = self.clock()
        self._last = now
        self.samples += 1
        gpus, procs = samples_of(snapshots, self.pods, self._holders(snapshots))
        new, findings = observe(self.state, gpus, procs, now, self.policy)
        self._pending = new
        boot = self.boot_id()
        return [e for e in (self._event(f, boot) for f in findings) if e is not None]

    def commit(self) -> None:
        """The last sample's events were handed on: its state is the state, durably."""
        if self._pending is None:
            return
        self.state, self._pending = self._pending, None
        # a report counter outlives its process only until the next commit (bounded by what is tracked)
        self._counts = {k: v for k, v in self._counts.items()
                        if not k.startswith("growth|") or k.removeprefix("growth|") in self.state.processes}
        self.store.save(STATE_NAME, {"boot_id": self.boot_id(), "counts": self._counts, **_dump(self.state)})

    def check(self, snap: GpuSnapshot) -> list[str]:
        """The health check's ``memory`` verdict on a fresh snapshot of one GPU: each process against its
        baseline (its own, else its container's: a restarted pod is judged at once), framebuffer held by no
        process, and processes whose pod is gone (``remediator.agent.orphans``). A process with no baseline
        yet, or a GPU whose processes cannot be read, is not judged."""
        if snap.lost or snap.processes is None:
            return []
        gpus, procs = samples_of([snap], self.pods, self._holders([snap]))
        p = self.policy
        out = []
        for s in procs:
            t = self.state.processes.get(s.key)
            baseline = t.baseline if t is not None else None
            if baseline is None and s.container:
                baseline = self.state.containers.get(s.container)
            if baseline is not None and s.used_bytes >= max(int(baseline * p.factor), baseline + p.min_growth_bytes):
                out.append(f"pid {s.pid} uses {_mib(s.used_bytes)}, at least {p.factor:g} x its baseline "
                           f"{_mib(baseline)}")
        for g in gpus:
            if g.process_count == 0 and g.used_bytes is not None and \
                    g.used_bytes - g.reserved_bytes >= p.no_owner_bytes:
                out.append(f"{_mib(g.used_bytes - g.reserved_bytes)} of framebuffer held by no process")
        if self.pods is not None:  # memory is not back while a process outlives its pod (an unkillable orphan)
            out += [f"pid {o.pid} holds {_mib(o.used_bytes or 0)} after its pod {o.pod_uid} is gone"
                    for o in find_orphans([snap], self.pods)]
        return out

    def _holders(self, snapshots: Sequence[GpuSnapshot]
                 ) -> Callable[[GpuIdentity], tuple[GpuHolder, ...] | None] | None:
        """Who holds each GPU, asked once per sample (the kubelet's ``List`` answers for every GPU at once,
        where the view can: ``KubeletHolders.holder_map``), and only when some GPU runs a process."""
        src = self.pod_resources
        if src is None or not any(s.processes for s in snapshots):
            return None
        every = getattr(src, "holder_map", None)
        if callable(every):
            found = every([s.identity for s in snapshots])
            if found is None:
                return None
            of: Callable[[GpuIdentity], tuple[GpuHolder, ...] | None] = found.of
            return of
        return src.gpu_holders

    def _event(self, f: Finding, boot: str) -> FaultEvent | None:
        gpu = GpuRef(index=f.gpu.index, uuid=f.gpu.uuid, pci_bus_id=f.gpu.pci_bus_id)
        where = f"GPU {f.gpu.index} ({f.gpu.uuid or f.gpu.pci_bus_id})"
        if f.what == "growth":
            s = f.sample
            assert s is not None and f.baseline_bytes is not None and f.since is not None
            counter = f"growth|{s.key}"
            n = self._counts[counter] = self._counts.get(counter, 0) + 1
            sustained = int((f.at - f.since).total_seconds())
            ratio = f.used_bytes / f.baseline_bytes if f.baseline_bytes else 0.0
            labels = {"source": "nvml", "pid": str(s.pid), "process_used_bytes": str(f.used_bytes),
                      "baseline_bytes": str(f.baseline_bytes), "growth_factor": f"{ratio:.3f}",
                      "growth_bytes_per_min": str(max(0, f.per_min)), "growth_window_s": str(sustained)}
            if s.pod_uid:
                labels["pod_uid"] = s.pod_uid
            h = s.holder
            origin = (Origin(pod=h.name, namespace=h.namespace, pod_uid=s.pod_uid or h.uid, container=h.container)
                      if h is not None else Origin(pod_uid=s.pod_uid) if s.pod_uid else None)
            owner = f" of pod {h.namespace}/{h.name} ({h.container})" if h is not None else (
                f" of pod {s.pod_uid}" if s.pod_uid else "")
            return make_event(
                event_id=f"agent|{self.node}|{boot}|memgrowth|{f.gpu.key}|{s.pid}|{s.pod_uid or '-'}|{n}",
                node=self.node, kind="memory_leak", code="process_growth", gpu=gpu, labels=labels,
                message=(f"{where}: pid {s.pid}{owner} uses {_mib(f.used_bytes)}, {ratio:.2f} x its baseline "
                         f"{_mib(f.baseline_bytes)}, over {self.policy.factor:g} x for {sustained} s"),
                clock=self.clock, origin=origin)
        counter = f"noowner|{f.gpu.key}"
        n = self._counts[counter] = self._counts.get(counter, 0) + 1
        labels = {"source": "nvml", "used_bytes": str(f.used_bytes), "reserved_bytes": str(f.reserved_bytes),
                  "process_count": "0"}
        if f.what == "no_owner_cleared":
            return make_event(event_id=f"agent|{self.node}|{boot}|memnoowner|{f.gpu.key}|{n}", node=self.node,
                              kind="memory_leak", code="fb_no_owner", gpu=gpu, labels={"source": "nvml"},
                              message=f"{where}: framebuffer no longer held without an owner", clock=self.clock,
                              is_healthy=True)
        assert f.since is not None
        return make_event(event_id=f"agent|{self.node}|{boot}|memnoowner|{f.gpu.key}|{n}", node=self.node,
                          kind="memory_leak", code="fb_no_owner", gpu=gpu, labels=labels, clock=self.clock,
                          message=(f"{where}: {_mib(f.used_bytes - f.reserved_bytes)} of framebuffer held with no "
                                   f"process on the GPU since {f.since.isoformat()}"))

    def _load(self) -> TrendState:
        data = self.store.load(STATE_NAME)
        counts = data.get("counts")
        if isinstance(counts, dict):
            self._counts = {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
        try:
            state = _undump(data)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("agent state %s unreadable (%s); memory baselines start afresh", STATE_NAME, e)
            return TrendState()
        if data.get("boot_id") not in (None, self.boot_id()):
            # a reboot: the PIDs are gone; what each container used is still the best baseline there is
            return TrendState(containers=state.containers)
        return state


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def _ts(d: datetime | None) -> str | None:
    return None if d is None else d.isoformat()


def _dt(s: Any) -> datetime | None:
    return None if s is None else datetime.fromisoformat(str(s))


def _dump(state: TrendState) -> dict[str, Any]:
    return {
        "processes": {k: {"gpu": t.gpu, "pid": t.pid, "first_at": _ts(t.first_at), "last_at": _ts(t.last_at),
                          "used": t.used, "baseline": t.baseline, "baseline_at": _ts(t.baseline_at),
                          "over_since": _ts(t.over_since), "reported_bytes": t.reported_bytes,
                          "container": t.container, "pod_uid": t.pod_uid}
                      for k, t in state.processes.items()},
        "containers": dict(state.containers),
        "no_owner_since": {k: _ts(v) for k, v in state.no_owner_since.items()},
        "no_owner_reported": {k: _ts(v) for k, v in state.no_owner_reported.items()},
        "untracked": state.untracked,
    }


def _undump(data: Mapping[str, Any]) -> TrendState:
    def when(v: Any) -> datetime:
        d = _dt(v)
        if d is None:
            raise ValueError("a time is missing")
        return d

    procs: dict[str, Tracked] = {}
    for k, t in dict(data.get("processes") or {}).items():
        procs[str(k)] = Tracked(
            gpu=str(t["gpu"]), pid=int(t["pid"]), first_at=when(t["first_at"]), last_at=when(t["last_at"]),
            used=int(t["used"]), baseline=None if t.get("baseline") is None else int(t["baseline"]),
            baseline_at=_dt(t.get("baseline_at")), over_since=_dt(t.get("over_since")),
            reported_bytes=None if t.get("reported_bytes") is None else int(t["reported_bytes"]),
            container=t.get("container"), pod_uid=t.get("pod_uid"))
    return TrendState(
        processes=procs,
        containers={str(k): int(v) for k, v in dict(data.get("containers") or {}).items()},
        no_owner_since={str(k): when(v) for k, v in dict(data.get("no_owner_since") or {}).items()},
        no_owner_reported={str(k): when(v) for k, v in dict(data.get("no_owner_reported") or {}).items()},
        untracked=int(data.get("untracked") or 0),
    )
