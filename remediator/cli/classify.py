"""``remediator classify``: offline, stateless signal recognition over log files and Alertmanager payloads.

Where it sits: a leaf command (DESIGN.md §10) over ``handlers.signatures``; nothing is published and no
state is kept, so each line is judged on its own (no burst grouping, no suppression of a 43 after a 13:
that is the handlers' job). Kernel, NCCL and application log lines go through ``LineScanner``; Alertmanager
webhook payloads, whether one per line or pretty-printed over many lines, are recognised as such and each
GPU alert in them is one signal, reported at the line where its payload starts.

With ``--json`` standard output carries one JSON object per signal and nothing else:
``{"line", "kind", "xid", "pci_bus_id", "gpu_index", "action", "playbook"}``; without it a table goes to
standard error. Exit 0 whether or not anything was found, 2 when an input cannot be read or the rules file
is invalid (every problem printed as ``FILE:LINE: message``).

``--rules FILE`` loads operator rules (``handlers.rules``): their added signatures are tried on the lines the
built-in families leave, and their overrides are applied to each signal's playbook -- a suppressed or
application-only signal is not reported. Overrides on kind and code always apply; those on node, namespace or
node pool apply when the input says where it came from: ``--node``, ``--namespace``, ``--pool`` (for every input),
or, for a file in the kubelet's pod-log layout (``/var/log/pods/<namespace>_<pod>_<uid>/<container>/N.log``),
the namespace its path names (a flag wins). ``--explain`` adds one key,
``explain``, to each JSON object (and an indented block under each table row): the rule that matched, the
span of the line it matched, and why the action and playbook follow (``handlers.signatures.explain``);
signals an override dropped are then reported too, with ``explain.override`` naming the rule.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from handlers.rules import EventContext, Override, RulesError, RuleSet, load_rules
from handlers.signatures import LineScanner, Signal
from handlers.signatures.dcgm import alerts_in_payload, is_alert_payload
from handlers.signatures.explain import explain as explain_signal

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


def classify_text(text: str, rules: RuleSet | None = None) -> list[Finding]:
    """Every signal in ``text`` (log lines and Alertmanager payloads), in input order."""
    scanner = LineScanner(rules=rules)
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


def classify_stream(stream: BinaryIO, rules: RuleSet | None = None) -> list[Finding]:
    """Read ``stream`` to its end and classify it (UTF-8; undecodable bytes are replaced)."""
    return classify_data(stream.read(), rules)


def classify_data(data: bytes, rules: RuleSet | None = None) -> list[Finding]:
    """Classify the bytes of one input (log lines and Alertmanager payloads)."""
    if b'"alerts"' not in data:
        return [Finding(n, s) for n, s in LineScanner(rules=rules).scan_bytes(data.removesuffix(b"\n"))]
    return classify_text(data.decode("utf-8", "replace"), rules)


# The kubelet's container-log layout: <root>/<namespace>_<pod>_<uid>/<container>/<N>.log
_POD_LOG_RE = re.compile(r"(?:^|/)(?P<ns>[a-z0-9][a-z0-9-]{0,62})_[^/_]+_[0-9a-fA-F-]{8,}/[^/]+/\d+\.log(?:\.\S*)?$")


def input_context(name: str, node: str | None, namespace: str | None, pool: str | None) -> EventContext | None:
    """The event context the overrides see for input ``name``: the flags, else what a pod-log path names."""
    if namespace is None and name != "-":
        m = _POD_LOG_RE.search(name)
        if m is not None:
            namespace = m.group("ns")
    if node is None and namespace is None and pool is None:
        return None
    return EventContext(node=node, namespace=namespace, node_pool=pool)


def overridden(findings: list[Finding], rules: RuleSet | None, context: EventContext | None = None
               ) -> list[tuple[Finding, Override | None, str | None, bool]]:
    """``(finding, override, playbook before, kept)`` after the overrides (``context``: where the input came from)."""
    out: list[tuple[Finding, Override | None, str | None, bool]] = []
    for f in findings:
        if not rules or not rules.overrides:
            out.append((f, None, f.signal.playbook, True))
            continue
        sig, ov = rules.apply_to_signal(f.signal, context)
        out.append((Finding(f.line, sig if sig is not None else f.signal), ov, f.signal.playbook, sig is not None))
    return out


def _explained(data: bytes, found: list[tuple[Finding, Override | None, str | None, bool]],
               rules: RuleSet | None) -> list[dict[str, Any]]:
    lines = data.decode("utf-8", "replace").split("\n")
    rows = []
    for f, ov, before, _kept in found:
        text = lines[f.line - 1] if 0 < f.line <= len(lines) else ""
        rows.append({**f.row(), "explain": explain_signal(text, f.signal, rules, ov, before)})
    return rows


def _table(rows: list[dict[str, Any]], source: str | None) -> Iterator[str]:
    widths = {k: max([len(k)] + [len(_cell(r[k])) for r in rows]) for k in ROW_KEYS}
    prefix = f"{source}: " if source else ""
    yield (prefix + "  ".join(k.upper().ljust(widths[k]) for k in ROW_KEYS)).rstrip()
    for r in rows:
        yield (prefix + "  ".join(_cell(r[k]).ljust(widths[k]) for k in ROW_KEYS)).rstrip()


def _explain_lines(row: dict[str, Any]) -> Iterator[str]:
    e = row["explain"]
    where = f" at {e['span'][0]}-{e['span'][1]} {e['matched']!r}" if e["span"] else ""
    yield f"line {row['line']}: {e['rule']}{where}"
    for reason in e["because"]:
        yield f"  - {reason}"


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


@click.command("classify")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per signal on standard output.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, exists=False), default=None,
              help="Operator rules YAML: added signatures and overrides (see ARCHITECTURE.md).")
@click.option("--explain", is_flag=True, help="Say for each signal which rule matched where, and why.")
@click.option("--node", default=None, metavar="NAME", help="The node the input came from (for overrides on node).")
@click.option("--namespace", default=None, metavar="NS",
              help="The namespace the input came from (for overrides on namespace; default: a pod-log path's).")
@click.option("--pool", default=None, metavar="POOL", help="The node pool the input came from (for overrides on it).")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
def classify(as_json: bool, rules_file: str | None, explain: bool, node: str | None, namespace: str | None,
             pool: str | None, files: tuple[str, ...]) -> None:
    """Report every GPU fault signal in log lines or Alertmanager JSON payloads (stdin when no FILE).

    Each line is judged on its own, a record split over lines as one. With --json: one object per signal
    with the keys line, kind, xid, pci_bus_id, gpu_index, action and playbook (and explain, with --explain);
    otherwise a table on standard error. --rules FILE adds operator signatures and overrides; --node,
    --namespace and --pool say where the input came from, for the overrides that match on them. Exit 0
    whether or not anything was found; 2 when a file cannot be read or the rules file is invalid.
    """
    rules: RuleSet | None = None
    if rules_file is not None:
        try:
            rules = load_rules(rules_file)
        except RulesError as exc:
            click.echo(f"remediator classify: {exc}", err=True)
            sys.exit(2)
    failed = False
    total = 0
    for name in files or ("-",):
        try:
            if name == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(name, "rb") as fh:
                    data = fh.read()
        except OSError as exc:
            click.echo(f"remediator classify: cannot read {name}: {exc.strerror or exc}", err=True)
            failed = True
            continue
        found = overridden(classify_data(data, rules), rules, input_context(name, node, namespace, pool))
        if explain:
            rows = _explained(data, [x for x in found if x[3] or explain], rules)
        else:
            rows = [f.row() for f, _ov, _pb, kept in found if kept]
        total += sum(1 for x in found if x[3])
        if as_json:
            for r in rows:
                click.echo(json.dumps(r))
        elif rows:
            for text in _table([{k: r[k] for k in ROW_KEYS} for r in rows], name if len(files) > 1 else None):
                click.echo(text, err=True)
            for r in rows:
                if "explain" in r:
                    for text in _explain_lines(r):
                        click.echo(text, err=True)
    if not as_json:
        click.echo(f"{total} signal{'s' if total != 1 else ''} found", err=True)
    if failed:
        sys.exit(2)
