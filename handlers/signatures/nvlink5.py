"""NVLink5 (Blackwell) Xid 144-150 decode with NVIDIA's "Xid 144-150 Decode" table.

Where it sits: ``handlers.signatures.kernel`` calls ``decode_nvlink5`` for an Xid 144-150 line and puts the
result in ``Signal.detail["nvlink"]``; the NVLink handler reads it from there. The table is data:
``handlers/data/xid_144_150_decode.csv`` (source in the ``.source`` sidecar next to it).

Message format (gpu-faults.md §1.2 WORKFLOW_NVLINK5_ERR):
``Xid (PCI:0000:BB:DF): <Xid>, <sub component> <Fatal|Nonfatal> <XC crosscontain> <iN injected> Link <n>
(<intrInfo> <errorStatus> <errorDebugData[0..4]>)``, with irregular runs of spaces. A row matches when its
IntrInfo bit pattern (V1 before R575, V2 from R575; ``-`` is "don't care") matches ``intrInfo`` and its
error status matches ``errorStatus``: an exact value where the table lists one, otherwise bit by bit. Among
the matching rows the most severe action wins (RESET_GPU over XID_154_EVAL over IGNORE); a row whose
"action 2" pattern matches (the error was promoted) takes its Action 2.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

NVLINK5_XIDS = frozenset(range(144, 151))

_SEVERITY_RANK = {"RESET_GPU": 3, "XID_154_EVAL": 2, "IGNORE": 1}

_SUBCODE_RE = re.compile(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|MSE|TREX|NETIR|NVLPW)\b")
_FATAL_RE = re.compile(r"\b(non-?\s?fatal|fatal)\b", re.IGNORECASE)
_LINK_RE = re.compile(r"\blink\s*(\d+)", re.IGNORECASE)
_REGS_RE = re.compile(r"\(\s*((?:0x[0-9a-f]+[\s,]*){2,})\)", re.IGNORECASE)
_XC_RE = re.compile(r"\b(XC\d+)\b", re.IGNORECASE)
_INJ_RE = re.compile(r"\b(i\d+)\b")


@dataclass(frozen=True, slots=True)
class DecodeRow:
    """One row of the decode table."""

    xid: int
    subcodes: tuple[str, ...]
    intr_v1: str
    intr_v2: str
    statuses: tuple[int, ...]  # empty: any status
    action: str
    promoted_v1: str
    promoted_v2: str
    action2: str
    investigatory: str
    severity: str
    origin: str


@dataclass(frozen=True, slots=True)
class NvlinkDecode:
    """What one NVLink5 Xid line says, decoded."""

    xid: int
    subcode: str | None
    severity_text: str | None  # "Fatal" / "Nonfatal" as the line prints it
    link: int | None
    intr_info: int | None
    error_status: int | None
    debug_data: tuple[int, ...]
    action: str | None  # decoded immediate action (the table's Data Center Recovery Action)
    investigatory: str | None
    severity: str | None  # the table's severity column
    promoted: bool
    rows: int  # how many table rows matched

    @property
    def is_fatal(self) -> bool:
        if self.action is not None:
            return self.action == "RESET_GPU"
        return (self.severity_text or "").lower() == "fatal"

    def as_detail(self) -> dict[str, object]:
        return {
            "subcode": self.subcode,
            "severity_text": self.severity_text,
            "link": self.link,
            "intr_info": None if self.intr_info is None else f"0x{self.intr_info:08x}",
            "error_status": None if self.error_status is None else f"0x{self.error_status:08x}",
            "debug_data": tuple(f"0x{d:08x}" for d in self.debug_data),
            "decoded_action": self.action,
            "investigatory_action": self.investigatory,
            "table_severity": self.severity,
            "promoted": self.promoted,
        }


@cache
def decode_table() -> tuple[DecodeRow, ...]:
    """The decode table, read once from ``handlers/data/xid_144_150_decode.csv``."""
    text = resources.files("handlers").joinpath("data/xid_144_150_decode.csv").read_text(encoding="utf-8")
    rows: list[DecodeRow] = []
    reader = csv.reader(text.splitlines())
    next(reader, None)
    for raw in reader:
        if not raw or not raw[0].strip().isdigit():
            continue
        cols = [c.strip() for c in raw] + [""] * 13
        statuses = tuple(int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", cols[4]))
        rows.append(DecodeRow(
            xid=int(cols[0]),
            subcodes=tuple(t.strip().upper() for t in re.split(r"[/ ]", cols[1]) if t.strip()),
            intr_v1=cols[2], intr_v2=cols[3], statuses=statuses, action=cols[5],
            promoted_v1=cols[6], promoted_v2=cols[7], action2=cols[8], investigatory=cols[9],
            severity=cols[10], origin=cols[11],
        ))
    return tuple(rows)


def _bits_match(pattern: str, value: int) -> bool:
    if len(pattern) != 32 or set(pattern) - {"0", "1", "-"}:
        return False
    bits = f"{value & 0xFFFFFFFF:032b}"
    return all(p == "-" or p == b for p, b in zip(pattern, bits, strict=True))


def _intr_match(row: DecodeRow, intr: int) -> tuple[bool, bool]:
    """(matches, promoted) for ``intr`` against the row's V1/V2 patterns and their action-2 patterns."""
    if row.action2 and (_bits_match(row.promoted_v1, intr) or _bits_match(row.promoted_v2, intr)):
        return True, True
    return _bits_match(row.intr_v1, intr) or _bits_match(row.intr_v2, intr), False


def _status_filter(rows: list[DecodeRow], status: int | None) -> list[DecodeRow]:
    if status is None:
        return rows
    anyrows = [r for r in rows if not r.statuses]
    exact = [r for r in rows if status in r.statuses]
    if exact:
        return exact + anyrows
    bitwise = [r for r in rows if any(s and (s & (s - 1)) == 0 and status & s for s in r.statuses)]
    return bitwise + anyrows


def decode_nvlink5(xid: int, text: str) -> NvlinkDecode | None:
    """Decode the part of an Xid 144-150 line after the code; None when ``xid`` is not 144-150."""
    if xid not in NVLINK5_XIDS:
        return None
    regs_m = _REGS_RE.search(text)
    regs = [int(v, 16) for v in re.findall(r"0x([0-9a-f]+)", regs_m.group(1), re.IGNORECASE)] if regs_m else []
    regs = [r & 0xFFFFFFFF for r in regs]
    intr = regs[0] if regs else None
    status = regs[1] if len(regs) > 1 else None
    head = text[: regs_m.start()] if regs_m else text
    sub_m = _SUBCODE_RE.search(head)
    subcode = sub_m.group(1) if sub_m else None
    fatal_m = _FATAL_RE.search(head)
    link_m = _LINK_RE.search(head)

    candidates = [r for r in decode_table() if r.xid == xid]
    if subcode is not None:
        named = [r for r in candidates if subcode.upper() in r.subcodes]
        if named:
            candidates = named
    promoted_rows: set[int] = set()
    if intr is not None:
        matched: list[DecodeRow] = []
        for r in candidates:
            ok, promoted = _intr_match(r, intr)
            if ok:
                matched.append(r)
                if promoted:
                    promoted_rows.add(id(r))
        if matched or subcode is None:
            candidates = matched
    candidates = _status_filter(candidates, status)

    best: DecodeRow | None = None
    best_action: str | None = None
    for r in candidates:
        action = r.action2 if id(r) in promoted_rows else r.action
        if best_action is None or _SEVERITY_RANK.get(action, 2) > _SEVERITY_RANK.get(best_action, 2):
            best, best_action = r, action
    return NvlinkDecode(
        xid=xid,
        subcode=subcode,
        severity_text=None if fatal_m is None else fatal_m.group(1),
        link=None if link_m is None else int(link_m.group(1)),
        intr_info=intr,
        error_status=status,
        debug_data=tuple(regs[2:]),
        action=best_action or None,
        investigatory=None if best is None else best.investigatory or None,
        severity=None if best is None else best.severity or None,
        promoted=best is not None and id(best) in promoted_rows,
        rows=len(candidates),
    )
