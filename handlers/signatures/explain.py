"""Why a line is the signal it is: the rule that matched, the span it matched, and where action and playbook
come from. Backs ``remediator classify --explain``.

Where it sits: beside the scanner, off the hot path (it re-reads only lines that already gave a signal). For a
built-in signal the rule is its family and the span is where the family's anchor lies in the unwrapped message
(for an Xid, the ``Xid (...): N`` text); for an operator signature (``handlers.rules``) it is the signature's own
match. The reasons name the Xid catalog row (immediate action, playbook, fatality) for an Xid, the family's own
routing otherwise, and any operator override that changed the playbook or dropped the signal.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from handlers.catalog import CATALOG
from handlers.signatures.model import Signal, unwrap_line

if TYPE_CHECKING:
    from handlers.rules import Override, RuleSet

_FAMILY_OF_KIND = {"xid": "kernel", "sxid": "kernel", "gpu_lost": "kernel", "nccl_timeout": "nccl",
                   "nccl_error": "nccl", "job_failure": "nccl", "cuda_oom": "cuda", "cuda_error": "cuda"}


def _family(sig: Signal) -> str:
    code = str(sig.code or "")
    if code.startswith(("DCGM_", "dcgm_")) or "dcgm_health" in sig.detail:
        return "dcgm"
    if sig.detail.get("reporter") == "operator-rule":
        return "operator"
    if sig.detail.get("reporter") in ("slurm", "nhc"):
        return "sched"
    return _FAMILY_OF_KIND.get(sig.kind, "kernel" if sig.kind in ("ecc", "health_check") else "dcgm")


def _span(text: str, sig: Signal) -> tuple[int, int] | None:
    if sig.xid is not None:
        m = re.search(r"xid\W{0,3}[^\n]{0,60}?\b" + str(sig.xid) + r"\b", text, re.IGNORECASE)
        if m is not None:
            return m.span()
    if sig.code is not None and not isinstance(sig.code, int):
        code = str(sig.code)
        i = text.find(code)
        if i >= 0:
            return i, i + len(code)
    from handlers.signatures import PREFILTER  # the anchors as one portable regex

    m = PREFILTER.search(text)
    return None if m is None else m.span()


def explain(line: str, sig: Signal, rules: RuleSet | None = None, override: Override | None = None,
            playbook_before: str | None = None) -> dict[str, Any]:
    """The explanation of ``sig`` found in the input line ``line`` (as read: prefixes and envelopes on it).

    Keys: ``rule`` (``builtin:<family>`` or ``operator:<name>``), ``rule_line`` (operator rules: the line in
    the rules file), ``message`` (the unwrapped line the rule saw), ``span`` (``[start, end]`` in it) and
    ``matched`` (that text), ``because`` (one sentence per step from the match to the action and playbook),
    and ``override`` (the operator override applied, or null).
    """
    text = unwrap_line(line)
    because: list[str] = []
    rule, rule_line, span = f"builtin:{_family(sig)}", None, None
    if sig.detail.get("reporter") == "operator-rule" and rules is not None:
        name = str(sig.detail.get("rule"))
        user = next((s for s in rules.signatures if s.name == name), None)
        if user is not None:
            rule, rule_line = f"operator:{name}", user.line
            m = user.pattern.search(text)
            span = None if m is None else m.span()
            because.append(f"operator signature {name} (rules line {user.line}) matched: kind {user.kind}, "
                           f"code {sig.code}")
    if span is None:
        span = _span(text, sig)
    if not because:
        because.append(f"the built-in {_family(sig)} family recognised kind {sig.kind}, code {sig.code}")
    if sig.xid is not None:
        info = CATALOG.get(sig.xid)
        if info is None:
            because.append(f"Xid {sig.xid} is not in the catalog: escalate (playbook {sig.playbook})")
        else:
            because.append(f"Xid catalog row {sig.xid} ({info.description or 'no description'}): immediate action "
                           f"{info.immediate_action or 'none'}, playbook {info.playbook or 'none'}, "
                           f"{'fatal' if info.is_fatal else 'not fatal'}")
            if sig.detail.get("recovery_action"):
                because.append(f"Xid 154 recovery action {sig.detail['recovery_action']!r} picks playbook "
                               f"{sig.playbook}")
    elif (playbook_before if override is not None else sig.playbook) is not None:
        because.append(f"the {_family(sig)} rule for {sig.kind} {sig.code} names playbook "
                       f"{playbook_before if override is not None else sig.playbook}")
    else:
        because.append("no playbook from the signature alone: the handlers decide from the node's history")
    if override is not None:
        if override.suppress or override.application_only:
            because.append(f"{override.describe()}: no decision")
        else:
            because.append(f"{override.describe()}: playbook {playbook_before} -> {override.playbook}")
    return {
        "rule": rule, "rule_line": rule_line, "message": text[:512],
        "span": list(span) if span else None, "matched": text[span[0]:span[1]] if span else None,
        "because": because,
        "override": None if override is None else {"name": override.name, "line": override.line,
                                                   "action": override.action},
    }
