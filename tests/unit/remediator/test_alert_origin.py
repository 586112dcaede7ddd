"""Alertmanager alert → the event's typed origin: fingerprint and workload pod, set once by ingest."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from remediator.contracts import AlertmanagerAlert, Origin, resolve_job
from remediator.ingest.alerts import AlertError, alert_to_event

RECEIVED = datetime(2024, 5, 1, 3, 12, 30, tzinfo=UTC)


def alert(fp: str = "c0ffee0123456789", **labels: str) -> AlertmanagerAlert:
    return AlertmanagerAlert.model_validate({
        "status": "firing", "startsAt": "2024-05-01T03:12:00Z", "fingerprint": fp,
        "labels": {"alertname": "GPUXidError", "xid": "79", "Hostname": "gpu-node-1", "gpu": "0",
                   "job": "dcgm-exporter", **labels}})


@pytest.mark.parametrize(("labels", "origin"), [
    pytest.param({}, Origin(fingerprint="c0ffee0123456789"), id="no-pod-mapping"),
    pytest.param({"pod": "trainer-0", "namespace": "ml", "container": "pytorch"},
                 Origin(fingerprint="c0ffee0123456789", pod="trainer-0", namespace="ml", container="pytorch"),
                 id="pod-mapping"),
    pytest.param({"pod": "dcgm-exporter-x7k2p", "namespace": "gpu-operator", "exported_pod": "trainer-0",
                  "exported_namespace": "ml", "exported_container": "pytorch"},
                 Origin(fingerprint="c0ffee0123456789", pod="trainer-0", namespace="ml", container="pytorch"),
                 id="exported-labels-name-the-workload"),
])
def test_every_alert_event_carries_its_fingerprint_and_pod(labels: dict[str, str], origin: Origin) -> None:
    ev = alert_to_event(alert(**labels), RECEIVED)
    assert ev is not None
    assert ev.origin == origin
    assert "fingerprint" not in ev.labels  # provenance is a typed field, not a label to look up


def test_the_scrape_job_is_never_the_events_job() -> None:
    ev = alert_to_event(alert(pod="trainer-0", namespace="ml"), RECEIVED)
    assert ev is not None and ev.origin.job is None
    assert resolve_job(ev.origin, ev.labels) is None  # "dcgm-exporter" is Prometheus' job, not a workload


def test_a_pod_label_too_long_for_an_origin_names_the_label() -> None:
    with pytest.raises(AlertError) as e:
        alert_to_event(alert(exported_namespace="n" * 64), RECEIVED)
    assert e.value.field == "labels.exported_namespace"


def test_a_fingerprint_too_long_names_the_fingerprint() -> None:
    with pytest.raises(AlertError) as e:
        alert_to_event(alert(fp="f" * 129), RECEIVED)
    assert e.value.field == "fingerprint"
