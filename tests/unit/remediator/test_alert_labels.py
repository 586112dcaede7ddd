"""Alertmanager alert labels (DESIGN.md §5, gpu-faults.md §2.6, §6): node, GPU, Xid and GPU alert recognition."""

from __future__ import annotations

import json

import pytest

from handlers.signatures import (
    alerts_in_payload,
    gpu_from_alert_labels,
    node_from_alert_labels,
    signal_from_alert,
)

UUID = "GPU-265c9814-6156-355b-e589-ff2064894f16"


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"node": "gpu-node-1", "Hostname": "other", "hostname": "third", "instance": "10.0.0.1:9400"}, "gpu-node-1"),
        ({"Hostname": "gpu-node-2", "hostname": "third", "instance": "10.0.0.1:9400"}, "gpu-node-2"),
        ({"hostname": "gpu-node-3", "instance": "10.0.0.1:9400"}, "gpu-node-3"),
        ({"instance": "10.0.0.1:9400", "job": "dcgm-exporter"}, None),
        ({"node": "", "Hostname": "gpu-node-4"}, "gpu-node-4"),
        ({}, None),
    ],
)
def test_node_label_precedence_never_instance(labels: dict[str, str], node: str | None) -> None:
    assert node_from_alert_labels(labels) == node


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"gpu": "3", "UUID": UUID, "pci_bus_id": "00000000:97:00.0", "device": "nvidia3"}, (3, UUID, "0000:97:00.0")),
        ({"device": "nvidia5"}, (5, None, None)),
        ({"gpu": "0", "device": "nvidia7"}, (0, None, None)),
        ({"uuid": UUID}, (None, UUID, None)),
        ({"gpu_uuid": UUID, "nvlink": "2"}, (None, UUID, None)),
        ({"pci_bus_id": "0009:01:00.0"}, (None, None, "0009:01:00.0")),
        ({"pci_bus_id": "garbage", "gpu": "x", "device": "sda"}, (None, None, None)),
        ({}, (None, None, None)),
    ],
)
def test_gpu_identity_from_labels(labels: dict[str, str], expected: tuple[object, ...]) -> None:
    assert gpu_from_alert_labels(labels) == expected


DCGM = {"gpu": "3", "UUID": UUID, "pci_bus_id": "00000000:97:00.0", "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3", "hostname": "gpu-node-1", "instance": "10.0.0.1:9400"}


@pytest.mark.parametrize("key", ["xid", "err_code"])
def test_xid_from_label(key: str) -> None:
    sig = signal_from_alert({**DCGM, "alertname": "GPUXidError", key: "79"}, {"summary": "Xid 79"})
    assert sig is not None
    assert (sig.kind, sig.xid, sig.code, sig.action, sig.playbook) == ("xid", 79, 79, "RESTART_BM", "gpu-lost")
    assert (sig.gpu_index, sig.gpu_uuid, sig.pci_bus_id) == (3, UUID, "0000:97:00.0")
    assert sig.detail["node"] == "gpu-node-1"


def test_xid_from_value_of_the_xid_metric() -> None:
    sig = signal_from_alert({**DCGM, "alertname": "DCGM_FI_DEV_XID_ERRORS"}, {}, value=48.0)
    assert sig is not None and sig.xid == 48


def test_xid_from_the_alert_text_when_no_label() -> None:
    sig = signal_from_alert({**DCGM, "alertname": "GPUXidCritical"}, {"description": "GPU 3 reported Xid 119"})
    assert sig is not None and sig.xid == 119
    unknown = signal_from_alert({**DCGM, "alertname": "GPUXidCritical"}, {"description": "GPU 3 reported an Xid"})
    assert unknown is not None and unknown.kind == "health_check" and unknown.playbook == "unknown-xid"


@pytest.mark.parametrize("value", [0.0, 0])
def test_zero_value_is_no_fault(value: float) -> None:
    assert signal_from_alert({**DCGM, "alertname": "GpuDbe"}, {"expr": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0"},
                             value=value) is None
    assert signal_from_alert({**DCGM, "alertname": "GPUXid", "xid": "0"}, {}) is None
    assert signal_from_alert({**DCGM, "alertname": "GpuDbe"}, {"value": "0"}) is None


@pytest.mark.parametrize(
    ("labels", "annotations", "kind", "playbook"),
    [
        ({"alertname": "GPUDoubleBitECC"}, {"expr": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0"}, "ecc", "gpu-memory-fatal"),
        ({"alertname": "GpuEccSbeRate"}, {"expr": "rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[5m]) > 10"}, "ecc",
         "ecc-correctable-rate"),
        ({"alertname": "DCGM_FI_DEV_ROW_REMAP_FAILURE"}, {}, "ecc", "memory-retirement-failure"),
        ({"alertname": "GPURowRemapPending", "__name__": "DCGM_FI_DEV_ROW_REMAP_PENDING"}, {}, "ecc",
         "row-remap-pending"),
        ({"alertname": "GPUMemoryLeak"},
         {"expr": "DCGM_FI_DEV_FB_USED > 1024 and on(UUID) (DCGM_FI_DEV_GPU_UTIL == 0)"},
         "memory_leak", "memory-leak"),
        ({"alertname": "GPUHighTemperature"}, {"expr": "DCGM_FI_DEV_GPU_TEMP > 85"}, "thermal", None),
        # by alert name only
        ({"alertname": "GPURowRemapFailure"}, {}, "ecc", "memory-retirement-failure"),
        ({"alertname": "GPURemappedRowsPending"}, {}, "ecc", "row-remap-pending"),
        ({"alertname": "GPUUncorrectableECCError"}, {}, "ecc", "gpu-memory-fatal"),
        ({"alertname": "GPUOrphanedMemory"}, {}, "memory_leak", "memory-leak"),
        ({"alertname": "GPUFallenOffBus"}, {}, "gpu_lost", "gpu-lost"),
        ({"alertname": "GPUOverheating"}, {}, "thermal", None),
        ({"alertname": "NvidiaDcgmHealth"}, {"description": "DCGM_FR_PENDING_ROW_REMAP on GPU 3"}, "ecc",
         "row-remap-pending"),
    ],
)
def test_gpu_alerts_by_metric_and_by_name(labels: dict[str, str], annotations: dict[str, str], kind: str,
                                          playbook: str | None) -> None:
    sig = signal_from_alert({**DCGM, **labels}, annotations)
    assert sig is not None
    assert (sig.kind, sig.playbook) == (kind, playbook)
    assert (sig.gpu_index, sig.gpu_uuid, sig.pci_bus_id) == (3, UUID, "0000:97:00.0")


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        ({"alertname": "Process Open FDS 2", "instance": "10.42.0.5:9090", "severity": "some"},
         {"summary": "High process Open FDS"}),
        ({"alertname": "KubePodCrashLooping", "namespace": "default", "pod": "x"}, {}),
        ({"alertname": "NodeMemoryHigh", "instance": "n:9100"}, {"summary": "memory leak suspected on node"}),
        ({"alertname": "HighTemperature", "instance": "n:9100", "chip": "cpu"}, {}),
        ({**DCGM, "alertname": "DCGMExporterDown"}, {}),
    ],
)
def test_non_gpu_alerts_are_none(labels: dict[str, str], annotations: dict[str, str]) -> None:
    assert signal_from_alert(labels, annotations) is None


PAYLOAD = {
    "version": "4",
    "groupKey": '{}/{severity=~"critical"}:{alertname="GPUXidError"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "gpu-remediator",
    "groupLabels": {"alertname": "GPUXidError"},
    "commonLabels": {"alertname": "GPUXidError", "Hostname": "gpu-node-9"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "notification_reason": "new",
    "alerts": [
        {"status": "firing", "labels": {**DCGM, "alertname": "GPUXidError", "err_code": "94", "GPU_I_ID": "2",
                                        "GPU_I_PROFILE": "1g.10gb", "exported_pod": "train-0",
                                        "exported_namespace": "ml", "pod": "dcgm-exporter-abc"},
         "annotations": {"summary": "Xid 94"}, "startsAt": "2024-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
         "generatorURL": "http://prom/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0\u0026g0.tab=1", "fingerprint": "f1"},
        {"labels": {"alertname": "GPUEcc", "UUID": UUID},
         "annotations": {}, "startsAt": "2024-01-01T00:00:00Z",
         "generatorURL": "http://prom/graph?g0.expr=DCGM_FI_DEV_ECC_DBE_VOL_TOTAL+%3E+0&g0.tab=1"},
    ],
}


def test_alerts_in_payload_merges_common_labels_and_reads_expressions() -> None:
    alerts = alerts_in_payload(PAYLOAD)
    assert len(alerts) == 2
    first, second = alerts
    assert first.labels["Hostname"] == "gpu-node-9" and first.status == "firing" and first.fingerprint == "f1"
    assert first.expr == "DCGM_FI_DEV_XID_ERRORS > 0"
    assert second.status == "firing" and second.fingerprint is None  # older payloads lack both per alert
    s1, s2 = first.signal(), second.signal()
    assert s1 is not None and (s1.kind, s1.xid, s1.action) == ("xid", 94, "RESTART_APP")
    assert s1.detail["mig_gi"] == 2 and s1.detail["pod"] == "train-0" and s1.detail["namespace"] == "ml"
    assert node_from_alert_labels(first.labels) == "gpu-node-9"
    assert s2 is not None and (s2.kind, s2.code) == ("ecc", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")


def test_alerts_in_payload_accepts_text_lists_and_rejects_the_rest() -> None:
    assert len(alerts_in_payload(json.dumps(PAYLOAD))) == 2
    assert len(alerts_in_payload([PAYLOAD, PAYLOAD])) == 4
    assert alerts_in_payload({"version": "4"}) == []
    assert alerts_in_payload("not json") == []
    assert alerts_in_payload(42) == []
    assert alerts_in_payload({"alerts": [1, "x", None]}) == []


def test_grafana_values_are_alert_values() -> None:
    payload = {"alerts": [{"labels": {**DCGM, "alertname": "GPUDbe"}, "values": {"A": 0, "B": 0.0},
                           "annotations": {"expr": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0"}}]}
    (alert,) = alerts_in_payload(payload)
    assert alert.value == 0.0 and alert.signal() is None
