"""One Alertmanager alert → at most one ``FaultEvent`` (DESIGN.md §5).

Where it sits: inside ingest, between the parsed webhook payload and ``bus.publish_event``. What a label
means (node from ``node``/``Hostname``/``hostname`` and never ``instance``; GPU index from ``gpu`` or
``device="nvidia3"``; ``UUID``; ``pci_bus_id`` normalised; Xid from ``xid`` or ``err_code``; which DCGM
metrics and alert names are GPU faults at all) is decided in ``handlers.signatures``, the one place that
knows it; this module only assembles the event and names the label at fault when it cannot.

The event id is ``alertmanager|<fingerprint>|<status>|<startsAt>`` where ``<startsAt>`` is the canonical
RFC 3339 form of the alert's start in UTC (``2024-05-01T03:12:00Z``, ``2024-05-01T03:12:00.25Z``: seconds,
a fraction only when there is one, at most microseconds, ``Z``). Canonical rather than the raw string so
the two members of an Alertmanager HA pair, or a proxy that re-serialises the payload, produce the same id
for the same alert; Go's nanosecond digits beyond the microsecond cannot distinguish two real alerts with
one fingerprint.

The event's ``origin`` is set here, once: the alert's ``fingerprint`` (the Alertmanager id space is
ingest's alone) and the workload's ``pod``/``namespace``/``container`` from dcgm-exporter's Kubernetes
mapping. Nothing downstream parses the fingerprint back out of the id.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

from pydantic import ValidationError

from handlers.signatures import gpu_from_alert_labels, node_from_alert_labels, signal_from_alert
from remediator.contracts import (
    KINDS,
    MESSAGE_MAX,
    AlertmanagerAlert,
    FaultEvent,
    GpuRef,
    Origin,
    bounded_labels,
    truncate,
)

log = logging.getLogger(__name__)

__all__ = ["NODE_LABELS", "AlertError", "alert_event_id", "alert_origin", "alert_to_event", "canonical_time",
           "event_labels"]

# Where the node name may come from, in order (DESIGN.md §5). ``instance`` is the exporter's address.
NODE_LABELS = ("node", "Hostname", "hostname")
_RFC1123 = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# Where a FaultEvent field came from in the alert, to name it in a 422.
_FIELD_ORIGIN = {"id": "fingerprint", "gpu": "labels.gpu", "code": "labels.xid", "message": "annotations",
                 "observed_at": "startsAt"}


class AlertError(ValueError):
    """An alert carries a GPU fault signal but cannot become an event; ``field`` names the culprit.

    ``field`` is relative to the alert (``labels.node``, ``fingerprint``); ingest prefixes ``alerts[i].``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def canonical_time(t: datetime) -> str:
    """``t`` in UTC as RFC 3339 with ``Z``: whole seconds, or the fraction without trailing zeros."""
    u = t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    text = u.replace(tzinfo=None).isoformat()  # YYYY-MM-DDTHH:MM:SS[.ffffff]
    return (text.rstrip("0") if u.microsecond else text) + "Z"


def alert_event_id(fingerprint: str, status: str, starts_at: datetime) -> str:
    """The idempotency key of one alert notification: ``alertmanager|<fingerprint>|<status>|<startsAt>``."""
    return f"alertmanager|{fingerprint}|{status}|{canonical_time(starts_at)}"


def _node(alert: AlertmanagerAlert) -> str:
    node = node_from_alert_labels(alert.labels)
    if not node:
        raise AlertError("labels.node", "no node name in the alert labels (node, Hostname or hostname; "
                                        "instance is the exporter's address, not the node)")
    if len(node) > 253 or not _RFC1123.fullmatch(node):
        source = next((k for k in NODE_LABELS if alert.labels.get(k)), "node")
        raise AlertError(f"labels.{source}", f"{node!r} is not a Kubernetes node name (RFC 1123)")
    return node


def _message(alert: AlertmanagerAlert) -> str:
    parts: list[str] = []
    for key in ("summary", "description", "message"):
        text = alert.annotations.get(key, "").strip()
        if text and text not in parts:
            parts.append(text)
    message = " | ".join(parts) or alert.labels.get("alertname", "")
    return truncate(message, MESSAGE_MAX)


def event_labels(alert_labels: dict[str, str]) -> dict[str, str]:
    """The alert's labels as event labels, with Prometheus' scrape labels kept apart from the workload's.

    In an alert, ``job`` is the Prometheus scrape job (``dcgm-exporter``), not the training job that used
    the GPU; the handlers read ``job`` as the workload (three application Xids in three *different* jobs mean
    hardware), so it moves to ``scrape_job``. dcgm-exporter's pod mapping (``exported_pod``/``pod``,
    ``exported_namespace``/``namespace``) names the workload's pod; where an ``exported_*`` label replaces
    the scrape target's ``pod``/``namespace`` (the exporter's own pod), those move to ``scrape_pod`` and
    ``scrape_namespace``, so dispatch can still tell which exporter pod sent it (``remediator.owners``).
    """
    labels = dict(alert_labels)
    if "job" in labels:
        labels["scrape_job"] = labels.pop("job")
    for ours, theirs in (("pod", "exported_pod"), ("namespace", "exported_namespace"),
                         ("container", "exported_container")):
        if labels.get(theirs):
            if ours != "container" and labels.get(ours) and labels[ours] != labels[theirs]:
                labels[f"scrape_{ours}"] = labels[ours]
            labels[ours] = labels[theirs]
    return labels


def alert_origin(alert: AlertmanagerAlert, labels: dict[str, str]) -> Origin:
    """The event's provenance: the alert's fingerprint, and the workload's pod, namespace and container from
    dcgm-exporter's Kubernetes mapping as ``event_labels`` resolved it (``exported_*`` first). The job is
    left to the resolver (``contracts.resolve_job``): an alert knows no owner reference.
    """
    workload = {k: labels[k] for k in ("pod", "namespace", "container") if labels.get(k)}
    try:
        return Origin(fingerprint=alert.fingerprint, **workload)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0])
        if name == "fingerprint":
            raise AlertError("fingerprint", err["msg"]) from None
        label = f"exported_{name}" if alert.labels.get(f"exported_{name}") else name
        raise AlertError(f"labels.{label}", err["msg"]) from None


def alert_to_event(alert: AlertmanagerAlert, received_at: datetime) -> FaultEvent | None:
    """The ``FaultEvent`` for ``alert``, or None when it carries no GPU fault signal (ingest ignores it).

    A resolved alert becomes an event with ``is_healthy=True``: informative only, a GPU goes back to
    service after our own verification. Raises ``AlertError`` naming the alert field when the alert is a
    GPU fault but cannot be placed (no node label, a node name that is not RFC 1123, an impossible GPU id).
    """
    signal = signal_from_alert(alert.labels, alert.annotations)
    if signal is None:
        return None
    if signal.kind not in KINDS:  # a signature family outgrew the event vocabulary: say so, do not crash
        log.warning("alert %s: signal kind %r is not a FaultEvent kind; ignored", alert.fingerprint, signal.kind)
        return None
    node = _node(alert)
    # signal_from_alert already merged the alert's GPU labels into the signal (labels first); ask the labels
    # again only when the signal carries no GPU identity at all.
    index, uuid, pci = signal.gpu_index, signal.gpu_uuid, signal.pci_bus_id
    if index is None and not uuid and not pci:
        index, uuid, pci = gpu_from_alert_labels(alert.labels)
    try:
        gpu = GpuRef(index=index, uuid=uuid, pci_bus_id=pci) if (index is not None or uuid or pci) else None
    except ValidationError as e:
        raise AlertError("labels.gpu", f"not a GPU identity: {e.errors()[0]['msg']}") from None
    resolved = alert.status == "resolved"
    observed = alert.startsAt
    if resolved:
        ends = alert.endsAt
        # Alertmanager's zero time (0001-01-01) means "unknown": fall back on when we heard of it.
        observed = ends if ends is not None and ends.year > 1 else received_at
    code: int | str | None = signal.xid if signal.kind in ("xid", "sxid") and signal.xid is not None \
        else signal.code
    labels = event_labels(alert.labels)
    origin = alert_origin(alert, labels)
    labels = bounded_labels(labels)  # values cut with a marker: an alert is never refused for its size
    try:
        return FaultEvent(
            id=alert_event_id(alert.fingerprint, alert.status, alert.startsAt),
            source="alertmanager",
            node=node,
            gpu=gpu,
            kind=signal.kind,  # checked against KINDS above
            code=code,
            is_fatal=signal.is_fatal and not resolved,
            is_healthy=resolved,
            message=_message(alert),
            observed_at=observed,
            received_at=received_at,
            labels=labels,
            origin=origin,
            recommended_action=signal.action,
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else ""
        raise AlertError(_FIELD_ORIGIN.get(loc, "labels"), err["msg"]) from None
