"""Incident bookkeeping shared by the handlers: groups, severity, fold-or-open, closing and lapsing.

Where it sits: between a handler's rules and the ``Verdict`` it returns. A handler works out *what* an event
calls for (a ``Proposal``); ``settle`` decides whether that opens an incident (and a ``Decision``) or folds
into one already open, so every family dedups the same way. The executor calls ``close_incident`` when a
playbook finishes; ``expire_incidents`` lets an incident without updates lapse after a TTL.

Groups (at most one running remediation per group, DESIGN.md §6):

* ``gpu:<node>/<gpu key>`` for playbooks that act on one GPU (the node is part of the group because a GPU
  key may be an index, which is only unique on its node);
* ``node:<node>`` for node-wide playbooks (``gpu-lost``, ``node-reboot``) and for GPU playbooks whose GPU is
  unknown;
* ``job:<namespace>/<job>`` for the NCCL playbooks, which restart a job (``pod:<namespace>/<pod>`` when the
  job is not known, see ``handlers.nccl.Correlation``).

Jobs: every family asks ``remediator.contracts.resolve_job`` (the one resolver) which job an event belongs to;
a sighting remembers that job, or "" when none is known.

Groups do not carry the handler family: an Xid 48 and a DCGM double-bit ECC value on the same GPU are one
incident. An open incident absorbs every proposal for its group that is not more severe (``SEVERITY``); a
more severe one supersedes it (a new incident and decision, whose ``labels["supersedes"]`` names the old
incident). An open node-wide incident also absorbs every proposal for a GPU on that node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from handlers.base import History, Incident, Sighting, Verdict, incident_id_for
from remediator.contracts import Decision, Evidence, FaultEvent, GpuRef, resolve_job

INCIDENT_TTL = timedelta(hours=6)
SIGHTING_LIMIT = 1024

NODE_WIDE_PLAYBOOKS = frozenset({"gpu-lost", "node-reboot"})

# Higher wins. Equal severity folds: a second, equally drastic remediation of the same group is never started.
SEVERITY: dict[str, int] = {
    "gpu-lost": 100,
    "node-reboot": 90,
    "memory-retirement-failure": 80,
    "gpu-memory-fatal": 70,
    "nvlink": 60,
    "gsp-hang": 60,
    "gpu-reset": 50,
    "row-remap-pending": 40,
    "app-xid-hardware-suspect": 30,
    "ecc-correctable-rate": 30,
    "nccl-timeout-suspect": 25,
    "memory-leak": 20,
    "memory-leak-growth": 15,  # restarts the job only, like nccl-timeout-no-suspect; an orphan supersedes it
    "nccl-timeout-no-suspect": 15,
    "unknown-xid": 10,
}

_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F-]+$")
_INDEX_RE = re.compile(r"^index-(\d+)$")


def gpu_group(node: str, gpu_key: str) -> str:
    return f"gpu:{node}/{gpu_key}"


def node_group(node: str) -> str:
    return f"node:{node}"


def job_group(namespace: str, job: str) -> str:
    return f"job:{namespace}/{job}"


def group_for(playbook: str, node: str, gpu: GpuRef | None) -> str:
    """The equivalence group of ``playbook`` on ``node``/``gpu``: node-wide playbooks and unknown GPUs → node."""
    if playbook in NODE_WIDE_PLAYBOOKS or gpu is None or gpu.key == "?":
        return node_group(node)
    return gpu_group(node, gpu.key)


def gpu_key_of(event: FaultEvent) -> str:
    return event.gpu.key if event.gpu is not None else ""


def gpu_ref_from_key(key: str) -> GpuRef | None:
    """Rebuild a ``GpuRef`` from a remembered ``GpuRef.key`` (uuid, PCI id or ``index-N``)."""
    if not key or key == "?":
        return None
    if _UUID_RE.match(key):
        return GpuRef(uuid=key)
    m = _INDEX_RE.match(key)
    if m:
        return GpuRef(index=int(m.group(1)))
    try:
        return GpuRef(pci_bus_id=key)
    except ValueError:
        return GpuRef(uuid=key)


# --- incidents ----------------------------------------------------------------------------------------


def close_incident(history: History, group: str) -> History:
    """The history with ``group``'s incident closed: call when its playbook finishes (any outcome).

    Closing an incident that is not open (already closed, lapsed or superseded) is a no-op.
    """
    return history.without_incident(group)


def expire_incidents(history: History, now: datetime, ttl: timedelta = INCIDENT_TTL) -> History:
    """Drop incidents not updated for longer than ``ttl`` (so a lost ``close`` cannot block a group forever)."""
    kept = tuple(i for i in history.incidents if now - i.updated_at <= ttl)
    return history if len(kept) == len(history.incidents) else replace(history, incidents=kept)


def covering_incident(history: History, group: str) -> Incident | None:
    """The open incident an event for ``group`` would fold into: the group's own, or its node's."""
    own = history.open_incident(group)
    if group.startswith("gpu:"):
        node = group[4:].rsplit("/", 1)[0]
        wide = history.open_incident(node_group(node))
        if wide is not None and (own is None or SEVERITY.get(wide.playbook, 0) >= SEVERITY.get(own.playbook, 0)):
            return wide
    return own


def fold(history: History, incident: Incident, now: datetime) -> History:
    """Count one more event into ``incident``."""
    return history.with_incident(replace(incident, updated_at=now, count=incident.count + 1))


# --- sightings ----------------------------------------------------------------------------------------


def remember(history: History, s: Sighting, now: datetime, keep: timedelta, kinds: Iterable[str],
             limit: int = SIGHTING_LIMIT) -> History:
    """Add ``s``; forget sightings of ``kinds`` older than ``keep`` (other families prune their own).

    Storms stay small: when the last two sightings of the same stream (kind, code, GPU, job) say the same as
    ``s``, the later of the two is replaced by ``s``, so a run of identical repeats keeps its first and its
    latest sighting (the first for "first in time", the latest for bursts and idempotency).
    """
    own = frozenset(kinds)
    kept = [x for x in history.sightings if x.kind not in own or now - x.at <= keep]
    stream = [i for i, x in enumerate(kept)
              if (x.kind, x.code, x.gpu, x.job) == (s.kind, s.code, s.gpu, s.job)]
    if len(stream) >= 2 and all(kept[i].detail == s.detail for i in stream[-2:]):
        del kept[stream[-1]]
    kept.append(s)
    return replace(history, sightings=tuple(kept[-limit:]))


def sighting_of(event: FaultEvent, now: datetime, detail: str = "", *, job: str | None = None,
                gpu: str | None = None) -> Sighting:
    return Sighting(event.id, event.kind, event.code, gpu_key_of(event) if gpu is None else gpu, now,
                    (resolve_job(event.origin, event.labels) or "") if job is None else job, detail)


def evidence_of(event: FaultEvent, detail: str) -> Evidence:
    return Evidence(event_id=event.id, kind=event.kind, code=event.code, at=event.observed_at, detail=detail)


def evidence_of_sighting(s: Sighting, detail: str) -> Evidence:
    return Evidence(event_id=s.event_id, kind=s.kind, code=s.code, at=s.at, detail=detail)


# --- proposals ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    """What a handler's rules call for; ``settle`` turns it into a decision or an incident update."""

    handler: str
    playbook: str
    node: str
    gpu: GpuRef | None
    group: str
    reason: str
    evidence: tuple[Evidence, ...]
    job: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def settle(event: FaultEvent, history: History, now: datetime, p: Proposal) -> Verdict:
    """Open an incident for ``p`` (and decide), or fold the event into the open incident that covers it.

    ``history`` must already hold the event's sighting. The decision's ``incident_id`` is
    ``incident_id_for(event.node, group, event.id)``, so a redelivered event that opened an incident names the
    same one, even when the decision targets another node (an NCCL suspect).
    """
    if p.playbook not in SEVERITY:
        raise ValueError(f"unknown playbook {p.playbook!r}")
    cover = covering_incident(history, p.group)
    if cover is not None and SEVERITY.get(cover.playbook, 0) >= SEVERITY[p.playbook]:
        history = fold(history, cover, now)
        reason = (f"{_sentence(p.reason)}; folded into open incident {cover.incident_id} "
                  f"({cover.playbook}, {cover.count + 1} events), no second remediation")
        return Verdict(None, history, reason, updated_incident=cover.incident_id)
    # Keyed on the event's node (not the target's): dispatch re-derives it from the redelivered event.
    incident_id = incident_id_for(event.node, p.group, event.id)
    labels = dict(p.labels)
    reason = _sentence(p.reason)
    superseded = history.open_incident(p.group)
    if superseded is not None:
        labels["supersedes"] = superseded.incident_id
        reason += f" (supersedes {superseded.incident_id}, {superseded.playbook})"
    decision = Decision(
        incident_id=incident_id, handler=p.handler, playbook=p.playbook, node=p.node, gpu=p.gpu,
        group=p.group, reason=reason, evidence=p.evidence, event_id=event.id, kind=event.kind,
        code=event.code, decided_at=now, job=p.job or None, labels=labels,
    )
    history = history.with_incident(Incident(incident_id, p.group, p.playbook, now, now))
    return Verdict(decision, history, reason)


def _sentence(text: str) -> str:
    return text.rstrip().rstrip(".")
