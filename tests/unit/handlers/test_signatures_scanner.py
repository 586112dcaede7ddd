"""LineScanner agrees with classify_line line for line; no input crashes any parser (Hypothesis); the benchmark."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.bench.classify import run
from handlers.signatures import (
    ANCHORS,
    PREFILTER,
    LineScanner,
    Signal,
    alerts_in_payload,
    anchored_lines,
    classify_line,
    gpu_from_alert_labels,
    gpu_identity,
    has_anchor,
    node_from_alert_labels,
    signal_from_alert,
    unwrap_line,
)
from remediator.cli.classify import classify_text
from remediator.contracts import KINDS, PLAYBOOK_NAMES, normalize_pci_bus_id

SIGNAL_LINES = [
    "[  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, DBE",
    "NVRM: Xid (0000:03:00): 14, Channel 00000001",
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9).",
    "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
    "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 29 LTSSM Fault Up",
    "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x0 0x0 0x0 0x0)",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
    "600013 milliseconds before timing out.",
    "[PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 9 PG status: last "
    "enqueued work: 9, last completed work: 8",
    "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=0",
    "the lagging/dead/mismatched ranks that caused the desync are: [7] finished collective #182",
    "To avoid data inconsistency, we are taking the entire process down.",
    "host:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with status=12 opcode=1 len=0 vendor err 129",
    "socketProgressOpt: Call to recv from 172.16.0.5<33759> failed : Connection reset by peer",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 1) of binary: py",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB on GPU",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",device="nvidia0",Hostname="h"} 79',
    "pynvml.NVMLError_GpuIsLost: GPU is lost",
    "health.go:159] Processing event {Device:{Handle:0x1} EventType:8 EventData:79 GpuInstanceId:1}",
    "XidCriticalError: Xid=94 on Device=GPU-3cb3c2a6-6c4d-1e56-7a1e-7c0a5e6d1b2f; marking device as unhealthy.",
    "server.go:292] 'nvidia.com/gpu' device marked unhealthy: GPU-3cb3c2a6-6c4d-1e56-7a1e-7c0a5e6d1b2f",
]
NOISE_LINES = [
    "2024-01-01T00:00:00.000000000Z stdout F  iteration      100/  500000 | lm loss: 2.345E+00 |",
    "gpu-node-3:1234:1290 [3] NCCL INFO Channel 05/0 : 3[3] -> 4[4] via P2P/IPC/read",
    "gpu-node-3:1234:1290 [3] NCCL INFO comm 0x55d5c8a0 rank 3 nranks 16 cudaDev 3 busId 3b000 - Init COMPLETE",
    "[    5.1] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b3c4d",
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",device="nvidia0",Hostname="h"} 0',
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",device="nvidia0",Hostname="h"} 99',
    "Traceback (most recent call last):",
    '  File "/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py", line 300, in _lazy_init',
    "Mar  1 12:00:01 gpu-node-1 systemd[1]: Started cri-containerd-abc.scope.",
    "",
    "   ",
    "ünïcödé ☃ NCCL ß İstanbul",
]


def _corpus() -> list[str]:
    lines = []
    for i in range(400):
        lines.append(NOISE_LINES[i % len(NOISE_LINES)])
        if i % 7 == 3:
            lines.append(SIGNAL_LINES[i % len(SIGNAL_LINES)])
    return lines


def _reference(lines: list[str]) -> list[tuple[int, Signal]]:
    return [(n, s) for n, s in ((n, classify_line(line)) for n, line in enumerate(lines, 1)) if s is not None]


def _agrees_with_framing(found: list[tuple[int, Signal]], lines: list[str]) -> None:
    """The scanner's signals against the lines judged alone, under the framing rules (``framing``): every
    line-alone signal is reported, at its line or (a table continuation row) at the row above with the same
    kind and code; any other signal is a joined record, reported at a line that gave nothing alone."""
    want = _reference(lines)
    at = {n: s for n, s in found}
    alone = {n for n, _ in want}
    for n, s in want:
        got = at.get(n) or at.get(n - 1)
        assert got is not None and (got.kind, got.code) == (s.kind, s.code), (n, s, found)
    extra = [n for n, _ in found if n not in alone and n + 1 not in alone]
    assert all(classify_line(lines[n - 1]) is None for n in extra), extra
    assert [n for n, _ in found] == sorted({n for n, _ in found})


@pytest.mark.parametrize("line", SIGNAL_LINES)
def test_every_signal_line_has_an_anchor_and_a_signal(line: str) -> None:
    assert has_anchor(line)
    assert classify_line(line) is not None


def test_anchors_are_lower_case_letters_only() -> None:
    assert all(a.isalpha() and a.islower() for a in ANCHORS)


def test_all_scanner_entry_points_agree_with_classify_line() -> None:
    lines = _corpus()
    want = _reference(lines)
    assert len(want) == sum(1 for i in range(400) if i % 7 == 3)
    text = "\n".join(lines)
    scanner = LineScanner(batch=50)
    assert list(scanner.scan(lines)) == want
    assert list(scanner.scan(line + "\n" for line in lines)) == want
    assert list(scanner.scan_text(text)) == want
    assert list(scanner.scan_bytes(text.encode())) == want
    for block in (1, 7, 64, 4096, 1 << 20):
        assert list(scanner.scan_stream(io.BytesIO(text.encode() + b"\n"), block)) == want, block
    # the agent's entry points: records with their spans, from lines or from raw bytes
    assert [(r.start + 1, r.signal) for r in scanner.records(lines)] == want
    assert [(r.start + 1, r.signal) for r in scanner.records_bytes(text.encode())] == want
    assert all(r.start == r.end for r in scanner.records(lines))


def test_anchored_lines_are_exactly_the_lines_with_an_anchor() -> None:
    lines = _corpus()
    data = "\n".join(lines).encode()
    got = anchored_lines(data)
    assert [i for i, _ in got] == [i for i, line in enumerate(lines) if has_anchor(line)]
    assert all(raw.decode() == lines[i] for i, raw in got)
    assert anchored_lines(b"") == [] and anchored_lines(b"no signal here\n") == []


def test_scan_with_embedded_newlines_judges_each_item_alone() -> None:
    items = ["noise", "NVRM: Xid (PCI:0000:07:00): 48,\n wrapped", "more noise"]
    assert [(n, s.xid) for n, s in LineScanner().scan(items)] == [(2, 48)]


def test_scan_start_offsets_line_numbers() -> None:
    assert [n for n, _ in LineScanner().scan_text(SIGNAL_LINES[0], start=41)] == [41]


def _valid(sig: Signal) -> None:
    assert sig.kind in KINDS
    if sig.kind == "xid":
        assert isinstance(sig.code, int) and sig.code == sig.xid
    else:
        assert sig.xid is None
    assert sig.playbook is None or sig.playbook in PLAYBOOK_NAMES
    if sig.pci_bus_id is not None:
        assert normalize_pci_bus_id(sig.pci_bus_id) == sig.pci_bus_id
    assert isinstance(sig.detail, Mapping)
    assert sig.gpu_index is None or sig.gpu_index >= 0


FRAGMENTS = st.sampled_from([
    "NVRM: ", "Xid ", "(PCI:", "0000:3b:00", ".0", "GPU-I:05", "): ", "79", "154", "149", "45", ", pid=", "'<unknown>'",
    "name=", "caused by previous Xid 149", "recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
    "NETIR_LINK_EVT", " Fatal ", "Link 01 (", "0x021425c6 0x00000000", ")", "SXid", "nvidia-nvswitch0: ",
    "fallen off the bus", "NCCL WARN ", "NET/IB : Got completion from peer ", "with status=", "opcode=", "WorkNCCL(",
    "SeqNum=", "OpType=", "Timeout(ms)=", "ran for ", " milliseconds", "[Rank ", "]", "watchdog", "desync are: [",
    "exitcode: ", "local_rank: ", "CUDA out of memory. ", "Tried to allocate ", "GiB", "MiB", "GPU 0 has a total "
    "capacity of ", " of which ", " is free", "this process has ", " memory in use", "CUDA error: ", "DCGM_FI_DEV_",
    "XID_ERRORS{", 'gpu="', 'UUID="', '",', "} ", "DCGM_FR_", "\\n", '\\"', "\n", "{", '"log":"', "stdout F ",
    "2024-01-01T00:00:00.000000000Z ", "[  219.470994] ", "ChildFailedError", "GPU is lost", "EventType:8 EventData:",
    "9" * 30, "-" * 5, "\x00", "\ud7ff", "İ", "ß",
])
LINE = st.lists(FRAGMENTS | st.text(max_size=12), max_size=25).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LINE)
def test_no_line_crashes_a_parser_and_signals_are_valid(line: str) -> None:
    sig = classify_line(line)
    if sig is not None:
        assert has_anchor(line)
        _valid(sig)
    unwrap_line(line)
    gpu_identity(line)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LINE)
def test_prefilter_regex_matches_wherever_an_anchor_is(line: str) -> None:
    if has_anchor(line):
        assert PREFILTER.search(line) is not None
        assert re.compile(PREFILTER.pattern.encode(), re.IGNORECASE).search(line.encode()) is not None


@pytest.mark.parametrize("line", SIGNAL_LINES)
def test_prefilter_regex_finds_every_signal_line(line: str) -> None:
    assert PREFILTER.search(line) is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_no_bytes_crash_a_parser(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    sig = classify_line(text)
    if sig is not None:
        _valid(sig)
    found = list(LineScanner().scan_bytes(data))
    _agrees_with_framing(found, [part.decode("utf-8", "replace") for part in data.split(b"\n")])
    classify_text(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINE.filter(lambda s: "\n" not in s and "\r" not in s), max_size=30))
def test_scanner_agrees_with_classify_line_on_any_lines(lines: list[str]) -> None:
    _agrees_with_framing(list(LineScanner().scan_text("\n".join(lines))), lines)


LABELS = st.dictionaries(
    st.sampled_from(["alertname", "xid", "err_code", "gpu", "device", "UUID", "pci_bus_id", "Hostname", "hostname",
                     "node", "instance", "__name__", "GPU_I_ID", "exported_pod", "pod"]) | st.text(max_size=8),
    st.sampled_from(["79", "0", "-1", "nvidia3", "GPU-1", "00000000:97:00.0", "GPUXidError", "DCGM_FI_DEV_XID_ERRORS",
                     "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "GpuRowRemapPending", "x" * 300, "NaN", "1e309"])
    | st.text(max_size=12),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(LABELS, st.dictionaries(st.text(max_size=8), st.text(max_size=30), max_size=4),
       st.none() | st.floats(allow_nan=True, allow_infinity=True))
def test_no_alert_crashes_the_label_parsers(labels: dict[str, str], annotations: dict[str, str],
                                            value: float | None) -> None:
    node_from_alert_labels(labels)
    gpu_from_alert_labels(labels)
    sig = signal_from_alert(labels, annotations, value)
    if sig is not None:
        _valid(sig)
    if value == 0:
        assert sig is None


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["alerts", "labels", "annotations", "status", "value", "values", "generatorURL"])
        | st.text(max_size=6), inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_no_payload_crashes_alerts_in_payload(payload: object) -> None:
    for alert in alerts_in_payload(payload):
        alert.signal()
    alerts_in_payload(json.dumps(payload))
    classify_text(json.dumps(payload, indent=2))


def test_benchmark_finds_exactly_the_injected_signals() -> None:
    messages: list[str] = []
    result = run(lines=30_000, progress=messages.append, signal_every=300)
    assert result["lines"] == 30_000
    assert result["expected_signals"] == 100
    assert result["signals"] == 100 and result["exact"] is True
    assert result["missed"] == result["unexpected"] == result["wrong_kind"] == 0
    assert result["lines_per_s"] > 0 and 60 <= result["avg_line_chars"] <= 300
    assert messages and "lines/s" in messages[-1]
    assert result["exact_user_rules"] is True and result["user_rule_signals"] > 0
    assert result["user_lines_found_without_rules"] == 0
    assert len(result["load_average"]) == 3
