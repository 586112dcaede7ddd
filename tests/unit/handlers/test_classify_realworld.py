"""Real-world GPU fault lines and Alertmanager payloads through ``remediator classify`` (DESIGN.md §10).

Every line in ``CASES`` is verbatim from a public source named beside it (issue and PR threads, parser test
fixtures, driver sources, docs); a handful are the exact line inside a Markdown quote or a log paste, with the
paste's own decoration left off. Each expectation was decided from ``../shared/reference/gpu-faults.md`` and the
``classify`` contract, not from what the classifier printed: an Xid line is kind ``xid`` with its number, the
PCI id normalised to ``DDDD:BB:DD.F`` and NVIDIA's immediate action from the catalog; other signals by kind
(``gpu_lost``, ``nccl_timeout``, ``cuda_oom`` ...); and lines with no GPU fault (identity lines, driver load
messages, NCCL INFO chatter, zero-valued metrics, stack frames, hints, warnings) print nothing.

The Alertmanager payloads are built from real parts: the kube-prometheus ``Watchdog`` alert as a receiver's test
fixture records it, PrometheusRule expressions and annotations from public GPU alerting guides, and
dcgm-exporter label sets as its issues show them (no public payload carries DCGM labels, gpu-faults.md §6).
"""
# ruff: noqa: E501, RUF001

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner

from handlers.catalog import CATALOG
from handlers.signatures import classify_line
from remediator.cli import main
from remediator.cli.classify import classify_text
from remediator.contracts import normalize_pci_bus_id


@dataclass(frozen=True)
class Expect:
    """What a correct classifier says about one line: nothing, or a first signal of this shape."""

    none: bool = False
    kind: str | None = None
    prefix: str | None = None  # any kind starting with this (``nccl`` = nccl_error or nccl_timeout)
    xid: int | None = None
    pci: str | None = None  # as the source prints it; compared normalised
    gpu: int | None = None


def X(xid: int, pci: str | None, gpu: int | None = None) -> Expect:
    return Expect(kind="xid", xid=xid, pci=pci, gpu=gpu)


def K(kind: str, pci: str | None = None, gpu: int | None = None) -> Expect:
    return Expect(kind=kind, pci=pci, gpu=gpu)


def KP(prefix: str) -> Expect:
    return Expect(prefix=prefix)


NONE = Expect(none=True)

# (line, expectation, source)
CASES: list[tuple[str, Expect, str]] = [
    ('NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)',
     X(149, '0018:01:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
     X(13, '0000:b5:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x50df30=0x107000e 0x50df34=0x20 0x50df28=0xf81eb60 0x50df2c=0x1174",
     X(13, '0000:b5:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
     X(74, '0003:00:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000',
     X(32, '0000:66:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:3f:00): 46',
     X(46, '0000:3f:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0001:ab:cd): 69, pid=1310987, name=train.3, Class Error: ChId 0008, Class 0000cbc0, Offset 00000184, Data ffffffff, ErrorCode 00000004',
     X(69, '0001:ab:cd'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:9b:00): 8, pid=5678, name=idle_timeout',
     X(8, '0000:9b:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:66:00): 999, pid=1234, name=test',
     X(999, '0000:66:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: GPU at PCI:0000:66:00: GPU-12345678-1234-5678-9abc-def012345678',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('[Wed Dec 11 13:23:01 2024] Linux version 5.15.0-117-generic',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:66:00): abc, pid=2280636',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)',
     X(154, '0008:01:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)',
     X(154, '0008:01:00'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)',
     X(145, '0000:00:08.0'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go'),
    ('NVRM: GPU at PCI:0000:00:08.0: GPU-123',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/xid_handler_test.go'),
    ('NVRM: Some other error message',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/xid/xid_handler_test.go'),
    ('[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:26b5) installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.',
     K('gpu_lost', pci='0000:b3:00.0'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: installed in this system has\n               NVRM: fallen off the bus and is not responding to commands.',
     K('gpu_lost', pci='0000:b3:00.0'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.',
     X(79, '0000:b3:00.0'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('               NVRM: fallen off the bus and is not responding to commands.',
     K('gpu_lost'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('               NVRM: (PCI ID: 10de:26b5) installed in this system has',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('Some other NVRM message',
     NONE, 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler_test.go'),
    ('[123] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('[73309.599396] nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26008, SOE Watchdog error',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('[38889.018130] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Severity 1 Engine instance 00 Sub-engine instance 00',
     K('sxid'), 'NVIDIA/NVSentinel:health-monitors/syslog-health-monitor/pkg/sxid/sxid_handler_test.go'),
    ('[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).',
     X(119, '0000:9b:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x0000000000002081 0x0000000000000004.',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM: GPU4 RPC history (CPU -> GSP):',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM:     entry function                   data0              data1              ts_start           ts_end             duration actively_polling',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM:      0    103  GSP_RM_ALLOC          0x0000000000002081 0x0000000000000004 0x00062ed1a6bd61fa 0x0000000000000000          y',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM:     -1    4124 GSP_LOCKDOWN_NOTICE   0x0000000000000000 0x0000000000000000 0x00062e099220bc3a 0x00062e099220bc3a',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] NVRM:      0    4115 NVLINK_INBAND_RECEIVE 0x0000000000000000 0x0000000000000000 0x00062e099d8f14e7 0x00062e099d8f14eb      4us',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] CPU: 17 PID: 2024380 Comm: nvidia-smi Tainted: P           OE     5.15.0-112-generic #122-Ubuntu',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025]  os_dump_stack+0xe/0x14 [nvidia]',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:18 2025] WARNING: kernel stack frame pointer at 000000005611dc97 in nvidia-smi:2024380 has bad value 00000000ec717e66',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:24 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 10 (FREE) (0xa55a0210 0x0).',
     X(119, '0000:9b:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:24:30 2025] clocksource: Long readout interval, skipping watchdog check: cs_nsec: 1584036171 wd_nsec: 1584036160',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:27:12 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1263500, name=cache_mgr_main, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c).',
     X(119, '0000:9b:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ('[Sun Feb 23 16:30:13 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1240590, name=gpud, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).',
     X(119, '0000:9b:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/testdata/dmesg-with-xid-119.log'),
    ("[111111111.111] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     X(79, '0000:05:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.',
     X(79, '0000:01:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('[...] NVRM: Xid (0000:03:00): 14, Channel 00000001',
     X(14, '0000:03:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('NVRM: Xid (0000:03:00): 14, Channel 00000001',
     X(14, '0000:03:00'), 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('Regular log content without Xid errors',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('NVRM: Xid error: xyz, invalid data',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('NVRM: Xid (invalid): some error',
     NONE, 'leptonai/gpud:components/accelerator/nvidia/error/xid/dmesg_test.go'),
    ('kern  :warn  : 2025-01-21T04:41:44,285060+00:00 pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in libnccl.so.2[7f7c7ac00000+d3d3000]',
     KP('nccl'), 'leptonai/gpud:components/accelerator/nvidia/nccl/testdata/dmesg.decode.iso.log'),
    ('6,3964,206764307,-;nvidia-nvswitch2: open (major=510)',
     NONE, 'leptonai/gpud:pkg/kmsg/testdata/kmsg.1.log'),
    ('6,3990,251895583,-;Initializing XFRM netlink socket',
     NONE, 'leptonai/gpud:pkg/kmsg/testdata/kmsg.1.log'),
    ('3,1234,567890,-;NVRM: Xid (PCI:0000:01:00): 13, pid=1234, Graphics SM Warp Exception',
     X(13, '0000:01:00'), 'find_string fixture (host-health kmsg test, C++)'),
    ('diff:371;NVRM: Xid (PCI:0000:37:00): 95, pid=5171, Uncontained: FBHUB. RST: Yes, D-RST: No',
     X(95, '0000:37:00'), 'find_string: ops ticket text (Inspur NF5468M6 fault report)'),
    ('4,12345,678901234,-;NVRM: Xid (PCI:0000:00:1E.0): 48',
     X(48, '0000:00:1e.0'), 'find_string fixture (Go kmsg ParseKmsgRecord test)'),
    ('<6>[12345.678901] NVRM: Xid (PCI:0000:03:00): 44, something',
     X(44, '0000:03:00'), 'find_string fixture (soullink_core kmsg_parse bench)'),
    ('6,12345,678901234,-;NVRM: Xid (PCI:0000:03:00): 119, GSP timeout',
     X(119, '0000:03:00'), 'find_string fixture (soullink_core kmsg_parse bench)'),
    ('kernel: usb 1-1: new device',
     NONE, 'find_string fixture (soullink_core kmsg_parse bench)'),
    ('systemd-journald[123]: Runtime journal (/run/log/journal/abcdef12345) is currently using 8.0M.',
     NONE, 'find_string fixture (soullink_core kmsg_parse bench)'),
    ("4,1234,5678901,-;NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     X(79, '0000:1a:00'), 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('[12345.678901] NVRM: Xid (PCI:0000:3b:00): 31, pid=12345, name=python3, Ch 00000010, intr 10000000.',
     X(31, '0000:3b:00'), 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('NVRM: Xid (PCI:00000000:65:00): 13, pid=4242, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): ESR 0x504648=0x1',
     X(13, '0000:65:00'), 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('[ 100.0] NVRM: Xid (PCI:0000:1A:00): 48',
     X(48, '0000:1a:00'), 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('4,1,2,-;Linux version 5.15.0-foo',
     NONE, 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('NVRM: loading NVIDIA UNIX x86_64 Kernel Module  560.35.03',
     NONE, 'find_string fixture (Go nvml TestParseXidLine_RealCorpus)'),
    ('6,902,101;amdgpu 0000:c3:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block',
     NONE, 'find_string fixture (agent kmsg test, AMD line)'),
    ('[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).',
     NONE, 'https://github.com/NVIDIA/NVSentinel/issues/155'),
    ('[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025',
     NONE, 'https://github.com/NVIDIA/NVSentinel/issues/155'),
    ('[Sun Jul 28 09:15:27 2024] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024',
     NONE, 'https://github.com/akash-network/support/issues/244'),
    ('[Wed Jul 31 23:14:18 2024] NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375',
     NONE, 'https://github.com/akash-network/support/issues/244'),
    ('[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008',
     X(43, '0000:00:05'), 'https://github.com/akash-network/support/issues/244'),
    ('[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE',
     X(31, '0000:00:07'), 'https://github.com/akash-network/support/issues/244'),
    ("[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
     X(94, '0000:00:08'), 'https://github.com/akash-network/support/issues/244'),
    ('2020/08/10 19:09:42 XidCriticalError: Xid=69 on Device=GPU-7540a9b3-eeb9-1214-1526-f93c9ea826a8, the device will go unhealthy.',
     X(69, None), 'https://github.com/NVIDIA/k8s-device-plugin/issues/189'),
    ("2020/08/10 19:09:42 'nvidia.com/gpu' device marked unhealthy: GPU-7540a9b3-eeb9-1214-1526-f93c9ea826a8",
     K('health_check'), 'https://github.com/NVIDIA/k8s-device-plugin/issues/189'),
    ('  XidCriticalError     True    Mon, 23 Jun 2025 18:45:43 +0000   Mon, 23 Jun 2025 18:44:57 +0000   {"31":true}                  6e43a052-e544-467b-a972-63d7cd2ce80a',
     X(31, None), 'https://github.com/GoogleCloudPlatform/container-engine-accelerators/pull/497'),
    ('[1231741.378609] NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a',
     X(43, '0009:01:00'), 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/904'),
    ('I1204 20:42:19.611278       1 device_health.go:78] creating NVML events for device health monitor',
     NONE, 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/pull/689'),
    ('I1204 20:42:19.675749       1 device_health.go:95] started device health monitoring',
     NONE, 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/pull/689'),
    ('[80747] [rank4]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600067 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/hiyouga/LlamaFactory/issues/7396'),
    ('[80748] [rank0]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.',
     K('nccl_timeout'), 'https://github.com/hiyouga/LlamaFactory/issues/7396'),
    ('[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/XPixelGroup/BasicSR/issues/737'),
    ('[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.',
     K('nccl_timeout'), 'https://github.com/XPixelGroup/BasicSR/issues/737'),
    ('[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/hiyouga/LlamaFactory/issues/6269'),
    ('frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c (0x7f3b6e7236fc in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'https://github.com/sgl-project/sglang/issues/1693'),
    ('  what():  [PG 3 Rank 5] Process group watchdog thread terminated with exception: [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=19008, NumelOut=152064, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/sgl-project/sglang/issues/1693'),
    ('Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 (most recent call first):',
     NONE, 'https://github.com/sgl-project/sglang/issues/1693'),
    ('frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f3b6e71a8d2 in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'https://github.com/sgl-project/sglang/issues/1693'),
    ('Epoch 0:   6%|██                               | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc, reduced_train_loss=2.590, global_step=3.2e+4, consumed_samples=2.56e+7][E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/pytorch/pytorch/issues/118369'),
    ('[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625251 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/pytorch/pytorch/issues/118369'),
    ('[36m(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for 600027 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm/issues/6042'),
    ('(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 1 Rank 1] Timeout at NCCL work: 158046, last enqueued NCCL work: 158046, last completed NCCL work: 158045.',
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm/issues/6042'),
    ('(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.',
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm/issues/6042'),
    ('(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:583] [Rank 1] To avoid data inconsistency, we are taking the entire process down.',
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm/issues/6042'),
    ('(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:1414] [PG 1 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for 600027 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm/issues/6042'),
    ('(RayWorkerWrapper pid=4009) Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):',
     NONE, 'https://github.com/vllm-project/vllm/issues/6042'),
    ("[rank7]:[E626 05:14:36.393067540 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 7] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. ",
     K('nccl_timeout'), 'https://github.com/snowflakedb/ArcticTraining/issues/219'),
    ('[rank2]:[E626 05:06:30.929096625 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=120049, OpType=_ALLGATHER_BASE, NumelIn=16384000, NumelOut=131072000, Timeout(ms)=1800000) ran for 1800065 milliseconds before timing out.',
     K('nccl_timeout'), 'https://github.com/snowflakedb/ArcticTraining/issues/219'),
    ("18:11:06.680 [rank4]:[E205 18:11:06.375750231 ProcessGroupNCCL.cpp:1870] [PG ID 12 PG GUID 99(EXPERT_MODEL_PARALLEL_GROUP) Rank 4] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. ",
     K('nccl_timeout'), 'https://github.com/modelscope/ms-swift/issues/7992'),
    ("[rank2]:[E419 10:53:25.421620797 ProcessGroupNCCL.cpp:1484] [PG ID 2 PG GUID 9 Rank 2] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. ",
     K('nccl_timeout'), 'https://github.com/verl-project/verl/issues/1158'),
    ('Exception raised from ncclCommWatchdog at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1901 (most recent call first):',
     NONE, 'https://github.com/huggingface/open-r1/issues/620'),
    ('frame #4: <unknown function> + 0x126850 (0x7fb4267bf850 in /lib/x86_64-linux-gnu/libc.so.6)',
     NONE, 'https://github.com/huggingface/open-r1/issues/620'),
    ('(WorkerDict pid=3490362) [rank1]:[E1118 20:32:23.957372583 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 2635 PG status: last enqueued work: 2635, last completed work: 2634',
     K('nccl_timeout'), 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490362) [rank1]:[E1118 20:32:23.957466207 ProcessGroupNCCL.cpp:667] Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490362) [rank1]:[E1118 20:32:23.957487695 ProcessGroupNCCL.cpp:681] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.',
     K('nccl_timeout'), 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490084) frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x76a6e0c016ed in /home/zyc/miniconda3/envs/verl-agent3/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490084) frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x890 (0x76a6e0c007d0 in /home/zyc/miniconda3/envs/verl-agent3/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490084) [2025-11-18 20:32:23,672 E 3490084 3490489] logging.cc:118: Unhandled exception: N3c1016DistBackendErrorE. what(): [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2667, OpType=_REDUCE_SCATTER_BASE, NumelIn=46797824, NumelOut=23398912, Timeout(ms)=1800000) ran for 1800053 milliseconds before timing out.',
     K('nccl_timeout'), 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490362) /home/zyc/miniconda3/envs/verl-agent3/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so(+0xe5c7aa) [0x7c0c90e5c7aa] c10d::ProcessGroupNCCL::ncclCommWatchdog()',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490362) *** SIGABRT received at time=1763469143 on cpu 138 ***',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    ('(WorkerDict pid=3490362) Fatal Python error: Aborted',
     NONE, 'find_string: verl-agent notes (update_policy) log paste, id 35554456042'),
    (' 10/10: 240it [05:55,  1.47s/it, loss=5.46][rank0]:[E709 17:05:38.162555850 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=20585, OpType=ALLREDUCE, NumelIn=1259621, NumelOut=1259621, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.',
     K('nccl_timeout'), 'find_string: training log paste in repo docs'),
    ('[rank3]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 59958 PG status: last enqueued work: 59998, last completed work: 59957',
     K('nccl_timeout'), 'find_string: training log paste in repo docs'),
    ('[rank3]:[E710 18:00:32.427312432 ProcessGroupNCCL.cpp:801] Stack trace of the failed collective: ',
     NONE, 'find_string: training log paste in repo docs'),
    ('#0 all_reduce from /usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:3174',
     NONE, 'find_string: training log paste in repo docs'),
    ('[rank368]:[E808 04:21:41.160918398 ProcessGroupNCCL.cpp:655] [Rank 368] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.',
     K('nccl_timeout'), 'find_string: training log paste in repo docs'),
    ('[rank1]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 1]  failure detected by watchdog at work sequence id: 1 PG status: last enqueued work: 547, last completed work: -1',
     K('nccl_timeout'), 'find_string: training log paste in repo docs'),
    ('hostname-test:984:1357 [4] NCCL INFO transport/net.cc:1298 -> 6',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1814'),
    ('hostname-test:984:1357 [4] NCCL INFO proxy.cc:874 -> 6 [Progress Thread]',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1814'),
    ('hostname-test:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 172.36.143.59<44206> with status=5 opcode=32656 len=32659 vendor err 249 (Recv) localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/1814'),
    ('kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid fd00:1148:9000:5000:4:200:3:ff22 remoteGidsfd00:1148:9000:5000:4:200:3:ff1f',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/1405'),
    ('H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor err 81 (Send)',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/928'),
    ('H100-2:19989:20082 [1] NCCL INFO proxy.cc:858 -> 6 [Proxy Thread]',
     NONE, 'https://github.com/NVIDIA/nccl/issues/928'),
    ('[0] node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1232'),
    ('[3] node2:22556:22556 [1] NCCL INFO threadThresholds 8/8/64 | 32/8/64 | 512 | 512',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1232'),
    ('[3] node2:22556:22556 [1] NCCL INFO 2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1232'),
    ('2025-11-24T03:20:21.001125857Z [2025-11-24 11:20:21] gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.44.137.149<52905> failed : Connection reset by peer',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/1920'),
    ('2025-11-24T03:20:21.001131605Z gpu-server320 [5] NCCL INFO misc/socket.cc:607 -> 6 socketWait(NCCL_SOCKET_SEND, sock, &sock->type, sizeof(sock->type), &sent)',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1920'),
    ('2025-11-24T03:20:21.001135879Z gpu-server320 [5] NCCL INFO bootstrap.cc:868 -> 6 ncclSocketConnect()',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1920'),
    ('ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/166'),
    ('ubuntu:39964:40075 [0] proxy.cc:1519 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from rank 0, retcode 2',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/166'),
    ('ubuntu:39964:40044 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node1<57557>',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/166'),
    ('ubuntu:39964:40044 [0] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7f6f18cb7f40',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/166'),
    ('ubuntu:39964:40049 [5] NCCL INFO Channel 20 : 5[5] -> 4[4] via SHM/direct/direct',
     NONE, 'https://github.com/NVIDIA/nccl-tests/issues/166'),
    ("Fri Aug 11 12:31:45 2023[1,0]<stdout>:tomte401:1850301:1881341 [0] transport.cc:154 NCCL WARN Cuda failure 'invalid argument'",
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/957'),
    ('Fri Aug 11 12:31:45 2023[1,0]<stdout>:tomte401:1850301:1881358 [0] proxy.cc:1485 NCCL WARN [Service thread] Error encountered progressing operation=Connect, res=3, closing connection',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/957'),
    ('Fri Aug 11 12:31:45 2023[1,0]<stdout>:tomte401:1850301:1881358 [0] proxy.cc:1519 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from rank 0, retcode 3',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/957'),
    ('dgxh100-4:460770:460869 [0] misc/socket.cc:30 NCCL WARN socketProgressOpt: Call to recv from 11.1.128.128<52035> failed : Connection reset by peer',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/185'),
    ('dgxh100-4:460770:460869 [0] NCCL INFO transport/net_ib.cc:710 -> 6',
     NONE, 'https://github.com/NVIDIA/nccl-tests/issues/185'),
    ('kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)',
     KP('nccl'), 'https://github.com/NVIDIA/nccl-tests/issues/252'),
    ('kolyoz2:25146:25852 [0] NCCL INFO [Service thread] Connection closed by localRank 0',
     NONE, 'https://github.com/NVIDIA/nccl-tests/issues/252'),
    ('[0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer 10.10.1.3<36138>',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/1612'),
    ('[0] NCCL INFO group.cc:75 -> 6 [Async thread]',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1612'),
    ('full-debug2-test-0:4300:4325 [0] NCCL INFO NET/FastSocket : Connected after 1000 retries.',
     NONE, 'https://github.com/google/nccl-fastsocket/issues/4'),
    ('9306dc444753:248281:248336 [3] misc/socket.cc:456 NCCL WARN Net : Connect to 172.17.0.2<40537> failed : Connection reset by peer',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/963'),
    ('9306dc444753:248281:248334 [2] misc/socket.cc:518 NCCL WARN Net : Call to recv from 172.17.0.2<40537> failed : Connection reset by peer',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/963'),
    ('algo-1:462:462 [0] NCCL INFO Bootstrap : Using eth0:10.200.5.135<0>',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('algo-1:462:462 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('algo-1:462:462 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.3.0aws',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM capability requires RDMA, which this device does not support.',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('NCCL version 2.10.3+cuda11.3',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('NCCL WARN NET/OFI Request completed with error. RC: 21. Error: unknown error',
     KP('nccl'), 'https://github.com/aws/aws-ofi-nccl/issues/161'),
    ('8h200-2:14630:14692 [0] process_err_completion:1723 NCCL WARN NET/OFI Operation with NULL context completed with error',
     KP('nccl'), 'https://github.com/NVIDIA/nccl/issues/1597'),
    ('8h200-2:14630:14695 [1] NCCL INFO Channel 05/0 : 0[0] -> 1[1] [receive] via NET/AWS Libfabric/1/GDRDMA',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1597'),
    ("[1,23]<stdout>:ip-172-32-45-165:72593:73427 [7] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument",
     KP('nccl'), 'https://github.com/aws/aws-ofi-nccl/issues/24'),
    ('[1,31]<stdout>:ip-172-32-36-209:8800:9549 [7] NCCL INFO include/net.h:24 -> 2',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/24'),
    ('INFO: Function: ofi_init Line: 686: NET/OFI Selected Provider is efa',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/22'),
    ('[ 1632.420956] infiniband efa_0: Failed to process command ALLOC_PD (opcode 14) comp_status 1 err -12',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/22'),
    ('  | 2025-05-16T16:39:51.208-07:00 | ip-10-36-29-253:79:79 [0] NCCL INFO cudaDriverVersion 12040',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/889'),
    ('  | 2025-05-16T16:39:51.208-07:00 | NCCL version 2.21.5+cuda12.8',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/889'),
    ('torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1',
     K('nccl_error'), 'https://github.com/vllm-project/vllm/issues/10523'),
    ('RuntimeError: NCCL error in: /home/liy/programs/pytorch/torch/lib/THD/base/data_channels/DataChannelNccl.cpp:324, unhandled system error',
     K('nccl_error'), 'https://github.com/pytorch/pytorch/pull/4921'),
    ('Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1',
     K('nccl_error'), 'https://github.com/pytorch/pytorch/issues/149984'),
    ('ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. ',
     K('nccl_error'), 'https://github.com/pytorch/pytorch/issues/149984'),
    ('Exception raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2501 (most recent call first):',
     NONE, 'https://github.com/pytorch/pytorch/issues/149984'),
    ('报错信息：torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3 ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.',
     K('nccl_error'), 'https://github.com/zai-org/CogVLM2/issues/178'),
    ('socketStartConnect: Connect to 192.168.19.14<52822> failed : No route to host',
     KP('nccl'), 'https://github.com/hkproj/pytorch-transformer-distributed/issues/1'),
    ('Last error:',
     NONE, 'https://github.com/hkproj/pytorch-transformer-distributed/issues/1'),
    ('  exitcode  : 1 (pid: 69812)',
     NONE, 'https://github.com/pytorch/pytorch/issues/121209'),
    ('  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html',
     NONE, 'https://github.com/pytorch/pytorch/issues/121209'),
    ('Root Cause (first observed failure):',
     NONE, 'https://github.com/pytorch/pytorch/issues/121209'),
    ('ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 1622990) of binary: /home/changquan/anaconda3/envs/lang/bin/python',
     K('job_failure'), 'https://github.com/Facico/Chinese-Vicuna/issues/113'),
    ('  File "/home/changquan/anaconda3/envs/lang/lib/python3.8/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper',
     NONE, 'https://github.com/Facico/Chinese-Vicuna/issues/113'),
    ('ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 16) of binary: /opt/conda/bin/python',
     K('job_failure'), 'https://github.com/Vision-CAIR/MiniGPT-4/issues/237'),
    ('ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 407727) of binary: /fs/nexus-scratch/sanjoyc/anaconda/envs/egovlp/bin/python',
     K('job_failure'), 'https://github.com/showlab/EgoVLP/issues/21'),
    ('torch.distributed.elastic.multiprocessing.errors.ChildFailedError:',
     K('job_failure'), 'https://github.com/showlab/EgoVLP/issues/21'),
    ('stderr: WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 153929 closing signal SIGTERM',
     NONE, 'https://github.com/hiyouga/LlamaFactory/issues/163'),
    ('stderr: ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 7 (pid: 153932) of binary: /home/panww/miniconda3/tools/bin/python',
     K('job_failure'), 'https://github.com/hiyouga/LlamaFactory/issues/163'),
    ('W0801 13:23:17.366000 32974 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 33051 closing signal SIGTERM',
     NONE, 'https://github.com/OEvortex/unsloth/issues/10'),
    ('E0801 13:23:20.000000 32974 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 3 (pid: 33054) of binary: /home/ubuntu/pythonn3.11/bin/python3',
     K('job_failure'), 'https://github.com/OEvortex/unsloth/issues/10'),
    ('E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 5 (pid: 2630) of binary: /root/miniconda3/bin/python',
     K('job_failure'), 'https://github.com/lmzpai/roboMamba/issues/10'),
    ('torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ',
     K('job_failure'), 'https://github.com/lmzpai/roboMamba/issues/10'),
    ('test.py FAILED',
     NONE, 'https://github.com/lmzpai/roboMamba/issues/10'),
    ('  <NO_OTHER_FAILURES>',
     NONE, 'https://github.com/lmzpai/roboMamba/issues/10'),
    ('[2024-05-08 08:47:31,261] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 5938 closing signal SIGTERM',
     NONE, 'https://github.com/xiuqhou/Salience-DETR/issues/4'),
    ('[2024-05-08 08:47:31,877] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 2 (pid: 5939) of binary: /home/ubuntu/anaconda3/envs/salience_detr/bin/python',
     K('job_failure'), 'https://github.com/xiuqhou/Salience-DETR/issues/4'),
    ('    raise ChildFailedError(',
     NONE, 'https://github.com/meta-llama/llama/issues/706'),
    ('RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76 GiB total capacity; 8.77 GiB already allocated; 19.75 MiB free; 13.71 GiB reserved in total by PyTorch)',
     K('cuda_oom'), 'https://github.com/rshaojimmy/MADDoG/issues/11'),
    ('RuntimeError: CUDA out of memory. Tried to allocate 8.13 GiB (GPU 0; 10.76 GiB total capacity; 643.57 MiB already allocated; 8.20 GiB free; 32.43 MiB cached)',
     K('cuda_oom'), 'https://github.com/RenYurui/StructureFlow/issues/35'),
    ('RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)',
     K('cuda_oom'), 'https://github.com/pytorch/pytorch/issues/16417'),
    ('RuntimeError: CUDA out of memory. Tried to allocate 92.00 MiB (GPU 0; 1.96 GiB total capacity; 1.46 GiB already allocated; 16.38 MiB free; 1.51 GiB reserved in total by PyTorch',
     K('cuda_oom'), 'https://github.com/singhsourabh/Resume-NER/issues/4'),
    ('`RuntimeError:CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB total capacity; 4.36 GiB already allocated; 6.69 MiB free; 4.63 GiB reserved in total by PyTorch)`',
     K('cuda_oom'), 'https://github.com/chnsh/DCRNN_PyTorch/issues/6'),
    ('RuntimeError: CUDA out of memory. Tried to allocate 26.00 MiB (GPU 0; 1024.00 MiB total capacity; 435.61 MiB already allocated; 24.17 MiB free; 26.39 MiB cached)',
     K('cuda_oom'), 'https://github.com/pytorch/examples/issues/621'),
    ('`CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch) `',
     K('cuda_oom'), 'https://github.com/pytorch/pytorch/issues/59778'),
    ('When I run it, it raises  RuntimeError: CUDA out of memory. Tried to allocate 74.00 MiB (GPU 0; 11.91 GiB total capacity; 10.79 GiB already allocated; 12.94 MiB free; 11.21 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF',
     K('cuda_oom'), 'https://github.com/RistoranteRist/FastFlow/issues/4'),
    ('It clearly shows I still have over 1GB unallocated.',
     NONE, 'https://github.com/ryujaehun/pytorch-gpu-benchmark/issues/1'),
    ('ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[500,17,17,4032] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc.',
     K('cuda_oom'), 'https://github.com/tensorflow/models/issues/7142'),
    ('  (0) Resource exhausted: OOM when allocating tensor with shape[16,112,112,147] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc',
     K('cuda_oom'), 'https://github.com/Azure/MachineLearningNotebooks/issues/880'),
    ('Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current allocation info.',
     NONE, 'https://github.com/Azure/MachineLearningNotebooks/issues/880'),
    ('ResourceExhaustedError: OOM when allocating tensor with shape[128,128,109,109] and type float on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc',
     K('cuda_oom'), 'https://github.com/keras-team/keras/issues/9643'),
    ('2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor with shape[16,1,892800,8,4,2,2] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc',
     K('cuda_oom'), 'https://github.com/zzw922cn/Automatic_Speech_Recognition/issues/78'),
    ('2018-06-08 17:26:00.908082: I tensorflow/core/common_runtime/bfc_allocator.cc:680] Stats: ',
     NONE, 'https://github.com/zzw922cn/Automatic_Speech_Recognition/issues/78'),
    ('jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.',
     K('cuda_oom'), 'https://github.com/patrickbryant1/AFProfile/issues/8'),
    ('BufferAssignment OOM Debugging.',
     NONE, 'https://github.com/patrickbryant1/AFProfile/issues/8'),
    ('jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.',
     K('cuda_oom'), 'https://github.com/jax-ml/jax/issues/13428'),
    ('2025-05-18 21:59:55.086788: W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.',
     NONE, 'https://github.com/flatironinstitute/nemos/issues/345'),
    ('RuntimeError: CUDA error: uncorrectable ECC error encountered',
     K('cuda_error'), 'https://github.com/huggingface/accelerate/issues/1192'),
    ('CUDA kernel errors might be asynchronously reported at some other API call,so the stacktrace below might be incorrect.',
     NONE, 'https://github.com/huggingface/accelerate/issues/1192'),
    ('For debugging consider passing CUDA_LAUNCH_BLOCKING=1.',
     NONE, 'https://github.com/huggingface/accelerate/issues/1192'),
    ('[15:58:29] WARNING  Sending process 197 closing signal SIGTERM                                                                                                                 api.py:699',
     NONE, 'https://github.com/huggingface/accelerate/issues/1192'),
    ('Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.',
     NONE, 'https://github.com/tloen/alpaca-lora/issues/123'),
    ('CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.',
     NONE, 'https://github.com/zai-org/ChatGLM3/issues/681'),
    ("CUDA error: uncorrectable ECC error encountered Search for `cudaErrorECCUncorrectable' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information. CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect. For debugging consider passing CUDA_LAUNCH_BLOCKING=1 Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
     K('cuda_error'), 'https://github.com/ostris/ai-toolkit/issues/470'),
    ('RuntimeError: CUDA error: no kernel image is available for execution on the device',
     K('cuda_error'), 'https://github.com/kohjingyu/gill/issues/39'),
    ('[2025-01-29 08:52:43 TP5] Using default MoE config. Performance might be sub-optimal! Config file not found at /home/ubuntu/.local/lib/python3.10/site-packages/sglang/srt/layers/moe/fused_moe_triton/configs/E=160,N=192,device_name=NVIDIA_A100-SXM4-80GB.json',
     NONE, 'https://github.com/sgl-project/sglang/issues/3204'),
    ('  what():  CUDA error: uncorrectable ECC error encountered',
     K('cuda_error'), 'https://github.com/sgl-project/sglang/issues/9151'),
    ('Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:42 (most recent call first):',
     NONE, 'https://github.com/sgl-project/sglang/issues/9151'),
    ('frame #1: <unknown function> + 0x111c7 (0x7f3009f6c1c7 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10_cuda.so)',
     NONE, 'https://github.com/sgl-project/sglang/issues/9151'),
    ('[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered',
     K('cuda_error'), 'https://github.com/vllm-project/vllm/issues/4108'),
    ('(RayWorkerVllm pid=7046) [2024-04-16 00:03:25,080 E 7046 7269] logging.cc:361:     @     0x7f514b634520  (unknown)  (unknown)',
     NONE, 'https://github.com/vllm-project/vllm/issues/4108'),
    ('frame #6: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7f5de5a3361d in /disk2/condaenvs/deepseek/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'https://github.com/InternLM/lmdeploy/issues/3258'),
    ('Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1601 (most recent call first):',
     NONE, 'https://github.com/InternLM/lmdeploy/issues/3258'),
    ('frame #2: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x118 (0x7f678a19e8a8 in /home/paperspace/gpt-fast/env/lib/python3.10/site-packages/torch/lib/libc10_cuda.so)',
     NONE, 'https://github.com/meta-pytorch/gpt-fast/issues/98'),
    ('frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x6c (0x7f673f7db3ac in /home/paperspace/gpt-fast/env/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'https://github.com/meta-pytorch/gpt-fast/issues/98'),
    ('frame #5: c10d::ProcessGroupNCCL::workCleanupLoop() + 0x15a (0x7f673f7e2bfa in /home/paperspace/gpt-fast/env/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)',
     NONE, 'https://github.com/meta-pytorch/gpt-fast/issues/98'),
    ('NVRM: GPU 0001:00:00.0: RmInitAdapter failed! (0x63:0x55:2344)',
     K('gpu_lost', pci='0001:00:00.0'), 'find_string: microsoft/lisa nvidia test comment (dmesg excerpt)'),
    ('NVRM: GPU 0001:00:00.0: rm_init_adapter failed, device minor number 0',
     K('gpu_lost', pci='0001:00:00.0'), 'find_string: microsoft/lisa nvidia test comment (dmesg excerpt)'),
    ('3,1042,8462102,-;NVRM: GPU 0000:00:03.0: RmInitAdapter failed! (0x22:0x65:884)',
     K('gpu_lost', pci='0000:00:03.0'), 'find_string: kernel/hypeman guest test fixture'),
    ('NVRM: RmInitAdapter failed! (0x62:0x65:2028)',
     K('gpu_lost'), 'find_string: DGX Spark GSP init failure fixture'),
    ('**Nov 25 15:40:58 cctvserver-MS-7B17 kernel: [159259.989773] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x24:0x65:1185)**',
     K('gpu_lost', pci='0000:02:00.0'), 'find_string: forum log paste (cctvserver)'),
    ('cctvserver-MS-7B17 kernel: [158878.530066] NVRM: Xid (PCI:0000:02:00): 13, pid=25450, Graphics SM Global Exception on (GPC 0, TPC 1, SM 1): Multiple Warp Errors**',
     X(13, '0000:02:00'), 'find_string: forum log paste (cctvserver)'),
    ('[    8.600582] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x25:0x65:1468)',
     K('gpu_lost', pci='0000:01:00.0'), 'find_string: geerlingguy raspberry-pi-pcie-devices notes'),
    ('[    8.600817] [drm:nv_drm_load [nvidia_drm]] *ERROR* [nvidia-drm] [GPU ID 0x00000100] Failed to allocate NvKmsKapiDevice',
     NONE, 'find_string: geerlingguy raspberry-pi-pcie-devices notes'),
    ('caller os_map_kernel_space.part.0+0xa2/0xb0 [nvidia] mapping multiple BARs',
     NONE, 'find_string: ESXi P40 passthrough notes'),
    ('NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, ... timeout 5200',
     K('gpu_lost'), 'find_string: zel GSP suspend bug notes'),
    ('     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 322227881 heartbeat 0 heartbeatWithOffsetMs 318098841 diff 4129040 timeout 5200',
     K('gpu_lost'), 'https://github.com/ublue-os/bazzite/issues/4449'),
    ('     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out',
     K('gpu_lost'), 'https://github.com/ublue-os/bazzite/issues/4449'),
    ('     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspProcessRpcEvent: Attempted to process RPC event from GPU0: 0x101a (PFM_REQ_HNDLR_STATE_SYNC_CALLBACK) during bootup without API lock',
     NONE, 'https://github.com/ublue-os/bazzite/issues/4449'),
    ('     Mar 21 21:42:01 kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: 0 @ kernel_gsp.c:1446',
     NONE, 'https://github.com/ublue-os/bazzite/issues/4449'),
    ('     Mar 21 21:43:00 kernel: nvidia 0000:05:00.0: Enabling HDA controller',
     NONE, 'https://github.com/ublue-os/bazzite/issues/4449'),
    ('[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200',
     K('gpu_lost'), 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[   14.650646] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  Release Build  (root@epyc)  Fri Jul  3 11:27:00 AM UTC 2026',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[   14.852483] workqueue: drm_fb_helper_damage_work hogged CPU for >10000us 8 times, consider switching to WQ_UNBOUND',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[   84.300463] NVRM: GPU6 _threadNodeCheckTimeout: _threadNodeCheckTimeout: Timeout was set to: 4000 msecs!',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[   84.738339] NVRM: GPU6 RPC event history (CPU <- GSP):',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[   84.738332] NVRM:     -3    72   GSP_SET_SYSTEM_INFO            0 0x0000000000000000 0x0000000000000000 0x000655d53b47bfbe 0x000655d53b587765   1095ms  ',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230'),
    ('[    8.046867] nvidia-nvlink: Nvlink Core is being initialized, major device number 239',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1064'),
    ('[    8.108512] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.58.03  Release Build  (nixbld@)  ',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1064'),
    ('[    9.082486] nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  595.58.03  Release Build  (nixbld@)  ',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1064'),
    ('[    9.165175] [drm] [nvidia-drm] [GPU ID 0x00000100] Loading driver',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1064'),
    ('192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: NVRM: kflcnCoreDumpNondestructive_IMPL: TRACE: 08 = 0x0000000004d4b1a0',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/446'),
    ('"Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU"',
     K('gpu_lost', pci='0000:02:00.0'), 'https://github.com/JosephKJ/OWOD/issues/81'),
    ('        Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost.  Reboot',
     K('gpu_lost', pci='0000:03:00.0'), 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('    CUDA Error: no CUDA-capable device is detected',
     K('cuda_error'), 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('| NVIDIA-SMI 369.30                 Driver Version: 369.30                    |',
     NONE, 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('| GPU  Name            TCC/WDDM | Bus-Id        Disp.A | Volatile Uncorr. ECC |',
     NONE, 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('|   0  GeForce 840M       WDDM  | 0000:03:00.0     Off |                  N/A |',
     NONE, 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('| N/A   37C    P8    N/A /  N/A |     52MiB /  2048MiB |      0%      Default |',
     NONE, 'https://github.com/AlexeyAB/darknet/issues/86'),
    ('NVMLError_GpuIsLost: GPU is lost',
     K('gpu_lost'), 'https://github.com/rossumai/nvgpu/issues/6'),
    ('    raise NVMLError(ret)',
     NONE, 'https://github.com/rossumai/nvgpu/issues/6'),
    ('Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost.  Reboot the system to recover this GPU',
     K('gpu_lost', pci='0000:03:00.0'), 'https://github.com/marian-nmt/marian/issues/251'),
    ('[  412.331] NVRM: GPU at 0000:01:00.0 has fallen off the bus.',
     K('gpu_lost', pci='0000:01:00.0'), 'find_string: incident fixture (fallen-off-bus)'),
    ('[12345.678] kernel: NVRM: Xid (PCI:0000:3b:00): 94, Ch 00000008',
     X(94, '0000:3b:00'), 'find_string: check_xid test fixture'),
    ('[12345.678] NVRM: Xid (PCI:0000:3b:00): 43, pid=1234, name=python, Ch 00000002',
     X(43, '0000:3b:00'), 'find_string: check_xid test fixture'),
    ('NVRM: Xid (PCI:000f:01:00): 119, Timeout after 6s of waiting for RPC response from GPU0 GSP!',
     X(119, '000f:01:00'), 'find_string: DGX Spark GSP init failure fixture'),
    ('#     NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action ... 0x1 (GPU Reset Required)',
     X(154, '0000:01:00'), "find_string: NixOS config comment quoting a frozen boot's kernel log"),
    ('[rank0]:[W1028 04:48:19.843866299 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to perform barrier as devices used by this process are currently unknown. This can potent',
     NONE, 'https://github.com/bmaltais/kohya_ss/issues/2933'),
    ('ially cause a hang if this rank to GPU mapping is incorrect.Specify device_ids in barrier() to force use of a particular device,or call init_process_group() with a device_id.01, 1233.43it/s]',
     NONE, 'https://github.com/bmaltais/kohya_ss/issues/2933'),
    ('[W ProcessGroupNCCL.cpp:1569] Rank 0 using best-guess GPU 0 to perform barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect.Specify device_ids in barrier() to force use of a particular device.',
     NONE, 'https://github.com/pytorch/pytorch/issues/60752'),
    ('[W404 00:15:21.693690333 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to perform barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect. Specify device_ids in barrier() to force use of a particular device, or call init_process_group() with a device_id.',
     NONE, 'https://github.com/deepspeedai/DeepSpeed/pull/7266'),
    ('2025-10-03T20:49:10.479Z (PolicyTrainerRayProcess pid=1720) [rank0]:[W1003 20:49:10.123654124',
     NONE, 'https://github.com/allenai/open-instruct/pull/1055'),
    ('  | 2024-12-04T05:26:27.056Z | W1204 05:26:26.878000 17959 site-packages/torch/distributed/run.py:793] *****************************************',
     NONE, 'https://github.com/aws/aws-ofi-nccl/issues/715'),
    ('#[rank0]:[W403 11:42:02.380967152 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call destroy_process_group to ensure that any pending NCCL operations have finished in this process. In rare cases this process can exit before this point and block the progress of another member of the process group. This constraint has always been present,  but this warning has only been added since PyTorch 2.4 (function operator())',
     NONE, 'https://github.com/zunxbt/gensyn-testnet/issues/10'),
    ('[rank0]:[W515 07:06:42.829549331 ProcessGroupNCCL.cpp:1117] WARNING: process group has NOT been destroyed before it is being destructed. On normal program exit, the application should call destroy_process_group to ensure that any pending NCCL data transfers have finished in this process. In rare cases this process can exit before this point and block the progress of another member of the process group. This constraint has always been present,  but this warning has only been added since PyTorch 2.4',
     NONE, 'https://github.com/pytorch/pytorch/issues/126275'),
    ('[rank0]:[W730 15:32:17.841273251 ProcessGroupNCCL.cpp:1479] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources. For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())',
     NONE, 'https://github.com/anhvth/opensloth/issues/17'),
    ('[rank0]: [w422 20:21:54.990623366 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NoT been destroyed before we destruct processGroupNccL. On normal program exit, the application should call destroy_process_group to ensure thatany pending NCCL operations have finished in this process.In rare cases this process can exit before this point and block the progress of another member of the process groupThis constraint has always been present,but this warning hasonly been added since PyTorch 2.4(function operator())',
     NONE, 'https://github.com/gensyn-ai/rl-swarm/issues/183'),
    ('W0219 09:17:03.837000 140066961602368 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 2448006 closing signal SIGTERM',
     NONE, 'https://github.com/hpcaitech/ColossalAI/issues/6202'),
    ('Processed prompts: 100%|████████████████████████████████████████████████████| 1/1 [00:00<00:00,  5.91it/s, est. speed input: 218.76 toks/s, output: 88.68 toks/s]',
     NONE, 'https://github.com/unslothai/unsloth/issues/1959'),
    ("[rank1]:[E418 01:32:50.907313453 ProcessGroupNCCL.cpp:1890] [PG ID 0 PG GUID 0(default_pg) Rank 1] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 233659, last completed NCCL work: 233659.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc.",
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm-omni/issues/2928'),
    ("[rank0]:[E418 01:32:50.907342463 ProcessGroupNCCL.cpp:1890] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from  rank 1 and we will try our best to dump the debug info. Last enqueued NCCL work: 233659, last completed NCCL work: 233659.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc.",
     K('nccl_timeout'), 'https://github.com/vllm-project/vllm-omni/issues/2928'),
    ("[rank6]:[E909 08:45:31.970959174 ProcessGroupNCCL.cpp:1870] [PG ID 0 PG GUID 0 Rank 6] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: -1, last completed NCCL work: -1.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
     K('nccl_timeout'), 'https://github.com/sgl-project/sglang/issues/10216'),
    ("[1803] [rank1]:[E602 11:17:52.557891708 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 1] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 6, last completed NCCL work: 6.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
     K('nccl_timeout'), 'https://github.com/hiyouga/LlamaFactory/issues/8261'),
    ("[rank2]:[E901 05:20:03.118859045 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received a dump signal due to a collective timeout from  rank 6 and we will try our best to dump the debug info. Last enqueued NCCL work: 460631, last completed NCCL work: 460630.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
     K('nccl_timeout'), 'https://github.com/OpenRLHF/OpenRLHF/issues/1126'),
    ('[rank7]:[E901 05:20:03.124073319 ProcessGroupNCCL.cpp:2271] [PG ID 0 PG GUID 0(default_pg) Rank 7]  failure detected by watchdog at work sequence id: 460631 PG status: last enqueued work: 460631, last completed work: 460630',
     K('nccl_timeout'), 'https://github.com/OpenRLHF/OpenRLHF/issues/1126'),
    ('[2025-06-26 16:48:28,488] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 174644',
     NONE, 'https://github.com/snowflakedb/ArcticTraining/issues/219'),
    ('/data-fast/miniforge3/envs/arctic/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: There appear to be 15 leaked semaphore objects to clean up at shutdown',
     NONE, 'https://github.com/snowflakedb/ArcticTraining/issues/219'),
    ('[rank3[]:[E508 07:35:59.440171617 ProcessGroupNCCL.cpp:733] Stack trace of the failed collective: ',
     NONE, 'https://github.com/vllm-project/vllm/pull/41160'),
    ('#0 broadcast from /usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:2968',
     NONE, 'https://github.com/vllm-project/vllm/pull/41160'),
    ("[E930 15:23:00.059980974 ProcessGroupNCCL.cpp:1487] [PG ID 4 PG GUID  Rank 2] ProcessGroupNCCL's watchdog got stuck for 10 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang.",
     K('nccl_timeout'), 'https://github.com/NVIDIA/Fuser/issues/3055'),
    ('[F930 15:23:07.686401350 ProcessGroupNCCL.cpp:1309] [PG ID 6 PG GUID  Rank 0] [PG ID 6 PG GUID  Rank 0] Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.',
     K('nccl_timeout'), 'https://github.com/NVIDIA/Fuser/issues/3055'),
    ('dgx1v-loki-23:5892:6289 [2] NCCL INFO misc/socket.cc:47 -> 3',
     NONE, 'https://github.com/NVIDIA/Fuser/issues/3055'),
    ('[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=2',
     K('nccl_timeout'), 'find_string: Megatron training notes (ALCF) quoting a run log, id 24255785376'),
    ('[2024-04-30 22:06:35][INFO][training:184] - time to initialize megatron (seconds)=12.987',
     NONE, 'find_string: Megatron training notes (ALCF) quoting a run log, id 24255785376'),
    ('[rank0]:[E327 17:04:16.986381360 ProcessGroupNCCL.cpp:565] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=12, NumelOut=12, Timeout(ms)=1000) ran for 1099 milliseconds before timing out.',
     K('nccl_timeout'), "https://github.com/pytorch/pytorch/pull/122850 (log re-joined from the PR's wrapped paste)"),
    ('NCCL version 2.19.3+cuda12.0',
     NONE, 'https://github.com/pytorch/pytorch/pull/122850'),
    ('ErrorCode:DCGM_FR_XID_ERROR GPU:4 PCI:0000:c4:00.0 GPU_UUID:GPU-d1816eb1-2926-4fbc-13f6-1cf1ba1b921b Detected XID 31 for GPU 4 Please consult the documentation for details of this XID. Recommended Action=NONE;',
     X(31, '0000:c4:00.0'), 'https://github.com/NVIDIA/NVSentinel/issues/911'),
    ('[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2827',
     K('gpu_lost'), 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982'),
    ('torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable',
     K('cuda_error'), 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982'),
    ("Search for `cudaErrorDevicesUnavailable' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.",
     NONE, 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982'),
    ('[   32.840884] NVRM: nvAssertFailedNoLog: Assertion failed: 0 @ kernel_gsp.c:1476',
     NONE, 'https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982'),
    ('{"time":"2026-03-06T09:34:56.504112213Z","level":"INFO","msg":"Evaluating NodeRuleEvaluator for node","module":"fault-quarantine","version":"dev","node":"10.0.15.233"}',
     NONE, 'https://github.com/NVIDIA/NVSentinel/pull/953'),
    ('[   24.020433] NVRM cpuidInfoAMD: Unrecognized AMD processor in cpuidInfoAMD',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/120'),
    ('[   24.021693] nvidia 0000:01:00.0: vgaarb: changed VGA decodes: olddecodes=io+mem,decodes=none:owns=none',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/120'),
    ('[   23.989750] nvidia: loading out-of-tree module taints kernel.',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/120'),
    ('Jun 12 16:30:53 fedora-box kernel: NVRM: GPU0 _kgspProcessRpcEvent: Failed to process received event 0x1004 (RC_TRIGGERED) from GPU0: status=0x21',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045'),
    ('Jun 12 16:31:18 fedora-box kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045'),
    ('kwi 15 07:56:59 testowy kernel: NVRM: GPU at PCI:0000:07:00: GPU-fb51809b-350a-99db-67b5-e16fc6d498ab',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045'),
    ('kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 38, pid=326, name=modprobe, channel 0x00000003 0000c597 00000000 00000000',
     X(38, '0000:07:00'), 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045'),
    ('kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 109, pid=326, name=modprobe, channel 0x00000007, errorString CTX SWITCH TIMEOUT, Info 0x74007',
     X(109, '0000:07:00'), 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045'),
    ('May 28 11:59:54 fedora kernel: nouveau 0000:09:00.0: gsp: RM version: 570.144',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151'),
    ('May 28 12:00:14 fedora kernel: WARNING: drivers/gpu/drm/nouveau/nvkm/subdev/gsp/rm/r535/rpc.c:164 at r535_gsp_msgq_wait+0xb4/0xd0 [nouveau], CPU#0: (udev-worker)/429',
     NONE, 'https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151'),
    ('DCGM_FI_DEV_XID_ERRORS,            gauge,   Value of the last XID error encountered.',
     NONE, 'NVIDIA/dcgm-exporter:etc/default-counters.csv'),
    ('DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed',
     NONE, 'NVIDIA/dcgm-exporter:etc/default-counters.csv'),
    ('# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.',
     NONE, 'NVIDIA/dcgm-exporter:etc/default-counters.csv'),
    ('# DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.',
     NONE, 'NVIDIA/dcgm-exporter:etc/default-counters.csv'),
    ('# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.',
     NONE, 'find_string: dcgm-exporter exposition in a test fixture'),
    ('# TYPE DCGM_FI_DEV_XID_ERRORS gauge',
     NONE, 'find_string: dcgm-exporter exposition in a test fixture'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a"} 79',
     X(79, None), 'find_string: dcgm fixture (Go test), id 71171141510'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a"} 0',
     NONE, 'find_string: dcgm fixture (Go test), id 71171141510'),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a"} 92',
     NONE, 'find_string: dcgm fixture (Go test), id 71171141510'),
    ('DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",UUID="GPU-u0"} 7',
     NONE, 'find_string: exporter fixture, id 70503092250'),
    ('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu="1",UUID="GPU-u1"} 0',
     NONE, 'find_string: exporter fixture, id 70503092250'),
    ('   DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 0',
     NONE, 'find_string: dcgm-exporter docs sample output, id 2204724251'),
    ('   DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 409.692000',
     NONE, 'find_string: dcgm-exporter docs sample output, id 2204724251'),
    ('   DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 4845',
     NONE, 'find_string: dcgm-exporter docs sample output, id 2204724251'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-b",Hostname="node-a"} 31',
     X(31, None), 'find_string: python prometheus-source test fixture, id 69304195733'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418",device="nvidia0",modelName="NVIDIA A800-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3",Hostname="msxf-hpc-64-35-ai",DCGM_FI_DRIVER_VERSION="535.129.03",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0',
     NONE, 'find_string: dcgm-exporter issue paste (A800 MIG), id 54546317502'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu=~"$gpu"}',
     NONE, 'find_string: PromQL in a Grafana guide, id 56694866005'),
    ('DCGM_FI_DEV_FB_USED{gpu=~"$gpu"} / DCGM_FI_DEV_FB_TOTAL{gpu=~"$gpu"}',
     NONE, 'find_string: PromQL in a Grafana guide, id 56694866005'),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a1b2...",pod="train-job-0"} 0        ← 0 is what you want; nonzero means driver-level fault events',
     NONE, 'find_string: GPU triage guide, id 62810101934'),
    ('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-a1b2...",pod="train-job-0"} 0 ← uncorrectable ECC errors; nonzero = hardware memory fault, not software',
     NONE, 'find_string: GPU triage guide, id 62810101934'),
    ('        expr: increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0',
     NONE, 'find_string: PrometheusRule example, id 59327255194'),
    ('      - alert: GPUXIDError',
     NONE, 'find_string: PrometheusRule example, id 59327255194'),
    ('          summary: "GPU XID 错误"',
     NONE, 'find_string: PrometheusRule example, id 59327255194'),
    ('I0531 18:14:25.288684      71 health.go:64] Ignoring the following XIDs for health checks: map[13:true 31:true 43:true 45:true 68:true 109:true]',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ("I0531 18:14:25.286708      71 server.go:148] Registered device plugin for 'nvidia.com/gpu.shared' with Kubelet",
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ("I0531 18:14:25.284247      71 server.go:141] Starting to serve 'nvidia.com/gpu.shared' on /var/lib/kubelet/device-plugins/nvidia-gpu.shared.sock",
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('Installing NVIDIA driver version 580.105.08.',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('Loading NVIDIA driver kernel modules...',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('+ modprobe nvidia NVreg_CoherentGPUMemoryMode=driver',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('Starting NVIDIA persistence daemon...',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('Installation of the kernel module for the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: 580.105.08) is now complete.',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('Defaulted container "nvidia-device-plugin" out of: nvidia-device-plugin, config-manager, toolkit-validation (init), config-manager-init (init)',
     NONE, 'find_string: GPU Operator lab notes with device-plugin/driver logs, id 57370384231'),
    ('{"level":"error","ts":"2025-03-04T07:57:23Z","msg":"failed to reconcile DCGM state","hostname":"ip-10-10-15-1.eu-west-1.compute.internal","monitor":"nvidia","error":"failed to initialize DCGM: Error connecting to nv-hostengine: Host engine connection invalid/disconnected"}',
     NONE, 'https://github.com/aws/containers-roadmap/issues/2555 (stacktrace field trimmed)'),
    ('"message": "xid 119 detected by dmesg (47 minutes ago)",',
     X(119, None), 'https://github.com/leptonai/gpud/pull/192'),
    ('torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF',
     K('cuda_oom', gpu=0), 'https://github.com/vllm-project/vllm/issues/783'),
    ('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 74.16 GiB. GPU 0 has a total capacity of 44.40 GiB of which 29.89 GiB is free. Process 2684311 has 14.51 GiB memory in use. Of the allocated memory 13.44 GiB is allocated by PyTorch, and 738.96 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)',
     K('cuda_oom', gpu=0), 'https://github.com/studio-dots-ai/dots.ocr/issues/196'),
    ('[rank0]:[W914 04:53:45.615225908 ProcessGroupNCCL.cpp:1476] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources. For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())',
     NONE, 'https://github.com/studio-dots-ai/dots.ocr/issues/196'),
    ('ERROR 03-13 09:00:43 [core.py:330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 7.75 GiB of which 1.17 GiB is free. Including non-PyTorch memory, this process has 5.02 GiB memory in use. Of the allocated memory 4.81 GiB is allocated by PyTorch, and 18.97 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)',
     K('cuda_oom', gpu=0), 'https://github.com/vllm-project/vllm/issues/12529'),
    ('CRITICAL 03-13 09:00:43 [core_client.py:260] Got fatal signal from worker processes, shutting down. See stack trace above for root cause issue.',
     NONE, 'https://github.com/vllm-project/vllm/issues/12529'),
    ('torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total capacty of 21.67 GiB of which 4.06 MiB is free. Process 2417585 has 21.65 GiB memory in use. Of the allocated memory 21.32 GiB is allocated by PyTorch, and 1018.00 KiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF',
     K('cuda_oom', gpu=0), 'https://github.com/vllm-project/vllm/issues/2140'),
    ('(VllmWorker rank=1 pid=194255) ERROR 05-08 14:46:12 [multiproc_executor.py:435] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB. GPU 1 has a total capacity of 21.98 GiB of which 156.94 MiB is free. Including non-PyTorch memory, this process has 21.80 GiB memory in use. Of the allocated memory 21.42 GiB is allocated by PyTorch, and 24.12 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)',
     K('cuda_oom', gpu=1), 'https://github.com/vllm-project/vllm/issues/17835'),
    ('| NVIDIA-SMI 550.163.01             Driver Version: 550.163.01     CUDA Version: 12.4     |',
     NONE, 'https://github.com/vllm-project/vllm/issues/17835'),
    ('| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |',
     NONE, 'https://github.com/vllm-project/vllm/issues/17835'),
    ('(VllmWorker rank=5 pid=3073)     self.worker.load_model()',
     NONE, 'https://github.com/vllm-project/vllm/issues/15182'),
    ('(VllmWorkerProcess pid=90) ERROR 12-16 21:40:15 multiproc_worker_utils.py:229]     output = executor(*args, **kwargs)',
     NONE, 'https://github.com/vllm-project/vllm/issues/11251'),
    ('2017-08-12 08:25:14.841699: E tensorflow/stream_executor/cuda/cuda_driver.cc:924] failed to allocate 90.48M (94873600 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY',
     K('cuda_oom'), 'https://github.com/tensorflow/tensorflow/issues/12237'),
    ('2019-07-21 23:23:06.228049: E tensorflow/stream_executor/cuda/cuda_driver.cc:828] failed to allocate 32.00M (33554432 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory',
     K('cuda_oom'), 'https://github.com/tensorflow/tensorflow/issues/30912'),
    ('2019-07-21 23:23:06.136829: I tensorflow/stream_executor/platform/default/dso_loader.cc:42] Successfully opened dynamic library libcublas.so.10',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/30912'),
    ('2019-07-21 23:23:06.224853: E tensorflow/stream_executor/cuda/cuda_blas.cc:238] failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED',
     K('cuda_error'), 'https://github.com/tensorflow/tensorflow/issues/30912'),
    ('2021-09-24 16:22:49.534717: W tensorflow/stream_executor/gpu/redzone_allocator.cc:312] Internal: Invoking GPU asm compilation is supported on Cuda non-Windows platforms only',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/52123'),
    ('2021-09-24 16:22:56.271936: W tensorflow/core/common_runtime/bfc_allocator.cc:243] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.60GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/52123'),
    ('2021-08-31 08:43:31.591671: I tensorflow/stream_executor/cuda/cuda_driver.cc:789] failed to allocate 3.81G (4087755776 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory',
     K('cuda_oom'), 'https://github.com/deepmodeling/dpgen/issues/528'),
    ('I tensorflow/stream_executor/dso_loader.cc:128] successfully opened CUDA library libcublas.so locally',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/6048'),
    ('I tensorflow/stream_executor/cuda/cuda_gpu_executor.cc:936] successful NUMA node read from SysFS had negative value (-1), but there must be at least one NUMA node, so returning NUMA node zero',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/6048'),
    ('I tensorflow/core/common_runtime/gpu/gpu_device.cc:885] Found device 0 with properties: ',
     NONE, 'https://github.com/tensorflow/tensorflow/issues/6048'),
    ('NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.',
     K('gpu_lost', pci='0000:29:00.0'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('NVRM: GPU 18:00.0: GPU has fallen off the bus.',
     K('gpu_lost', pci='0000:18:00.0'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('NVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: (PCI ID: 10de:2901) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.',
     K('gpu_lost', pci='0000:18:00.0'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('[171167.630899] NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)',
     X(149, '0008:01:00'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)',
     X(154, '0019:01:00'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('[171168.109293] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 15 (0x0215e5c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)',
     X(149, '0009:01:00'), 'leptonai/gpud:components/accelerator/nvidia/xid/kmsg_test.go'),
    ('{"level":"warn","ts":"2024-11-08T04:24:24Z","caller":"nvml/xid.go:170","msg":"notified xid event","event":{"time":"2024-11-08T04:24:24Z","sample_duration":"5s","device_uuid":"GPU-e3038df4-dc48-27c8-a48a-36956600f1c2","xid":0,"nvml_event_type":16,"nvml_event_type_single_bit_ecc_error":false,"nvml_event_type_double_bit_ecc_error":false,"nvml_event_type_p_state":false,"nvml_event_type_xid_critical_error":false,"nvml_event_type_clock":true,"nvml_event_type_power_source_change":false,"nvml_event_type_mig_config_change":false,"detail":null,"message":"received event but xid unknown"}}',
     NONE, 'https://github.com/leptonai/gpud/pull/164'),
    ('[I ProcessGroupNCCL.cpp:850] [Rank 0] NCCL watchdog thread started!',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('[I ProcessGroupNCCL.cpp:672] [Rank 0] ProcessGroupNCCL initialized with following options:',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('NCCL_ASYNC_ERROR_HANDLING: 1',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('NCCL_DESYNC_DEBUG: 0',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('NCCL_BLOCKING_WAIT: 0',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('TIMEOUT(ms): 1800000',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('USE_HIGH_PRIORITY_STREAM: 0',
     NONE, 'https://github.com/NVIDIA/nccl/issues/1241'),
    ('AcceleratedHardwareReady  True → False  Reason: NvidiaXID79Error',
     X(79, None), 'find_string: EKS node auto-repair walkthrough (p6-b200.48xlarge), id 55306173014'),
    ('Message: detected XID-79 on the instance, review kernel logs for additional information.',
     X(79, None), 'find_string: EKS node auto-repair walkthrough (p6-b200.48xlarge), id 55306173014'),
    ('False reason=NvidiaXID79Error msg=detected XID-79 on the instance, review kernel logs for additional information.',
     X(79, None), 'find_string: EKS NMA walkthrough (Japanese), id 57430446238'),
    ('detected unknown XID-13 on the instance, review kernel logs for additional information.',
     X(13, None), 'aws/eks-node-monitoring-agent:monitors/nvidia/dcgm (Sprintf format, unknown-XID branch), id 51874852598'),
]


def _family(line: str, expect: Expect) -> str:
    if not expect.none:
        return expect.kind or (expect.prefix or "signal") + "_any"
    low = line.lower()
    for word, family in (("dcgm", "dcgm"), ("nvrm", "kernel"), ("nccl", "nccl"), ("cuda", "cuda"), ("xid", "xid")):
        if word in low:
            return "none_" + family
    return "none_other"


def _params() -> list[Any]:
    counts: dict[str, int] = {}
    params = []
    for line, expect, source in CASES:
        family = _family(line, expect)
        counts[family] = counts.get(family, 0) + 1
        params.append(pytest.param(line, expect, source, id=f"{family}-{counts[family]:03d}"))
    return params


def _check(expect: Expect, rows: list[dict[str, Any]], context: str) -> None:
    if expect.none:
        assert rows == [], f"{context}: expected no signal, got {rows}"
        return
    assert rows, f"{context}: expected a signal, got none"
    first = rows[0]
    if expect.prefix is not None:
        assert str(first["kind"]).startswith(expect.prefix), f"{context}: {first}"
    else:
        assert first["kind"] == expect.kind, f"{context}: {first}"
    if expect.kind == "xid":
        assert first["xid"] == expect.xid, f"{context}: {first}"
        want = None if expect.pci is None else normalize_pci_bus_id(expect.pci)
        assert first["pci_bus_id"] == want, f"{context}: {first}"
        info = CATALOG.get(expect.xid) if expect.xid is not None else None
        assert first["action"] == (info.immediate_action or None if info else None), f"{context}: {first}"
    else:
        assert first["xid"] is None and first["action"] is None, f"{context}: {first}"
        if expect.pci is not None:
            assert first["pci_bus_id"] == normalize_pci_bus_id(expect.pci), f"{context}: {first}"
    if expect.gpu is not None:
        assert first["gpu_index"] == expect.gpu, f"{context}: {first}"


def _row(sig: Any) -> dict[str, Any]:
    return {"kind": sig.kind, "xid": sig.xid, "pci_bus_id": sig.pci_bus_id, "gpu_index": sig.gpu_index,
            "action": sig.action, "playbook": sig.playbook}


@pytest.mark.parametrize(("line", "expect", "source"), _params())
def test_real_line_is_judged_as_the_reference_says(line: str, expect: Expect, source: str) -> None:
    single = classify_line(line)
    _check(expect, [] if single is None else [_row(single)], f"classify_line ({source})")
    cli = [f.row() for f in classify_text(line + "\n")]
    if "\n" not in line:
        assert cli == [] if single is None else [r for r in cli if r["line"] == 1], source
        _check(expect, cli, f"classify ({source})")
    else:  # a message the kernel wrapped over lines: per line, the line naming the fault is the signal
        kinds = {r["kind"] for r in cli}
        assert kinds == (set() if expect.none else {expect.kind}), f"classify ({source}): {cli}"


def test_all_real_lines_through_the_cli_in_one_file(tmp_path: Path) -> None:
    """The same table as one log file through ``remediator classify --json``: line numbers line up."""
    singles = [(line, expect) for line, expect, _ in CASES if "\n" not in line and "\r" not in line]
    log = tmp_path / "fleet.log"
    log.write_text("\n".join(line for line, _ in singles) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["classify", "--json", str(log)])
    assert result.exit_code == 0, result.output
    by_line: dict[int, list[dict[str, Any]]] = {}
    for text in result.stdout.splitlines():
        row = json.loads(text)
        assert set(row) == {"line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook"}
        by_line.setdefault(row["line"], []).append(row)
    for n, (line, expect) in enumerate(singles, 1):
        _check(expect, by_line.get(n, []), f"line {n}: {line[:100]!r}")
    assert set(by_line) <= set(range(1, len(singles) + 1))


def test_the_table_is_big_and_covers_every_family() -> None:
    assert len(CASES) >= 150
    assert len({line for line, _, _ in CASES}) == len(CASES)
    kinds = {e.kind for _, e, _ in CASES if e.kind}
    assert {"xid", "sxid", "gpu_lost", "health_check", "nccl_timeout", "nccl_error", "job_failure", "cuda_oom",
            "cuda_error"} <= kinds
    assert sum(1 for _, e, _ in CASES if e.none) >= 100


# --- Alertmanager payloads -----------------------------------------------------------------------------

_UUID = "GPU-265c9814-6156-355b-e589-ff2064894f16"  # dcgm-exporter issue #317


def _dcgm_labels(**extra: str) -> dict[str, str]:
    """An alert's labels as a kube-prometheus scrape of dcgm-exporter leaves them (gpu-faults.md §2.6)."""
    labels = {"DCGM_FI_DRIVER_VERSION": "550.90.07", "Hostname": "gpu-node-17", "UUID": _UUID,
              "container": "nvidia-dcgm-exporter", "device": "nvidia3", "endpoint": "gpu-metrics", "gpu": "3",
              "instance": "10.42.3.7:9400", "job": "nvidia-dcgm-exporter", "modelName": "NVIDIA H100 80GB HBM3",
              "namespace": "gpu-operator", "pci_bus_id": "00000000:9B:00.0", "pod": "nvidia-dcgm-exporter-x7k2p",
              "service": "nvidia-dcgm-exporter", "exported_namespace": "team-research", "exported_pod": "trainer-0",
              "exported_container": "main"}
    labels.update(extra)
    return labels


def _alert(labels: dict[str, str], annotations: dict[str, str], expr: str, fingerprint: str) -> dict[str, Any]:
    return {"status": "firing", "labels": labels, "annotations": annotations, "startsAt": "2025-11-01T09:43:24.47Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://kube-prometheus-stack-prometheus.monitoring:9090/graph?g0.expr="
                            + quote(expr) + "&g0.tab=1",
            "fingerprint": fingerprint}


# kube-prometheus's always-firing alert, as apprise's Alertmanager test fixture records it.
WATCHDOG = {
    "status": "firing",
    "labels": {"alertname": "Watchdog", "prometheus": "monitoring/kube-prometheus-stack-prometheus", "severity": "none"},
    "annotations": {
        "description": "This is an alert meant to ensure that the entire alerting pipeline is functional.\nThis alert is always firing, therefore it should always be firing in Alertmanager\nand always fire against a receiver. There are integrations with various notification\nmechanisms that send a notification when this alert is not firing. For example the\n\"DeadMansSnitch\" integration in PagerDuty.\n",
        "runbook_url": "https://runbooks.prometheus-operator.dev/runbooks/general/watchdog",
        "summary": "An alert that should always be firing to certify that Alertmanager is working properly.",
    },
    "startsAt": "2025-11-01T09:43:24.47Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://kube-prometheus-stack-prometheus.monitoring:9090/graph?g0.expr=vector%281%29&g0.tab=1",
    "fingerprint": "7da76e02b5888fb5",
}

# name -> (alert, expected row fields or None for no signal). Rules and annotations from public PrometheusRule
# examples: GPUXIDError "DCGM_FI_DEV_XID_ERRORS > 0" / "GPU {{ $labels.gpu }} reported XID error {{ $value }}",
# GPUXidErrors "increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0", GPUECCDoubleBitError, GPUHighTemperature,
# GPUMemoryHigh, DCGMExporterDown; KubePodCrashLooping from kube-prometheus.
ALERTS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "xid-err_code-label": (
        _alert(_dcgm_labels(alertname="GPUXIDError", severity="critical", err_code="79",
                            err_msg="GPU has fallen off the bus"),
               {"summary": "GPU XID error detected", "description": "GPU 3 reported XID error 79"},
               "DCGM_FI_DEV_XID_ERRORS > 0", "a1"),
        {"kind": "xid", "xid": 79, "pci_bus_id": "0000:9b:00.0", "gpu_index": 3, "action": "RESTART_BM"}),
    "xid-value-in-description": (
        _alert(_dcgm_labels(alertname="GPUXIDError", severity="warning"),
               {"summary": "GPU XID error detected", "description": "GPU 3 reported XID error 48"},
               "DCGM_FI_DEV_XID_ERRORS > 0", "a2"),
        {"kind": "xid", "xid": 48, "pci_bus_id": "0000:9b:00.0", "gpu_index": 3, "action": "WORKFLOW_XID_48"}),
    "xid-exp-count-xid-label": (
        _alert({"alertname": "GpuXidErrorFatalPattern", "severity": "pager", "xid": "74", "hostname": "gpu-node-9",
                "gpu": "1", "pci_bus_id": "00000000:1B:00.0", "UUID": _UUID},
               {}, 'increase(DCGM_EXP_XID_ERRORS_COUNT{xid=~"48|63|64|74|79|92"}[1m]) > 0', "a3"),
        {"kind": "xid", "xid": 74, "pci_bus_id": "0000:1b:00.0", "gpu_index": 1,
         "action": "WORKFLOW_NVLINK_ERR"}),
    "ecc-dbe": (
        _alert(_dcgm_labels(alertname="GPUECCDoubleBitError", severity="critical"),
               {"summary": "GPU 3 has double-bit ECC errors -- schedule replacement"},
               "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0", "a4"),
        {"kind": "ecc", "xid": None, "pci_bus_id": "0000:9b:00.0", "gpu_index": 3, "action": None}),
    "row-remap-failure": (
        _alert(_dcgm_labels(alertname="GPURowRemapFailure", severity="critical"),
               {"summary": "Row remapping failed on GPU 3"}, "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", "a5"),
        {"kind": "ecc", "xid": None, "pci_bus_id": "0000:9b:00.0", "gpu_index": 3, "action": None}),
    "temperature": (
        _alert(_dcgm_labels(alertname="GPUHighTemperature", severity="warning"),
               {"summary": "GPU 3 temperature above 80C"}, "DCGM_FI_DEV_GPU_TEMP > 80", "a6"),
        {"kind": "thermal", "xid": None, "gpu_index": 3}),
    "exporter-down": (
        _alert({"alertname": "DCGMExporterDown", "severity": "critical", "job": "dcgm-exporter",
                "instance": "10.42.3.7:9400"},
               {"summary": "DCGM Exporter is down", "description": "GPU metrics collection has failed for 5 minutes"},
               'up{job="dcgm-exporter"} == 0', "a7"),
        None),
    "watchdog": (WATCHDOG, None),
    "crashloop": (
        _alert({"alertname": "KubePodCrashLooping", "container": "trainer", "namespace": "team-research",
                "pod": "trainer-0", "severity": "warning", "job": "kube-state-metrics"},
               {"description": "Pod team-research/trainer-0 (trainer) is in waiting state (reason: \"CrashLoopBackOff\").",
                "summary": "Pod is crash looping."},
               'max_over_time(kube_pod_container_status_waiting_reason{job="kube-state-metrics",reason="CrashLoopBackOff"}[5m]) >= 1',
               "a8"),
        None),
}


def _payload(alerts: list[dict[str, Any]]) -> dict[str, Any]:
    name = alerts[0]["labels"]["alertname"]
    return {"receiver": "remediator", "status": "firing", "alerts": alerts, "groupLabels": {"alertname": name},
            "commonLabels": {"alertname": name}, "commonAnnotations": {},
            "externalURL": "http://kube-prometheus-stack-alertmanager.monitoring:9093", "version": "4",
            "groupKey": '{}:{alertname="' + name + '"}', "truncatedAlerts": 0}


def _classify(text: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["classify", "--json"], input=text)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("style", ["pretty", "one-line"])
@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alertmanager_payload_with_dcgm_labels(name: str, style: str) -> None:
    alert, want = ALERTS[name]
    payload = _payload([alert])
    text = (json.dumps(payload, indent=2) if style == "pretty" else json.dumps(payload)) + "\n"
    rows = _classify(text)
    if want is None:
        assert rows == []
        return
    assert len(rows) == 1, rows
    assert rows[0]["line"] == 1
    assert {k: rows[0][k] for k in want} == want


def test_payloads_between_log_lines_are_reported_where_they_start() -> None:
    """Pretty and one-line payloads mixed with kernel and NCCL lines: one signal per GPU alert, at its first line."""
    gpu = ALERTS["xid-err_code-label"][0]
    pretty = json.dumps(_payload([WATCHDOG, gpu, ALERTS["crashloop"][0]]), indent=2)
    one_line = json.dumps(_payload([ALERTS["ecc-dbe"][0], WATCHDOG]))
    lines = [
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
        pretty,
        "hostname-test:984:1357 [4] NCCL INFO transport/net.cc:1298 -> 6",
        one_line,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ]
    text = "\n".join(lines) + "\n"
    rows = _classify(text)
    pretty_at = 3
    one_line_at = pretty_at + pretty.count("\n") + 2
    assert [(r["line"], r["kind"], r["xid"]) for r in rows] == [
        (2, "xid", 119), (pretty_at, "xid", 79), (one_line_at, "ecc", None), (one_line_at + 1, "job_failure", None)]


def test_grafana_payload_with_a_zero_value_is_no_signal() -> None:
    """Grafana-managed alerts carry ``values``; a zero-valued DCGM alert is no fault (DESIGN.md §5)."""
    payload = {"receiver": "remediator", "status": "firing", "orgId": 1, "alerts": [{
        "status": "firing", "labels": {"alertname": "GPU ECC DBE", "Hostname": "gpu-node-3", "gpu": "6", "UUID": _UUID,
                                       "device": "nvidia6", "grafana_folder": "GPU"},
        "annotations": {}, "startsAt": "2024-05-01T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "", "fingerprint": "b7", "values": {"B": 0, "C": 0},
        "valueString": "[ var='B' labels={Hostname=gpu-node-3, gpu=6} value=0 ]"}],
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "https://grafana/",
        "version": "1", "groupKey": "{}:{}", "truncatedAlerts": 0}
    assert _classify(json.dumps(payload, indent=2) + "\n") == []
