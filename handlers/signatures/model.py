"""The ``Signal`` value and the text normalisation every line parser shares.

Where it sits: at the bottom of ``handlers.signatures``. The family parsers (``kernel``, ``nccl``, ``cuda``,
``dcgm``) build ``Signal``s; ``unwrap_line`` strips what log shippers put around a line (CRI container-log
prefixes, docker ``json-file`` objects, JSON string escaping) before any parser looks at it; ``catalog_view``
is the one place that asks the Xid catalog (``handlers.catalog``) for an Xid's immediate action and playbook.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from handlers.catalog import CATALOG, UNKNOWN_PLAYBOOK
from remediator.contracts import normalize_pci_bus_id

_EMPTY: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Signal:
    """One GPU fault signal recognised in one log line, metric series or alert.

    ``kind`` is the FaultEvent vocabulary of DESIGN.md §3. ``code`` is the Xid (or SXid) number, or the
    DCGM field, NCCL status or a short name of what was seen (``watchdog_timeout``). ``action`` is NVIDIA's
    immediate action for an Xid exactly as the catalog spells it, else None; ``playbook`` is ours or None.
    ``detail`` holds whatever else the line said that a handler may correlate on (rank, sequence number,
    peer, decoded NVLink registers, recovery action, bytes in use, ...).
    """

    kind: str
    code: int | str | None = None
    xid: int | None = None
    pci_bus_id: str | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    action: str | None = None
    playbook: str | None = None
    is_fatal: bool = False
    detail: Mapping[str, object] = field(default_factory=lambda: _EMPTY)


# --- catalog ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogView:
    """What a parser needs from the Xid catalog for one code."""

    known: bool
    action: str | None
    playbook: str | None
    is_fatal: bool


def catalog_view(xid: int) -> CatalogView:
    """The catalog's immediate action, playbook and fatality for ``xid``; unknown codes escalate."""
    info = CATALOG.get(xid)
    if info is None:
        return CatalogView(False, None, UNKNOWN_PLAYBOOK, False)
    return CatalogView(True, info.immediate_action or None, info.playbook or None, info.is_fatal)


# --- text normalisation ----------------------------------------------------------------------------

# CRI (containerd/CRI-O) container log: "<RFC3339Nano> <stdout|stderr> <F|P> <message>".
_CRI_RE = re.compile(r"^\s*\d{4}-\d\d-\d\dT[0-9:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+(?:stdout|stderr)\s+[FP]\s?")
_JSON_LOG_KEYS = ("log", "message", "msg", "MESSAGE", "textPayload", "text", "line")
_ESCAPE_RE = re.compile(r"\\(?:[nrt\"\\/]|u[0-9a-fA-F]{4})")


def unwrap_line(line: str) -> str:
    """Return the log message inside ``line``: no CRI prefix, no JSON envelope, no JSON escaping.

    Handles ``2024-01-01T00:00:00.000000000Z stdout F <msg>``, docker/fluent-bit/journald JSON objects
    (``{"log": "<msg>\\n", ...}``, ``{"MESSAGE": ...}``), a whole line that is one JSON string, and lines
    that still carry JSON escapes (``\\"``, ``\\n``, ``\\u0027``). Anything else comes back unchanged
    (trailing newline removed).
    """
    text = line.rstrip("\r\n")
    head = text.lstrip()[:1]
    if not head or (head not in "{\"" and not (head.isdigit() and _CRI_RE.match(text))):
        return _unescape(text) if "\\" in text and _ESCAPE_RE.search(text) else text
    for _ in range(3):  # envelopes nest at most a few deep (CRI around docker JSON around a JSON string)
        before = text
        m = _CRI_RE.match(text)
        if m is not None:
            text = text[m.end():]
        stripped = text.strip()
        if stripped[:1] == "{" and stripped[-1:] == "}":
            inner = _json_message(stripped)
            if inner is not None:
                text = inner
        elif len(stripped) > 1 and stripped[0] == '"' and stripped[-1] == '"':
            try:
                decoded = json.loads(stripped)
            except ValueError:
                decoded = None
            if isinstance(decoded, str):
                text = decoded
        if text == before:
            break
    if "\\" in text and _ESCAPE_RE.search(text):
        text = _unescape(text)
    return text.rstrip("\r\n")


def json_fields(line: str) -> list[str]:
    """Every string value of the JSON record(s) ``line`` carries, depth first, in document order.

    ``line`` may still have a CRI prefix; a value that is itself a JSON object (a structured log inside a
    docker or Fluent Bit envelope) is opened too. ``unwrap_line`` keeps only the first message-like field;
    this is the fallback for records whose signal sits elsewhere (an agent's ``{"msg": "known sxid", "line":
    "<kernel line>"}``, an event's ``details.message``, a logger's ``error`` or ``exc_info``). Anything that is
    not a JSON object gives an empty list.
    """
    text = line.strip()
    m = _CRI_RE.match(text)
    if m is not None:
        text = text[m.end():].strip()
    out: list[str] = []
    _collect(text, out, 0)
    return out


def _collect(text: str, out: list[str], depth: int) -> None:
    if depth > 3 or text[:1] not in ("{", "[") or text[-1:] not in ("}", "]"):
        return
    try:
        obj = json.loads(text)
    except ValueError:
        return
    stack: list[object] = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            value = node.strip()
            if value[:1] in ("{", "[") and value[-1:] in ("}", "]"):
                _collect(value, out, depth + 1)
            else:
                out.append(node.rstrip("\r\n"))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def _json_message(text: str) -> str | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key in _JSON_LOG_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            return value
    return None


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        s = m.group(0)
        c = s[1]
        if c == "n":
            return "\n"
        if c == "r":
            return "\r"
        if c == "t":
            return "\t"
        if c == "u":
            return chr(int(s[2:], 16))
        return c

    return _ESCAPE_RE.sub(one, text)


def pci_or_none(raw: str | None) -> str | None:
    """``raw`` normalised to ``DDDD:BB:DD.F``, or None when it is absent or not a PCI bus id."""
    if not raw:
        return None
    try:
        return normalize_pci_bus_id(raw)
    except ValueError:
        return None


def to_int(raw: str | None, base: int = 10) -> int | None:
    """``int(raw)`` or None, for optional numeric captures."""
    if raw is None:
        return None
    try:
        return int(raw, base)
    except ValueError:
        return None


def freeze(detail: dict[str, object]) -> Mapping[str, object]:
    """A read-only view of ``detail`` without the None values."""
    return MappingProxyType({k: v for k, v in detail.items() if v is not None})
