"""Alertmanager alert → FaultEvent: the label mapping of DESIGN.md §5 and the idempotency key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from remediator.contracts import AlertmanagerAlert
from remediator.ingest.alerts import AlertError, alert_event_id, alert_to_event, canonical_time

RECEIVED = datetime(2024, 5, 1, 3, 12, 30, tzinfo=UTC)


def alert(labels: dict[str, str], *, status: str = "firing", fp: str = "c0ffee0123456789",
          starts: str = "2024-05-01T03:12:00Z", ends: str = "0001-01-01T00:00:00Z",
          annotations: dict[str, str] | None = None) -> AlertmanagerAlert:
    base = {"alertname": "GPUXidError", "err_code": "79", "instance": "10.0.3.7:9400", "job": "dcgm-exporter"}
    return AlertmanagerAlert.model_validate({
        "status": status, "labels": {**base, **labels}, "startsAt": starts, "endsAt": ends,
        "annotations": annotations if annotations is not None else {"summary": "Xid 79 on GPU 0"},
        "fingerprint": fp, "generatorURL": "",
    })


def event(labels: dict[str, str], **kw: Any) -> Any:
    ev = alert_to_event(alert(labels, **kw), RECEIVED)
    assert ev is not None
    return ev


@pytest.mark.parametrize(("labels", "node"), [
    pytest.param({"node": "gpu-a", "Hostname": "gpu-b", "hostname": "gpu-c"}, "gpu-a", id="node-first"),
    pytest.param({"Hostname": "gpu-b", "hostname": "gpu-c"}, "gpu-b", id="Hostname-older-exporters"),
    pytest.param({"hostname": "gpu-c"}, "gpu-c", id="hostname-newer-exporters"),
    pytest.param({"hostname": "gpu-7.rack-3.example"}, "gpu-7.rack-3.example", id="dotted-fqdn"),
])
def test_node_comes_from_node_then_Hostname_then_hostname(labels: dict[str, str], node: str) -> None:
    assert event(labels).node == node


def test_instance_is_never_the_node() -> None:
    with pytest.raises(AlertError) as err:
        alert_to_event(alert({"instance": "gpu-node-1"}), RECEIVED)
    assert err.value.field == "labels.node"


def test_a_node_that_is_not_rfc1123_names_its_label() -> None:
    with pytest.raises(AlertError) as err:
        alert_to_event(alert({"Hostname": "GPU_NODE_1"}), RECEIVED)
    assert err.value.field in ("labels.Hostname", "labels.node")


@pytest.mark.parametrize(("labels", "index"), [
    pytest.param({"gpu": "2", "device": "nvidia3"}, 2, id="gpu-label-wins"),
    pytest.param({"device": "nvidia3"}, 3, id="device-nvidia3"),
    pytest.param({"gpu": "0"}, 0, id="gpu-zero"),
])
def test_gpu_index_from_gpu_else_device(labels: dict[str, str], index: int) -> None:
    ev = event({"node": "gpu-a", **labels})
    assert ev.gpu is not None and ev.gpu.index == index


@pytest.mark.parametrize(("raw", "normalised"), [
    pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml-eight-digit-domain"),
    pytest.param("0000:3b:00.0", "0000:3b:00.0", id="already-normal"),
    pytest.param("0000:AF:00", "0000:af:00.0", id="no-function"),
])
def test_pci_bus_id_is_normalised(raw: str, normalised: str) -> None:
    ev = event({"node": "gpu-a", "pci_bus_id": raw})
    assert ev.gpu is not None and ev.gpu.pci_bus_id == normalised


def test_uuid_label() -> None:
    ev = event({"node": "gpu-a", "UUID": "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6"})
    assert ev.gpu is not None and ev.gpu.uuid == "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6"


@pytest.mark.parametrize(("labels", "code"), [
    pytest.param({"err_code": "48"}, 48, id="err_code"),
    pytest.param({"xid": "63"}, 63, id="xid-label"),
])
def test_xid_code_from_err_code_or_xid(labels: dict[str, str], code: int) -> None:
    base = {"node": "gpu-a"}
    if "xid" in labels:
        base["err_code"] = ""
    ev = event({**base, **labels})
    assert ev.kind == "xid" and ev.code == code


def test_event_fields() -> None:
    ev = event({"node": "gpu-a", "gpu": "1", "err_code": "79"},
               annotations={"summary": "Xid 79 on GPU 1", "description": "GPU fell off the bus"})
    assert ev.id == "alertmanager|c0ffee0123456789|firing|2024-05-01T03:12:00Z"
    assert ev.source == "alertmanager" and ev.is_fatal and not ev.is_healthy
    assert ev.observed_at == datetime(2024, 5, 1, 3, 12, tzinfo=UTC) and ev.received_at == RECEIVED
    assert ev.message == "Xid 79 on GPU 1 | GPU fell off the bus"
    assert ev.labels["instance"] == "10.0.3.7:9400" and ev.labels["err_code"] == "79"


def test_resolved_is_healthy_and_observed_at_its_end_or_when_received() -> None:
    ended = event({"node": "gpu-a"}, status="resolved", ends="2024-05-01T04:00:00Z")
    assert ended.is_healthy and not ended.is_fatal
    assert ended.id == "alertmanager|c0ffee0123456789|resolved|2024-05-01T03:12:00Z"
    assert ended.observed_at == datetime(2024, 5, 1, 4, tzinfo=UTC)
    zero = event({"node": "gpu-a"}, status="resolved")  # Alertmanager's zero endsAt: unknown
    assert zero.observed_at == RECEIVED


def test_an_alert_without_a_gpu_signal_is_not_an_event() -> None:
    watchdog = AlertmanagerAlert.model_validate({
        "status": "firing", "labels": {"alertname": "Watchdog", "severity": "none"},
        "startsAt": "2024-05-01T03:12:00Z", "fingerprint": "aaaa"})
    assert alert_to_event(watchdog, RECEIVED) is None


@pytest.mark.parametrize(("when", "text"), [
    pytest.param(datetime(2024, 5, 1, 3, 12, tzinfo=UTC), "2024-05-01T03:12:00Z", id="whole-seconds"),
    pytest.param(datetime(2024, 5, 1, 3, 12, 0, 250000, tzinfo=UTC), "2024-05-01T03:12:00.25Z", id="fraction"),
    pytest.param(datetime(2024, 5, 1, 5, 12, tzinfo=timezone(timedelta(hours=2))), "2024-05-01T03:12:00Z",
                 id="offset-to-utc"),
])
def test_canonical_start_time(when: datetime, text: str) -> None:
    assert canonical_time(when) == text


def test_the_same_instant_written_two_ways_is_one_id() -> None:
    a = alert({"node": "gpu-a"}, starts="2024-05-01T03:12:00.123456789Z")
    b = alert({"node": "gpu-a"}, starts="2024-05-01T05:12:00.123456+02:00")
    assert alert_event_id(a.fingerprint, a.status, a.startsAt) == alert_event_id(b.fingerprint, b.status, b.startsAt)
    assert alert_event_id(a.fingerprint, a.status, a.startsAt).endswith("|2024-05-01T03:12:00.123456Z")


def test_scrape_job_is_not_the_workload_job() -> None:
    """An alert's ``job`` is Prometheus' scrape job; the workload comes from dcgm-exporter's pod mapping."""
    from remediator.ingest.alerts import event_labels

    labels = event_labels({"job": "dcgm-exporter", "exported_pod": "train-a-0", "exported_namespace": "ml",
                           "Hostname": "gpu-node-1"})
    assert "job" not in labels and labels["scrape_job"] == "dcgm-exporter"
    assert labels["pod"] == "train-a-0" and labels["namespace"] == "ml"
