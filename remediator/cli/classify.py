"""``remediator classify``: offline, stateless signal recognition over log files and Alertmanager payloads.

Where it sits: a leaf command (DESIGN.md §10) over ``handlers.signatures``; nothing is published and no
state is kept, so each line is judged on its own (no burst grouping, no suppression of a 43 after a 13:
that is the handlers' job). Kernel, NCCL and application log lines go through ``LineScanner``; Alertmanager
webhook payloads, whether one per line or pretty-printed over many lines, are recognised as such and each
GPU alert in them is one signal, reported at the line where its payload starts.

With ``--json`` standard output carries one JSON object per signal and nothing else:
``{"line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook"}``; without it a table goes to
standard error. Exit 0 whether or not anything was found, 2 when an input cannot be read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from handlers.signatures import LineScanner, Signal
from handlers.signatures.dcgm import alerts_in_payload, is_alert_payload

ROW_KEYS = ("line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook")


@dataclass(frozen=True, slots=True)
class Finding:
    """One recognised signal and the 1-based input line it was found on."""

    line: int
    signal: Signal

    def row(self) -> dict[str, Any]:
        s = self.signal
        return {"line": self.line, "kind": s.kind, "xid": s.xid, "pci_bus_id": s.pci_bus_id,
                "gpu_index": s.gpu_index, "action": s.action, "playbook": s.playbook}


def _payload_spans(text: str) -> list[tuple[int, int, list[Signal]]]:
    """``(start, end, signals)`` for every Alertmanager payload in ``text`` that starts a line."""
    if '"alerts"' not in text:
        return []
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int, list[Signal]]] = []
    pos = 0
    n = len(text)
    while pos < n:
        le = text.find("\n", pos)
        if le < 0:
            le = n
        stripped = text[pos:le].lstrip(" \t\r\ufeff")
        if stripped[:1] in ("{", "["):
            start = pos + (len(text[pos:le]) - len(stripped))
            try:
                obj, end = decoder.raw_decode(text, start)
            except ValueError:
                obj, end = None, start
            if obj is not None and is_alert_payload(obj):
                sigs = [s for s in (a.signal() for a in alerts_in_payload(obj)) if s is not None]
                spans.append((pos, end, sigs))
                nl = text.find("\n", end)
                pos = n if nl < 0 else nl + 1
                continue
        pos = le + 1
    return spans


def classify_text(text: str) -> list[Finding]:
    """Every signal in ``text`` (log lines and Alertmanager payloads), in input order."""
    scanner = LineScanner()
    found: list[Finding] = []
    cursor = 0
    line_no = 1
    for start, end, sigs in _payload_spans(text):
        segment = text[cursor:start]
        found.extend(Finding(n, s) for n, s in scanner.scan_text(segment.removesuffix("\n"), line_no))
        line_no += segment.count("\n")
        found.extend(Finding(line_no, s) for s in sigs)
        nl = text.find("\n", end)
        stop = len(text) if nl < 0 else nl + 1
        line_no += text.count("\n", start, stop)
        cursor = stop
    rest = text[cursor:]
    if rest:
        found.extend(Finding(n, s) for n, s in scanner.scan_text(rest.removesuffix("\n"), line_no))
    return found


def classify_stream(stream: BinaryIO) -> list[Finding]:
    """Read ``stream`` to its end and classify it (UTF-8; undecodable bytes are replaced)."""
    data = stream.read()
    if b'"alerts"' not in data:
        return [Finding(n, s) for n, s in LineScanner().scan_bytes(data.removesuffix(b"\n"))]
    return classify_text(data.decode("utf-8", "replace"))


def _table(rows: list[dict[str, Any]], source: str | None) -> Iterator[str]:
    widths = {k: max([len(k)] + [len(_cell(r[k])) for r in rows]) for k in ROW_KEYS}
    prefix = f"{source}: " if source else ""
    yield (prefix + "  ".join(k.upper().ljust(widths[k]) for k in ROW_KEYS)).rstrip()
    for r in rows:
        yield (prefix + "  ".join(_cell(r[k]).ljust(widths[k]) for k in ROW_KEYS)).rstrip()


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


@click.command("classify")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per signal on standard output.")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
def classify(as_json: bool, files: tuple[str, ...]) -> None:
    """Report every GPU fault signal in log lines or Alertmanager JSON payloads (stdin when no FILE).

    Each line is judged on its own. With --json: one object per signal with the keys line, kind, xid,
    pci_bus_id, gpu_index, action and playbook; otherwise a table on standard error. Exit 0 whether or not
    anything was found; 2 when a file cannot be read.
    """
    failed = False
    total = 0
    for name in files or ("-",):
        try:
            if name == "-":
                findings = classify_stream(sys.stdin.buffer)
            else:
                with open(name, "rb") as fh:
                    findings = classify_stream(fh)
        except OSError as exc:
            click.echo(f"remediator classify: cannot read {name}: {exc.strerror or exc}", err=True)
            failed = True
            continue
        rows = [f.row() for f in findings]
        total += len(rows)
        if as_json:
            for r in rows:
                click.echo(json.dumps(r))
        elif rows:
            for text in _table(rows, name if len(files) > 1 else None):
                click.echo(text, err=True)
    if not as_json:
        click.echo(f"{total} signal{'s' if total != 1 else ''} found", err=True)
    if failed:
        sys.exit(2)
