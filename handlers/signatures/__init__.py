"""Stateless signature parsers: one log line, metric series or alert in, at most one ``Signal`` out.

Where it sits: at the front of the flow. The node agent runs ``LineScanner`` over kernel and container logs
and turns each ``Signal`` into a ``FaultEvent``; ingest uses ``signal_from_alert`` and the label helpers
on Alertmanager payloads; ``remediator classify`` prints what ``classify_line`` and ``alerts_in_payload``
find. Nothing here keeps state: grouping bursts, suppressing an Xid 43 after an Xid 13, correlating ranks
and deciding on a playbook are the stateful handlers' job.

Families: ``kernel`` (NVRM Xid, NVSwitch SXid, fallen off the bus, GPU identity lines, Xid 154 recovery
actions, Xid 45 "caused by previous Xid", NVLink5 Xid 144-150 decoded by ``nvlink5``), ``nccl`` (PyTorch
ProcessGroupNCCL watchdog, heartbeat monitor and desync reports, NCCL WARN lines, NCCL errors in Python
exceptions, torch elastic child failures), ``cuda`` (CUDA errors and out-of-memory), ``dcgm`` (dcgm-exporter
series lines and alert labels).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import AnyStr, BinaryIO

from handlers.signatures.cuda import classify_cuda
from handlers.signatures.dcgm import (
    Alert,
    alerts_in_payload,
    classify_dcgm_series,
    is_series_line,
    gpu_from_alert_labels,
    node_from_alert_labels,
    signal_from_alert,
)
from handlers.signatures.kernel import classify_kernel, gpu_identity
from handlers.signatures.model import Signal, unwrap_line
from handlers.signatures.nccl import classify_nccl

__all__ = [
    "ANCHORS",
    "PREFILTER",
    "Alert",
    "LineScanner",
    "Signal",
    "alerts_in_payload",
    "classify_line",
    "gpu_from_alert_labels",
    "gpu_identity",
    "has_anchor",
    "node_from_alert_labels",
    "signal_from_alert",
    "unwrap_line",
]

# Every signal any family recognises contains one of these (lower case). A line without any of them is
# never parsed; ``LineScanner`` finds them in big lower-cased blocks with ``find`` (C speed), so ordinary log
# lines cost almost nothing. Keep this in step with the family parsers: tests check every signal line and
# Hypothesis checks that nothing outside these is ever recognised.
ANCHORS: tuple[str, ...] = (
    "xid", "nvrm", "nccl", "cuda", "dcgm_", "lost", "watchdog", "heartbeat", "desync", "exitcode",
    "childfailed", "off the bus", "out of memory", "eventdata", "socketprogress", "entire process down",
)
_KERNEL = ("xid", "nvrm", "lost", "off the bus", "eventdata", "heartbeat")
_CUDA = ("cuda", "out of memory")
_NCCL = ("nccl", "watchdog", "heartbeat", "desync", "exitcode", "childfailed", "socketprogress",
         "entire process down")
# An "NCCL INFO" line is chatter unless it also says one of these.
_INFO_UNLESS = ("error", "fail", "warn", "timeout", "timed out", "xid", "abort")

PREFILTER = re.compile("|".join(re.escape(a) for a in ANCHORS), re.IGNORECASE)


def has_anchor(text: str) -> bool:
    """True when ``text`` contains one of ``ANCHORS`` (case-insensitive): it may hold a signal."""
    low = text.lower()
    return any(a in low for a in ANCHORS)


def classify_line(line: str) -> Signal | None:
    """The GPU fault signal in ``line`` judged alone, or None for noise, identity lines and zero metrics.

    ``line`` may still carry a CRI container-log prefix, a docker JSON envelope, JSON escapes or any
    timestamp/syslog/dmesg prefix; embedded newlines (a wrapped or multi-line message) are allowed. A kernel
    line carrying an Xid is always kind ``xid`` with its number, whatever else it also says.
    """
    if not has_anchor(line):
        return None
    text = unwrap_line(line)
    low = text.lower()
    try:
        return _classify(text, low)
    except (ValueError, IndexError, OverflowError, KeyError):  # a malformed line is noise, never a crash
        return None


def _classify(text: str, low: str) -> Signal | None:
    if "dcgm_" in low:
        sig = classify_dcgm_series(text)
        if sig is not None or is_series_line(text):
            return sig
    if "nccl info" in low and not any(w in low for w in _INFO_UNLESS):
        return None
    if any(a in low for a in _KERNEL):
        sig = classify_kernel(text)
        if sig is not None:
            return sig
    if any(a in low for a in _CUDA):
        sig = classify_cuda(text)
        if sig is not None:
            return sig
    if any(a in low for a in _NCCL):
        return classify_nccl(text)
    return None


def _hit_starts(low: AnyStr, anchors: tuple[AnyStr, ...], nl: AnyStr) -> list[int]:
    """Sorted start offsets of the lines of ``low`` that contain an anchor."""
    starts: set[int] = set()
    for a in anchors:
        i = low.find(a)
        while i >= 0:
            ls = low.rfind(nl, 0, i) + 1
            starts.add(ls)
            le = low.find(nl, i)
            if le < 0:
                break
            i = low.find(a, le)
    return sorted(starts)


_BANCHORS = tuple(a.encode() for a in ANCHORS)


class LineScanner:
    """The fast path for many lines: anchors first, full parsing only for the lines that contain one.

    All three entry points yield ``(1-based line number, Signal)`` in input order. ``scan`` takes an
    iterable of lines (with or without their newlines) and batches them; ``scan_text`` takes one string;
    ``scan_bytes`` takes raw bytes (a file read in big blocks), lower-cases whole blocks (ASCII, so offsets
    are kept) and decodes only the lines that contain an anchor.
    """

    __slots__ = ("batch",)

    def __init__(self, batch: int = 8192) -> None:
        self.batch = batch

    def scan(self, lines: Iterable[str], start: int = 1) -> Iterator[tuple[int, Signal]]:
        it = iter(lines)
        n = start
        while True:
            chunk = list(islice(it, self.batch))
            if not chunk:
                return
            clean = [ln[:-1] if ln[-1:] == "\n" else ln for ln in chunk]
            text = "\n".join(clean)
            if text.count("\n") == len(clean) - 1:
                yield from self.scan_text(text, n)
            else:  # a line with an embedded newline: judge each item alone
                for k, ln in enumerate(clean):
                    sig = classify_line(ln)
                    if sig is not None:
                        yield n + k, sig
            n += len(chunk)

    def scan_text(self, text: str, start: int = 1) -> Iterator[tuple[int, Signal]]:
        """Scan ``text`` (newline-separated lines); line numbers count from ``start``."""
        low = text.lower()
        if len(low) != len(text):  # a few characters change length when lower-cased: go line by line
            for k, ln in enumerate(text.split("\n")):
                sig = classify_line(ln)
                if sig is not None:
                    yield start + k, sig
            return
        line_no, pos = start, 0
        for ls in _hit_starts(low, ANCHORS, "\n"):
            le = text.find("\n", ls)
            if le < 0:
                le = len(text)
            line_no += text.count("\n", pos, ls)
            pos = ls
            sig = classify_line(text[ls:le])
            if sig is not None:
                yield line_no, sig

    def scan_bytes(self, data: bytes, start: int = 1) -> Iterator[tuple[int, Signal]]:
        """Scan raw bytes (UTF-8, undecodable bytes replaced); line numbers count from ``start``."""
        low = data.lower()
        line_no, pos = start, 0
        for ls in _hit_starts(low, _BANCHORS, b"\n"):
            le = data.find(b"\n", ls)
            if le < 0:
                le = len(data)
            line_no += data.count(b"\n", pos, ls)
            pos = ls
            sig = classify_line(data[ls:le].decode("utf-8", "replace"))
            if sig is not None:
                yield line_no, sig

    def scan_stream(self, stream: BinaryIO, block: int = 1 << 23) -> Iterator[tuple[int, Signal]]:
        """Scan a binary stream in blocks of about ``block`` bytes, cut at line ends."""
        line_no = 1
        rest = b""
        while True:
            data = stream.read(block)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            body, rest = data[: cut + 1], data[cut + 1:]
            yield from self.scan_bytes(body, line_no)
            line_no += body.count(b"\n")
        if rest:
            yield from self.scan_bytes(rest, line_no)
