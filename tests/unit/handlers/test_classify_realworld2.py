"""A second, blind pass of real-world lines through ``remediator classify`` (DESIGN.md §10).

``test_classify_realworld.py`` collected the first 388 lines; this table is material that pass did not use (a test
below checks that no line repeats), chosen for the variety of *wrappers and formats* a fleet produces rather than
for new fault kinds: syslog and ``journalctl`` lines with host names, ``journalctl -o short-iso`` and ``-o json``
records, ``dmesg -T``/``--time-format iso``/``-x`` prefixes, Talos and Loki/Fluent Bit/GKE/CRI envelopes, JSON
health events whose first message field is not the signal, device-plugin and DRA-driver log formats, dcgm-exporter
scrapes with ``pci_bus_id`` and MIG labels, old drivers (``Xid (0001:00)``), MIG ``GPU-I``/``GPU-CI`` prefixes,
ARM/Grace PCI domains, NVLink5 lines, tool renderings of Xids (gpud's ``XID 149.0 ...``), PyTorch 1.x and 2.4+
NCCL lines, JAX/XLA CUDA errors, nccl-tests output, and negatives that look close to signals.

``CASES`` holds lines verbatim from the public source named beside each (issue and PR threads, test fixtures,
docs, a forum thread); where a Markdown quote marker or code tick was part of the paste it is kept. ``WRAPPED``
holds verbatim messages inside the envelope a shipper writes (the envelope is built here, from the shipper's
documented format, and says so). Expectations come from ``../shared/reference/gpu-faults.md`` and the classify
contract, not from what the classifier printed.
"""
# ruff: noqa: E501

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from handlers.signatures import classify_line
from remediator.cli import main
from remediator.cli.classify import classify_text
from tests.unit.handlers.test_classify_realworld import KP, NONE, Expect, K, X, _check, _family, _row

OGKM = "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/"
GPUD = "https://github.com/leptonai/gpud/pull/"

# (line, expectation, source)
CASES: list[tuple[str, Expect, str]] = [
    # --- kernel: Xid lines across the catalog, with the prefixes real collectors leave on them ---------------
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     X(63, "0000:10:1c"), "stas00/ml-engineering: Troubleshooting NVIDIA GPUs (find_string id 27272816670)"),
    ("NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8 00000000 206dae68 206da022 206da190 206d85f6 206d8d86",
     X(62, "0000:01:00"), "https://forums.developer.nvidia.com/t/bug-xid-62-gsp-watchdog-timeout-on-rtx-5080-during-high-context-llm-inference/371272"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     X(154, "0000:01:00"), "https://forums.developer.nvidia.com/t/bug-xid-62-gsp-watchdog-timeout-on-rtx-5080-during-high-context-llm-inference/371272"),
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     X(45, "0000:dc:00"), OGKM + "1150"),
    ("kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145",
     X(45, "0000:ed:00"), OGKM + "1150"),
    ("[Sun Apr 26 23:12:26 2026] NVRM: Xid (PCI:0001:6c:00): 119, pid=10200, name=NvmlTaskRunner, Timeout after 45s of waiting for RPC response from GPU5 GSP! Expected function 76 (GSP_RM_CONTROL) sequence 24174 (0x20801322 0x808).",
     X(119, "0001:6c:00"), "https://github.com/vllm-project/vllm/issues/40652"),
    ("[Sun Apr 26 23:13:11 2026] NVRM: Xid (PCI:0001:96:00): 119, pid=10200, name=NvmlTaskRunner, Timeout after 45s of waiting for RPC response from GPU6 GSP! Expected function 76 (GSP_RM_CONTROL) sequence 23837 (0x20810108 0x3e0).",
     X(119, "0001:96:00"), "https://github.com/vllm-project/vllm/issues/40652"),
    ("[Sun Apr 26 23:12:26 2026] NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
     NONE, "https://github.com/vllm-project/vllm/issues/40652 (banner around the Xid line)"),
    ("[Sun Apr 26 23:12:26 2026] NVRM: _kgspLogXid119: Note: Please also check logs above.",
     NONE, "https://github.com/vllm-project/vllm/issues/40652"),
    ("[10900.272607] NVRM: GPU at PCI:0000:0b:00: GPU-aaaba90e-a327-1a65-9c8d-fd28b59b8057",
     NONE, "https://github.com/madMAx43v3r/chia-gigahorse/issues/74 (identity line)"),
    ("[10900.272611] NVRM: Xid (PCI:0000:0b:00): 109, pid=11263, name=Renderer, Ch 00000020, errorString CTX SWITCH TIMEOUT, Info 0xac00d",
     X(109, "0000:0b:00"), "https://github.com/madMAx43v3r/chia-gigahorse/issues/74"),
    ("[11002.151833] r8169 0000:05:00.0: invalid VPD tag 0x00 (size 0) at offset 0; assume missing optional EEPROM",
     NONE, "https://github.com/madMAx43v3r/chia-gigahorse/issues/74"),
    ("Sep 18 20:07:01 NVRM: Xid (PCI:0000:02:00): 109, pid=8494,   name=RenderThread, channel 0x0000000d, CTX SWITCH TIMEOUT, Info 0x14c011",
     X(109, "0000:02:00"), OGKM + "1146"),
    ("[ 7839.537906] NVRM: GPU at PCI:0000:26:00: GPU-b50e4ccf-b785-06da-31c0-1f77c0c46f4c",
     NONE, OGKM + "502 (identity line)"),
    ("[ 7839.537911] NVRM: Xid (PCI:0000:26:00): 109, pid=55914, name=re8.exe, Ch 00000046, errorString CTX SWITCH TIMEOUT, Info 0x2c02c  ",
     X(109, "0000:26:00"), OGKM + "502 (trailing spaces kept)"),
    ('[XID found] (54 minutes ago) "NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801702 0x4)."',
     X(119, "0000:9b:00"), GPUD + "500 (gpud scan output)"),
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     X(149, "0019:01:00"), GPUD + "1174"),
    ("NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     X(149, "0000:00:00"), GPUD + "1174"),
    ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
     X(145, "0018:01:00"), GPUD + "1174"),
    ("NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
     X(94, "0000:9b:00"), GPUD + "1174"),
    ("XID 149.0 (err status 0x00000000) NVLINK_NETIR_ERROR NVLINK: NETIR Error detected on GPU PCI:0019:01:00",
     X(149, "0019:01:00"), GPUD + "1174 (gpud's rendering of an Xid)"),
    ("> NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
     X(144, "0000:01:00"), GPUD + "1160 (Markdown quote kept)"),
    ("> NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     X(149, "0000:00:00"), GPUD + "1160"),
    ("- XID 144.0 (err status 0x00000008) NVLINK_SAW_ERROR detected on GPU PCI:0000:01:00",
     X(144, "0000:01:00"), GPUD + "1160 (gpud's rendering)"),
    ("line kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}",
     K("sxid"), GPUD + "338"),
    ('{"level":"warn","ts":"2025-01-28T06:47:16Z","caller":"diagnose/scan.go:263","msg":"known sxid","line":"kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}"}',
     K("sxid"), GPUD + "338 (zap JSON: the SXid is in \"line\", not \"msg\")"),
    ("[   38.269013] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 56 Sub-engine instance 00",
     K("sxid"), "https://github.com/NVIDIA/nvtrust/issues/124"),
    ("[   38.279408] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ interrupt",
     K("sxid"), "https://github.com/NVIDIA/nvtrust/issues/124"),
    ("[   38.268983] NVRM: GPU 0000:05:00.0: RmInitAdapter failed! (0x22:0x3f:744)",
     K("gpu_lost", "0000:05:00.0"), "https://github.com/NVIDIA/nvtrust/issues/124"),
    ("[   38.269689] NVRM: GPU 0000:05:00.0: rm_init_adapter failed, device minor number 0",
     K("gpu_lost", "0000:05:00.0"), "https://github.com/NVIDIA/nvtrust/issues/124"),
    ("[   38.288927] [drm] [nvidia-drm] [GPU ID 0x00000500] Loading driver",
     NONE, "https://github.com/NVIDIA/nvtrust/issues/124"),
    ("[   21.091872] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)",
     K("gpu_lost", "0000:01:00.0"), "https://github.com/Cyridd/cmpunlocker/issues/4"),
    ("Feb 17 08:00:34 abggdna-DGX-Station-A100 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106",
     K("gpu_lost"), OGKM + "688"),
    ("[24128.828315] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000",
     X(32, "0000:01:00"), "https://github.com/Bumblebee-Project/Bumblebee/issues/677"),
    ("[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
     X(31, "0000:01:00"), "https://github.com/Bumblebee-Project/Bumblebee/issues/677"),
    ("Mar 21 20:18:56 pc kernel: [   65.315783] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     X(79, "0000:01:00"), "congphase/my-t450s:troubleshoot_log.md (nvidia-bug-report excerpt)"),
    ("Mar 21 20:18:56 pc kernel: [   65.315792] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
     K("gpu_lost", "0000:01:00.0"), "congphase/my-t450s:troubleshoot_log.md (nvidia-bug-report excerpt)"),
    ("    [   36.508494] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
     K("gpu_lost", "0000:01:00.0"), "blog 'Using nvidia driver on debian jessie' (indented reST literal kept)"),
    ("Feb 15 17:37:45 Gipfeli kernel: [82659.755847] NVRM: Xid (PCI:0000:41:00): 13, Graphics Exception: ESR 0x5067b0=0x9 0x5067b4=0x24 0x5067a8=0x4c1eb72 0x5067ac=0x174",
     X(13, "0000:41:00"), "https://github.com/3dem/relion/issues/436"),
    ("Feb 15 17:37:45 Gipfeli kernel: [82659.755933] NVRM: Xid (PCI:0000:41:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding",
     X(13, "0000:41:00"), "https://github.com/3dem/relion/issues/436"),
    ("```[93297.027938] NVRM: Xid (PCI:0000:43:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x52e7b0=0x101000e 0x52e7b4=0x4 0x52e7a8=0xc81eb60 0x52e7ac=0x1174",
     X(13, "0000:43:00"), "https://github.com/vllm-project/vllm/issues/5901 (code fence glued to the first line)"),
    ("[93297.029837] NVRM: Xid (PCI:0000:43:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x52ef30=0x0 0x52ef34=0x20 0x52ef28=0xc81eb60 0x52ef2c=0x1174",
     X(13, "0000:43:00"), "https://github.com/vllm-project/vllm/issues/5901 (A800)"),
    ("[Wed Jun 24 15:44:20 2026] NVRM: Xid (PCI:0000:70:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): MMU Fault",
     X(13, "0000:70:00"), "https://github.com/NVIDIA/TensorRT-LLM/issues/15610 (B200/B300)"),
    ("`[356702.608922] NVRM: Xid (PCI:0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0): Misaligned Address",
     X(13, "0000:01:00"), "https://github.com/mbevand/silentarmy/issues/6 (code tick glued)"),
    ("[356702.608928] NVRM: Xid (PCI:0000:01:00): 13, Graphics SM Global Exception on (GPC 0, TPC 0): Physical Multiple Warp Errors",
     X(13, "0000:01:00"), "https://github.com/mbevand/silentarmy/issues/6"),
    ("<4>[10469.844457] general protection fault, probably for non-canonical address 0x4fbc642329c30539: 0000 [#1] PREEMPT SMP NOPTI",
     NONE, "https://github.com/NVIDIA/k8s-device-plugin/issues/941 (dmesg -r)"),
    ("<4>[10469.844606] RIP: 0010:__kmalloc+0x15b/0x480",
     NONE, "https://github.com/NVIDIA/k8s-device-plugin/issues/941"),
    ("[Sun Apr 14 12:48:42 2024] NVRM: GPU 0000:81:00.0: RmInitAdapter failed! (0x25:0x40:1470)",
     K("gpu_lost", "0000:81:00.0"), "https://github.com/illinois-scicomp/machine-shop-maintenance/issues/76"),
    ("  6a | 04/12/2024 | 03:27:29 PM CDT | Critical Interrupt | Bus Correctable error () | Asserted",
     NONE, "https://github.com/illinois-scicomp/machine-shop-maintenance/issues/76 (IPMI SEL)"),
    ("[Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2874 ",
     K("gpu_lost"), "https://github.com/scitix/sichek/issues/51"),
    # old drivers: no "PCI:", and before that only "bus:device"
    ("NVRM: Xid (0000:01:00): 31, Ch 00000007, engmask 00000120, intr 10000000",
     X(31, "0000:01:00"), "ArchWiki NVIDIA/Troubleshooting (find_string id 38039984776)"),
    ("NVRM: Xid (0001:00): 8, Channel 00000002",
     X(8, None), "Ubuntu forums thread, /var/log/kernel.log (find_string id 57125060875)"),
    ("[  983.540000] NVRM: Xid (0001:00): 6, PE0000 0438 ff7f6a59 0000f478 00000000 fff6e7dc",
     X(6, None), "find_string id 57094795175 (2007 dmesg)"),
    ("[  983.544000] NVRM: Xid (0001:00): 29,  L1 -> L0",
     X(29, None), "find_string id 57094795175"),
    ("[ 1954.496000] NVRM: API mismatch: the client has the version 1.0-7184, but",
     NONE, "find_string id 57094795175"),
    ("Jun 28 21:29:48 misha-d630 kernel: [  265.538924] NVRM: Xid (0001:00): 6, PE0001 ",
     X(6, None), "find_string id 56917713966 (syslog, trailing space kept)"),
    ("May 11 02:29:19 Opossumi kernel: [11458.586892] NVRM: Xid (0002:00): 13, 0001 00000000 00005039 00000328 00000000 00000023",
     X(13, None), "find_string id 56847485479 (syslog)"),
    ("Jul  2 16:26:43 coll kernel: [  266.028035] NVRM: Xid (0002:00): 13, 0001 00000000 0000502d 000008dc 00000000 00000100",
     X(13, None), "find_string id 56764426419 (syslog, two-space day)"),
    # syslog / journal with host names, and fixtures of agents that parse them
    ("May 25 12:34:56 gpu-host kernel: NVRM: Xid (PCI:0000:01:00): 31, Ch 00000010",
     X(31, "0000:01:00"), "find_string id 62497156342 (journalctl fixture)"),
    ("  Jan 15 14:30:45 dgx-01 kernel: NVRM: Xid (PCI:0000:10:00.0): 79, ...",
     X(79, "0000:10:00.0"), "find_string id 25319948647 (journalctl format as a review quotes it)"),
    ("Apr 09 10:00:03 host kernel: NVRM: Xid (PCI:0000:03:00): 56, CMDre 00000000",
     X(56, "0000:03:00"), "find_string id 55178779386 (journalctl -k fixture)"),
    ("Apr 09 10:00:01 host kernel: NVRM: VM: invalid mmap",
     NONE, "find_string id 55178779386"),
    ("Aug 19 21:36:23 fedora kernel: NVRM: Xid (PCI:0000:23:00): 120, GSP task exception: load access page fault (cause:0xd) @ pc:0x13636b2, partition:2#0, task:3, gfid: 0",
     X(120, "0000:23:00"), "find_string id 58479869362"),
    ("Aug 19 21:36:23 fedora kernel: NVRM: kgspHealthCheck_TU102: ****************************** GSP-CrashCat Report *******************************",
     NONE, "find_string id 58479869362"),
    ("Aug 19 21:36:23 fedora kernel: NVRM: kgspPrintGspBinBuildId_IMPL: GSP bin buildId: 4f09703c5c7d57baa527d6a189bb6d118bc60e49",
     NONE, "find_string id 58479869362"),
    ("Aug 19 21:36:23 fedora kernel: NVRM:     Reported by libos partition:2#4 kernel v3.1 [0] @ ts:1787168183",
     NONE, "find_string id 58479869362"),
    ("kernel: NVRM: Xid (PCI:000f:01:00): 13, pid=4242, name=python3, Graphics Exception",
     X(13, "000f:01:00"), "find_string id 70880480438 (rule fixture, domain 000f)"),
    ("2026-08-15T14:32:10+0000 host kernel: NVRM: Xid (PCI:0000:01:00): 109, name=IL2Series.exe, channel 0x00000028, errorString CTX SWITCH TIMEOUT, Info 0x1c022",
     X(109, "0000:01:00"), "find_string id 71508369305 (journalctl -o short-iso, name= without pid=)"),
    ("kernel: NVRM: Xid (PCI:0000:3b:00.0): 94, Ch 00000008",
     X(94, "0000:3b:00.0"), "find_string id 61007585284 (function digit)"),
    ("[1.0] NVRM: Xid (PCI:0000:3b:00): 95, pid='<unknown>'",
     X(95, "0000:3b:00"), "find_string id 61007585284"),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception",
     X(13, "0000:3b:00"), "find_string id 71581654546 (MIG with GPU-CI)"),
    ("kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1234",
     X(79, "0000:01:00"), "find_string id 63293591089"),
    ("kernel: NVRM: Xid (0000:01:00): 79, GPU has fallen off the bus.",
     X(79, "0000:01:00"), "find_string id 69317348945"),
    ("NVRM: Xid (PCI:0000:65:00): 13, pid=1235, Graphics Exception",
     X(13, "0000:65:00"), "find_string id 69317348945"),
    # --- device plugin, DRA driver, node conditions --------------------------------------------------------------
    ("I1025 02:19:08.002792       1 health.go:151] Skipping non-nvmlEventTypeXidCriticalError event: {Device:{Handle:0x7f0dcf40bdf8} EventType:2 EventData:0 GpuInstanceId:4294967295 ComputeInstanceId:4294967295}",
     NONE, "https://github.com/NVIDIA/gpu-operator/issues/1065 (the plugin says it SKIPS this non-Xid event: no fault, issue 13)"),
    ("    type: XidCriticalError",
     NONE, "https://github.com/GoogleCloudPlatform/container-engine-accelerators/pull/497 (condition YAML)"),
    # --- dcgm-exporter scrapes ------------------------------------------------------------------------------------
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",pci_bus_id="00000000:02:00.0",device="nvidia0",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 0',
     NONE, "find_string id 23737440080 (scrape fixture with pci_bus_id)"),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="2",UUID="GPU-87654321-4321-4321-4321-cba987654321",pci_bus_id="00000000:04:00.0",device="nvidia2",modelName="NVIDIA H100 PCIe",Hostname="ed7e7a5e585f"} 0',
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",pci_bus_id="00000000:02:00.0",device="nvidia0",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 46614',
     NONE, "find_string id 23737440080 (memory in use is state, not a fault)"),
    ('DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",pci_bus_id="00000000:02:00.0",device="nvidia0",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 2048',
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-12345678-1234-1234-1234-123456789abc",pci_bus_id="00000000:03:00.0",device="nvidia1",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 0',
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-87654321-4321-4321-4321-cba987654321",pci_bus_id="00000000:04:00.0",device="nvidia2",modelName="NVIDIA H100 PCIe",Hostname="ed7e7a5e585f"} 43.99',
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",pci_bus_id="00000000:02:00.0",device="nvidia0",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 955287014',
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_POWER_VIOLATION{gpu="0",UUID="GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",pci_bus_id="00000000:02:00.0",device="nvidia0",modelName="NVIDIA RTX 6000 Ada Generation",Hostname="ed7e7a5e585f"} 12000',
     NONE, "find_string id 23737440080 (power capping is no fault kind)"),
    ('DCGM_FI_DEV_THERMAL_VIOLATION{gpu="2",UUID="GPU-87654321-4321-4321-4321-cba987654321",pci_bus_id="00000000:04:00.0",device="nvidia2",modelName="NVIDIA H100 PCIe",Hostname="ed7e7a5e585f"} 5000',
     K("thermal", "00000000:04:00.0", 2), "find_string id 23737440080"),
    ("# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered",
     NONE, "find_string id 23737440080"),
    ("# TYPE DCGM_FI_DEV_POWER_VIOLATION counter",
     NONE, "find_string id 23737440080"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="node-a"} 25',
     NONE, "find_string id 69304195733"),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaa",err_code="31",err_msg="MMU fault",DCGM_FI_DEV_BRAND="GeForce"} 31',
     X(31, None, 0), "netdata collector test fixture (find_string id 6059780851)"),
    ('\t\tDCGM_FI_DEV_XID_ERRORS{gpu="0", UUID="GPU-c0b5694b-2b5d-6b20-f903-558341437f6b",container="",namespace="",pod=""} 0',
     NONE, "find_string id 42531759392 (tab-indented fixture)"),
    ('\t\tDCGM_FI_DEV_ENC_UTIL{gpu="0", UUID="GPU-c0b5694b-2b5d-6b20-f903-558341437f6b",container="",namespace="",pod=""} 0',
     NONE, "find_string id 42531759392"),
    # --- PyTorch ProcessGroupNCCL, 1.x and 2.x --------------------------------------------------------------------
    ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/OFA-Sys/OFA/issues/271"),
    ("RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2511984, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809553 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/open-mmlab/mmdetection/issues/12392"),
    ("[E ProcessGroupNCCL.cpp:828] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2511984, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809826 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/open-mmlab/mmdetection/issues/12392"),
    ('  File "/home/anaconda3/envs/torch2.0.1/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", line 1700, in all_reduce',
     NONE, "https://github.com/open-mmlab/mmdetection/issues/12392"),
    ("RuntimeError: : NCCL communicator was aborted on rank 3.  Original reason for failure was: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=266392, OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1803169 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/mlfoundations/open_clip/issues/1087"),
    ("export NCCL_BLOCKING_WAIT=1", NONE, "https://github.com/mlfoundations/open_clip/issues/1087"),
    ("export NCCL_TIMEOUT=7200", NONE, "https://github.com/mlfoundations/open_clip/issues/1087"),
    ('echo "NCCL_ASYNC_ERROR_HANDLING=$NCCL_ASYNC_ERROR_HANDLING"', NONE,
     "https://github.com/mlfoundations/open_clip/issues/1087"),
    ("[E ProcessGroupNCCL.cpp:915] [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/huggingface/picotron_tutorial/issues/6"),
    ("  what():  [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/huggingface/picotron_tutorial/issues/6"),
    ("terminate called after throwing an instance of 'std::runtime_error'", NONE,
     "https://github.com/huggingface/picotron_tutorial/issues/6"),
    ("[E ProcessGroupNCCL.cpp:488] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
     K("nccl_timeout"), "https://github.com/huggingface/picotron_tutorial/issues/6"),
    ("[E ProcessGroupNCCL.cpp:494] To avoid data inconsistency, we are taking the entire process down.",
     K("nccl_timeout"), "https://github.com/huggingface/picotron_tutorial/issues/6"),
    ("terminate called after throwing an instance of 'c10::DistBackendError'", NONE,
     "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("  what():  [Rank 6] NCCL watchdog thread terminated with exception: [Rank 6] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=880, OpType=BROADCAST, NumelIn=131137536, NumelOut=131137536, Timeout(ms)=1800000) ran for 1800902 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:525 (most recent call first):",
     NONE, "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1e6 (0x7f32040db6e6 in /opt/conda/envs/ml_v4/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)",
     NONE, "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("frame #2: c10d::ProcessGroupNCCL::workCleanupLoop() + 0x19d (0x7f32040dec3d in /opt/conda/envs/ml_v4/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)",
     NONE, "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x119 (0x7f32040df839 in /opt/conda/envs/ml_v4/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so)",
     NONE, "https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15"),
    ("RuntimeError: NCCL communicator was aborted on rank 7.  Original reason for failure was: [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809147 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/mlcommons/training/issues/546 (PyTorch 1.10: no SeqNum)"),
    ("    self.process_group, tensors, buffer_size, authoritative_rank", NONE,
     "https://github.com/mlcommons/training/issues/546"),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=49, OpType=ALLREDUCE, Timeout(ms)=18000000) ran for 18005607 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/agiresearch/InstructGLM/issues/3"),
    ("dist.init_process_group(backend='nccl',timeout=timedelta(seconds=18000)) # (i tried 5 hours it still not work)",
     NONE, "https://github.com/agiresearch/InstructGLM/issues/3"),
    ("export NCCL_SOCKET_IFNAME=eth1", NONE, "https://github.com/agiresearch/InstructGLM/issues/3"),
    ("export NCCL_IB_HCA=mlx5_2:1", NONE, "https://github.com/agiresearch/InstructGLM/issues/3"),
    ("[rank0]:[E1206 18:44:12.715588844 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
     K("nccl_timeout"), "https://github.com/hiyouga/LlamaFactory/issues/6269"),
    ("[1757] {'loss': 0.0, 'grad_norm': 1.4142135381698608, 'learning_rate': 4.3181818181818185e-06, 'epoch': 0.01}",
     NONE, "https://github.com/hiyouga/LlamaFactory/issues/8261"),
    ("> [E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=56693, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1804371 milliseconds before timing out.",
     K("nccl_timeout"), "https://github.com/aioz-ai/GCD/issues/6"),
    ("RuntimeError: [2] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout",
     K("nccl_error"), "https://github.com/pytorch/pytorch/issues/82091 (PyTorch 1.x/2.0: RuntimeError, not DistBackendError)"),
    ("Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:580 (most recent call first):",
     NONE, "https://github.com/pytorch/pytorch/issues/82091"),
    ("(RayWorkerVllm pid=7046) Fatal Python error: Aborted", NONE, "https://github.com/vllm-project/vllm/issues/4108"),
    # --- NCCL's own lines, nccl-tests, NCCL errors raised into Python -----------------------------------------------
    ("A03-R28-I49-3-9000018:46841:46987 [0] include/socket.h:428 NCCL WARN Net : Call to recv from 11.127.49.2<36048> failed : Connection reset by peer",
     K("nccl_error"), "https://github.com/NVIDIA/nccl/issues/629"),
    ("A03-R28-I49-2-6000166:104934:104934 [1] init.cc:204 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
     KP("nccl"), "https://github.com/NVIDIA/nccl/issues/629"),
    ("A03-R28-I49-2-6000166:104934:105018 [0] NCCL INFO proxy.cc:452 -> 2 [Proxy Thread]",
     NONE, "https://github.com/NVIDIA/nccl/issues/629"),
    ("A03-R28-I49-2-6000166: Test NCCL failure common.cu:497 'unhandled cuda error'",
     K("nccl_error"), "https://github.com/NVIDIA/nccl/issues/629 (nccl-tests: ncclUnhandledCudaError)"),
    (" .. A03-R28-I49-2-6000166 pid 104934: Test failure common.cu:587",
     NONE, "https://github.com/NVIDIA/nccl/issues/629"),
    ("Test CUDA failure common.cu:334 'an illegal memory access was encountered'",
     K("cuda_error"), "https://github.com/NVIDIA/nccl/issues/393 (nccl-tests)"),
    ("misc/strongstream.cc:343 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
     KP("nccl"), "https://github.com/NVIDIA/TensorRT-LLM/issues/448"),
    ("enqueue.cc:1556 NCCL WARN Cuda failure 700 'an illegal memory access was encountered'",
     KP("nccl"), "https://github.com/Lightning-AI/pytorch-lightning/issues/20757"),
    ("node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'",
     KP("nccl"), "https://github.com/NVIDIA/nccl/issues/1488"),
    ("node23:12098:12141 [2] NCCL INFO group.cc:75 -> 1 [Async thread]",
     NONE, "https://github.com/NVIDIA/nccl/issues/1488"),
    ("[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
     K("nccl_error"), "https://github.com/NVIDIA/nccl/issues/1410"),
    ("[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.",
     K("nccl_error"), "https://github.com/NVIDIA/nccl/issues/1410"),
    ("[rank7]: Last error:", NONE, "https://github.com/NVIDIA/nccl/issues/1410"),
    ("[rank0]: Cuda failure 999 'unknown error'",
     K("cuda_error"), "https://github.com/alisson-anjos/diffusion-pipe-ui/issues/10 (cudaErrorUnknown)"),
    ("  what():  NCCL error in: /opt/conda/conda-bld/pytorch_1614378063927/work/torch/lib/c10d/../c10d/NCCLUtils.hpp:155, unhandled cuda error, NCCL version 2.7.8",
     K("nccl_error"), "https://github.com/llSourcell/Object_Detection_demo_LIVE/issues/9"),
    ("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:911, unhandled cuda error, NCCL version 2.7.8 ncclUnhandledCudaError: Call to CUDA function failed.",
     K("nccl_error"), "https://github.com/facebookresearch/SlowFast/issues/462"),
    ("11月 15 14:15:47 leon-NF5468M6 nv-fabricmanager[4177]: request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]",
     NONE, "https://github.com/NVIDIA/gpu-operator/issues/610 (no NVSwitch: configuration, not a fault)"),
    # --- CUDA runtime and XLA errors, OOM ---------------------------------------------------------------------------
    ("INTERNAL: Failed to execute XLA Runtime executable: run time error: custom call 'xla.gpu.func.launch' failed: Failed to launch CUDA kernel: fusion_1560 with block dimensions: 160x1x1 and grid dimensions: 1x1x1: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered.",
     K("cuda_error"), "https://github.com/jaxleyverse/jaxley/issues/53"),
    ("E1120 10:59:55.894873   35984 pjrt_stream_executor_client.cc:3067] Execution of replica 0 failed: INTERNAL: Failed to retrieve branch_index value on stream 0x5583cca477e0: CUDA error: Could not synchronize CUDA stream: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered.",
     K("cuda_error"), "https://github.com/jax-ml/jax/issues/25002"),
    ("2021-06-08 13:00:47.364628: E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:1981] Execution of replica 0 failed: Internal: Failed to launch CUDA kernel: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
     K("cuda_error"), "https://github.com/jax-ml/jax/issues/6921"),
    ("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime executable: run time error: custom call 'xla.gpu.func.launch' failed: Failed to launch CUDA kernel: add with block dimensions: 128x1x1 and grid dimensions: 448x1x1: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered.",
     K("cuda_error"), "https://github.com/openxla/xla/issues/15945"),
    ("2024-08-10 13:09:02.411862: E external/xla/xla/stream_executor/cuda/cuda_driver.cc:663] failed to unload module 0x5215a9a0; leaking: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
     K("cuda_error"), "https://github.com/openxla/xla/issues/15945"),
    ("2024-08-10 13:09:04.162614: E external/xla/xla/stream_executor/cuda/cuda_event.cc:29] Error polling for event status: failed to query event: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
     K("cuda_error"), "https://github.com/openxla/xla/issues/15945"),
    ('> Program hit CUDA_ERROR_ILLEGAL_ADDRESS (error 700) due to "an illegal memory access was encountered" on CUDA API call to cuMemcpyDtoHAsync_v2',
     K("cuda_error"), "https://github.com/jax-ml/jax/issues/3017"),
    ("    ** On entry to GEMM_EX  parameter number 12 had an illegal value",
     NONE, "https://github.com/jax-ml/jax/issues/304"),
    ("For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
     NONE, "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/982"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 258.00 MiB (GPU 0; 23.54 GiB total capacity; 11.75 GiB already allocated; 572.50 MiB free; 12.40 GiB reserved in total by PyTorch) If reserved memory is &gt;&gt; allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
     K("cuda_oom", gpu=0), "https://github.com/zihaosheng/VLM-RL/issues/12 (HTML-escaped >>)"),
    ("`torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacty of 23.69 GiB of which 3.09 GiB is free. Including non-PyTorch memory, this process has 20.57 GiB memory in use. Of the allocated memory 20.13 GiB is allocated by PyTorch, and 755.50 KiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`",
     K("cuda_oom", gpu=0), "https://github.com/vllm-project/vllm/issues/2140 (PyTorch 2.1 'capacty', code ticks kept)"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free. Of the allocated memory 13.98 GiB is allocated by PyTorch, and 129.48 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     K("cuda_oom", gpu=0), "https://github.com/huggingface/meshgen/issues/7 (no 'this process has')"),
    ("...CUDA out of memory. Tried to allocate 30.29 GiB. GPU 0 has a total capacity of 10.74 GiB of which 3.69 GiB is free. Including non-PyTorch memory, this process has 6.68 GiB memory in use. Of the allocated memory 6.10 GiB is allocated by PyTorch, and 396.58 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     K("cuda_oom", gpu=0), "https://github.com/lllyasviel/FramePack/issues/369"),
    ("Unloaded DynamicSwap_LlamaModel as complete.", NONE, "https://github.com/lllyasviel/FramePack/issues/369"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
     K("cuda_oom", gpu=0), "https://github.com/carolchenyx/MGFN./issues/35"),
    ("RuntimeError: CUDA error: out of memory",
     K("cuda_oom"), "https://github.com/NVIDIA/k8s-device-plugin/issues/267 (a GPU with an uncorrectable ECC error)"),
    ('I only get the following at start: Cuda error in func "cuda_init_device" at line 33: out of memory.',
     K("cuda_oom"), "https://github.com/NoncerPro/noncerpro-nimiq-cuda/issues/17"),
    ("|   0  Tesla K80           On   | 00000000:00:1E.0 Off |                    0 |",
     NONE, "https://github.com/jax-ml/jax/issues/3017 (nvidia-smi table row)"),
    ("|   0  Tesla V100S-PCI...  Off  | 00000000:00:07.0 Off |                    0 |",
     NONE, "https://github.com/NVIDIA/k8s-device-plugin/issues/243 (nvidia-smi table row)"),
    # --- nvidia-smi, NVML, node tools ------------------------------------------------------------------------------
    ('  echo "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  Reboot the system to recover this GPU" >&2',
     K("gpu_lost", "0000:41:00.0"), "find_string id 70430200406 (nvidia-smi stub; 'GPU0000:' with no space)"),
    ("Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
     NONE, GPUD + "1209 (journalctl -k around a fallen-off-the-bus event)"),
    ("Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: EXT4-fs (md127p3): re-mounted 0f3cd65a-338b-4574-bba3-ecef214e1917 r/w. Quota mode: none.",
     NONE, GPUD + "1209"),
    ("Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us 4 times, consider switching to WQ_UNBOUND",
     NONE, GPUD + "1209"),
    ("10.10.10.10: 2025/11/25 13:58:49 nvidia-fabricmanager-wrapper: found NVSwitch LPF: device=mlx5_10 guid=0xcc40f3030027f630",
     NONE, "https://github.com/siderolabs/extensions/issues/893 (Talos)"),
    ("192.168.11.119: kern: warning: [2026-04-22T21:27:51.291213998Z]:  nvidia_unlocked_ioctl+0x447/0x950 [nvidia]",
     NONE, OGKM + "1118 (Talos kernel log, stack frame)"),
    ("2024-05-24 10:22:29.245 ERROR [5231:5273] [[NvSwitch]] ReadNvSwitchStatusAllSwitches() returned Object is in an undefined state [/workspaces/dcgm-rel_dcgm_2_2-postmerge/modules/nvswitch/DcgmModuleNvSwitch.cpp:388] [DcgmNs::DcgmModuleNvSwitch::RunOnce]",
     NONE, "https://github.com/NVIDIA/DCGM/issues/174 (nv-hostengine noise)"),
    ("2021-01-04 15:34:28.197 WARN  [12466:15949] Fixing entityGroupId for global field [/workspaces/dcgm-rel_dcgm_2_0-postmerge/dcgmlib/src/DcgmCacheManager.cpp:4254] [DcgmCacheManager::GetLatestSample]",
     NONE, "https://github.com/NVIDIA/gpu-monitoring-tools/issues/146"),
    ("var WellKnownXidCodes = []uint{46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151, 155, 156, 158}",
     NONE, "https://github.com/aws/eks-node-monitoring-agent/issues/272 (source code, not a log line)"),
]


# --- verbatim messages in the envelopes collectors and shippers write (envelope built here) --------------------

_NPD_EVENT = {"level": "info", "ts": "2024-08-21T18:35:35Z", "msg": "NPD caught event",
              "details": {"severity": "warn", "reason": "XidHardwareFailure",
                          "message": "NVRM: Xid (PCI:0000:b9:00): 71, NVLink: fatal error detected on link 6"},
              "HealthMonitoringAgentDetectionEvent": "HealthEvent"}
_TS = "2025-09-12T07:41:03.118220564Z"


def _docker(msg: str, stream: str = "stderr") -> str:
    """docker json-file / Fluent Bit tail: ``{"log": "<msg>\\n", "stream": ..., "time": ...}`` (Go escapes <, >, &)."""
    return json.dumps({"log": msg + "\n", "stream": stream, "time": _TS}).replace("<", "\\u003c").replace(">", "\\u003e")


def _cri(msg: str, flag: str = "F", stream: str = "stderr") -> str:
    """containerd / CRI-O container log line: ``<RFC3339Nano> <stream> <P|F> <msg>``."""
    return f"{_TS} {stream} {flag} {msg}"


def _journal_json(msg: str) -> str:
    """``journalctl -k -o json`` record."""
    return json.dumps({"__CURSOR": "s=6c4c3f1b;i=1f3a;b=9f2c;m=3e2d6a1;t=63e1;x=1", "__REALTIME_TIMESTAMP": "1757662863118220",
                       "__MONOTONIC_TIMESTAMP": "65315783", "_BOOT_ID": "9f2c8e1d0b3a4c55a7e6f0d1c2b3a495",
                       "_TRANSPORT": "kernel", "PRIORITY": "4", "SYSLOG_FACILITY": "0", "SYSLOG_IDENTIFIER": "kernel",
                       "_HOSTNAME": "gpu-node-17", "MESSAGE": msg}, separators=(",", ":"))


def _fluentbit_k8s(msg: str) -> str:
    """Fluent Bit ``tail`` + ``kubernetes`` filter record, as forwarded to Elasticsearch/Loki."""
    return json.dumps({"date": 1757662863.118, "log": msg, "stream": "stderr", "time": _TS,
                       "kubernetes": {"pod_name": "trainer-0", "namespace_name": "team-research",
                                      "container_name": "main", "host": "gpu-node-17"}})


def _gke(msg: str) -> str:
    """Cloud Logging entry for a GKE container or node log (``textPayload``)."""
    return json.dumps({"insertId": "kq0z7wf6x9b1a", "textPayload": msg,
                       "resource": {"type": "k8s_container", "labels": {"cluster_name": "a3-cluster", "pod_name": "trainer-0"}},
                       "timestamp": "2025-09-12T07:41:03.118220564Z", "severity": "ERROR",
                       "logName": "projects/p/logs/stderr", "receiveTimestamp": "2025-09-12T07:41:04.2Z"})


def _vector_journald(msg: str) -> str:
    """Vector ``journald`` source event forwarded as JSON."""
    return json.dumps({"message": msg, "host": "gpu-node-17", "source_type": "journald", "SYSLOG_IDENTIFIER": "kernel",
                       "timestamp": "2025-09-12T07:41:03.118220Z", "_TRANSPORT": "kernel"})


def _loki_push(msg: str) -> str:
    """Loki push API body (``/loki/api/v1/push``) with one kernel line."""
    return json.dumps({"streams": [{"stream": {"job": "node/kmsg", "host": "gpu-node-17"},
                                    "values": [["1757662863118220564", msg]]}]})


def _logfmt(msg: str) -> str:
    """A Go agent logging the kernel line it saw with logfmt (``msg="..."``, quotes escaped)."""
    return 'ts=2025-09-12T07:41:03.118Z level=warn caller=kmsg.go:88 msg="' + msg.replace('"', '\\"') + '" source=/dev/kmsg'


XID_74 = "NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
XID_32 = "NVRM: Xid (PCI:0000:01:00): 32, pid=177594, name=SOTTR.exe, channel 0x00000023 intr 00040000"
XID_109 = "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
XID_94 = "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
IDENT = "NVRM: GPU at PCI:0000:01:00: GPU-dbe116b8-a325-0daf-c382-c87c94a4bf0b"
WD = "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Process 12345 has 78.12 GiB memory in use."
IB = "gpu-node-1:123:456 [0] transport/net_ib.cc:1096 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<51234> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
INFO = "A03-R28-I49-2-6000166:104934:105018 [0] NCCL INFO proxy.cc:452 -> 2 [Proxy Thread]"
DIST = "[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5"
HINT = "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect."
ILLEGAL = "[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"

_SRC_HP = "AWS HyperPod resiliency docs (find_string ids 6840468611, 4559669392)"
_SRC_RUST = "journald parser fixtures (find_string ids 67025605073, 71015465889)"

WRAPPED: list[tuple[str, Expect, str]] = [
    (json.dumps(_NPD_EVENT, separators=(",", ":")), X(71, "0000:b9:00"),
     _SRC_HP + ": NPD health event, compacted to one line; the Xid is in details.message, msg is not the signal"),
    (next(ln for ln in json.dumps(_NPD_EVENT, indent=2).splitlines() if "NVRM" in ln), X(71, "0000:b9:00"), _SRC_HP + ": the same event pretty-printed, its message line"),
    ("Sep 12 07:41:03 ip-10-1-83-12 kernel: " + XID_74, X(74, "0000:b9:00"),
     _SRC_HP + ": the injected /var/log/messages line with date and host filled in"),
    ('{"__REALTIME_TIMESTAMP":"1757422415123456","PRIORITY":"3","MESSAGE":"NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.","_TRANSPORT":"kernel","SYSLOG_IDENTIFIER":"kernel"}',
     X(79, "0000:01:00"), _SRC_RUST + " (verbatim)"),
    ('{"__CURSOR":"s=2","__REALTIME_TIMESTAMP":"1790200000000001","_TRANSPORT":"kernel","PRIORITY":"4","MESSAGE":"NVRM: Xid (PCI:0000:01:00): 32, pid=177594, name=SOTTR.exe, channel 0x00000023 intr 00040000"}',
     X(32, "0000:01:00"), _SRC_RUST + " (verbatim)"),
    ('{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1790200000000000","_TRANSPORT":"kernel","PRIORITY":"4","MESSAGE":"NVRM: GPU at PCI:0000:01:00: GPU-dbe116b8-a325-0daf-c382-c87c94a4bf0b"}',
     NONE, _SRC_RUST + " (identity record)"),
    (_journal_json(XID_109), X(109, "0000:cb:00"), "journalctl -o json around " + GPUD + "46"),
    (_journal_json(IDENT), NONE, "journalctl -o json around " + _SRC_RUST),
    ("2025-09-12T07:41:03+0000 gpu-node-17 kernel: " + XID_94, X(94, "0000:00:08"),
     "journalctl -o short-iso around https://github.com/akash-network/support/issues/244"),
    ("Sep 12 07:41:03.118220 gpu-node-17 kernel: " + XID_94, X(94, "0000:00:08"), "journalctl -o short-precise, same message"),
    ("2025-09-12T07:41:03.118220+00:00 gpu-node-17 kernel: " + XID_32, X(32, "0000:01:00"), "journalctl -o short-iso-precise"),
    ("<4>1 2025-09-12T07:41:03.118220+00:00 gpu-node-17 kernel - - - " + XID_74, X(74, "0000:b9:00"), "RFC 5424 syslog forward"),
    ("kern  :warn  : [Fri Sep 12 07:41:03 2025] " + XID_109, X(109, "0000:cb:00"), "dmesg -x -T"),
    ("2025-09-12T07:41:03,118220+00:00 " + XID_79, X(79, "0000:01:00"), "dmesg --time-format iso"),
    ("[Fri Sep 12 07:41:03 2025] " + IDENT, NONE, "dmesg -T identity line"),
    (_vector_journald(XID_79), X(79, "0000:01:00"), "Vector journald event"),
    (_loki_push(XID_94), X(94, "0000:00:08"), "Loki push body"),
    (_logfmt(XID_94), X(94, "0000:00:08"), "logfmt agent line"),
    (_gke(XID_79), X(79, "0000:01:00"), "Cloud Logging textPayload"),
    (_gke(WD), K("nccl_timeout"), "Cloud Logging textPayload, " + "https://github.com/hiyouga/LlamaFactory/issues/6269"),
    (_docker(XID_94), X(94, "0000:00:08"), "docker json-file (Go escapes <>)"),
    (_docker(WD), K("nccl_timeout"), "docker json-file"),
    (_docker(INFO), NONE, "docker json-file, NCCL INFO"),
    (_docker(HINT), NONE, "docker json-file, CUDA hint"),
    (_fluentbit_k8s(OOM), K("cuda_oom", gpu=0), "Fluent Bit kubernetes record"),
    (_fluentbit_k8s(IB), K("nccl_error"), "Fluent Bit kubernetes record"),
    (_fluentbit_k8s(DIST), K("nccl_error"), "Fluent Bit kubernetes record, https://github.com/NVIDIA/nccl/issues/1410"),
    (_cri(WD), K("nccl_timeout"), "CRI F line"),
    (_cri(WD[:150], flag="P"), K("nccl_timeout"), "CRI P (partial) line: the first 150 characters"),
    (_cri(WD[150:]), NONE, "CRI F line: the rest of the partial line"),
    (_cri(ILLEGAL), K("cuda_error"), "CRI F line, https://github.com/vllm-project/vllm/issues/4108"),
    (_cri(INFO, stream="stdout"), NONE, "CRI stdout NCCL INFO"),
    (_cri('{"level":"error","ts":1757662863.118,"logger":"trainer","msg":"step failed","error":"CUDA error: uncorrectable ECC error encountered"}'),
     K("cuda_error"), "CRI line carrying a zap JSON record: the CUDA error is in \"error\", msg is not the signal"),
    (_cri('{"level":"info","ts":1757662863.118,"msg":"NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=eth0","component":"launcher"}'),
     NONE, "CRI line carrying a zap JSON record: NCCL settings, no fault"),
    # lines rendered from the log format strings of components that report Xids and ECC events
    ("I0912 07:41:03.118220       1 device_health.go:512] Processing event XID=79 event", X(79, None),
     "rendered from klog.V(4).Infof(\"Processing event XID=%d event\") in the DRA driver's device_health.go (find_string id 55897266256)"),
    ("I0912 07:41:03.118220       1 device_health.go:498] Skipping non-nvmlEventTypeXidCriticalError event: Data=0, Type=2, GI=4294967295, CI=4294967295",
     NONE, "rendered from the DRA driver's \"Data=%d, Type=%d, GI=%d, CI=%d\" format (find_string id 55897266256); the driver skips it (issue 13)"),
    ("2019/07/11 08:15:42 Skipping non-nvmlEventTypeXidCriticalError event: {UUID:0xc000318220 Etype:2 Edata:0}",
     NONE, "rendered from the 2019 device plugin's log.Printf(\"...: %+v\", e) (find_string id 44437632859); skipped, no fault (issue 13)"),
    ('DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-265c9814-6156-355b-e589-ff2064894f16",pci_bus_id="00000000:3B:00.0",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",hostname="gpu-node-17",DCGM_FI_DRIVER_VERSION="580.105.08",err_code="31",err_msg="MMU Fault"} 31',
     X(31, "00000000:3B:00.0", 0), "dcgm-exporter#317 series with the labels of gpu-faults.md §2.6 (lower-case hostname, pci_bus_id, err_code)"),
    (_docker('{"asctime": "2025-09-12 07:41:03", "levelname": "ERROR", "name": "train", "message": "epoch 3 finished", "exc_info": "RuntimeError: CUDA error: an illegal memory access was encountered"}'),
     K("cuda_error"), "docker json-file around a python-json-logger record with the exception in exc_info"),
]


def _params(table: list[tuple[str, Expect, str]], tag: str) -> list[Any]:
    counts: dict[str, int] = {}
    params = []
    for line, expect, source in table:
        family = _family(line, expect)
        counts[family] = counts.get(family, 0) + 1
        params.append(pytest.param(line, expect, source, id=f"{tag}-{family}-{counts[family]:03d}"))
    return params


@pytest.mark.parametrize(("line", "expect", "source"), _params(CASES, "real") + _params(WRAPPED, "wrapped"))
def test_line_is_judged_as_the_reference_says(line: str, expect: Expect, source: str) -> None:
    assert "\n" not in line
    single = classify_line(line)
    _check(expect, [] if single is None else [_row(single)], f"classify_line ({source})")
    cli = [f.row() for f in classify_text(line + "\n")]
    assert cli == ([] if single is None else [r for r in cli if r["line"] == 1]), source
    _check(expect, cli, f"classify ({source})")


def test_all_lines_through_the_cli_in_one_file(tmp_path: Path) -> None:
    """Both tables as one log file through ``remediator classify --json``: line numbers line up."""
    table = [(line, expect) for line, expect, _ in CASES + WRAPPED]
    log = tmp_path / "fleet.log"
    log.write_text("\n".join(line for line, _ in table) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["classify", "--json", str(log)])
    assert result.exit_code == 0, result.output
    by_line: dict[int, list[dict[str, Any]]] = {}
    for text in result.stdout.splitlines():
        row = json.loads(text)
        assert set(row) == {"line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook"}
        by_line.setdefault(row["line"], []).append(row)
    for n, (line, expect) in enumerate(table, 1):
        _check(expect, by_line.get(n, []), f"line {n}: {line[:100]!r}")


def test_the_tables_are_new_material_and_big_enough() -> None:
    from tests.unit.handlers.test_classify_realworld import CASES as FIRST_PASS

    first = {line for line, _, _ in FIRST_PASS}
    lines = [line for line, _, _ in CASES + WRAPPED]
    assert len(set(lines)) == len(lines)
    assert not first & set(lines), sorted(first & set(lines))
    assert len(CASES) >= 150
    kinds = {e.kind for _, e, _ in CASES + WRAPPED if e.kind}
    # no "ecc": this table's only ECC rows were device-plugin lines that *skip* an event (no fault, issue 13)
    assert {"xid", "sxid", "gpu_lost", "thermal", "nccl_timeout", "nccl_error", "cuda_oom", "cuda_error"} <= kinds
    assert sum(1 for _, e, _ in CASES if e.none) >= 50


# --- Alertmanager webhook payloads: shapes the first pass did not send --------------------------------------------
# Label sets follow dcgm-exporter as gpu-faults.md §2.6 describes it (``hostname`` from May 2026, ``Hostname``
# before, ``uuid`` with --use-old-namespace, MIG ``GPU_I_ID``/``GPU_I_PROFILE``); rule texts follow public
# PrometheusRule examples. The payload envelopes follow prometheus/alertmanager's webhook docs (version 4, and the
# legacy version 3 with a numeric groupKey and no per-alert status/fingerprint, gpu-faults.md §6).

_UUID = "GPU-265c9814-6156-355b-e589-ff2064894f16"


def _alert(labels: dict[str, str], annotations: dict[str, str], status: str = "firing",
           url: str = "") -> dict[str, Any]:
    return {"status": status, "labels": labels, "annotations": annotations, "startsAt": "2026-06-02T11:38:47.212Z",
            "endsAt": "2026-06-02T11:43:47.212Z" if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": url, "fingerprint": "5c1b2e7f0a9d3e41"}


def _payload(alerts: list[dict[str, Any]], status: str = "firing") -> dict[str, Any]:
    name = alerts[0]["labels"].get("alertname", "")
    return {"receiver": "gpu-remediator", "status": status, "alerts": alerts, "groupLabels": {"alertname": name},
            "commonLabels": {"alertname": name}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
            "version": "4", "groupKey": '{}/{severity=~"critical|warning"}:{alertname="' + name + '"}',
            "truncatedAlerts": 0}


_MIG_LABELS = {"alertname": "GPUXidError", "severity": "critical", "gpu": "0", "UUID": _UUID, "device": "nvidia0",
               "modelName": "NVIDIA A30", "GPU_I_PROFILE": "1g.6gb", "GPU_I_ID": "3", "hostname": "gpu-node-17",
               "pci_bus_id": "00000000:3B:00.0", "DCGM_FI_DRIVER_VERSION": "580.105.08", "err_code": "94",
               "err_msg": "Contained ECC error", "container": "", "namespace": "", "pod": ""}
_PROM = "http://prometheus-k8s.monitoring.svc:9090/graph?g0.expr="

PAYLOADS: dict[str, tuple[Any, list[dict[str, Any]]]] = {
    "mig-xid-lowercase-hostname": (
        _payload([_alert(_MIG_LABELS, {"summary": "XID error on GPU 0 of gpu-node-17"})]),
        [{"kind": "xid", "xid": 94, "pci_bus_id": "0000:3b:00.0", "gpu_index": 0, "action": "RESTART_APP"}]),
    "xid-zero-in-description": (  # the rendered "{{ $value }}" of a last-Xid gauge that went back to 0
        _payload([_alert({"alertname": "GPUXIDError", "Hostname": "gpu-node-3", "gpu": "1", "UUID": _UUID},
                         {"description": "GPU 1 reported XID error 0"})]),
        []),
    "expr-only-row-remap-failure-go-escaped-url": (  # the GPU signal is only in the expression
        _payload([_alert({"alertname": "GpuMemoryHealth", "Hostname": "gpu-node-3", "gpu": "6", "UUID": _UUID},
                         {"summary": "GPU memory health degraded"},
                         url=_PROM + "DCGM_FI_DEV_ROW_REMAP_FAILURE+%3E+0&g0.tab=1")]),
        [{"kind": "ecc", "xid": None, "gpu_index": 6, "action": None}]),
    "old-namespace-uuid-dbe": (
        _payload([_alert({"alertname": "GPUDoubleBitECC", "node": "gpu-node-9", "gpu": "2", "uuid": _UUID,
                          "device": "nvidia2", "pod_name": "trainer-0", "pod_namespace": "ml"},
                         {"summary": "DBE on GPU 2"}, url=_PROM + "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL+%3E+0")]),
        [{"kind": "ecc", "xid": None, "gpu_index": 2, "action": None}]),
    "fb-used-no-pod": (
        _payload([_alert({"alertname": "GPUMemoryHeldWithoutPod", "Hostname": "gpu-node-3", "gpu": "4",
                          "UUID": _UUID, "exported_pod": ""},
                         {"description": "GPU 4 holds 40 GiB with no pod allocated"},
                         url=_PROM + "DCGM_FI_DEV_FB_USED+%3E+1024+and+on%28UUID%29+DCGM_FI_DEV_GPU_UTIL+%3D%3D+0")]),
        [{"kind": "memory_leak", "xid": None, "gpu_index": 4}]),
    "non-gpu-node-not-ready": (
        _payload([_alert({"alertname": "KubeNodeNotReady", "node": "gpu-node-3", "severity": "warning",
                          "job": "kube-state-metrics"},
                         {"description": "gpu-node-3 has been unready for more than 15 minutes.",
                          "runbook_url": "https://runbooks.prometheus-operator.dev/runbooks/kubernetes/kubenodenotready",
                          "summary": "Node is not ready."},
                         url=_PROM + 'kube_node_status_condition%7Bcondition%3D%22Ready%22%7D+%3D%3D+0')]),
        []),
    "non-gpu-target-down-dcgm-job": (  # the exporter is down: no GPU fault is known
        _payload([_alert({"alertname": "TargetDown", "job": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                          "service": "nvidia-dcgm-exporter", "severity": "warning"},
                         {"description": "100% of the nvidia-dcgm-exporter/nvidia-dcgm-exporter targets in gpu-operator namespace are down.",
                          "summary": "One or more targets are unreachable."},
                         url=_PROM + "100+%2A+%28count+by+%28job%29+%28up+%3D%3D+0%29%29")]),
        []),
    "v3-legacy-payload": (  # groupKey a number, labels only in commonLabels, no per-alert status
        {"receiver": "webhook", "status": "firing", "version": "3", "groupKey": 3318441392870386185,
         "alerts": [{"labels": {}, "annotations": {}, "startsAt": "2018-08-03T09:52:26.739266876Z",
                     "endsAt": "0001-01-01T00:00:00Z"}],
         "groupLabels": {"alertname": "GPUXidError"},
         "commonLabels": {"alertname": "GPUXidError", "Hostname": "gpu-node-3", "gpu": "5", "err_code": "79"},
         "commonAnnotations": {}, "externalURL": "http://alertmanager:9093"},
        [{"kind": "xid", "xid": 79, "gpu_index": 5, "action": "RESTART_BM"}]),
    "list-of-two-payloads": (
        [_payload([_alert({"alertname": "KubePodCrashLooping", "pod": "trainer-0", "namespace": "ml"}, {})]),
         _payload([_alert({"alertname": "GPUXIDError", "Hostname": "gpu-node-3", "gpu": "1", "xid": "48"}, {})])],
        [{"kind": "xid", "xid": 48, "gpu_index": 1, "action": "WORKFLOW_XID_48"}]),
}


def _classify(text: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["classify", "--json"], input=text)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("style", ["pretty", "one-line"])
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_alertmanager_payload(name: str, style: str) -> None:
    payload, want = PAYLOADS[name]
    if style == "pretty":
        text = json.dumps(payload, indent=2)
    else:  # as Alertmanager (Go's encoding/json) sends it: <, > and & escaped
        text = json.dumps(payload).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    rows = _classify(text + "\n")
    assert len(rows) == len(want), rows
    for row, expected in zip(rows, want, strict=True):
        assert row["line"] == 1
        assert {k: row[k] for k in expected} == expected


def test_a_resolved_gpu_alert_is_still_reported_with_its_kind() -> None:
    """Judgement: DESIGN.md §5 turns a resolved alert into an event of the same kind with ``is_healthy``; classify,
    which has no status column, reports the signal the alert is about, as ingest does."""
    alert = _alert({**_MIG_LABELS, "err_code": "79", "err_msg": "GPU has fallen off the bus"}, {}, status="resolved")
    rows = _classify(json.dumps(_payload([alert], status="resolved")) + "\n")
    assert [(r["kind"], r["xid"], r["gpu_index"]) for r in rows] == [("xid", 79, 0)]
