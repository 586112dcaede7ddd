"""The ECC handler: DCGM/NVML memory-error values into memory playbooks (gpu-faults.md §2, DESIGN.md §6).

Where it sits: dispatch calls ``decide`` for events of kind ``ecc`` with the node's history (KV
``node.<node>``, shared with the Xid handler, so an Xid 48 and a DBE value on the same GPU are one incident).

Event conventions (what the node agent and ingest publish):

* ``kind="ecc"``, ``gpu`` set (a value without a GPU is recorded, not acted on).
* ``code`` names the value, one of the strings below; the DCGM field id (int) or DCGM field name is accepted
  as an alias and folded onto the same name.
* ``labels["value"]``: the value as a decimal string (a counter's current reading, or ``1``/``0`` for a flag).
  A missing or unreadable value on an alert means "the condition holds" (``1``) and the reason says so.
* ``is_healthy=True`` reports a cleared flag; it is recorded, never acted on.

Codes (DCGM field and id in brackets) and what each calls for:

* ``dbe_volatile`` (ECC_DBE_VOL_TOTAL, 311): > 0 → ``gpu-memory-fatal`` (isolate + reset).
* ``dbe_aggregate`` (ECC_DBE_AGG_TOTAL, 313): a rise over the last reading → ``gpu-memory-fatal``; the first
  reading is the baseline.
* ``sbe_volatile`` / ``sbe_aggregate`` (310 / 312): rate over the threshold → watch → ``ecc-correctable-rate``.
* ``row_remap_pending`` (ROW_REMAP_PENDING, 396): 1 → ``row-remap-pending``, labelled ``reset_when=idle``.
* ``retired_pages_pending`` (RETIRED_PENDING, 392): 1 → ``row-remap-pending`` (a reset activates it).
* ``row_remap_failure`` (ROW_REMAP_FAILURE, 395), ``retirement_failure`` (Xid 64 pre-Ampere, NVML
  DramRetirementFailure), ``sram_threshold_exceeded`` (THRESHOLD_SRM, 346): 1 →
  ``memory-retirement-failure`` (isolate, escalate for replacement).
* ``retired_pages_dbe`` / ``retired_pages_sbe`` (391 / 390): both together at or over the limit →
  ``memory-retirement-failure``.
* ``retired_pages_limit`` (DCGM_FR_RETIRED_PAGES_LIMIT / _DBE_LIMIT): 1 → ``memory-retirement-failure``.
* ``uncontained_error`` (DCGM_FR_UNCONTAINED_ERROR): 1 → ``gpu-memory-fatal``.
* ``remapped_rows_uncorrectable`` / ``remapped_rows_correctable`` (393 / 394), ``bank_remap_avail_none``
  (389): recorded for the trend.

DCGM health-watch codes (``DCGM_FR_*``) are aliases too: VOLATILE_DBE_DETECTED → ``dbe_volatile``,
VOLATILE_SBE_DETECTED → ``sbe_volatile``, PENDING_ROW_REMAP → ``row_remap_pending``, ROW_REMAP_FAILURE →
``row_remap_failure``, PENDING_PAGE_RETIREMENTS → ``retired_pages_pending``, SRAM_THRESHOLD →
``sram_threshold_exceeded``. The node agent (``remediator.agent.nvml_poller``) sends our names with
``labels["value"]`` and ``labels["previous"]``, on change only.

The correctable-error rule: the rate is the counter's rise over ``sbe_rate_window`` (the reading at the
window's start is the last one at or before it; after a counter reset only readings after the reset count).
When the rate first reaches ``sbe_rate_per_min`` a watch starts; if it is still at or over the threshold
``sbe_watch`` later, the handler decides ``ecc-correctable-rate``; a reading under the threshold ends the
watch. Defaults are heuristics (no source gives a number): 10 per minute over an hour, watched for 30
minutes. The retired-page limit defaults to 60 of the 64 pages a pre-Ampere frame buffer can retire.
All of these are an ``EccPolicy``, which ``decide`` takes as its fourth argument; the registry binds one to
``DEFINITION`` (``handlers.build_registry``), the service from its ``ecc_*`` and ``incident_ttl_s`` settings;
tests call ``decide`` with any policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from handlers.base import HandlerDefinition, History, Sighting, Verdict
from handlers.incidents import (
    INCIDENT_TTL,
    SEVERITY,
    Proposal,
    covering_incident,
    evidence_of,
    evidence_of_sighting,
    expire_incidents,
    gpu_key_of,
    group_for,
    remember,
    settle,
)
from remediator.contracts import FaultEvent

HANDLER = "ecc"
KINDS = ("ecc",)

SBE_RATE_PER_MIN = 10.0
SBE_RATE_WINDOW = timedelta(hours=1)
SBE_WATCH = timedelta(minutes=30)
SBE_MIN_SPAN = timedelta(minutes=1)
RETIRED_PAGES_LIMIT = 60

_WATCH = "sbe_watch"

_ALIASES: dict[str, tuple[int | str, ...]] = {
    "dbe_volatile": (311, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "uncorrectable_volatile", "DCGM_FR_VOLATILE_DBE_DETECTED"),
    "dbe_aggregate": (313, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "uncorrectable_aggregate"),
    "sbe_volatile": (310, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "correctable_volatile", "DCGM_FR_VOLATILE_SBE_DETECTED"),
    "sbe_aggregate": (312, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "correctable_aggregate"),
    "row_remap_pending": (396, "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FR_PENDING_ROW_REMAP"),
    "row_remap_failure": (395, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED",
                          "DCGM_FR_ROW_REMAP_FAILURE"),
    "retired_pages_pending": (392, "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
                              "DCGM_FR_PENDING_PAGE_RETIREMENTS"),
    "retired_pages_limit": ("DCGM_FR_RETIRED_PAGES_LIMIT", "DCGM_FR_RETIRED_PAGES_DBE_LIMIT"),
    "uncontained_error": ("DCGM_FR_UNCONTAINED_ERROR",),
    "retired_pages_dbe": (391, "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"),
    "retired_pages_sbe": (390, "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"),
    "retirement_failure": ("retired_pages_failure", "dram_retirement_failure"),
    "sram_threshold_exceeded": (346, "DCGM_FI_DEV_THRESHOLD_SRM", "DCGM_FI_DEV_SRAM_EXCEEDED",
                                "DCGM_FR_SRAM_THRESHOLD"),
    "bank_remap_avail_none": (389, "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE", "DCGM_FI_DEV_BANK_REMAP_AVAIL_NONE"),
    "remapped_rows_uncorrectable": (393, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    "remapped_rows_correctable": (394, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                                  "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
}
_CANONICAL: dict[int | str, str] = {}
for _name, _aliases in _ALIASES.items():
    _CANONICAL[_name] = _name
    for _alias in _aliases:
        _CANONICAL[_alias.lower() if isinstance(_alias, str) else _alias] = _name

ECC_CODES: tuple[str, ...] = tuple(_ALIASES)

_FLAG_PLAYBOOKS = {
    "row_remap_pending": ("row-remap-pending", "a row remap is pending and needs a GPU reset, done when idle"),
    "retired_pages_pending": ("row-remap-pending", "a page retirement is pending and a GPU reset activates it"),
    "row_remap_failure": ("memory-retirement-failure", "row remapping failed, an RMA criterion"),
    "retirement_failure": ("memory-retirement-failure", "page retirement failed, an RMA criterion"),
    "sram_threshold_exceeded": ("memory-retirement-failure",
                                "the SRAM error threshold is exceeded, which calls for field diag and RMA"),
    "retired_pages_limit": ("memory-retirement-failure", "DCGM reports the retired-page limit reached, an RMA "
                            "criterion"),
    "uncontained_error": ("gpu-memory-fatal", "DCGM reports an uncontained memory error, so it is isolated "
                          "and reset"),
}


@dataclass(frozen=True)
class EccPolicy:
    """The ECC handler's parameters; the defaults are the module constants."""

    sbe_rate_per_min: float = SBE_RATE_PER_MIN
    sbe_rate_window: timedelta = SBE_RATE_WINDOW
    sbe_watch: timedelta = SBE_WATCH
    sbe_min_span: timedelta = SBE_MIN_SPAN
    retired_pages_limit: int = RETIRED_PAGES_LIMIT
    incident_ttl: timedelta = INCIDENT_TTL

    @property
    def keep(self) -> timedelta:
        return max(self.sbe_rate_window, self.sbe_watch, timedelta(hours=24))


def canonical_code(code: int | str | None) -> str | None:
    """Our name for an ECC value (``dbe_volatile``, ...), from our name, a DCGM field id or name; else None."""
    if code is None:
        return None
    key: int | str = code.strip().lower() if isinstance(code, str) else code
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    return _CANONICAL.get(key)


def decide(event: FaultEvent, history: History, now: datetime, policy: EccPolicy) -> Verdict:
    """Decide on one ECC value under ``policy``: pure, ``now`` is the only clock."""
    history = expire_incidents(history, now, policy.incident_ttl)
    code = canonical_code(event.code)
    gpu = gpu_key_of(event)
    value, assumed = _value(event)
    name = code or str(event.code)
    h = _remember(history, Sighting(event.id, "ecc", name, gpu, now, "", f"v={value}"), now, policy)
    where = f"GPU {gpu or '?'} on {event.node}"
    if code is None:
        return Verdict(None, h, f"unknown ECC value {event.code!r} on {where} recorded; no rule for it")
    if event.is_healthy:
        return Verdict(None, h, f"{code} on {where} reported healthy; recorded")
    if not gpu:
        return Verdict(None, h, f"{code}={value} on {event.node} recorded; it names no GPU to act on")
    shown = f"{code}={value}" + (" (no value given; the firing alert is taken as 1)" if assumed else "")

    if code == "dbe_volatile":
        if value <= 0:
            return Verdict(None, h, f"{shown} on {where} recorded; no uncorrectable errors")
        return _propose(event, h, now, "gpu-memory-fatal",
                        f"{where} has {value} uncorrectable (double-bit) ECC errors since the last driver load, "
                        "so it is isolated and reset", f"{shown}")
    if code == "dbe_aggregate":
        prev = _previous(history, code, gpu)
        if prev is None and not assumed:
            return Verdict(None, h, f"{shown} on {where} recorded as the baseline of the lifetime DBE counter")
        if prev is not None and value <= prev[1]:
            return Verdict(None, h, f"{shown} on {where} recorded; the lifetime DBE counter did not rise")
        rise = value - prev[1] if prev is not None else value
        return _propose(event, h, now, "gpu-memory-fatal",
                        f"the lifetime uncorrectable ECC counter of {where} rose by {rise} to {value}",
                        f"{shown}, previous {prev[1] if prev else 'unknown'}")
    if code in _FLAG_PLAYBOOKS:
        if value <= 0:
            return Verdict(None, h, f"{shown} on {where} recorded; flag not set")
        playbook, why = _FLAG_PLAYBOOKS[code]
        labels = {"reset_when": "idle"} if playbook == "row-remap-pending" else {}
        return _propose(event, h, now, playbook, f"on {where} {why}", shown, labels)
    if code in ("retired_pages_dbe", "retired_pages_sbe"):
        other = "retired_pages_sbe" if code == "retired_pages_dbe" else "retired_pages_dbe"
        prev_other = _previous(history, other, gpu)
        total = value + (prev_other[1] if prev_other else 0)
        if total < policy.retired_pages_limit:
            return Verdict(None, h, f"{shown} on {where} recorded; {total} retired pages in all, under the "
                                    f"limit of {policy.retired_pages_limit}")
        return _propose(event, h, now, "memory-retirement-failure",
                        f"{where} has {total} retired pages, at or over the limit of "
                        f"{policy.retired_pages_limit}, an RMA criterion",
                        f"{shown}, {other}={prev_other[1] if prev_other else 0}")
    if code in ("sbe_volatile", "sbe_aggregate"):
        return _correctable(event, code, value, h, now, policy, gpu, where)
    return Verdict(None, h, f"{shown} on {where} recorded for the trend; no action")


evaluate = decide  # the name tests and tools have called it by

DEFINITION = HandlerDefinition(HANDLER, frozenset(KINDS), decide, EccPolicy)


def _correctable(event: FaultEvent, code: str, value: int, h: History, now: datetime, policy: EccPolicy,
                 gpu: str, where: str) -> Verdict:
    rate = _rate(h, code, gpu, now, policy)
    watch = _latest(h, _WATCH, gpu)
    active = watch is not None and watch.detail == "start"
    if rate is None:
        return Verdict(None, h, f"{code}={value} on {where} recorded; not enough readings for a rate yet")
    per_min, span = rate
    shown = (f"{code}={value}, {per_min:.2f}/min over {span.total_seconds() / 60:g} min "
             f"(threshold {policy.sbe_rate_per_min:g}/min)")
    if per_min < policy.sbe_rate_per_min:
        if active:
            h = _mark(h, event, now, gpu, "clear", policy)
            return Verdict(None, h, f"correctable ECC rate on {where} fell under the threshold ({shown}); "
                                    "watch ended")
        return Verdict(None, h, f"correctable ECC rate on {where} recorded ({shown})")
    group = group_for("ecc-correctable-rate", event.node, event.gpu)
    cover = covering_incident(h, group)
    if cover is not None and SEVERITY[cover.playbook] >= SEVERITY["ecc-correctable-rate"]:
        return _propose(event, h, now, "ecc-correctable-rate", f"correctable ECC rate on {where} is high", shown)
    if not active or watch is None:
        h = _mark(h, event, now, gpu, "start", policy)
        return Verdict(None, h, f"correctable ECC rate on {where} is over the threshold ({shown}); watching for "
                                f"{policy.sbe_watch.total_seconds() / 60:g} min before acting")
    watched = now - watch.at
    if watched < policy.sbe_watch:
        return Verdict(None, h, f"correctable ECC rate on {where} still over the threshold ({shown}); watched "
                                f"{watched.total_seconds() / 60:g} of {policy.sbe_watch.total_seconds() / 60:g} min")
    h = _mark(h, event, now, gpu, "decided", policy)
    return settle(event, h, now, Proposal(
        HANDLER, "ecc-correctable-rate", event.node, event.gpu, group,
        f"the correctable ECC error rate of {where} stayed over the threshold for "
        f"{watched.total_seconds() / 60:g} min, an early sign of failing memory",
        (evidence_of(event, shown), evidence_of_sighting(watch, "watch started")), None))


def _rate(h: History, code: str, gpu: str, now: datetime, policy: EccPolicy) -> tuple[float, timedelta] | None:
    readings = sorted(((s.at, _parse(s.detail)) for s in h.sightings
                       if s.kind == "ecc" and s.code == code and s.gpu == gpu), key=lambda r: r[0])
    # A counter that went down was reset (GPU reset, driver reload): only what follows the reset counts.
    for i in range(len(readings) - 1, 0, -1):
        if readings[i][1] < readings[i - 1][1]:
            readings = readings[i:]
            break
    if len(readings) < 2:
        return None
    start = now - policy.sbe_rate_window
    before = [r for r in readings if r[0] <= start]
    base_at, base_value = (start, before[-1][1]) if before else readings[0]
    span = now - base_at
    if span < policy.sbe_min_span:
        return None
    return (readings[-1][1] - base_value) / (span.total_seconds() / 60), span


def _previous(history: History, code: str, gpu: str) -> tuple[datetime, int] | None:
    s = _latest(history, code, gpu)
    return None if s is None else (s.at, _parse(s.detail))


def _latest(history: History, code: str, gpu: str) -> Sighting | None:
    return next((s for s in reversed(history.sightings) if s.kind == "ecc" and s.code == code and s.gpu == gpu),
                None)


def _mark(h: History, event: FaultEvent, now: datetime, gpu: str, what: str, policy: EccPolicy) -> History:
    return _remember(h, Sighting(event.id, "ecc", _WATCH, gpu, now, "", what), now, policy)


def _value(event: FaultEvent) -> tuple[int, bool]:
    raw = event.labels.get("value", "").strip()
    try:
        return int(float(raw)), False
    except ValueError:
        return 1, True


def _parse(detail: str) -> int:
    try:
        return int(detail.removeprefix("v="))
    except ValueError:
        return 0


def _propose(event: FaultEvent, h: History, now: datetime, playbook: str, reason: str, shown: str,
             labels: dict[str, str] | None = None) -> Verdict:
    return settle(event, h, now, Proposal(HANDLER, playbook, event.node, event.gpu,
                                          group_for(playbook, event.node, event.gpu), reason,
                                          (evidence_of(event, shown),), None, labels or {}))


def _remember(history: History, s: Sighting, now: datetime, policy: EccPolicy) -> History:
    return remember(history, s, now, policy.keep, KINDS)


__all__ = ["DEFINITION", "ECC_CODES", "HANDLER", "KINDS", "EccPolicy", "canonical_code", "decide", "evaluate"]
