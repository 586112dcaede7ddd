"""The Xid handler: NVIDIA's catalog plus the co-occurrence rules of gpu-faults.md §1.7.

Where it sits: dispatch calls ``decide`` for every event of kind ``xid``, ``sxid`` or ``gpu_lost`` with the
node's history (KV ``node.<node>``); the resulting ``Decision`` names a playbook from
``remediator.contracts.PLAYBOOK_NAMES`` (the map from code to playbook is ``handlers.catalog``).

Rules, in the order they are tried for an Xid on one GPU ("the burst" is that GPU's Xids back to the last
gap of ``burst_quiet``, three minutes by default, as NVIDIA Fleet Intelligence groups them):

1. A burst that contains a 79 (the GPU fell off the bus): everything after it follows the 79 (119/120 are
   its GSP timeouts) and folds into the node's ``gpu-lost`` incident, or is recorded.
2. 154 (recovery action changed) is done as it says: "GPU Reset Required", "Drain and Reset", "Drain P2P" →
   ``gpu-reset``; "Node Reboot Required" (and the bus/system reboot and IMEX actions) → ``node-reboot``;
   "None" → recorded; unreadable → ``unknown-xid``. A 154 earlier in the burst overrides the per-Xid table
   for the Xids NVIDIA links to it (catalog column ``xid154_linkage``).
3. 45 with another Xid in the burst, or with "caused by previous Xid N" in its text, follows that Xid:
   folded into its incident, or recorded. A solo 45 is an application-class Xid (rule 8).
4. 43 after 13/31 in the burst is the channel teardown of that fault: recorded, not counted.
5. 171/172 after a 48 qualify it (DRAM or SRAM): folded into the 48's incident, or recorded.
6. 74 while other GPUs of the node logged 74 in the same node-wide burst: the first GPU in time is the
   suspect; the proposal targets it (one NVLink incident, not one per peer).
7. 48 + 63 and 48 + 64 need no rule of their own: 63 (``row-remap-pending``) folds into the 48's
   ``gpu-memory-fatal`` incident, 64 (``memory-retirement-failure``) is more severe and supersedes it.
8. Application-class Xids (13, 31, 43, 45, RESTART_APP): recorded; once ``app_threshold`` different jobs
   (three by default) have had one on the same GPU within ``app_window`` (24 hours by default, inclusive)
   → ``app-xid-hardware-suspect`` on that GPU. Sightings without a job do not count.
9. Other codes NVIDIA files under IGNORE: recorded. Codes the catalog does not list: ``unknown-xid``.
10. Everything else: the catalog's playbook.

Kind ``gpu_lost`` → ``gpu-lost``. Kind ``sxid`` (NVSwitch): after a 79 it follows the 79; fatal → ``nvlink``
for the whole node (NVSwitch systems reset links node-wide); non-fatal → recorded.

Repeats and flapping never start a second remediation: ``handlers.incidents.settle`` folds any proposal that
is not more severe than the incident already open for its group (``Verdict.updated_incident``).

Configuration: an ``XidPolicy`` (rule 8's ``app_window``/``app_threshold``, the burst gap, the incident
TTL; defaults are the module constants), which ``decide`` takes as its fourth argument. The registry binds
one to ``DEFINITION`` (``handlers.build_registry``), the service from its settings (``xid_app_window_s``,
``xid_app_threshold``, ``xid_burst_quiet_s``, ``incident_ttl_s``); tests call ``decide`` with any policy.

Jobs: an event's job is ``remediator.contracts.resolve_job`` (the owner reference, then the Kubeflow,
JobSet and batch labels); a pod name alone is no job, so the restarts of one job are not counted as
different jobs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from handlers.base import HandlerDefinition, History, Sighting, Verdict
from handlers.catalog import CATALOG, UNKNOWN_PLAYBOOK, XidCatalog, XidInfo
from handlers.incidents import (
    INCIDENT_TTL,
    Proposal,
    covering_incident,
    evidence_of,
    evidence_of_sighting,
    expire_incidents,
    fold,
    gpu_key_of,
    gpu_ref_from_key,
    group_for,
    node_group,
    remember,
    settle,
    sighting_of,
)
from remediator.contracts import Evidence, FaultEvent, resolve_job

HANDLER = "xid"
KINDS = ("xid", "sxid", "gpu_lost")

APP_WINDOW = timedelta(hours=24)
APP_THRESHOLD = 3
BURST_QUIET = timedelta(minutes=3)

_CAUSED_BY_RE = re.compile(r"caused\s+by\s+previous\s+xid\s*(\d+)", re.IGNORECASE)
_RECOVERY_RE = re.compile(r"recovery\s+action\s+changed\s+from\s+\S+\s*(?:\([^)]*\))?\s+to\s+(\S+)\s*(?:\(([^)]*)\))?",
                          re.IGNORECASE)
# NVML_GPU_RECOVERY_ACTION_* values (gpu-faults.md §2.3) → our playbook; None means "no action".
_RECOVERY_BY_CODE: dict[int, str | None] = {
    0: None, 1: "gpu-reset", 2: "node-reboot", 3: "gpu-reset", 4: "gpu-reset", 5: "node-reboot",
    6: "node-reboot", 7: "node-reboot",
}


@dataclass(frozen=True)
class XidPolicy:
    """The Xid handler's parameters; the defaults are the module constants."""

    app_window: timedelta = APP_WINDOW
    app_threshold: int = APP_THRESHOLD
    burst_quiet: timedelta = BURST_QUIET
    incident_ttl: timedelta = INCIDENT_TTL
    catalog: XidCatalog = field(default=CATALOG, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.app_threshold < 1:
            raise ValueError("app_threshold must be at least 1")
        if self.app_window <= timedelta(0) or self.burst_quiet <= timedelta(0):
            raise ValueError("app_window and burst_quiet must be positive")

    @classmethod
    def from_settings(cls, app_window_s: float, app_threshold: int, burst_quiet_s: float = BURST_QUIET.total_seconds(),
                      incident_ttl_s: float = INCIDENT_TTL.total_seconds()) -> XidPolicy:
        """Build from the service settings (``xid_app_window_s``, ``xid_app_threshold``, ``xid_burst_quiet_s``,
        ``incident_ttl_s``)."""
        return cls(app_window=timedelta(seconds=app_window_s), app_threshold=app_threshold,
                   burst_quiet=timedelta(seconds=burst_quiet_s), incident_ttl=timedelta(seconds=incident_ttl_s))

    @property
    def keep(self) -> timedelta:
        """How long Xid sightings are remembered: long enough for the application window and a burst."""
        return max(self.app_window, self.burst_quiet, timedelta(hours=24))


def decide(event: FaultEvent, history: History, now: datetime, policy: XidPolicy) -> Verdict:
    """Decide on one Xid/SXid/GPU-lost event under ``policy``: pure, ``now`` is the only clock."""
    history = expire_incidents(history, now, policy.incident_ttl)
    if event.is_healthy:
        h = _remember(history, sighting_of(event, now, "healthy"), now, policy)
        what = "GPU answers again" if event.kind == "gpu_lost" else f"{event.kind} {event.code} cleared"
        return Verdict(None, h, f"healthy event on {event.node} ({what}) recorded; nothing to do")
    if event.kind == "gpu_lost":
        return _gpu_lost(event, history, now, policy)
    if event.kind == "sxid":
        return _sxid(event, history, now, policy)
    if not isinstance(event.code, int):
        raise ValueError("an Xid event needs an integer code")
    return _xid(event, event.code, history, now, policy)


evaluate = decide  # the name tests and tools have called it by

DEFINITION = HandlerDefinition(HANDLER, frozenset(KINDS), decide, XidPolicy)


# --- kinds --------------------------------------------------------------------------------------------


def _gpu_lost(event: FaultEvent, history: History, now: datetime, policy: XidPolicy) -> Verdict:
    h = _remember(history, sighting_of(event, now), now, policy)
    where = f"GPU {event.gpu.key}" if event.gpu else "a GPU"
    return settle(event, h, now, Proposal(
        HANDLER, "gpu-lost", event.node, event.gpu, node_group(event.node),
        f"{where} on {event.node} is lost to the driver ({event.message or 'GPU_IS_LOST'}), so the node is "
        "lost for GPU work until it is power-cycled",
        (evidence_of(event, "GPU lost"),), resolve_job(event.origin, event.labels)))


def _sxid(event: FaultEvent, history: History, now: datetime, policy: XidPolicy) -> Verdict:
    prior = _node_burst(history, now, policy)
    h = _remember(history, sighting_of(event, now), now, policy)
    lost = next((s for s in prior if _is_lost(s)), None)
    if lost is not None:
        return _follow(event, h, now, node_group(event.node),
                       f"SXid {event.code} follows Xid 79 ({lost.event_id}) on {event.node}, the root cause")
    if not event.is_fatal:
        return Verdict(None, h, f"non-fatal SXid {event.code} on {event.node} recorded; no action")
    return settle(event, h, now, Proposal(
        HANDLER, "nvlink", event.node, None, node_group(event.node),
        f"fatal NVSwitch SXid {event.code} on {event.node} needs the node's NVLink fabric drained and reset",
        (evidence_of(event, f"fatal SXid {event.code}"),), resolve_job(event.origin, event.labels)))


def _xid(event: FaultEvent, code: int, history: History, now: datetime, policy: XidPolicy) -> Verdict:
    gpu = gpu_key_of(event)
    info = policy.catalog.get(code)
    burst = _gpu_burst(history, gpu, now, policy)
    where = f"GPU {gpu or '?'} on {event.node}"

    # Rule 1: after a 79 everything on this GPU (or the node) follows the 79.
    lost = next((s for s in _node_burst(history, now, policy) if _is_lost(s)), None)
    if code != 79 and lost is not None:
        h = _remember(history, sighting_of(event, now, "follows:79"), now, policy)
        return _follow(event, h, now, node_group(event.node),
                       f"Xid {code} on {where} follows the loss of a GPU ({lost.event_id}), the root cause")

    # Rule 2: Xid 154 says what to do.
    if code == 154:
        return _xid154(event, history, now, policy, where)
    x154 = next((s for s in reversed(burst) if s.code == 154), None)
    if x154 is not None and info is not None and info.xid154_linkage and code != 79:
        action = x154.detail.removeprefix("recovery:")
        if action == "none":
            h = _remember(history, sighting_of(event, now, "follows:154"), now, policy)
            return Verdict(None, h, f"Xid {code} on {where} recorded: Xid 154 earlier in this burst "
                                    "says no recovery action is needed, which overrides the catalog")
        if action in _RECOVERY_PLAYBOOKS:
            h = _remember(history, sighting_of(event, now, "follows:154"), now, policy)
            return _propose(event, h, now, action,
                            f"Xid {code} on {where} with Xid 154 earlier in this burst asking for {action}, "
                            "which overrides the catalog", (evidence_of_sighting(x154, "Xid 154 in burst"),))

    # Rule 3: 45 follows its cause.
    if code == 45:
        cause = _cause_of_45(event, burst)
        if cause is not None:
            h = _remember(history, sighting_of(event, now, f"follows:{cause}"), now, policy)
            return _follow(event, h, now, group_for("gpu-reset", event.node, event.gpu),
                           f"Xid 45 on {where} is the teardown that follows Xid {cause}")

    # Rule 4: 43 after 13/31 is the channel teardown of that fault.
    if code == 43:
        first = next((s for s in reversed(burst) if s.code in (13, 31)), None)
        if first is not None:
            h = _remember(history, sighting_of(event, now, f"follows:{first.code}"), now, policy)
            return Verdict(None, h, f"Xid 43 on {where} recorded as the channel teardown after Xid "
                                    f"{first.code}; not counted on its own")

    # Rule 5: 171/172 qualify a 48.
    if code in (171, 172) and any(s.code == 48 for s in burst):
        h = _remember(history, sighting_of(event, now, "follows:48"), now, policy)
        unit = "DRAM" if code == 171 else "SRAM"
        return _follow(event, h, now, group_for("gpu-memory-fatal", event.node, event.gpu),
                       f"Xid {code} on {where} qualifies the preceding Xid 48 as a {unit} error")

    h = _remember(history, sighting_of(event, now), now, policy)

    if info is None:
        return _propose(event, h, now, UNKNOWN_PLAYBOOK,
                        f"Xid {code} on {where} is not in the Xid catalog ({policy.catalog.version}); "
                        "a person must look at it", (evidence_of(event, f"Xid {code}, not in catalog"),))

    # Rule 6: 74 on several peers → the first GPU in time.
    if code == 74:
        return _nvlink_74(event, h, now, policy, gpu, where)

    # Rule 8: application-class Xids.
    if info.escalates_on_repeat:
        return _application(event, code, h, now, policy, gpu, where)

    # Rule 9: IGNORE.
    if not info.actionable:
        return Verdict(None, h, f"Xid {code} ({info.mnemonic}) on {where} recorded: NVIDIA's action is "
                                f"{info.immediate_action or 'none'}, no node action")

    # Rule 10 (and 7): the catalog's playbook.
    extra = ""
    if code == 48:
        remap = sorted({str(s.code) for s in burst if s.code in (63, 64)})
        if remap:
            extra = f", with Xid {'/'.join(remap)} in the same burst"
    return _propose(event, h, now, info.playbook,
                    f"Xid {code} ({info.mnemonic}: {info.description}) on {where}{extra}; NVIDIA's action is "
                    f"{info.immediate_action or 'none'}",
                    (evidence_of(event, f"Xid {code}, {_burst_count(burst, code) + 1} in this burst"),))


_RECOVERY_PLAYBOOKS = frozenset({"gpu-reset", "node-reboot", UNKNOWN_PLAYBOOK})


def _xid154(event: FaultEvent, history: History, now: datetime, policy: XidPolicy, where: str) -> Verdict:
    action_text, playbook = _recovery_action(event)
    detail = "recovery:none" if playbook is None else f"recovery:{playbook}"
    h = _remember(history, sighting_of(event, now, detail), now, policy)
    if playbook is None:
        return Verdict(None, h, f"Xid 154 on {where} says the recovery action is now {action_text}; recorded")
    if playbook == UNKNOWN_PLAYBOOK:
        reason = f"Xid 154 on {where} changed the recovery action to an unreadable value ({action_text!r})"
    else:
        reason = f"Xid 154 on {where} says the recovery action is now {action_text}, which overrides the catalog"
    return _propose(event, h, now, playbook, reason, (evidence_of(event, f"Xid 154: {action_text}"),))


def _recovery_action(event: FaultEvent) -> tuple[str, str | None]:
    """(what the 154 says, our playbook or None for "no action"), from labels first, then the text."""
    name = event.labels.get("recovery_action", "").strip()
    code_text = event.labels.get("recovery_action_code", "").strip()
    if not name and not code_text:
        m = _RECOVERY_RE.search(event.message)
        if m is not None:
            code_text, name = m.group(1), (m.group(2) or "").strip()
    low = name.lower()
    if low:
        if "reboot" in low or "bus reset" in low or "imex" in low:
            return name, "node-reboot"
        if "reset" in low or "p2p" in low:
            return name, "gpu-reset"
        if low == "none":
            return name, None
    try:
        value = int(code_text, 0)
    except ValueError:
        return name or code_text or "unknown", UNKNOWN_PLAYBOOK
    if value in _RECOVERY_BY_CODE:
        return name or f"0x{value:x}", _RECOVERY_BY_CODE[value]
    return name or f"0x{value:x}", UNKNOWN_PLAYBOOK


def _nvlink_74(event: FaultEvent, h: History, now: datetime, policy: XidPolicy, gpu: str,
               where: str) -> Verdict:
    peers = [s for s in _node_burst(h, now, policy) if s.code == 74 and s.kind == "xid" and s.gpu]
    first = min(peers, key=lambda s: s.at) if peers else None
    gpus = sorted({s.gpu for s in peers})
    if first is not None and first.gpu != gpu:
        target = gpu_ref_from_key(first.gpu)
        reason = (f"Xid 74 on {where} while {len(gpus)} GPUs of the node logged Xid 74 in this burst; "
                  f"the first in time, GPU {first.gpu}, is the suspect and its peers' links went down with it")
        evidence = (evidence_of_sighting(first, f"first Xid 74, GPU {first.gpu}"),
                    evidence_of(event, f"Xid 74 on peer GPU {gpu}, {len(gpus)} GPUs in burst"))
        return settle(event, h, now, Proposal(HANDLER, "nvlink", event.node, target,
                                              group_for("nvlink", event.node, target), reason, evidence,
                                              resolve_job(event.origin, event.labels)))
    return _propose(event, h, now, "nvlink",
                    f"Xid 74 (NVLink error) on {where} needs its links drained and the GPU reset",
                    (evidence_of(event, f"Xid 74, {len(gpus) or 1} GPU(s) with Xid 74 in burst"),))


def _application(event: FaultEvent, code: int, h: History, now: datetime, policy: XidPolicy, gpu: str,
                 where: str) -> Verdict:
    hits = [s for s in h.sightings
            if s.kind == "xid" and s.gpu == gpu and isinstance(s.code, int) and _is_application(s.code, policy)
            and not s.detail.startswith("follows:") and s.job and now - s.at <= policy.app_window]
    jobs = sorted({s.job for s in hits})
    job = resolve_job(event.origin, event.labels)
    window_h = policy.app_window.total_seconds() / 3600
    if job and len(jobs) >= policy.app_threshold and gpu:
        evidence = tuple(
            evidence_of_sighting(max((s for s in hits if s.job == j), key=lambda s: s.at),
                                 f"application Xid in job {j} ({sum(1 for s in hits if s.job == j)} sightings)")
            for j in jobs)
        return _propose(event, h, now, "app-xid-hardware-suspect",
                        f"Xid {code} on {where} makes {len(jobs)} different jobs with application Xids on this "
                        f"GPU within {window_h:g} h (threshold {policy.app_threshold}), which points at the "
                        "hardware", evidence)
    counted = f"{len(jobs)} of {policy.app_threshold} distinct jobs within {window_h:g} h"
    if not job:
        return Verdict(None, h, f"application Xid {code} on {where} recorded; no job label, so it is not "
                                f"counted ({counted})")
    return Verdict(None, h, f"application Xid {code} on {where} in job {job} recorded; no node action "
                            f"({counted})")


# --- helpers ------------------------------------------------------------------------------------------


def _propose(event: FaultEvent, h: History, now: datetime, playbook: str, reason: str,
             evidence: tuple[Evidence, ...]) -> Verdict:
    return settle(event, h, now, Proposal(HANDLER, playbook, event.node, event.gpu,
                                          group_for(playbook, event.node, event.gpu), reason, evidence,
                                          resolve_job(event.origin, event.labels)))


def _follow(event: FaultEvent, h: History, now: datetime, group: str, reason: str) -> Verdict:
    """Fold a consequent event into the incident of its cause, or record it when none is open."""
    cover = covering_incident(h, group)
    if cover is None:
        return Verdict(None, h, f"{reason}; recorded, no incident of its own")
    return Verdict(None, fold(h, cover, now),
                   f"{reason}; folded into open incident {cover.incident_id} ({cover.playbook})",
                   updated_incident=cover.incident_id)


def _cause_of_45(event: FaultEvent, burst: tuple[Sighting, ...]) -> int | None:
    m = _CAUSED_BY_RE.search(event.message)
    if m is not None:
        return int(m.group(1))
    other = next((s for s in reversed(burst) if s.kind == "xid" and s.code != 45), None)
    return other.code if other is not None and isinstance(other.code, int) else None


def _is_lost(s: Sighting) -> bool:
    return s.detail != "healthy" and (s.kind == "gpu_lost" or (s.kind == "xid" and s.code == 79))


def _is_application(code: int, policy: XidPolicy) -> bool:
    info: XidInfo | None = policy.catalog.get(code)
    return info is not None and info.escalates_on_repeat


def _burst_count(burst: tuple[Sighting, ...], code: int) -> int:
    return sum(1 for s in burst if s.code == code)


def _gpu_burst(history: History, gpu: str, now: datetime, policy: XidPolicy) -> tuple[Sighting, ...]:
    """This GPU's Xid sightings back to the last quiet gap (oldest first)."""
    return _burst([s for s in history.sightings if s.kind == "xid" and s.gpu == gpu and s.detail != "healthy"],
                  now, policy.burst_quiet)


def _node_burst(history: History, now: datetime, policy: XidPolicy) -> tuple[Sighting, ...]:
    """The node's Xid/SXid/GPU-lost sightings, every GPU together, back to the last quiet gap (oldest first)."""
    return _burst([s for s in history.sightings if s.kind in KINDS and s.detail != "healthy"], now,
                  policy.burst_quiet)


def _burst(sightings: list[Sighting], now: datetime, quiet: timedelta) -> tuple[Sighting, ...]:
    ordered = sorted(sightings, key=lambda s: s.at)
    out: list[Sighting] = []
    edge = now
    for s in reversed(ordered):
        if edge - s.at > quiet:
            break
        out.append(s)
        edge = s.at
    return tuple(reversed(out))


def _remember(history: History, s: Sighting, now: datetime, policy: XidPolicy) -> History:
    return remember(history, s, now, policy.keep, KINDS)


__all__ = ["APP_THRESHOLD", "APP_WINDOW", "BURST_QUIET", "DEFINITION", "HANDLER", "KINDS", "XidPolicy", "decide",
           "evaluate"]
