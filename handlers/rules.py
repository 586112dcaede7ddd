"""Operator rules: signatures and decision overrides as data, from one YAML file.

Where it sits: beside the built-in signatures and handlers. ``remediator classify --rules FILE`` and the
service (setting ``rules_file``, reloaded by ``remediator.rules_watch`` while ``serve`` runs) load a file with
``load_rules``; the ``LineScanner`` built with the resulting ``RuleSet`` tries its ``signatures`` on the lines
the built-in families leave unrecognised, and dispatch passes every decision through ``RuleSet.apply`` before
it is stored and published. The built-in rules stay the default: without a file nothing here runs.

The file (``version: 1``)::

    signatures:                      # added signatures, tried after the built-in families
      - name: ib-port-flap           # unique, [a-z0-9-]
        pattern: 'mlx5_(?P<hca>\\d+): port (?P<port>\\d+) link down'   # Python regex, case-insensitive
        contains: "link down"        # optional literal every matching line holds (the prefilter anchor);
                                     # default: the longest literal run of the pattern
        kind: nccl_error             # FaultEvent kind (DESIGN.md §3)
        code: ib_port_down           # str or int; "{port}" takes a named group
        playbook: null               # optional, one of the playbook names
        fatal: false
        fields: [hca, port]          # named groups copied into the signal's detail (default: all)
    overrides:                       # decision overrides, first match wins
      - name: xid31-research-app-only
        match: {kind: xid, code: 31, namespace: research}
        application_only: true       # the job's own fault: no node or GPU remediation
      - name: thermal-to-reset
        match: {kind: thermal}
        playbook: gpu-reset          # route to another playbook
      - name: quiet-pool-b
        match: {code: dcgm_health_thermal, node_pool: pool-b}
        suppress: true               # no decision at all

``match`` keys: ``kind``, ``code`` (str or int; an Xid's number), ``source``, ``node`` and ``namespace``
(``fnmatch`` globs), ``node_pool`` (against the event labels ``node_pool``, ``cloud.google.com/gke-nodepool``,
``eks.amazonaws.com/nodegroup``, ``karpenter.sh/nodepool``, ``agentpool``) and ``labels`` (a map of exact
label values). Each override takes exactly one action. Every applied override is named in the decision's
evidence (an ``Evidence`` of kind ``operator_override``) and reason, and so in the audit record.

What user rules can never do: name or change a safety guard (dry run, lock, cooldown, attempt limits,
disruption budget, breaker, approval) -- keys such as ``guards``, ``dry_run`` or ``approval`` are refused at
load; route to a playbook that does not exist; or replace a built-in signature (added signatures only see
lines no built-in family recognised). A routed decision goes through the executor's rails like any other.
Every problem is reported at load as ``FILE:LINE: message``, and a file that fails to load changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from handlers.signatures.model import Signal, freeze
from remediator.contracts import KINDS, PLAYBOOK_NAMES, Decision, Evidence, FaultEvent

RULES_VERSION = 1
NODE_POOL_LABELS = ("node_pool", "cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup",
                    "karpenter.sh/nodepool", "agentpool")
_GUARD_WORDS = frozenset({"guard", "guards", "guards_enabled", "dry_run", "dryrun", "lock", "cooldown", "budget",
                          "breaker", "approval", "approve", "attempts", "max_node_attempts", "max_gpu_attempts",
                          "bypass", "force", "skip_guards", "safety"})
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_SIG_KEYS = frozenset({"name", "pattern", "contains", "kind", "code", "playbook", "fatal", "fields", "description"})
_OV_KEYS = frozenset({"name", "match", "playbook", "application_only", "suppress", "description"})
_MATCH_KEYS = frozenset({"kind", "code", "source", "node", "namespace", "node_pool", "labels"})
_ACTIONS = ("playbook", "application_only", "suppress")


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file and line of each problem."""


@dataclass(frozen=True)
class UserSignature:
    """One operator-defined signature, compiled."""

    name: str
    pattern: re.Pattern[str]
    anchor: str  # the prefilter: lower-cased literal every matching line holds
    kind: str
    code: str | int | None
    playbook: str | None
    fatal: bool
    fields: tuple[str, ...] | None
    line: int

    def match(self, text: str, low: str | None = None) -> tuple[Signal, tuple[int, int]] | None:
        """The signal this signature finds in ``text`` (an unwrapped line) and the matched span, or None.

        ``low`` is ``text.lower()`` when the caller has it already (one lower-casing for every signature).
        """
        if self.anchor not in (text.lower() if low is None else low):
            return None
        m = self.pattern.search(text)
        if m is None:
            return None
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        keep = groups if self.fields is None else {k: groups.get(k) for k in self.fields}
        code: str | int | None = self.code
        if isinstance(code, str) and "{" in code:
            try:
                code = code.format(**groups)
            except (KeyError, IndexError, ValueError):
                code = self.code
        detail: dict[str, object] = {**keep, "rule": self.name, "reporter": "operator-rule"}
        return Signal(kind=self.kind, code=code, playbook=self.playbook, is_fatal=self.fatal,
                      detail=freeze(detail)), m.span()


@dataclass(frozen=True)
class Match:
    """What an override applies to; an absent key matches anything."""

    kind: str | None = None
    code: str | None = None
    source: str | None = None
    node: str | None = None
    namespace: str | None = None
    node_pool: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def needs_event(self) -> bool:
        """True when the match looks at what only an event knows (node, namespace, pool, labels, source)."""
        return any((self.source, self.node, self.namespace, self.node_pool, self.labels))

    def of(self, kind: str, code: object, event: FaultEvent | EventContext | None) -> bool:
        """True when ``kind``/``code`` (and ``event``, or the context given for it, where the match needs it) fit."""
        if self.kind is not None and self.kind != kind:
            return False
        if self.code is not None and self.code != str(code):
            return False
        if not self.needs_event:
            return True
        if event is None:
            return False
        ctx = event if isinstance(event, EventContext) else EventContext.of(event)
        if self.source is not None and self.source != ctx.source:
            return False
        if self.node is not None and (ctx.node is None or not fnmatchcase(ctx.node, self.node)):
            return False
        if self.namespace is not None and (ctx.namespace is None or not fnmatchcase(ctx.namespace, self.namespace)):
            return False
        if self.node_pool is not None and (ctx.node_pool is None or not fnmatchcase(ctx.node_pool, self.node_pool)):
            return False
        return all(ctx.labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class EventContext:
    """What an override may look at beyond kind and code: where the event came from.

    Built from a ``FaultEvent`` in dispatch (``EventContext.of``); ``remediator classify --node/--namespace/--pool``
    builds one from its flags (or from a kubelet pod-log path), so the same overrides apply offline.
    """

    source: str | None = None
    node: str | None = None
    namespace: str | None = None
    node_pool: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, event: FaultEvent) -> EventContext:
        """The context of ``event``: its origin's namespace (else its ``namespace`` label) and node-pool label."""
        pool = next((event.labels[k] for k in NODE_POOL_LABELS if event.labels.get(k)), None)
        return cls(source=event.source, node=event.node,
                   namespace=event.origin.namespace or event.labels.get("namespace"), node_pool=pool,
                   labels=event.labels)


@dataclass(frozen=True)
class Override:
    """One decision override: a match and exactly one action."""

    name: str
    match: Match
    playbook: str | None
    application_only: bool
    suppress: bool
    line: int

    @property
    def action(self) -> str:
        if self.suppress:
            return "suppress"
        if self.application_only:
            return "application_only"
        return f"playbook {self.playbook}"

    def describe(self) -> str:
        """One line naming the rule, its file line and its action."""
        return f"operator rule {self.name} (line {self.line}): {self.action}"


@dataclass(frozen=True)
class Applied:
    """The outcome of the overrides for one decision or signal: what is left of it and which rules acted."""

    decision: Decision | None
    overrides: tuple[Override, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class RuleSet:
    """A loaded rules file: its added signatures and its overrides (empty: built-in behaviour only)."""

    signatures: tuple[UserSignature, ...] = ()
    overrides: tuple[Override, ...] = ()
    source: str | None = None

    def __bool__(self) -> bool:
        return bool(self.signatures or self.overrides)

    def anchors(self) -> tuple[str, ...]:
        """The prefilter anchors of the added signatures."""
        return tuple(s.anchor for s in self.signatures)

    @cached_property
    def _anchor_re(self) -> re.Pattern[str]:
        return re.compile("|".join(re.escape(a) for a in self.anchors()) or "(?!)")

    def signal(self, text: str) -> tuple[UserSignature, Signal, tuple[int, int]] | None:
        """The first added signature that matches the unwrapped line ``text``."""
        low = text.lower()
        if self._anchor_re.search(low) is None:
            return None  # no signature's literal is on the line: one search instead of one per signature
        for sig in self.signatures:
            hit = sig.match(text, low)
            if hit is not None:
                return sig, hit[0], hit[1]
        return None

    def override_for(self, kind: str, code: object, event: FaultEvent | EventContext | None = None
                     ) -> Override | None:
        """The first override whose match fits (``event`` None: only matches that need no event)."""
        return next((o for o in self.overrides if o.match.of(kind, code, event)), None)

    def apply(self, decision: Decision, event: FaultEvent) -> Applied:
        """``decision`` after the first matching override: routed, or dropped (application-only, suppressed)."""
        ov = self.override_for(event.kind, event.code if event.code is not None else decision.code, event)
        if ov is None:
            return Applied(decision)
        if ov.suppress or ov.application_only:
            what = ("application-only: the job's own fault, no node or GPU remediation" if ov.application_only
                    else "suppressed")
            return Applied(None, (ov,), f"{decision.playbook} for {event.kind} {event.code}: {what} by "
                                        f"{ov.describe()}")
        assert ov.playbook is not None
        evidence = Evidence(event_id=event.id, kind="operator_override", code=ov.name,
                            detail=f"playbook {decision.playbook} -> {ov.playbook} by {ov.describe()}")
        routed = decision.model_copy(update={
            "playbook": ov.playbook, "evidence": (*decision.evidence, evidence),
            "reason": f"{decision.reason} (routed to {ov.playbook} by operator rule {ov.name})"})
        return Applied(routed, (ov,), evidence.detail)

    def apply_to_signal(self, sig: Signal, context: EventContext | None = None
                        ) -> tuple[Signal | None, Override | None]:
        """``sig`` after the overrides (what ``classify`` applies offline): without ``context`` only the ones
        that need no event; with it also those on node, namespace, node pool and labels it names."""
        ov = self.override_for(sig.kind, sig.xid if sig.xid is not None else sig.code, context)
        if ov is None:
            return sig, None
        if ov.suppress or ov.application_only:
            return None, ov
        return replace(sig, playbook=ov.playbook), ov


EMPTY = RuleSet()


class RulesSource:
    """The rules of one file as they are now: loaded at start, reloaded when the file changes.

    ``current()`` is what dispatch calls per decision (a plain attribute read). ``reload_if_changed``
    re-reads the file when its modification time or size changed; a file that no longer loads leaves the
    rules in force unchanged and its errors in ``last_error``. A source without a path is always empty.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        self._rules: RuleSet = EMPTY
        self._stamp: tuple[int, int] | None = None
        self.last_error: str | None = None
        self.generation = 0  # how many times rules were (re)loaded

    def current(self) -> RuleSet:
        """The rules in force."""
        return self._rules

    def load(self) -> RuleSet:
        """Load the file now; ``RulesError`` when it cannot be used (the start of ``serve`` fails on it)."""
        if self.path is None:
            return self._rules
        stamp = self._stat()
        self._rules = load_rules(self.path)
        self._stamp, self.last_error = stamp, None
        self.generation += 1
        return self._rules

    def reload_if_changed(self) -> bool:
        """Reload when the file changed; True when new rules are now in force."""
        if self.path is None:
            return False
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            self._rules = load_rules(self.path)
        except RulesError as exc:
            self.last_error = str(exc)
            return False
        self.last_error = None
        self.generation += 1
        return True

    def _stat(self) -> tuple[int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size


# --- loading ----------------------------------------------------------------------------------------


def load_rules(path: str | Path) -> RuleSet:
    """The rules in the YAML file at ``path``; ``RulesError`` (every problem, ``FILE:LINE: ...``) otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return parse_rules(text, str(p))


def parse_rules(text: str, source: str = "<rules>") -> RuleSet:
    """The rules in ``text`` (the file's content); ``source`` names it in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise RulesError(f"{source}:{line}: not YAML: {getattr(exc, 'problem', exc)}") from exc
    errors: list[str] = []

    def err(node: yaml.Node | None, msg: str) -> None:
        errors.append(f"{source}:{_line(node)}: {msg}")

    if root is None:
        return RuleSet(source=source)
    if not isinstance(root, yaml.MappingNode):
        raise RulesError(f"{source}:{_line(root)}: the rules file is a mapping with version, signatures, overrides")
    top = _items(root)
    for key, (knode, _v) in top.items():
        if key not in ("version", "signatures", "overrides"):
            err(knode, _unknown(key, ("version", "signatures", "overrides")))
    version = top.get("version")
    if version is not None and _scalar(version[1]) != RULES_VERSION:
        err(version[1], f"version must be {RULES_VERSION}")
    names: set[str] = set()
    sigs = [s for s in (_signature(n, err, names) for n in _seq(top.get("signatures"), "signatures", err)) if s]
    ovs = [o for o in (_override(n, err, names) for n in _seq(top.get("overrides"), "overrides", err)) if o]
    if errors:
        raise RulesError("\n".join(errors))
    return RuleSet(tuple(sigs), tuple(ovs), source)


def _line(node: yaml.Node | None) -> int:
    return 1 if node is None else node.start_mark.line + 1


def _unknown(key: str, allowed: Sequence[str]) -> str:
    if key.lower() in _GUARD_WORDS:
        return f"{key!r}: user rules cannot change safety guards (the executor's rails always apply)"
    return f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})"


def _items(node: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    return {str(k.value): (k, v) for k, v in node.value}


def _scalar(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node)) if isinstance(node, yaml.ScalarNode) else None


def _seq(entry: tuple[yaml.Node, yaml.Node] | None, what: str, err: Any) -> list[yaml.Node]:
    if entry is None:
        return []
    node = entry[1]
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~"):
        return []
    if not isinstance(node, yaml.SequenceNode):
        err(node, f"{what} must be a list")
        return []
    return list(node.value)


def _str(node: yaml.Node | None) -> str | None:
    if node is None:
        return None
    v = _scalar(node)
    return None if v is None else str(v)


def _common(node: yaml.Node, allowed: frozenset[str], what: str, err: Any, names: set[str]
            ) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
    if not isinstance(node, yaml.MappingNode):
        err(node, f"each {what} is a mapping")
        return None
    items = _items(node)
    for key, (knode, _v) in items.items():
        if key not in allowed:
            err(knode, _unknown(key, sorted(allowed)))
    name = _str(items["name"][1]) if "name" in items else None
    if name is None:
        err(node, f"a {what} needs a name")
    elif not _NAME_RE.match(name):
        err(items["name"][1], f"name {name!r}: lower-case letters, digits and dashes")
    elif name in names:
        err(items["name"][1], f"name {name!r} is used twice")
    else:
        names.add(name)
    return items


def _playbook(items: dict[str, tuple[yaml.Node, yaml.Node]], err: Any) -> str | None:
    if "playbook" not in items:
        return None
    pb = _str(items["playbook"][1])
    if pb is not None and pb not in PLAYBOOK_NAMES:
        err(items["playbook"][1], f"unknown playbook {pb!r} (one of: {', '.join(PLAYBOOK_NAMES)})")
    return pb


def _signature(node: yaml.Node, err: Any, names: set[str]) -> UserSignature | None:
    items = _common(node, _SIG_KEYS, "signature", err, names)
    if items is None:
        return None
    pattern_text = _str(items["pattern"][1]) if "pattern" in items else None
    pattern: re.Pattern[str] | None = None
    if pattern_text is None:
        err(node, "a signature needs a pattern")
    else:
        try:
            pattern = re.compile(pattern_text, re.IGNORECASE)
        except re.error as exc:
            err(items["pattern"][1], f"pattern is not a regular expression: {exc}")
    kind = _str(items["kind"][1]) if "kind" in items else None
    if kind not in KINDS:
        err(items["kind"][1] if "kind" in items else node, f"kind {kind!r} is not one of {', '.join(KINDS)}")
    contains = _str(items["contains"][1]) if "contains" in items else None
    if contains is None and pattern_text is not None:
        contains = _longest_literal(pattern_text)
    anchor = (contains or "").lower()
    if pattern is not None and len(re.sub(r"[^a-z]", "", anchor)) < 3:
        err(items["contains"][1] if "contains" in items else items["pattern"][1],
            "no literal of three letters or more to prefilter on: give `contains`")
    fields: tuple[str, ...] | None = None
    if "fields" in items:
        fnode = items["fields"][1]
        if not isinstance(fnode, yaml.SequenceNode):
            err(fnode, "fields is a list of the pattern's named groups")
        else:
            fields = tuple(str(_scalar(f)) for f in fnode.value)
            missing = [f for f in fields if pattern is not None and f not in pattern.groupindex]
            if missing:
                err(fnode, f"fields {missing} are not named groups of the pattern")
    fatal = _scalar(items["fatal"][1]) if "fatal" in items else False
    if not isinstance(fatal, bool):
        err(items["fatal"][1], "fatal is true or false")
    playbook = _playbook(items, err)
    code_raw = _scalar(items["code"][1]) if "code" in items else None
    if pattern is None or kind not in KINDS:
        return None
    assert kind is not None
    return UserSignature(name=str(_str(items["name"][1])), pattern=pattern, anchor=anchor, kind=kind,
                         code=code_raw if isinstance(code_raw, (str, int)) else None, playbook=playbook,
                         fatal=bool(fatal), fields=fields, line=_line(node))


def _override(node: yaml.Node, err: Any, names: set[str]) -> Override | None:
    items = _common(node, _OV_KEYS, "override", err, names)
    if items is None:
        return None
    match = Match()
    if "match" not in items or not isinstance(items["match"][1], yaml.MappingNode):
        err(items["match"][1] if "match" in items else node, "an override needs a match mapping")
        return None
    m = _items(items["match"][1])
    values: dict[str, Any] = {}
    for key, (knode, vnode) in m.items():
        if key not in _MATCH_KEYS:
            err(knode, _unknown(key, sorted(_MATCH_KEYS)))
        elif key == "labels":
            if not isinstance(vnode, yaml.MappingNode):
                err(vnode, "labels is a map of label values")
            else:
                values["labels"] = {k: str(_str(v[1])) for k, v in _items(vnode).items()}
        else:
            values[key] = _str(vnode)
    if values.get("kind") is not None and values["kind"] not in KINDS:
        err(m["kind"][1], f"kind {values['kind']!r} is not one of {', '.join(KINDS)}")
    if not values:
        err(items["match"][1], "an empty match would override every decision: name at least one key")
    match = Match(**values)
    actions = [a for a in _ACTIONS if a in items and _scalar(items[a][1]) not in (None, False)]
    if len(actions) != 1:
        err(node, f"an override takes exactly one action of {', '.join(_ACTIONS)} (got {len(actions)})")
        return None
    playbook = _playbook(items, err)
    for flag in ("application_only", "suppress"):
        if flag in items and _scalar(items[flag][1]) not in (True, False, None):
            err(items[flag][1], f"{flag} is true or false")
    return Override(name=str(_str(items["name"][1])), match=match, playbook=playbook,
                    application_only=actions[0] == "application_only", suppress=actions[0] == "suppress",
                    line=_line(node))


_META = set(".^$*+?{}[]\\|()")


def _longest_literal(pattern: str) -> str:
    """The longest run of the pattern that is plain text outside any group, class or quantifier."""
    best, run, i, depth = "", "", 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.isalnum():  # \d, \s, \b ...: not literal
                best, run = max(best, run, key=len), ""
            elif depth == 0:
                run += nxt
            i += 2
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            depth = max(0, depth - 1)
        if c in _META or depth:
            if c in "*?{" and run:
                run = run[:-1]  # the quantified character is optional
            best, run = max(best, run, key=len), ""
        else:
            run += c
        i += 1
    return max(best, run, key=len).strip()


__all__ = ["EMPTY", "NODE_POOL_LABELS", "RULES_VERSION", "Applied", "EventContext", "Match", "Override", "RuleSet",
           "RulesError", "RulesSource", "UserSignature", "load_rules", "parse_rules"]
