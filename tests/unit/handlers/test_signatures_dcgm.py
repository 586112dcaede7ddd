"""dcgm-exporter series lines and DCGM health codes (gpu-faults.md §2.5, §2.6): a zero value is no fault."""

from __future__ import annotations

import pytest

from handlers.signatures import classify_line

UUID = "GPU-265c9814-6156-355b-e589-ff2064894f16"
OLD = f'gpu="3",UUID="{UUID}",device="nvidia3",modelName="NVIDIA A30",Hostname="node-a"'
NEW = (f'gpu="3",UUID="{UUID}",pci_bus_id="00000000:97:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",'
       'hostname="node-a",DCGM_FI_DRIVER_VERSION="580.105.08"')
MIG = f'gpu="0",UUID="{UUID}",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",Hostname="h"'


@pytest.mark.parametrize("labels", [OLD, NEW, MIG], ids=["old", "new", "mig"])
@pytest.mark.parametrize(
    "metric",
    ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
     "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_RETIRED_PENDING",
     "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_GPU_UTIL",
     "DCGM_FI_DEV_FB_USED"],
)
@pytest.mark.parametrize("zero", ["0", "0.0", "0e+00"])
def test_zero_values_are_no_fault(labels: str, metric: str, zero: str) -> None:
    assert classify_line(f"{metric}{{{labels}}} {zero}") is None
    assert classify_line(f"{metric}{{{labels}}} {zero} 1718000000000") is None


def test_the_published_zero_xid_series_is_no_fault() -> None:
    line = ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-265c9814-6156-355b-e589-ff2064894f16",device="nvidia0",'
            'modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",'
            'Hostname="yg-data-k8s-gpu-a30-node-test-test0003.mt"} 0')
    assert classify_line(line) is None


@pytest.mark.parametrize("labels", [OLD, NEW], ids=["old", "new"])
def test_nonzero_xid_series_is_that_xid(labels: str) -> None:
    sig = classify_line(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 79")
    assert sig is not None
    assert (sig.kind, sig.xid, sig.gpu_index, sig.gpu_uuid, sig.action) == ("xid", 79, 3, UUID, "RESTART_BM")
    assert sig.pci_bus_id == ("0000:97:00.0" if labels == NEW else None)
    assert sig.detail["node"] == "node-a"


def test_err_code_label_wins_over_the_value() -> None:
    sig = classify_line(f'DCGM_FI_DEV_XID_ERRORS{{{NEW},err_code="48",err_msg="DBE"}} 48')
    assert sig is not None and sig.xid == 48 and sig.detail["err_msg"] == "DBE"


def test_mig_labels_are_kept() -> None:
    sig = classify_line(f"DCGM_FI_DEV_XID_ERRORS{{{MIG}}} 94")
    assert sig is not None and sig.xid == 94 and sig.gpu_index == 0
    assert sig.detail["mig_gi"] == 3 and sig.detail["mig_profile"] == "1g.6gb"


@pytest.mark.parametrize(
    ("metric", "kind", "playbook", "fatal"),
    [
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc", "gpu-memory-fatal", True),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc", "ecc-correctable-rate", False),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "ecc", "memory-retirement-failure", True),
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", "ecc", "memory-retirement-failure", True),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "ecc", "row-remap-pending", True),
        ("DCGM_FI_DEV_RETIRED_PENDING", "ecc", "row-remap-pending", True),
        ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", "ecc", "row-remap-pending", True),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "ecc", None, False),
        ("DCGM_FI_DEV_RETIRED_DBE", "ecc", None, False),
        ("DCGM_FI_DEV_THRESHOLD_SRM", "ecc", "memory-retirement-failure", True),
        ("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal", None, False),
        ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "health_check", "gpu-reset", True),
    ],
)
def test_nonzero_fault_series(metric: str, kind: str, playbook: str | None, fatal: bool) -> None:
    sig = classify_line(f"{metric}{{{NEW}}} 1")
    assert sig is not None
    assert (sig.kind, sig.code, sig.playbook, sig.is_fatal) == (kind, metric, playbook, fatal)
    assert (sig.gpu_index, sig.gpu_uuid, sig.pci_bus_id) == (3, UUID, "0000:97:00.0")


def test_recovery_action_value_picks_the_playbook() -> None:
    reboot = classify_line(f"DCGM_FI_DEV_GPU_RECOVERY_ACTION{{{NEW}}} 2")
    assert reboot is not None and reboot.playbook == "node-reboot"


@pytest.mark.parametrize(
    "line",
    [
        f"DCGM_FI_DEV_GPU_UTIL{{{NEW}}} 87",
        f"DCGM_FI_DEV_FB_USED{{{NEW}}} 74213",
        f"DCGM_FI_DEV_GPU_TEMP{{{NEW}}} 71",
        f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{NEW}}} 3",
        f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{NEW}}} 1",
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        f"DCGM_FI_DEV_XID_ERRORS{{{NEW}}} NaN",
        "dcgm-exporter: Starting webserver on :9400",
        "DCGM_FR_OK",
    ],
)
def test_state_metrics_and_exporter_noise_are_no_fault(line: str) -> None:
    assert classify_line(line) is None


def test_thermal_clock_event_reasons() -> None:
    sig = classify_line(f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{NEW}}} 64")
    assert sig is not None and sig.kind == "thermal"


def test_series_line_inside_a_cri_container_log() -> None:
    sig = classify_line(f"2024-01-01T00:00:00.000000000Z stdout F DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{OLD}}} 2")
    assert sig is not None and sig.kind == "ecc" and sig.gpu_index == 3


@pytest.mark.parametrize(
    ("line", "kind", "code", "playbook"),
    [
        ("GpuAllWatch False ErrorCode:DCGM_FR_UNCONTAINED_ERROR GPU:0 Recommended Action=RESTART_VM;", "ecc",
         "DCGM_FR_UNCONTAINED_ERROR", "gpu-memory-fatal"),
        ("dcgm health: DCGM_FR_VOLATILE_DBE_DETECTED on GPU 2", "ecc", "DCGM_FR_VOLATILE_DBE_DETECTED",
         "gpu-memory-fatal"),
        ("dcgm health: DCGM_FR_PENDING_ROW_REMAP", "ecc", "DCGM_FR_PENDING_ROW_REMAP", "row-remap-pending"),
        ("dcgm health: DCGM_FR_ROW_REMAP_FAILURE", "ecc", "DCGM_FR_ROW_REMAP_FAILURE", "memory-retirement-failure"),
        ("dcgm health: DCGM_FR_NVLINK_DOWN link 3", "health_check", "DCGM_FR_NVLINK_DOWN", "nvlink"),
        ("dcgm health: DCGM_FR_SXID_ERROR", "sxid", "DCGM_FR_SXID_ERROR", "node-reboot"),
        ("dcgm health: DCGM_FR_THERMAL_VIOLATIONS", "thermal", "DCGM_FR_THERMAL_VIOLATIONS", None),
    ],
)
def test_dcgm_health_codes(line: str, kind: str, code: str, playbook: str | None) -> None:
    sig = classify_line(line)
    assert sig is not None and (sig.kind, sig.code, sig.playbook) == (kind, code, playbook)


def test_dcgm_health_xid_carries_the_number() -> None:
    sig = classify_line("dcgm health: DCGM_FR_XID_ERROR Detected XID 79 for GPU 1")
    assert sig is not None and sig.kind == "xid" and sig.xid == 79
