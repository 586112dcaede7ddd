"""Kernel-log signatures: every Xid line variant of gpu-faults.md §1.1, SXid, gpu lost, identity, §3 reporters."""

from __future__ import annotations

import pytest

from handlers.catalog import CATALOG
from handlers.signatures import classify_line, gpu_identity

PREFIXES = {
    "none": "",
    "dmesg": "[  219.470994] ",
    "dmesg-T": "[Fri Aug 30 11:43:09 2024] ",
    "thread-id": "[ 130.456250] [ T1946] ",
    "syslog": "Dec  2 11:38:47 worker4 kernel: ",
    "syslog+dmesg": "Dec  2 11:38:47 worker4 kernel: [  219.470994] ",
    "dmesg-x": "kern  :warn  : 2025-01-21T04:41:44,283575+00:00 ",
    "journald": "Jan 21 04:41:44 gpu-node-7 kernel: ",
    "journald-iso": "2025-01-21T04:41:44.283575+0000 gpu-node-7 kernel: ",
    "rfc5424": "<4>1 2025-01-21T04:41:44.283575Z gpu-node-7 kernel - - - ",
    "cri": "2024-01-01T00:00:00.000000000Z stdout F ",
    "klog-err": "E0121 04:41:44.283575    2211 ",
}

# (line without prefix, xid, normalised pci or None, mig gi or None)
XID_LINES = [
    ("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
     "has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
     48, "0000:07:00.0", None),
    ("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus", 79, "0000:44:00.0", None),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1778, GPU has fallen off the bus.", 79, "0000:3b:00.0", None),
    ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, "
     "TPC 7, SM 0): Illegal Instruction Parameter", 13, "0000:cb:00.0", None),
    ("NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 "
     "faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ", 31, "0000:01:00.0", None),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     94, "0000:01:00.0", 5),
    ("NVRM: Xid (PCI:0000:b7:00 GPU-I:13): 95, pid=2211, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No",
     95, "0000:b7:00.0", 13),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00.0", None),
    ("NVRM: Xid (0000:02:00): 13, 0002 00000000 00008297 00001b48 00000000 00000040", 13, "0000:02:00.0", None),
    ("NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 149, "0009:01:00.0", None),
    ("NVRM: Xid (PCI:0019:01:00): 119, pid=3303, name=nvidia-smi, Timeout after 6s of waiting for RPC response "
     "from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).", 119, "0019:01:00.0", None),
    ("NVRM: Xid (PCI:0000:b3:00.0): 63, pid=2231, Row Remapper: New row (0x00000004c3f52a48) marked for "
     "remapping, reset gpu to activate.", 63, "0000:b3:00.0", None),
    ("NVRM: Xid (PCI:0000:ca:00): 64, pid=1, Row Remapper Error: Row (0x0000000126fe0c40) failed to be remapped",
     64, "0000:ca:00.0", None),
    ("NVRM: Xid (PCI:0000:38:00): 43, pid=2390447, name=pt_main_thread, Ch 00000008", 43, "0000:38:00.0", None),
    ("NVRM: Xid (PCI:0000:9b:00): 92, pid=2211, High single-bit ECC error rate", 92, "0000:9b:00.0", None),
    ("NVRM: Xid (PCI:0000:18:00): 120, pid=4017, name=python3, GSP task timeout @ pc:0x4a8c4c4, "
     "task: 1", 120, "0000:18:00.0", None),
    ("NVRM: Xid (PCI:0000:5d:00): 62, pid=9, 0000(0000) 00000000 00000000", 62, "0000:5d:00.0", None),
    ("NVRM: Xid (PCI:0000:5d:00): 140, pid=9, name=python, An uncorrectable ECC error escaped", 140,
     "0000:5d:00.0", None),
    ("NVRM: Xid (PCI:0000:3B:00): 74, pid=1, NVLink: fatal error detected on link 3(0x0, 0x0, 0x0, 0x0)", 74,
     "0000:3b:00.0", None),
    ("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, something new", 999, "0000:3b:00.0", None),
    ("nvrm:   xid   (pci:0000:3b:00)  :  79 ,  GPU has fallen off the bus", 79, "0000:3b:00.0", None),
    ("NVRM: XID (PCI:0000:3B:00): 48, DBE", 48, "0000:3b:00.0", None),
    ("NVRM: Xid (PCI:00000000:3b:00.0): 79, GPU has fallen off the bus", 79, "0000:3b:00.0", None),
]


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
@pytest.mark.parametrize(("line", "xid", "pci", "gi"), XID_LINES,
                         ids=[f"xid{x[1]}-{i}" for i, x in enumerate(XID_LINES)])
def test_xid_lines_with_every_prefix(prefix: str, line: str, xid: int, pci: str | None, gi: int | None) -> None:
    sig = classify_line(PREFIXES[prefix] + line)
    assert sig is not None
    assert (sig.kind, sig.code, sig.xid, sig.pci_bus_id) == ("xid", xid, xid, pci)
    assert sig.detail.get("mig_gi") == gi
    info = CATALOG.get(xid)
    assert sig.action == (info.immediate_action if info else None)
    assert sig.playbook == (info.playbook if info and xid != 154 else sig.playbook)
    if info is None:
        assert sig.playbook == "unknown-xid"


def test_action_is_the_catalog_bucket_exactly_for_every_catalogued_code() -> None:
    for info in CATALOG:
        sig = classify_line(f"[  1.0] NVRM: Xid (PCI:0000:3b:00): {info.code}, pid=1, name=python, text")
        assert sig is not None and sig.kind == "xid" and sig.xid == info.code
        assert sig.action == info.immediate_action
        if info.code != 154:
            assert sig.playbook == info.playbook
            assert sig.is_fatal == info.is_fatal or info.code in range(144, 151)


def test_pid_name_and_channel_are_extracted() -> None:
    sig = classify_line("NVRM: Xid (PCI:0000:38:00): 43, pid=2390447, name=pt_main_thread, Ch 00000008")
    assert sig is not None
    assert sig.detail["pid"] == 2390447
    assert sig.detail["process"] == "pt_main_thread"
    assert sig.detail["channel"] == "00000008"
    unknown = classify_line("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, DBE")
    assert unknown is not None
    assert "pid" not in unknown.detail and "process" not in unknown.detail


@pytest.mark.parametrize("caused", [149, 79, 48, 94])
def test_xid_45_links_the_xid_that_caused_it(caused: int) -> None:
    sig = classify_line(f"[ 1.5] NVRM: Xid (PCI:0000:0a:00): 45, pid=8822, name=python3, Ch 00000010, "
                        f"caused by previous Xid {caused}")
    assert sig is not None and sig.xid == 45
    assert sig.detail["caused_by_xid"] == caused
    plain = classify_line("NVRM: Xid (PCI:0000:0a:00): 45, pid=8822, name=python3, Ch 00000010")
    assert plain is not None and "caused_by_xid" not in plain.detail
    older = classify_line("NVRM: Xid (PCI:0000:0a:00): 45, Preemptive Cleanup, due to previous Xid 79")
    assert older is not None and older.detail["caused_by_xid"] == 79


@pytest.mark.parametrize(
    ("text", "action", "code", "playbook"),
    [
        ("0x0 (None) to 0x4 (Drain and Reset)", "Drain and Reset", 4, "gpu-reset"),
        ("0x0 (None) to 0x1 (GPU Reset Required)", "GPU Reset Required", 1, "gpu-reset"),
        ("0x0 (None) to 0x2 (Node Reboot Required)", "Node Reboot Required", 2, "node-reboot"),
        ("0x0 (None) to 0x3 (Drain P2P)", "Drain P2P", 3, "gpu-reset"),
        ("0x4 (Drain and Reset) to 0x0 (None)", "None", 0, None),
        ("0x0 to 0x2", "Node Reboot Required", 2, "node-reboot"),
    ],
)
def test_xid_154_carries_the_new_recovery_action(text: str, action: str, code: int, playbook: str | None) -> None:
    sig = classify_line(f"[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from {text}")
    assert sig is not None
    assert (sig.kind, sig.xid, sig.pci_bus_id) == ("xid", 154, "0009:01:00.0")
    assert sig.action == "XID_154"
    assert sig.detail["recovery_action"] == action
    assert sig.detail["recovery_action_code"] == code
    assert sig.playbook == playbook
    assert sig.is_fatal == (playbook is not None)


def test_xid_154_without_a_readable_action_escalates() -> None:
    sig = classify_line("NVRM: Xid (PCI:0009:01:00): 154, something unexpected")
    assert sig is not None and sig.action == "XID_154" and sig.playbook == "unknown-xid"


@pytest.mark.parametrize(
    ("line", "pci"),
    [
        ("[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "0000:01:00.0"),
        ("Dec  2 11:38:47 worker4 kernel: NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.", "0000:b3:00.0"),
        ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:1db6) installed in this system has fallen off the bus "
         "and is not responding to commands.", "0000:b3:00.0"),
        ("NVRM: fallen off the bus and is not responding to commands.", None),
        ("[ 11.0] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d has fallen off the bus",
         "0000:9b:00.0"),
    ],
)
def test_fallen_off_the_bus_without_an_xid_is_gpu_lost(line: str, pci: str | None) -> None:
    sig = classify_line(line)
    assert sig is not None
    assert (sig.kind, sig.xid, sig.pci_bus_id, sig.playbook, sig.is_fatal) == ("gpu_lost", None, pci, "gpu-lost",
                                                                                 True)


def test_the_syslog_time_of_day_is_not_taken_for_a_pci_id() -> None:
    sig = classify_line("Dec  2 11:38:47 worker4 kernel: NVRM: fallen off the bus and is not responding.")
    assert sig is not None and sig.pci_bus_id is None


@pytest.mark.parametrize(
    ("line", "code", "playbook"),
    [
        ("Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover "
         "this GPU", "gpu_is_lost", "gpu-lost"),
        ("pynvml.NVMLError_GpuIsLost: GPU is lost", "gpu_is_lost", "gpu-lost"),
        ("[  12.5] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)", "rm_init_adapter_failed",
         "gpu-lost"),
        ("[  12.6] NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 0", "rm_init_adapter_failed",
         "gpu-lost"),
        ("[ 500.1] NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, last heartbeat 4s ago", "gsp_heartbeat_timeout",
         "gsp-hang"),
        ("[ 500.2] NVRM: nvAssertFailedNoLog: Assertion failed: NV_ERR_RESET_REQUIRED", "NV_ERR_RESET_REQUIRED",
         "gpu-reset"),
    ],
)
def test_gpu_failures_without_an_xid_number(line: str, code: str, playbook: str) -> None:
    sig = classify_line(line)
    assert sig is not None
    assert (sig.kind, sig.code, sig.playbook, sig.is_fatal) == ("gpu_lost", code, playbook, True)


def test_a_line_with_an_xid_is_an_xid_whatever_else_it_says() -> None:
    sig = classify_line("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus, RmInitAdapter failed, GPU is lost")
    assert sig is not None and sig.kind == "xid" and sig.xid == 79


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d",
        "[    5.1] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d",
        "Dec  2 11:38:47 worker4 kernel: NVRM: GPU at PCI:0009:01:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d",
        "[    4.9] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
        "[    5.0] nvidia-nvswitch: Probing device 0000:05:00.0, Vendor Id = 0x10de, Device Id = 0x22a3",
        "[    6.0] NVRM: Persistence mode is deprecated and will be removed in a future release.",
        "NVRM: GPU 0000:3b:00.0: Enabling persistence mode",
    ],
)
def test_identity_and_driver_noise_are_no_signal(line: str) -> None:
    assert classify_line(line) is None


def test_gpu_identity_maps_pci_to_uuid() -> None:
    assert gpu_identity("[ 5.1] NVRM: GPU at PCI:0000:9B:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d") == (
        "0000:9b:00.0", "GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d")
    assert gpu_identity("NVRM: GPU at 0009:01:00.0: GPU-00000000-1111-2222-3333-444444444444") == (
        "0009:01:00.0", "GPU-00000000-1111-2222-3333-444444444444")
    assert gpu_identity("NVRM: Xid (PCI:0000:07:00): 48, DBE") is None
    assert gpu_identity("NVRM: GPU at 0000:01:00.0 has fallen off the bus.") is None


@pytest.mark.parametrize(
    ("line", "code", "fatal", "switch_pci", "link"),
    [
        ("nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 29 LTSSM Fault Up", 20034, True,
         "0000:8a:00.0", 29),
        ("[ 99.1] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
         12028, False, "0000:05:00.0", 46),
        ("Dec  2 11:38:47 node kernel: nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 28006, Non-fatal, Link 12 MC TS "
         "crumbstore MCTO (First)", 28006, False, "0000:07:00.0", 12),
        ("SXid (PCI:0000:86:00.0): 19084, Fatal, Link 00 AN1 Heartbeat Timeout Error", 19084, True, "0000:86:00.0", 0),
    ],
)
def test_nvswitch_sxid(line: str, code: int, fatal: bool, switch_pci: str, link: int) -> None:
    sig = classify_line(line)
    assert sig is not None
    assert (sig.kind, sig.code, sig.xid, sig.is_fatal) == ("sxid", code, None, fatal)
    assert sig.detail["nvswitch_pci"] == switch_pci
    assert sig.detail["link"] == link
    assert sig.playbook == ("node-reboot" if fatal else None)


@pytest.mark.parametrize(
    ("line", "xid", "uuid"),
    [
        ("I0125 10:17:05.123456       1 health.go:185] XidCriticalError: Xid=94 on Device=GPU-3cb3c2a6-6c4d-1e56-"
         "7a1e-7c0a5e6d1b2f; marking device as unhealthy.", 94, "GPU-3cb3c2a6-6c4d-1e56-7a1e-7c0a5e6d1b2f"),
        ("I0125 10:17:05.123456       1 health.go:159] Processing event {Device:{Handle:0x7f1bbc000b60} EventType:8 "
         "EventData:79 GpuInstanceId:4294967295 ComputeInstanceId:4294967295}", 79, None),
        ("Conditions: XidCriticalError   True    Mon, 01 Jan 2024 00:00:00 +0000   {\"31\":true}   "
         "1f2e3d4c-5b6a-7980-1a2b-3c4d5e6f7a8b", 31, None),
        ("AcceleratedHardwareReady False NvidiaXID79Error detected XID-79 on the instance, review kernel logs for "
         "additional information.", 79, None),
        ("Warning  NvidiaXID13Warning  node/ip-10-0-0-1  detected XID-13 on the instance", 13, None),
    ],
)
def test_xids_as_kubernetes_components_report_them(line: str, xid: int, uuid: str | None) -> None:
    sig = classify_line(line)
    assert sig is not None
    assert (sig.kind, sig.xid, sig.gpu_uuid) == ("xid", xid, uuid)
    assert sig.action == CATALOG.get(xid).immediate_action  # type: ignore[union-attr]


def test_device_plugin_marking_a_gpu_unhealthy() -> None:
    sig = classify_line("I0125 10:17:05.123456       1 server.go:292] 'nvidia.com/gpu' device marked unhealthy: "
                        "GPU-3cb3c2a6-6c4d-1e56-7a1e-7c0a5e6d1b2f")
    assert sig is not None and (sig.kind, sig.code) == ("health_check", "device_marked_unhealthy")
    assert sig.gpu_uuid == "GPU-3cb3c2a6-6c4d-1e56-7a1e-7c0a5e6d1b2f" and sig.detail["resource"] == "nvidia.com/gpu"
    assert classify_line("pod marked unhealthy by the readiness probe") is None


def test_nvml_event_the_plugin_skips_is_no_fault() -> None:
    # issue 13: the device plugin logging that it SKIPS a non-critical NVML event is not an ECC fault
    assert classify_line("health.go:159] Skipping non-nvmlEventTypeXidCriticalError event: {Device:{Handle:0x1} "
                         "EventType:2 EventData:0 GpuInstanceId:4294967295 ComputeInstanceId:4294967295}") is None


def test_wrapped_line_with_an_embedded_newline() -> None:
    sig = classify_line("NVRM: Xid (PCI:0000:07:00): 48, pid=1, name=x,\n An uncorrectable double bit error")
    assert sig is not None and sig.xid == 48


def test_json_escaped_kernel_line() -> None:
    line = r'{\"log\":\"NVRM: Xid (PCI:0000:07:00): 48, pid=\u0027<unknown>\u0027, DBE\\n\"}'
    sig = classify_line(line)
    assert sig is not None and sig.xid == 48 and sig.pci_bus_id == "0000:07:00.0"
