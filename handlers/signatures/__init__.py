"""Stateless signature parsers: one log line, metric series or alert in, at most one ``Signal`` out.

Where it sits: at the front of the flow. The node agent runs ``LineScanner`` over kernel and container logs
and turns each ``Signal`` into a ``FaultEvent``; ingest uses ``signal_from_alert`` and the label helpers
on Alertmanager payloads; ``remediator classify`` prints what ``classify_line`` and ``alerts_in_payload``
find. Nothing here keeps state: grouping bursts, suppressing an Xid 43 after an Xid 13, correlating ranks
and deciding on a playbook are the stateful handlers' job.

Families: ``kernel`` (NVRM Xid, NVSwitch SXid, fallen off the bus, GPU identity lines, Xid 154 recovery
actions, Xid 45 "caused by previous Xid", NVLink5 Xid 144-150 decoded by ``nvlink5``, nvidia-smi's "Unable to
determine the device handle ...: Unknown Error"), ``nccl`` (PyTorch ProcessGroupNCCL watchdog, heartbeat
monitor and desync reports, NCCL WARN lines with or without the tag, NET/IB and NET/OFI failures, XLA/JAX "NCCL
operation ... failed", NCCL errors in Python exceptions, torch elastic child failures), ``cuda`` (CUDA errors,
cuBLAS/cuDNN status codes, device-side assertion lines, out-of-memory as PyTorch, JAX/XLA and TensorFlow print
it), ``dcgm`` (dcgm-exporter series lines, alert labels, host-engine health watches, ``dcgmi diag`` rows).
A record split over lines is joined by ``framing``; operator rules (``handlers.rules``) add signatures.
A component reporting that it skipped or ignored an event is never a signal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, BinaryIO, overload

from handlers.signatures.cuda import classify_cuda
from handlers.signatures.dcgm import (
    Alert,
    alerts_in_payload,
    classify_dcgm_series,
    classify_dcgm_tool,
    gpu_from_alert_labels,
    is_series_line,
    node_from_alert_labels,
    signal_from_alert,
)
from handlers.signatures.framing import frame
from handlers.signatures.kernel import classify_kernel, gpu_identity, is_skip_report
from handlers.signatures.model import Signal, json_fields, unwrap_line

if TYPE_CHECKING:
    from handlers.rules import RuleSet
from handlers.signatures.nccl import classify_nccl, is_old_nccl_warn

__all__ = [
    "ANCHORS",
    "PREFILTER",
    "Alert",
    "LineScanner",
    "Signal",
    "alerts_in_payload",
    "anchored_lines",
    "classify_line",
    "gpu_from_alert_labels",
    "gpu_identity",
    "has_anchor",
    "node_from_alert_labels",
    "signal_from_alert",
    "unwrap_line",
]

# Every signal any family recognises contains one of these anchors once the line is reduced to its
# "skeleton": lower-cased, with every byte that is not a letter of some anchor deleted (so "fallen off the bus" is
# looked for as "fallenoffthebus", "DCGM_FI" as "dcgmfi"). A line without one is never parsed. ``LineScanner``
# builds the skeleton of a whole block with one ``bytes.translate`` and finds the anchors with ``bytes.find``
# (both C loops), so ordinary log lines cost almost nothing. Keep this in step with the family parsers:
# tests check that every signal line has an anchor and that nothing without one is ever recognised.
ANCHORS: tuple[str, ...] = (
    "xid", "nvrm", "nccl", "cuda", "dcgm", "gpuislost", "fallenoffthebus", "outofmemory", "detectedbywatchdog",
    "heartbeatmonitor", "causedthedesync", "failedexitcode", "childfailederror", "eventtypeeventdata",
    "socket", "entireprocessdown", "markedunhealthy", "oomwhenallocating",
    # issue 13: nvidia-smi's handle errors, XLA/TF "Resource exhausted", cuBLAS/cuDNN outside PyTorch, CUDA
    # device-side assertion lines, DCGM host-engine health watches and dcgmi diag result rows.
    "devicehandlefor", "resourceexhausted", "cublasstatus", "cudnnstatus", "threadassertion", "healthsystem",
    "failgpu",
)
_BANCHORS = tuple(a.encode() for a in ANCHORS)
# "nccl" followed by "info" is no anchor: NCCL's INFO chatter (a large share of a training job's log) is never
# a signal, and such a line is looked at only when another anchor is on it.
_CHATTER = b"ncclinfo"
_ALPHABET = frozenset(b"".join((*_BANCHORS, _CHATTER)))
_LOWER = bytes(c + 32 if 65 <= c <= 90 else c for c in range(256))
_DELETE = bytes(c for c in range(256) if _LOWER[c] not in _ALPHABET and c != 10)

_KERNEL = ("xid", "nvrm", "lost", "off the bus", "eventdata", "heartbeat", "unhealthy", "device handle")
_CUDA = ("cuda", "out of memory", "oom when allocating", "resource exhausted", "resource_exhausted",
         "resourceexhausted", "cublas", "cudnn", "assertion")
_DCGM_TOOL = ("health system", "fail - ", "uncorrectable memory")
_NCCL_FIRST = ("nccl warn", "nccl error in", "nccl operation", "ncclunhandledcudaerror", "ncclsystemerror",
               "ncclinternalerror", "ncclremoteerror", "ncclinvalid", "test nccl failure")
_NCCL = ("nccl", "watchdog", "heartbeat", "desync", "exitcode", "childfailed", "socket",
         "entire process down")  # plain lower-case substrings: a superset of the anchors above

# The anchors as one regex, for callers that want a pattern (``re.compile(PREFILTER.pattern.encode(), re.I)``
# works on bytes): it matches wherever ``has_anchor`` is true (between an anchor's letters it allows whatever
# the skeleton deletes), and more. It is the portable form and slow (Python's ``re`` has no multi-literal
# search: about 15x slower than ``anchored_lines``/``LineScanner``, which are the ones to use on a hot path).
_BETWEEN = "[^" + "".join(sorted({chr(c) for c in _ALPHABET})) + "\\n]*"
PREFILTER = re.compile("|".join(_BETWEEN.join(a) for a in ANCHORS), re.IGNORECASE | re.ASCII)


def skeleton(data: bytes) -> bytes:
    """``data`` lower-cased with every byte that no anchor uses deleted (newlines kept)."""
    return data.translate(_LOWER, _DELETE)


def _anchored_lines(skel: bytes, anchors: tuple[bytes, ...] = _BANCHORS) -> set[int]:
    """Start offsets (in ``skel``) of the lines that hold an anchor."""
    starts: set[int] = set()
    find, rfind, chatter = skel.find, skel.rfind, skel.startswith
    for a in anchors:
        i = find(a)
        while i >= 0:
            if a == b"nccl" and chatter(_CHATTER, i):
                i = find(a, i + 8)
                continue
            starts.add(rfind(b"\n", 0, i) + 1)
            le = find(b"\n", i)
            if le < 0:
                break
            i = find(a, le)
    return starts


def has_anchor(text: str) -> bool:
    """True when ``text`` may hold a signal: its skeleton contains one of ``ANCHORS``."""
    return bool(_anchored_lines(skeleton(text.encode("utf-8", "replace"))))


def classify_line(line: str) -> Signal | None:
    """The GPU fault signal in ``line`` judged alone, or None for noise, identity lines and zero metrics.

    ``line`` may still carry a CRI container-log prefix, a docker JSON envelope, JSON escapes or any
    timestamp/syslog/dmesg prefix; embedded newlines (a wrapped or multi-line message) are allowed. A kernel
    line carrying an Xid is always kind ``xid`` with its number, whatever else it also says.
    """
    if not has_anchor(line):
        return None
    return _parse(line)


def _parse(line: str) -> Signal | None:
    """``classify_line`` after the gate: unwrap and hand to the families.

    A JSON record whose message field says nothing gets a second look at its other string fields: agents
    and loggers put the kernel line or the exception beside the message (``"line"``, ``"error"``,
    ``"exc_info"``, ``details.message``). That costs nothing on the hot path: it runs only for anchored
    lines that are JSON and gave no signal.
    """
    text = unwrap_line(line)
    try:
        sig = _classify(text, text.lower())
        if sig is None and "{" in line:
            for value in json_fields(line):
                if value != text and has_anchor(value):
                    inner = unwrap_line(value)
                    sig = _classify(inner, inner.lower())
                    if sig is not None:
                        break
        return sig
    except (ValueError, IndexError, OverflowError, KeyError, RecursionError):  # a malformed line is noise
        return None


def _classify(text: str, low: str) -> Signal | None:
    if "nccl info" in low and "nccl warn" not in low:
        return None
    if ("skip" in low or "ignor" in low) and is_skip_report(text):
        return None  # a component saying it skipped or ignored an event reports no fault
    if "dcgm_" in low:
        sig = classify_dcgm_series(text)
        if sig is not None or is_series_line(text):
            return sig
    if any(a in low for a in _KERNEL):
        sig = classify_kernel(text, low)
        if sig is not None:
            return sig
    if any(a in low for a in _DCGM_TOOL):
        sig = classify_dcgm_tool(text, low)
        if sig is not None:
            return sig
    if any(a in low for a in _NCCL_FIRST) or ("] " in text and is_old_nccl_warn(text)):
        # NCCL's own report of a CUDA failure is an NCCL error, in old tag-less WARN lines too
        sig = classify_nccl(text)
        if sig is not None:
            return sig
    if any(a in low for a in _CUDA):
        sig = classify_cuda(text)
        if sig is not None:
            return sig
    if any(a in low for a in _NCCL):
        return classify_nccl(text)
    return None


def anchored_lines(block: bytes) -> list[tuple[int, bytes]]:
    """``(0-based line index, line)`` for every line of ``block`` that holds an anchor, in order.

    The fast prefilter for callers with their own per-line handling (the pod-log scanner): one ``translate``
    builds the block's skeleton and one ``find`` loop per anchor marks the lines; nothing else is split out
    or decoded. Every line ``classify_line`` could recognise is among them.
    """
    skel = skeleton(block)
    starts = _anchored_lines(skel)
    if not starts:
        return []
    count = skel.count
    lines = block.split(b"\n")  # skeleton offsets differ from the block's; line numbers do not
    out: list[tuple[int, bytes]] = []
    line_no, spos = 0, 0
    for ls in sorted(starts):
        line_no += count(b"\n", spos, ls)
        spos = ls
        out.append((line_no, lines[line_no]))
    return out


class _Lines(Sequence[str]):
    """The lines of a block, decoded only when the framing layer reads one."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[bytes]) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [r.decode("utf-8", "replace") for r in self._raw[i]]
        return self._raw[i].decode("utf-8", "replace")


_WHOLE = ("NCCL INFO", "DCGM_FI_", "DCGM_EXP_", "NVRM: GPU at", "NVRM: loading")


def _whole_record(raw: str) -> bool:
    """Lines that are a record of their own by format: no framing join is tried around them."""
    return any(w in raw for w in _WHOLE)


def rule_anchor(literal: str) -> bytes:
    """The skeleton form of an operator signature's ``contains`` literal (what the block prefilter looks for)."""
    return skeleton(literal.encode("utf-8", "replace")).replace(b"\n", b"")


def _parser(rules: RuleSet | None) -> Callable[[str], Signal | None]:
    """``_parse``, then the operator's added signatures on what the built-in families leave unrecognised."""
    if not rules or not rules.signatures:
        return _parse

    def parse(line: str) -> Signal | None:
        sig = _parse(line)
        if sig is not None:
            return sig
        hit = rules.signal(unwrap_line(line))
        return None if hit is None else hit[1]

    return parse


def _scan_block(block: bytes, first_line: int, rules: RuleSet | None = None) -> Iterator[tuple[int, Signal]]:
    """Signals in ``block`` (whole lines, UTF-8), numbered from ``first_line``; records framed (``framing``)."""
    skel = skeleton(block)
    starts = _anchored_lines(skel)
    if rules and rules.signatures:
        starts |= _anchored_lines(skel, tuple(rule_anchor(a) for a in rules.anchors()))
    if not starts:
        return
    count = skel.count
    indices: list[int] = []
    line_no, spos = 0, 0
    for ls in sorted(starts):
        line_no += count(b"\n", spos, ls)
        spos = ls
        indices.append(line_no)
    lines = _Lines(block.split(b"\n"))
    for index, sig in frame(lines, indices, _parser(rules), complete=_whole_record):
        yield first_line + index, sig


class LineScanner:
    """The fast path for many lines: anchors first, full parsing only for the lines that contain one.

    Every entry point yields ``(1-based line number, Signal)`` in input order and judges each line as
    ``classify_line`` does; a record split over lines is joined by the framing layer (``framing``) and
    reported once, at the line where it starts. ``scan`` takes an iterable of lines (with or without their newlines);
    ``scan_text`` one string; ``scan_bytes`` raw bytes; ``scan_stream`` a binary stream read in big blocks.
    """

    __slots__ = ("batch", "rules")

    def __init__(self, batch: int = 8192, rules: RuleSet | None = None) -> None:
        self.batch = batch
        self.rules = rules  # operator rules (``handlers.rules``): their added signatures are tried too

    def scan(self, lines: Iterable[str], start: int = 1) -> Iterator[tuple[int, Signal]]:
        """Scan ``lines`` (each with or without its newline), numbering them from ``start``."""
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
            else:  # an item with an embedded newline: judge each item alone
                parse = _parser(self.rules)
                for k, ln in enumerate(clean):
                    sig = parse(ln) if has_anchor(ln) or self.rules else None
                    if sig is not None:
                        yield n + k, sig
            n += len(chunk)

    def scan_text(self, text: str, start: int = 1) -> Iterator[tuple[int, Signal]]:
        """Scan ``text`` (newline-separated lines); line numbers count from ``start``."""
        yield from _scan_block(text.encode("utf-8", "replace"), start, self.rules)

    def scan_bytes(self, data: bytes, start: int = 1) -> Iterator[tuple[int, Signal]]:
        """Scan raw bytes (UTF-8, undecodable bytes replaced); line numbers count from ``start``."""
        yield from _scan_block(data, start, self.rules)

    def scan_stream(self, stream: BinaryIO, block: int = 1 << 20) -> Iterator[tuple[int, Signal]]:
        """Scan a binary stream read in blocks of ``block`` bytes; a line cut by a block end is joined up.

        Each block is scanned up to its last newline (with the unfinished line of the block before in front);
        its unfinished last line is kept for the next one. Records are framed within a block.
        """
        line_no = 1
        rest = b""
        while True:
            data = stream.read(block)
            if not data:
                break
            cut = data.rfind(b"\n")
            if cut < 0:
                rest += data
                continue
            complete = rest + data[:cut] if rest else data[:cut]
            yield from _scan_block(complete, line_no, self.rules)
            line_no += complete.count(b"\n") + 1
            rest = data[cut + 1:]
        if rest:
            yield from self.scan_bytes(rest, line_no)
