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
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, BinaryIO

from handlers.signatures.cuda import classify_cuda
from handlers.signatures.dcgm import (
    Alert,
    alerts_in_payload,
    classify_dcgm_series,
    classify_dcgm_tool,
    gpu_from_alert_labels,
    is_series_line,
    node_from_alert_labels,
    series_is_state,
    signal_from_alert,
)
from handlers.signatures.framing import frame_records
from handlers.signatures.kernel import classify_kernel, gpu_identity, is_skip_report
from handlers.signatures.model import Signal, json_fields, unwrap_line

if TYPE_CHECKING:
    from handlers.rules import RuleSet
from handlers.signatures.nccl import classify_nccl, is_old_nccl_warn
from handlers.signatures.prefilter import BlockLines, Prefilter, line_offsets, prefilter, skeleton, skeleton_anchor
from handlers.signatures.sched import classify_scheduler

__all__ = [
    "ANCHORS",
    "PREFILTER",
    "Alert",
    "LineScanner",
    "Record",
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
# "skeleton": lower-cased, with every byte that is not an ASCII letter deleted (so "fallen off the bus" is looked
# for as "fallenoffthebus", "DCGM_FI" as "dcgmfi"). A line without one is never parsed. ``LineScanner`` builds
# the skeleton of a whole block with one ``bytes.translate`` and finds every anchor in it with one Aho-Corasick
# pass (``prefilter``), so ordinary log lines cost almost nothing. Keep this in step with the family parsers:
# tests check that every signal line has an anchor and that nothing without one is ever recognised.
ANCHORS: tuple[str, ...] = (
    "xid", "nvrm", "nccl", "cuda", "dcgm", "gpuislost", "fallenoffthebus", "outofmemory", "detectedbywatchdog",
    "heartbeatmonitor", "causedthedesync", "failedexitcode", "childfailederror", "eventtypeeventdata",
    "socket", "entireprocessdown", "markedunhealthy", "oomwhenallocating",
    # issue 13: nvidia-smi's handle errors, XLA/TF "Resource exhausted", cuBLAS/cuDNN outside PyTorch, CUDA
    # device-side assertion lines, DCGM host-engine health watches and dcgmi diag result rows.
    "devicehandlefor", "resourceexhausted", "cublasstatus", "cudnnstatus", "threadassertion", "healthsystem",
    "failgpu",
    # NCCL releases before the tag ("[0] misc/ibvwrap.cc:252 WARN ..."): a C/C++/CUDA source file, then WARN;
    # an IB completion error quoted without NCCL's prefix; dcgmi diag's "| Error | GPU 3 has uncorrectable memory
    # errors ..." rows; Slurm's "gres/gpu count reported lower than configured".
    "cwarn", "cuwarn", "hwarn", "gotcompletionfrompeer", "uncorrectablememory", "gresgpucountreportedlower",
    "exitswithreturncode",  # DeepSpeed's launcher: a rank's process "exits with return code = -9"
    "failedcheckcheck",  # NHC: "Health check failed:  Check check_nv_gpu_count 2 returned 1"
)
_BANCHORS = tuple(a.encode() for a in ANCHORS)

_KERNEL = ("xid", "nvrm", "lost", "off the bus", "eventdata", "heartbeat", "unhealthy", "device handle")
_CUDA = ("cuda", "out of memory", "oom when allocating", "resource exhausted", "resource_exhausted",
         "resourceexhausted", "cublas", "cudnn", "assertion")
_DCGM_TOOL = ("health system", "fail - ", "uncorrectable memory")
_NCCL_FIRST = ("nccl warn", "nccl error in", "nccl operation", "rccl operation", "ncclunhandledcudaerror",
               "ncclsystemerror", "ncclinternalerror", "ncclremoteerror", "ncclinvalid", "test nccl failure")
# plain lower-case substrings: a superset of the anchors above
_NCCL = ("nccl", "watchdog", "heartbeat", "desync", "exitcode", "childfailed", "socket",
         "entire process down", "completion from peer", "exits with return code")

# The anchors as one regex, for callers that want a pattern (``re.compile(PREFILTER.pattern.encode(), re.I)``
# works on bytes): it matches wherever ``has_anchor`` is true (between an anchor's letters it allows whatever
# the skeleton deletes), and more. It is the portable form and slow (Python's ``re`` has no multi-literal
# search: far slower than ``anchored_lines``/``LineScanner``, which are the ones to use on a hot path).
_BETWEEN = "[^a-z\\n]*"
PREFILTER = re.compile("|".join(_BETWEEN.join(a) for a in ANCHORS), re.IGNORECASE | re.ASCII)


def _rules_prefilter(rules: RuleSet | None) -> Prefilter:
    """The prefilter for the built-in anchors and, when ``rules`` add signatures, theirs too."""
    if not rules or not rules.signatures:
        return prefilter(_BANCHORS)
    return prefilter(_with_rule_anchors(rules.anchors()))


@lru_cache(maxsize=32)
def _with_rule_anchors(literals: tuple[str, ...]) -> tuple[bytes, ...]:
    return _BANCHORS + tuple(sorted({rule_anchor(a) for a in literals} - {b""}))


def has_anchor(text: str) -> bool:
    """True when ``text`` may hold a signal: its skeleton contains one of ``ANCHORS``."""
    return bool(prefilter(_BANCHORS).lines(skeleton(text.encode("utf-8", "replace")))[0])


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
        sig = classify_nccl(text)
        if sig is not None:
            return sig
    if "count reported lower" in low or "check failed" in low:
        return classify_scheduler(text)
    return None


def anchored_lines(block: bytes) -> list[tuple[int, bytes]]:
    """``(0-based line index, line)`` for every line of ``block`` that holds an anchor, in order.

    The fast prefilter for callers with their own per-line handling: one ``translate`` builds the block's
    skeleton, one Aho-Corasick pass marks the lines (``prefilter``); nothing else is split out or decoded.
    Every line ``classify_line`` could recognise is among them.
    """
    indices, _n = prefilter(_BANCHORS).lines(skeleton(block))
    if not indices:
        return []
    out: list[tuple[int, bytes]] = []
    find = block.find
    for index, start in zip(indices, line_offsets(block, indices), strict=True):
        end = find(b"\n", start)
        out.append((index, block[start:] if end < 0 else block[start:end]))
    return out


_WHOLE = ("NCCL INFO", "DCGM_FI_", "DCGM_EXP_", "NVRM: GPU at", "NVRM: loading")


def _whole_record(raw: str) -> bool:
    """Lines that are a record of their own by format: no framing join is tried around them."""
    return any(w in raw for w in _WHOLE)


# The driver's GPU identity and load banners, alone on their line (a dmesg timestamp at most before them).
_BANNER_RE = re.compile(rb"^(?:\[\s*\d+\.\d+\]\s*)?NVRM: (?:GPU at PCI:[0-9A-Fa-f:.]+: GPU-[0-9A-Fa-f-]+"
                        rb"|loading NVIDIA UNIX [\w.]+ Kernel Module +[\w.]+ +[ \w:]*)\s*$")


@lru_cache(maxsize=32)
def _literals(anchors: tuple[str, ...]) -> re.Pattern[bytes]:
    """The operator signatures' anchor literals as one pattern (for ``_silent``)."""
    return re.compile(b"|".join(re.escape(a.encode()) for a in anchors))


def _silent(raw: bytes, literals: re.Pattern[bytes] | None) -> bool:
    """True for the commonest anchored noise, judged on the raw line without parsing: NCCL INFO chatter (no
    JSON, no escapes, no ``NCCL WARN``), the driver's identity and load banners and dcgm-exporter series of
    fields that are state or at zero (``dcgm.series_is_state``) -- lines that give no signal
    and are whole records by format (``_whole_record``), so framing needs nothing from them. ``literals`` are
    the operator signatures' anchors (lower case, as one pattern): a line holding one is parsed as usual.
    """
    if b"NCCL INFO" in raw:
        if b"{" in raw or b"\\" in raw:
            return False
        low = raw.lower()
        return b"nccl warn" not in low and (literals is None or literals.search(low) is None)
    if b"NVRM: " in raw and _BANNER_RE.match(raw) is not None:
        return literals is None or literals.search(raw.lower()) is None
    if series_is_state(raw):
        return literals is None or literals.search(raw.lower()) is None
    return False


def rule_anchor(literal: str) -> bytes:
    """The skeleton form of an operator signature's ``contains`` literal (what the block prefilter looks for)."""
    return skeleton_anchor(literal)


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


@dataclass(frozen=True, slots=True)
class Record:
    """One signal and the lines its record spans (0-based, ``start`` to ``end`` inclusive, within one block)."""

    start: int
    end: int
    signal: Signal


def _block_records(block: bytes, rules: RuleSet | None = None, lines_seen: list[int] | None = None
                   ) -> Iterator[Record]:
    """The records in ``block`` (whole lines, UTF-8), framed (``framing``); indices are the block's lines.

    ``lines_seen`` (when given) receives the block's number of lines, which the prefilter counted anyway.
    """
    indices, n = _rules_prefilter(rules).lines(skeleton(block))
    if lines_seen is not None:
        lines_seen.append(n)
    if not indices:
        return
    offsets = line_offsets(block, indices)
    lines = BlockLines(block, dict(zip(indices, offsets, strict=True)), n)
    literals = _literals(rules.anchors()) if rules and rules.signatures else None
    silent: set[int] = set()
    find = block.find
    for i, start in zip(indices, offsets, strict=True):
        end = find(b"\n", start)
        if _silent(block[start:] if end < 0 else block[start:end], literals):
            silent.add(i)
    for start, end, sig in frame_records(lines, indices, _parser(rules), complete=_whole_record, silent=silent):
        yield Record(start, end, sig)


def _scan_block(block: bytes, first_line: int, rules: RuleSet | None = None) -> Iterator[tuple[int, Signal]]:
    """Signals in ``block`` (whole lines, UTF-8), numbered from ``first_line``; records framed (``framing``)."""
    for rec in _block_records(block, rules):
        yield first_line + rec.start, rec.signal


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

    def records(self, lines: Sequence[str]) -> list[Record]:
        """The records among ``lines`` (each one line, no newline): 0-based start and end indices and the signal.

        What the agent's watchers use: the same prefilter, framing and parsers (operator signatures included)
        as ``remediator classify``, with the span of each record so its first line names the event and its
        lines are reported once. An item with an embedded newline makes every item be judged alone.
        """
        if not lines:
            return []
        text = "\n".join(lines)
        if text.count("\n") == len(lines) - 1:
            return list(_block_records(text.encode("utf-8", "replace"), self.rules))
        parse = _parser(self.rules)
        out = []
        for k, ln in enumerate(lines):
            sig = parse(ln) if has_anchor(ln) or self.rules else None
            if sig is not None:
                out.append(Record(k, k, sig))
        return out

    def records_bytes(self, data: bytes) -> list[Record]:
        """The records in raw bytes (lines split at ``\\n``, UTF-8, undecodable bytes replaced)."""
        return list(_block_records(data, self.rules))

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
            seen: list[int] = []
            for rec in _block_records(complete, self.rules, seen):
                yield line_no + rec.start, rec.signal
            line_no += seen[0]
            rest = data[cut + 1:]
        if rest:
            yield from self.scan_bytes(rest, line_no)
