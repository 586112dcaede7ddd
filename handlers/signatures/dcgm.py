"""dcgm-exporter signatures: metric series lines, DCGM health codes, and Alertmanager alert labels.

Where it sits: ``handlers.signatures.classify_line`` calls ``classify_dcgm_series`` for Prometheus text
lines (``DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-...",...} 79``) and DCGM health-watch lines
(``DCGM_FR_*``); ingest (``POST /v1/alertmanager``) and ``remediator classify`` use ``signal_from_alert``,
``node_from_alert_labels`` and ``gpu_from_alert_labels`` on alerts, and ``alerts_in_payload`` to pull the
alerts out of a webhook payload. gpu-faults.md §2.5, §2.6 and §6 and DESIGN.md §5 give the rules:

* node <- ``node``, else ``Hostname`` (exporters before May 2026), else ``hostname``; never ``instance``;
* GPU index <- ``gpu``, else the number in ``device`` (``nvidia3``); uuid <- ``UUID`` (``uuid`` with the old
  namespace, ``gpu_uuid`` on NVLink metrics); PCI <- ``pci_bus_id``, normalised; MIG <- ``GPU_I_ID`` and
  ``GPU_I_PROFILE``; workload <- ``exported_pod`` over ``pod``;
* Xid <- the ``xid`` or ``err_code`` label (else the value of ``DCGM_FI_DEV_XID_ERRORS``);
* ECC, row-remap, page-retirement, memory and thermal alerts by DCGM metric name, else by alert name;
* a zero value is not a fault, and an alert with no GPU signal gives None.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from handlers.signatures.kernel import xid_signal
from handlers.signatures.model import Signal, freeze, pci_or_none, to_int


@dataclass(frozen=True, slots=True)
class MetricRule:
    """What a non-zero value of one DCGM field means."""

    kind: str
    playbook: str | None
    is_fatal: bool = False


_ECC_DBE = MetricRule("ecc", "gpu-memory-fatal", True)
_ECC_SBE = MetricRule("ecc", "ecc-correctable-rate")
_ECC_COUNT = MetricRule("ecc", None)
_REMAP_PENDING = MetricRule("ecc", "row-remap-pending", True)
_REMAP_FAILED = MetricRule("ecc", "memory-retirement-failure", True)

# dcgm-exporter (legacy) names and the new DCGM names, gpu-faults.md §2.5.
METRICS: dict[str, MetricRule] = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _ECC_DBE,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _ECC_SBE,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_RETIRED_SBE": _ECC_COUNT,
    "DCGM_FI_DEV_RETIRED_DBE": _ECC_COUNT,
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_RETIRED_PENDING": _REMAP_PENDING,
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": _REMAP_PENDING,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _ECC_COUNT,
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _ECC_COUNT,
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": _ECC_COUNT,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _REMAP_FAILED,
    "DCGM_FI_DEV_ROW_REMAP_FAILED": _REMAP_FAILED,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": _REMAP_PENDING,
    "DCGM_FI_DEV_THRESHOLD_SRM": _REMAP_FAILED,
    "DCGM_FI_DEV_SRAM_EXCEEDED": _REMAP_FAILED,
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE": _ECC_COUNT,
    "DCGM_FI_DEV_BANK_REMAP_AVAIL_NONE": _ECC_COUNT,
    "DCGM_FI_DEV_THERMAL_VIOLATION": MetricRule("thermal", None),
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": MetricRule("health_check", "gpu-reset", True),
}
_XID_METRICS = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "DCGM_EXP_XID_ERRORS_COUNT",
                          "DCGM_FI_DEV_XID_ERRORS_ACTIVE"})
# Metrics that describe state but are no fault by their value alone; as an alert they mean the named kind.
_ALERT_ONLY: dict[str, MetricRule] = {
    "DCGM_FI_DEV_FB_USED": MetricRule("memory_leak", "memory-leak"),
    "DCGM_FI_DEV_FB_FREE": MetricRule("memory_leak", "memory-leak"),
    "DCGM_FI_DEV_GPU_TEMP": MetricRule("thermal", None),
    "DCGM_FI_DEV_MEMORY_TEMP": MetricRule("thermal", None),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": MetricRule("thermal", None),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": MetricRule("thermal", None),
}
_CLOCK_REASONS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
# Clock event reasons that are thermal: SW thermal (0x20), HW thermal (0x40), HW slowdown (0x8).
_THERMAL_REASONS = 0x20 | 0x40 | 0x08

# DCGM health/diagnostic failure codes (DCGM_FR_*), gpu-faults.md §2.5.
_HEALTH: dict[str, MetricRule] = {
    "DCGM_FR_VOLATILE_DBE_DETECTED": _ECC_DBE,
    "DCGM_FR_VOLATILE_SBE_DETECTED": _ECC_SBE,
    "DCGM_FR_PENDING_PAGE_RETIREMENTS": _REMAP_PENDING,
    "DCGM_FR_RETIRED_PAGES_LIMIT": _REMAP_FAILED,
    "DCGM_FR_RETIRED_PAGES_DBE_LIMIT": _REMAP_FAILED,
    "DCGM_FR_PENDING_ROW_REMAP": _REMAP_PENDING,
    "DCGM_FR_ROW_REMAP_FAILURE": _REMAP_FAILED,
    "DCGM_FR_UNCONTAINED_ERROR": MetricRule("ecc", "gpu-memory-fatal", True),
    "DCGM_FR_SRAM_THRESHOLD": _REMAP_FAILED,
    "DCGM_FR_NVLINK_DOWN": MetricRule("health_check", "nvlink", True),
    "DCGM_FR_NVLINK_ERROR_CRITICAL": MetricRule("health_check", "nvlink", True),
    "DCGM_FR_NVLINK_ERROR_THRESHOLD": MetricRule("health_check", "nvlink"),
    "DCGM_FR_SXID_ERROR": MetricRule("sxid", "node-reboot", True),
    "DCGM_FR_GPU_LOST": MetricRule("gpu_lost", "gpu-lost", True),
    "DCGM_FR_FALLEN_OFF_BUS": MetricRule("gpu_lost", "gpu-lost", True),
    "DCGM_FR_TEMP_VIOLATION": MetricRule("thermal", None),
    "DCGM_FR_THERMAL_VIOLATIONS": MetricRule("thermal", None),
    "DCGM_FR_THERMAL_VIOLATIONS_TS": MetricRule("thermal", None),
    "DCGM_FR_CLOCK_THROTTLE_THERMAL": MetricRule("thermal", None),
    "DCGM_FR_CLOCKS_EVENT_THERMAL": MetricRule("thermal", None),
}

_SERIES_RE = re.compile(r"\b(?P<name>DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*\"((?:[^\"\\]|\\.)*)\"")
_HEALTH_RE = re.compile(r"\b(DCGM_FR_[A-Z0-9_]+)\b")
# "xid=79", "XID 31", "Xid: 48", "xid79", and rendered alert texts "GPU 0 reported XID error 79".
_XID_NUM_RE = re.compile(r"\bxid(?:\s+errors?)?\s*[:=# ]\s*(\d{1,4})\b|\bxid(\d{1,4})\b", re.IGNORECASE)
# The GPU a DCGM health message names (NVSentinel condition text: "ErrorCode:DCGM_FR_XID_ERROR GPU:4
# PCI:0000:c4:00.0 GPU_UUID:GPU-d181...").
_HEALTH_GPU_RE = re.compile(r"\bGPU\s*[:=]\s*(\d{1,3})\b")
_HEALTH_PCI_RE = re.compile(r"\bPCI\s*[:=]\s*([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
_DEVICE_NUM_RE = re.compile(r"^nvidia(\d+)$", re.IGNORECASE)
_UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}")


# --- series lines ----------------------------------------------------------------------------------


def parse_labels(body: str) -> dict[str, str]:
    """Prometheus label pairs ``a="x",b="y"`` as a dict (escapes undone)."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL_RE.findall(body)}


def _float(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return None if math.isnan(value) else value


_SERIES_START_RE = re.compile(r"^\s*(?:#\s*(?:HELP|TYPE)\s+)?DCGM_(?:FI|EXP)_[A-Z0-9_]+\s*(?:\{|\s)")
_SERIES_NAMES = frozenset(METRICS) | _XID_METRICS | {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                                                      "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}


def is_series_line(text: str) -> bool:
    """True for a Prometheus exposition line of a DCGM metric (or its ``# HELP``/``# TYPE`` line)."""
    return _SERIES_START_RE.match(text) is not None


def series_is_state(raw: bytes) -> bool:
    """True for a raw exposition line ``classify_dcgm_series`` gives None for, judged without the parsers.

    What ``LineScanner`` uses to skip the commonest anchored noise of an exporter's scrape: a series line (its
    name first, pure ASCII, no escapes) of a field this family does not judge (utilisation, clocks, power), or
    of a judged one at zero. Anything else -- a judged field with a value, a ``# HELP`` line, a line that
    only mentions a field -- is False and is parsed as usual.
    """
    if not raw.startswith(b"DCGM_") or not raw.isascii() or b"\\" in raw:
        return False
    m = _SERIES_RE.match(raw.decode())  # the match classify_dcgm_series's search finds first, when at 0
    if m is None:
        return False
    if m.group("name") not in _SERIES_NAMES:
        return True
    value = _float(m.group("value"))
    return value is None or value == 0


def classify_dcgm_series(text: str) -> Signal | None:
    """The signal in one dcgm-exporter series line or DCGM health line; None for zero values."""
    if "DCGM_" not in text and "dcgm_" not in text:
        return None
    m = _SERIES_RE.search(text)
    if m is not None and not text.lstrip().startswith("#"):
        name = m.group("name")
        if name not in _SERIES_NAMES:
            return None  # utilisation, clocks, power, memory in use: state, not a fault
        value = _float(m.group("value"))
        if value is None or value == 0:
            return None
        return _metric_signal(name, parse_labels(m.group("labels") or ""), value, series=True)
    h = _HEALTH_RE.search(text)
    if h is not None:
        return _health_signal(h.group(1), text)
    return None


def _as_int(value: float | None) -> int:
    return int(value) if value is not None and math.isfinite(value) else 0


def _metric_signal(name: str, labels: Mapping[str, str], value: float | None, *, series: bool) -> Signal | None:
    if name in _XID_METRICS:
        code = to_int(labels.get("xid") or labels.get("err_code"))
        if code is not None and code < 0:
            code = None
        if code is None and name != "DCGM_EXP_XID_ERRORS_COUNT" and value is not None and value >= 1:
            code = _as_int(value)
        if code is None or code == 0:
            return None
        return _with_gpu(xid_signal(code, extra=_label_detail(labels, name, value)), labels)
    rule = METRICS.get(name)
    if rule is None and not series:
        rule = _ALERT_ONLY.get(name)
    if rule is None and series and name in _CLOCK_REASONS and _as_int(value) & _THERMAL_REASONS:
        rule = _ALERT_ONLY[name]
    if rule is None:
        return None
    playbook = rule.playbook
    if name == "DCGM_FI_DEV_GPU_RECOVERY_ACTION" and value is not None:
        playbook = "node-reboot" if _as_int(value) in (2, 5, 6, 7) else "gpu-reset"
    sig = Signal(kind=rule.kind, code=name, playbook=playbook, is_fatal=rule.is_fatal,
                 detail=freeze(_label_detail(labels, name, value)))
    return _with_gpu(sig, labels)


def _health_signal(code: str, text: str) -> Signal | None:
    if code == "DCGM_FR_OK":
        return None
    rule = _HEALTH.get(code)
    if code in ("DCGM_FR_XID_ERROR", "DCGM_FR_XID"):
        x = _XID_NUM_RE.search(text)
        if x is None:
            return _health_gpu(Signal(kind="health_check", code=code, playbook="unknown-xid", is_fatal=True), text)
        return _health_gpu(xid_signal(int(x.group(1) or x.group(2)), extra={"dcgm_health": code}), text)
    detail: dict[str, object] = {"dcgm_health": code}
    action = re.search(r"recommended\s+action\s*=\s*([A-Z_]+)", text, re.IGNORECASE)
    if action is not None:
        detail["recommended_action"] = action.group(1)
    if rule is None:
        return _health_gpu(Signal(kind="health_check", code=code, detail=freeze(detail)), text)
    return _health_gpu(Signal(kind=rule.kind, code=code, playbook=rule.playbook, is_fatal=rule.is_fatal,
                              detail=freeze(detail)), text)


def _health_gpu(sig: Signal, text: str) -> Signal:
    """``sig`` with the GPU index, PCI id and UUID that a DCGM health message names, where it names them."""
    uuid = _UUID_RE.search(text)
    pci = _HEALTH_PCI_RE.search(text)
    index = _HEALTH_GPU_RE.search(text)
    if uuid is None and pci is None and index is None:
        return sig
    return Signal(kind=sig.kind, code=sig.code, xid=sig.xid,
                  pci_bus_id=sig.pci_bus_id or (pci_or_none(pci.group(1)) if pci else None),
                  gpu_index=sig.gpu_index if sig.gpu_index is not None else (int(index.group(1)) if index else None),
                  gpu_uuid=sig.gpu_uuid or (uuid.group(0) if uuid else None), action=sig.action,
                  playbook=sig.playbook, is_fatal=sig.is_fatal, detail=sig.detail)


# --- alert labels ----------------------------------------------------------------------------------


def node_from_alert_labels(labels: Mapping[str, str]) -> str | None:
    """The Kubernetes node of an alert: ``node``, else ``Hostname``, else ``hostname``; never ``instance``."""
    for key in ("node", "Hostname", "hostname"):
        value = labels.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def gpu_from_alert_labels(labels: Mapping[str, str]) -> tuple[int | None, str | None, str | None]:
    """``(index, uuid, pci_bus_id)`` of an alert's GPU; index from ``gpu`` or ``device`` ``nvidiaN``."""
    raw = (labels.get("gpu") or "").strip()
    index = int(raw) if raw.isascii() and raw.isdigit() else None
    if index is None:
        m = _DEVICE_NUM_RE.match((labels.get("device") or "").strip())
        index = int(m.group(1)) if m else None
    uuid = None
    for key in ("UUID", "uuid", "gpu_uuid"):
        value = (labels.get(key) or "").strip()
        if value:
            uuid = value
            break
    pci = pci_or_none((labels.get("pci_bus_id") or "").strip() or None)
    return index, uuid, pci


def _with_gpu(sig: Signal, labels: Mapping[str, str]) -> Signal:
    index, uuid, pci = gpu_from_alert_labels(labels)
    return Signal(kind=sig.kind, code=sig.code, xid=sig.xid, pci_bus_id=pci or sig.pci_bus_id,
                  gpu_index=index if index is not None else sig.gpu_index, gpu_uuid=uuid or sig.gpu_uuid,
                  action=sig.action, playbook=sig.playbook, is_fatal=sig.is_fatal, detail=sig.detail)


def _label_detail(labels: Mapping[str, str], metric: str | None, value: float | None) -> dict[str, object]:
    detail: dict[str, object] = {"metric": metric, "value": value}
    for key, out in (("GPU_I_ID", "mig_gi"), ("GPU_I_PROFILE", "mig_profile"), ("modelName", "model"),
                     ("err_msg", "err_msg"), ("alertname", "alertname"), ("namespace", "namespace"),
                     ("container", "container")):
        v = labels.get(key)
        if v:
            detail[out] = to_int(v) if out == "mig_gi" else v
    pod = labels.get("exported_pod") or labels.get("pod_name") or labels.get("pod")
    if labels.get("exported_pod"):
        detail["namespace"] = labels.get("exported_namespace") or detail.get("namespace")
        detail["container"] = labels.get("exported_container") or detail.get("container")
    if pod:
        detail["pod"] = pod
    node = node_from_alert_labels(labels)
    if node:
        detail["node"] = node
    return detail


_GPU_LABELS = ("UUID", "uuid", "gpu_uuid", "gpu", "pci_bus_id", "modelName", "GPU_I_ID", "DCGM_FI_DRIVER_VERSION",
               "err_code", "xid")
_GPU_WORDS = re.compile(r"gpu|dcgm|nvidia|xid|nvlink|cuda|nccl", re.IGNORECASE)
# Alert-name words -> (kind, playbook, fatal), tried in order.
_NAME_RULES: tuple[tuple[re.Pattern[str], str, str | None, bool], ...] = (
    (re.compile(r"fallen.?off|gpu.?(?:is.?)?lost|gpuislost|off.?the.?bus", re.I), "gpu_lost", "gpu-lost", True),
    (re.compile(r"remap\w*.?fail|row.?remap.?failure|retire\w*.?fail|sram.?threshold", re.I), "ecc",
     "memory-retirement-failure", True),
    (re.compile(r"remap\w*.?pending|pending.?remap|retire\w*.?pending|pending.?(?:page|retire)", re.I), "ecc",
     "row-remap-pending", True),
    (re.compile(r"dbe|double.?bit|uncorrect\w*|uncontained", re.I), "ecc", "gpu-memory-fatal", True),
    (re.compile(r"sbe|single.?bit|correctable", re.I), "ecc", "ecc-correctable-rate", False),
    (re.compile(r"ecc|remap|retired", re.I), "ecc", None, False),
    (re.compile(r"leak|orphan|zombie", re.I), "memory_leak", "memory-leak", False),
    (re.compile(r"nccl.?timeout|collective.?timeout|watchdog", re.I), "nccl_timeout", None, False),
    (re.compile(r"temp|thermal|overheat|hot", re.I), "thermal", None, False),
    (re.compile(r"nvlink", re.I), "health_check", "nvlink", False),
)


def signal_from_alert(labels: Mapping[str, str], annotations: Mapping[str, str],
                      value: float | None = None) -> Signal | None:
    """The GPU signal of one Alertmanager alert, or None for non-GPU alerts and zero values.

    An Xid comes from the ``xid``/``err_code`` label; other alerts are recognised by the DCGM metric they
    name (``__name__``, or a ``DCGM_*`` name in the alert name, annotations or expression) and then by the
    alert name. ``value`` is the alert's value where the sender gives one (``0`` means no fault).
    """
    if value is not None and (math.isnan(value) or value == 0):
        return None
    if value is None:
        for key in ("value", "Value", "current_value"):
            v = _float(str(annotations.get(key, "")).strip()) if annotations.get(key) else None
            if v is not None:
                if v == 0:
                    return None
                value = v
                break
    alertname = labels.get("alertname", "")
    code = to_int((labels.get("xid") or labels.get("err_code") or "").strip() or None)
    if code is not None:
        if code <= 0:
            return None
        return _with_gpu(xid_signal(code, extra=_label_detail(labels, "xid", value)), labels)
    texts = [labels.get("__name__", ""), alertname, *(str(v) for v in annotations.values())]
    metrics = [m for t in texts for m in re.findall(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+", t)]
    for name in metrics:
        sig = _metric_signal(name, labels, value, series=False)
        if sig is not None:
            return sig
        if name in _XID_METRICS:
            x = _xid_in_texts(texts)
            if x == 0:
                return None  # "reported XID error 0": the rendered value of a last-Xid gauge back at zero
            if x is not None:
                return _with_gpu(xid_signal(x, extra=_label_detail(labels, name, value)), labels)
    health = [m for t in texts for m in _HEALTH_RE.findall(t)]
    for code_name in health:
        hs = _health_signal(code_name, " ".join(texts))
        if hs is not None:
            return _with_gpu(hs, labels)
    gpu_context = any(labels.get(k) for k in _GPU_LABELS) or bool(_DEVICE_NUM_RE.match(labels.get("device", ""))) \
        or bool(_GPU_WORDS.search(alertname)) or bool(metrics)
    if not gpu_context:
        return None
    if re.search(r"xid", alertname, re.IGNORECASE) or any(m in _XID_METRICS for m in metrics):
        x = _xid_in_texts(texts)
        if x == 0:
            return None  # Xid 0 does not exist: the alert text rendered a zero value
        if x is None:
            return _with_gpu(Signal(kind="health_check", code="xid_unknown", playbook="unknown-xid", is_fatal=True,
                                    detail=freeze(_label_detail(labels, None, value))), labels)
        return _with_gpu(xid_signal(x, extra=_label_detail(labels, None, value)), labels)
    words = " ".join([alertname, annotations.get("summary", ""), annotations.get("description", "")])
    for pattern, kind, playbook, fatal in _NAME_RULES:
        if pattern.search(alertname) or (not alertname and pattern.search(words)):
            return _with_gpu(Signal(kind=kind, code=alertname or kind, playbook=playbook, is_fatal=fatal,
                                    detail=freeze(_label_detail(labels, None, value))), labels)
    return None


def _xid_in_texts(texts: list[str]) -> int | None:
    for t in texts:
        m = _XID_NUM_RE.search(t)
        if m is not None:
            return int(m.group(1) or m.group(2))
    return None


# --- Alertmanager payloads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert of an Alertmanager (or compatible) webhook payload, as classify needs it."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    status: str = "firing"
    value: float | None = None
    expr: str | None = None  # the rule expression, from generatorURL's g0.expr
    fingerprint: str | None = None

    def signal(self) -> Signal | None:
        """``signal_from_alert`` over this alert (its expression counts as an annotation)."""
        annotations = dict(self.annotations)
        if self.expr and "expr" not in annotations:
            annotations["expr"] = self.expr
        return signal_from_alert(self.labels, annotations, self.value)


def is_alert_payload(obj: object) -> bool:
    """True for an Alertmanager webhook payload (or a list of them): a dict with an ``alerts`` list."""
    if isinstance(obj, list):
        return bool(obj) and all(is_alert_payload(o) for o in obj)
    return isinstance(obj, dict) and isinstance(obj.get("alerts"), list)


def alerts_in_payload(payload: object) -> list[Alert]:
    """The alerts of an Alertmanager webhook payload (version 4, tolerant of older and extra fields).

    ``payload`` may be the decoded JSON, its text, or a list of payloads. Labels and annotations are
    merged over the payload's ``commonLabels``/``commonAnnotations`` (older payloads keep some only there).
    Anything that is not a payload gives an empty list.
    """
    if isinstance(payload, (str, bytes)):
        try:
            payload = json.loads(payload)
        except ValueError:
            return []
    if isinstance(payload, list):
        return [a for p in payload for a in alerts_in_payload(p)]
    if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
        return []
    common_labels = _str_map(payload.get("commonLabels"))
    common_ann = _str_map(payload.get("commonAnnotations"))
    out: list[Alert] = []
    for raw in payload["alerts"]:
        if not isinstance(raw, dict):
            continue
        labels = {**common_labels, **_str_map(raw.get("labels"))}
        annotations = {**common_ann, **_str_map(raw.get("annotations"))}
        out.append(Alert(labels=labels, annotations=annotations,
                         status=str(raw.get("status") or payload.get("status") or "firing"),
                         value=_alert_value(raw), expr=_expr(raw.get("generatorURL")),
                         fingerprint=str(raw["fingerprint"]) if raw.get("fingerprint") else None))
    return out


def _str_map(obj: object) -> dict[str, str]:
    if not isinstance(obj, dict):
        return {}
    return {str(k): str(v) for k, v in obj.items() if v is not None}


def _alert_value(raw: Mapping[str, Any]) -> float | None:
    """The value where a sender includes one (Grafana: ``values``/``value``); Alertmanager gives none."""
    v = raw.get("value")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        return _float(v.strip())
    values = raw.get("values")
    if isinstance(values, dict):
        nums = [float(x) for x in values.values() if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if nums:
            return max(nums, key=abs)
    return None


def _expr(url: object) -> str | None:
    if not isinstance(url, str) or "expr=" not in url:
        return None
    try:
        query = parse_qs(urlsplit(url).query)
    except ValueError:
        return None
    exprs = query.get("g0.expr") or next((v for k, v in query.items() if k.endswith("expr")), None)
    return exprs[0] if exprs else None


# --- DCGM's own output: host-engine health watches and dcgmi diag result tables ---------------------

# nv-hostengine: "[[Health]] Detected a WARNING in health system Thermal: 'Detected clocks event due to thermal
# violation in GPU 2. ...'" (the system is a dcgmHealthSystems_t name: PCIe, NVLINK, PMU, MCU, Memory, SM,
# InfoROM, Thermal, Power, Driver, NVSwitch ...; the severity WARNING or FAILURE).
_HEALTH_WATCH_RE = re.compile(
    r"detected\s+an?\s+(?P<sev>warning|failure|error)\s+in\s+health\s+system\s+(?P<system>[A-Za-z]+)\s*:?\s*(?P<msg>.*)",
    re.IGNORECASE | re.DOTALL,
)
_HEALTH_SYSTEM_KIND: dict[str, str] = {"thermal": "thermal", "memory": "ecc", "nvswitch": "sxid"}
_IN_GPU_RE = re.compile(r"\bGPU\s*(?:ID\s*)?[:#]?\s*(\d{1,3})\b", re.IGNORECASE)
# dcgmi diag result rows: "| GPU Memory | Fail - GPU: 0 |", "| Targeted Power | Fail - GPUs: 1, 3 |" (the test
# name is on the row above when the cell is a continuation), "| Memory | Fail - All |", and the deployment
# section's "| Error | GPU 3 has uncorrectable memory errors and row |".
_DIAG_FAIL_RE = re.compile(
    r"^\s*\|\s*(?P<test>[^|]*?)\s*\|\s*fail\s*-\s*(?:gpus?\s*:\s*(?P<gpus>\d+(?:\s*,\s*\d+)*)|(?P<all>all))\s*\|",
    re.IGNORECASE | re.MULTILINE,
)
_DIAG_ERROR_RE = re.compile(r"^\s*\|\s*error\s*\|\s*gpu\s+(?P<gpu>\d+)\s+(?P<msg>[^|]*)\|",
                            re.IGNORECASE | re.MULTILINE)


def classify_dcgm_tool(text: str, low: str | None = None) -> Signal | None:
    """A DCGM host-engine health-watch line or a failing ``dcgmi diag`` result row, or None.

    A continuation row of a diag table (empty first cell) names its test only when the framing layer has
    joined it to the row above (``handlers.signatures.framing``); alone it is still a failure on its GPUs.
    """
    low = text.lower() if low is None else low
    if "health system" in low:
        m = _HEALTH_WATCH_RE.search(text)
        if m is not None:
            system = m.group("system")
            failure = m.group("sev").lower() != "warning"
            msg = m.group("msg").strip(" '`\"")
            g = _IN_GPU_RE.search(msg)
            return Signal(kind=_HEALTH_SYSTEM_KIND.get(system.lower(), "health_check"),
                          code=f"dcgm_health_{system.lower()}", gpu_index=int(g.group(1)) if g else None,
                          is_fatal=failure,
                          detail=freeze({"reporter": "nv-hostengine", "health_system": system,
                                         "severity": m.group("sev").upper(), "message": msg[:512] or None}))
    if "fail" in low:
        f = _DIAG_FAIL_RE.search(text)
        if f is not None:
            gpus = tuple(int(x) for x in re.findall(r"\d+", f.group("gpus") or ""))
            tests = [t.strip() for t in re.findall(r"^\s*\|\s*([^|]*?)\s*\|", text, re.MULTILINE) if t.strip()]
            test = f.group("test") or (tests[-1] if tests else None)
            return Signal(kind="health_check", code="dcgm_diag_fail", gpu_index=gpus[0] if len(gpus) == 1 else None,
                          is_fatal=True,
                          detail=freeze({"reporter": "dcgmi diag", "test": test, "gpus": gpus or None,
                                         "all_gpus": True if f.group("all") else None}))
    if "uncorrectable memory" in low:
        e = _DIAG_ERROR_RE.search(text)
        if e is not None:
            cells = re.findall(r"^\s*\|[^|]*\|([^|]*)\|", text[e.start():], re.MULTILINE)
            message = " ".join(c.strip() for c in cells if c.strip())
            pending = "pending" in low
            return Signal(kind="ecc", code="dcgm_diag_uncorrectable_memory", gpu_index=int(e.group("gpu")),
                          playbook="row-remap-pending" if pending else None, is_fatal=True,
                          detail=freeze({"reporter": "dcgmi diag", "message": message[:512]}))
    return None
