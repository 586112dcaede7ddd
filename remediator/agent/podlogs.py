"""Container-log scanner: NCCL timeouts and errors, CUDA errors and OOMs from the pods' CRI log files.

Where it sits: the agent's workload path, beside the kernel-log watcher. It follows every
``<root>/<namespace>_<pod>_<uid>/<container>/<N>.log`` (the kubelet's ``/var/log/pods`` layout; rotation
by the kubelet is followed through ``follow.FileFollower``), parses the CRI format
``<time> <stdout|stderr> <F|P> <message>`` (``P`` parts are joined up to the closing ``F``), and runs the
shared scanner over the messages (``handlers.signatures.LineScanner``: the prefilter, framing of records split
over lines, the family parsers and the operator's added signatures -- the path ``remediator classify`` takes).
Each signal of kind ``nccl_timeout``, ``nccl_error``, ``cuda_error``, ``cuda_oom`` or ``job_failure`` becomes a
``FaultEvent`` with labels ``namespace``, ``pod``, ``pod_uid``, ``container``, ``job`` and ``rank`` and whatever
the line itself said (``seq``, ``op_type``, ``timeout_ms``, ``peer``, ...). Its ``origin`` is the pod the log
path names (namespace, pod, UID, container), which the agent knows for certain; the ``job`` label below is a
guess and stays a label.

Cost: a verbose job log is mostly lines that can carry no signal (``NCCL INFO`` chatter, progress lines).
The chunk read from a file goes through the scanner as one byte string (one ``bytes.translate`` and one
Aho-Corasick pass, ``handlers.signatures.prefilter``), so a line without an anchor is never decoded or parsed;
only chunks with partial (``P``) lines are split into messages first (the ``P`` parts joined), which then take
the same scanner.

``job`` and ``rank``, in order of precedence: what the log line says (``[Rank 3]``), a ``labels.json``
(``{"job": ..., "rank": ...}``) in the pod's log directory (the simulated node writes one), then the pod
name: ``<job>-master-<i>`` is rank ``i``, ``<job>-worker-<i>`` rank ``i+1`` (Kubeflow PyTorchJob, whose
master is rank 0), ``<job>-<i>-<5 chars>`` rank ``i`` (indexed batch Job), ``<job>-<i>`` rank ``i``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from handlers.rules import RuleSet
from handlers.signatures import LineScanner, Signal
from handlers.signatures.prefilter import line_offsets
from remediator.agent.events import Clock, EventSink, detail_labels, make_event, submit_when_room
from remediator.agent.follow import Chunk, FileFollower
from remediator.agent.state import StateStore
from remediator.contracts import FaultEvent, Origin, utcnow

log = logging.getLogger(__name__)

STATE_NAME = "podlogs"
POD_KINDS = frozenset({"nccl_timeout", "nccl_error", "cuda_error", "cuda_oom", "job_failure"})

_CRI_RE = re.compile(rb"^(\S+) (stdout|stderr) ([FP])(?: |$)")
_POD_DIR_RE = re.compile(r"^(?P<ns>[^_]+)_(?P<pod>[^_]+)_(?P<uid>[0-9A-Za-z-]+)$")
_PYTORCHJOB_RE = re.compile(r"^(?P<job>.+)-(?P<role>master|worker)-(?P<i>\d+)$")
_INDEXED_JOB_RE = re.compile(r"^(?P<job>.+)-(?P<i>\d+)-[a-z0-9]{5}$")
_ORDINAL_RE = re.compile(r"^(?P<job>.+)-(?P<i>\d+)$")


def job_and_rank_from_pod(pod: str) -> dict[str, str]:
    """``job`` and ``rank`` guessed from a pod name (see the module docstring), or ``{}``."""
    m = _PYTORCHJOB_RE.match(pod)
    if m:
        i = int(m.group("i"))
        return {"job": m.group("job"), "rank": str(i if m.group("role") == "master" else i + 1)}
    for rx in (_INDEXED_JOB_RE, _ORDINAL_RE):
        m = rx.match(pod)
        if m:
            return {"job": m.group("job"), "rank": str(int(m.group("i")))}
    return {}


def pod_labels(log_file: Path) -> dict[str, str] | None:
    """Labels of ``<root>/<ns>_<pod>_<uid>/<container>/<N>.log``, or None when the path is not that shape."""
    container = log_file.parent.name
    m = _POD_DIR_RE.match(log_file.parent.parent.name)
    if m is None:
        return None
    labels = {"namespace": m.group("ns"), "pod": m.group("pod"), "pod_uid": m.group("uid"),
              "container": container}
    labels.update(job_and_rank_from_pod(m.group("pod")))
    try:
        extra = json.loads((log_file.parent.parent / "labels.json").read_text())
    except (OSError, ValueError):
        extra = None
    if isinstance(extra, dict):
        labels.update({k: str(v) for k, v in extra.items() if k in ("job", "rank") and v is not None})
    return labels


def pod_origin(labels: dict[str, str]) -> Origin:
    """The origin of events from one container log: the pod its path names (never a job guessed from it)."""
    return Origin(pod=labels["pod"], namespace=labels["namespace"], pod_uid=labels["pod_uid"],
                  container=labels["container"])


@dataclass(slots=True)
class _Tracked:
    follower: FileFollower
    labels: dict[str, str]
    origin: Origin
    partial: list[bytes] = field(default_factory=list)
    partial_start: int | None = None
    partial_file: str | None = None


class PodLogScanner:
    """Follows every container log under ``root`` and publishes the workload fault signals in them."""

    def __init__(self, root: Path | str, *, node: str, sink: EventSink, state: StateStore,
                 clock: Clock = utcnow, poll_interval_s: float = 0.5, rescan_interval_s: float = 5.0,
                 retry_s: float = 1.0, rules: Callable[[], RuleSet | None] = lambda: None) -> None:
        self.root = Path(root)
        self.rules = rules  # the operator rules in force (their added signatures are tried too)
        self.node = node
        self.sink = sink
        self.state = state
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.rescan_interval_s = rescan_interval_s
        self.retry_s = retry_s
        self._files: dict[str, _Tracked] = {}
        self._saved: dict[str, Any] = {}
        self.lines_scanned_bytes = 0
        self.events_published = 0

    @property
    def files_followed(self) -> int:
        return len(self._files)

    @property
    def behind(self) -> bool:
        """True when a file has more to read than the last poll took (poll again at once)."""
        return any(t.follower.more for t in self._files.values())

    # --- files ---------------------------------------------------------------------------------------

    def discover(self) -> None:
        """Start following new log files; drop the ones that are gone and fully read."""
        seen: set[str] = set()
        try:
            with os.scandir(self.root) as it:
                pod_dirs = [e for e in it if e.is_dir()]
        except OSError:
            pod_dirs = []
        for pod_dir in pod_dirs:
            try:
                with os.scandir(pod_dir.path) as it:
                    containers = [e for e in it if e.is_dir()]
            except OSError:
                continue
            for cdir in containers:
                try:
                    with os.scandir(cdir.path) as it:
                        logs = [e.path for e in it if e.name.endswith(".log") and e.is_file()]
                except OSError:
                    continue
                for path in logs:
                    seen.add(path)
                    if path not in self._files:
                        self._track(path)
        for path in list(self._files):
            if path not in seen:
                pos = self._files[path].follower.position()
                gone = pos["current"] is None and not pos["draining"]
                if gone or not os.path.exists(os.path.dirname(path)):
                    del self._files[path]
                    self._saved.pop(path, None)

    def _track(self, path: str) -> None:
        labels = pod_labels(Path(path))
        if labels is None:
            return
        follower = FileFollower(path)
        saved = self._saved.get(path)
        if isinstance(saved, dict):
            follower.restore(saved)
        try:
            origin = pod_origin(labels)
        except ValidationError:  # not a name the kubelet writes; the labels still say what the path said
            log.warning("%s: pod directory names no valid pod; its events carry no origin", path)
            origin = Origin()
        self._files[path] = _Tracked(follower, labels, origin)

    # --- scanning ------------------------------------------------------------------------------------

    def scan_once(self) -> list[FaultEvent]:
        """Read what is new in every followed file and return the events in it."""
        events: list[FaultEvent] = []
        for tracked in self._files.values():
            for chunk in tracked.follower.poll():
                self.lines_scanned_bytes += len(chunk.data)
                self._scan_chunk(tracked, chunk, events)
        return events

    def _scan_chunk(self, tracked: _Tracked, chunk: Chunk, out: list[FaultEvent]) -> None:
        data = chunk.data
        scanner = LineScanner(rules=self.rules())
        if not tracked.partial and b" P " not in data:
            # the whole chunk through the scanner at once (CRI prefixes are unwrapped by the parsers); only the
            # lines of a record are split out, located without splitting the chunk
            records = scanner.records_bytes(data)
            if not records:
                return
            starts = line_offsets(data, [r.start for r in records])
            for rec, start in zip(records, starts, strict=True):
                end = start
                for _ in range(rec.end - rec.start + 1):
                    nl = data.find(b"\n", end)
                    end = len(data) if nl < 0 else nl + 1
                msgs = [self._message(raw) for raw in data[start:end].rstrip(b"\n").split(b"\n")]
                self._emit(tracked, chunk, chunk.start + start, "\n".join(msgs), rec.signal, out)
            return
        messages: list[tuple[int, str]] = []  # (offset of the first part, the message with P parts joined)
        for offset, line in chunk.lines():
            cri = _CRI_RE.match(line)
            if cri is None:
                msg, tag = line, b"F"
            else:
                msg, tag = line[cri.end():], cri.group(3)
            if tag == b"P":
                if not tracked.partial:
                    tracked.partial_start, tracked.partial_file = offset, chunk.file_id
                tracked.partial.append(msg)
                continue
            start = offset
            if tracked.partial:
                msg = b"".join(tracked.partial) + msg
                start = tracked.partial_start if tracked.partial_start is not None else offset
                tracked.partial, tracked.partial_start, tracked.partial_file = [], None, None
            messages.append((start, msg.decode("utf-8", errors="replace")))
        texts = [m for _, m in messages]
        for rec in scanner.records(texts):
            self._emit(tracked, chunk, messages[rec.start][0], "\n".join(texts[rec.start:rec.end + 1]), rec.signal,
                       out)

    @staticmethod
    def _message(raw: bytes) -> str:
        cri = _CRI_RE.match(raw)
        return (raw[cri.end():] if cri else raw).decode("utf-8", errors="replace")

    def _emit(self, tracked: _Tracked, chunk: Chunk, offset: int, text: str, sig: Signal,
              out: list[FaultEvent]) -> None:
        if sig.kind not in POD_KINDS:
            return
        labels = dict(tracked.labels)
        labels.update(detail_labels(sig.detail))
        labels["source"] = "container_log"
        if sig.gpu_index is not None:
            labels.setdefault("gpu_index", str(sig.gpu_index))
        lb = tracked.labels
        event = make_event(
            event_id=f"agent|{self.node}|pod|{lb['pod_uid']}|{lb['container']}|{chunk.file_id}@{offset}",
            node=self.node, kind=sig.kind, code=sig.code if not isinstance(sig.code, bool) else str(sig.code),
            gpu=None, message=text, labels=labels, clock=self.clock, is_fatal=sig.is_fatal,
            recommended_action=sig.action, origin=tracked.origin)
        if event is not None:
            out.append(event)

    # --- position ------------------------------------------------------------------------------------

    def positions(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, tracked in self._files.items():
            pos = tracked.follower.position()
            cur = pos.get("current")
            if tracked.partial_start is not None and cur and tracked.partial_file is not None \
                    and tracked.partial_file.startswith(f"{cur['dev']}:{cur['ino']}:"):
                cur["offset"] = min(int(cur["offset"]), tracked.partial_start)
            out[path] = pos
        return out

    def restore(self) -> None:
        data = self.state.load(STATE_NAME)
        files = data.get("files")
        self._saved = dict(files) if isinstance(files, dict) else {}

    def save(self) -> None:
        positions = self.positions()
        self._saved = positions
        self.state.save(STATE_NAME, {"files": positions})

    async def run(self) -> None:
        self.restore()
        loop = asyncio.get_running_loop()
        next_rescan = 0.0
        last_saved: dict[str, Any] | None = None
        while True:
            now = loop.time()
            if now >= next_rescan:
                self.discover()
                next_rescan = now + self.rescan_interval_s
            events = self.scan_once()
            await submit_when_room(self.sink, events, self.retry_s)
            self.events_published += len(events)
            positions = self.positions()
            if positions != last_saved:
                self.state.save(STATE_NAME, {"files": positions})
                self._saved = positions
                last_saved = positions
            if not self.behind:
                await asyncio.sleep(self.poll_interval_s)
