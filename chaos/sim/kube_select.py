"""Label and field selectors, parsed and evaluated the way the Kubernetes API server does.

Where it sits: chaos/sim, under the simulated cluster. The ``labelSelector`` and ``fieldSelector`` query
parameters that ``kube_api`` receives, and the ``spec.selector`` of PodDisruptionBudgets, Jobs and
DaemonSets that ``cluster`` evaluates, all end here. Nothing outside the simulator imports it.

Field selectors are strict, as on a real API server: a field a resource does not index is a 400
(``field label not supported``), so a client that filters on an unsupported field fails here as it would
against a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Op = Literal["=", "!=", "in", "notin", "exists", "!"]

_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_KEY_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


class SelectorError(ValueError):
    """A selector that does not parse, or names a field the resource cannot be filtered on."""


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op == "=":
            return present and labels[self.key] in self.values
        if self.op == "in":
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as Kubernetes does.
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()
    matches_nothing: bool = False

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Parse the string form (``a=b,c!=d,e in (f,g),!h``); raises ``SelectorError``."""
        if text is None or not text.strip():
            return cls()
        reqs: list[Requirement] = []
        for term in _split_terms(text):
            if m := _SET_RE.match(term):
                values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
                reqs.append(Requirement(m.group(1), "in" if m.group(2) == "in" else "notin", values))
            elif m := _EQ_RE.match(term):
                op: Op = "!=" if m.group(2) == "!=" else "="
                reqs.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
            elif m := _KEY_RE.match(term):
                reqs.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
            else:
                raise SelectorError(f"unable to parse requirement: {term!r}")
        return cls(tuple(reqs))

    @classmethod
    def from_api(cls, selector: Mapping[str, Any] | None) -> LabelSelector:
        """The ``metav1.LabelSelector`` form (``matchLabels``/``matchExpressions``).

        ``None`` matches nothing and ``{}`` matches everything, as for a policy/v1 PodDisruptionBudget.
        """
        if selector is None:
            return cls(matches_nothing=True)
        reqs = [Requirement(k, "=", frozenset({str(v)})) for k, v in (selector.get("matchLabels") or {}).items()]
        ops: dict[str, Op] = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
        for expr in selector.get("matchExpressions") or []:
            op = ops.get(str(expr.get("operator")))
            if op is None:
                raise SelectorError(f"unknown selector operator {expr.get('operator')!r}")
            reqs.append(Requirement(str(expr["key"]), op, frozenset(str(v) for v in expr.get("values") or [])))
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.matches_nothing:
            return False
        lab = labels or {}
        return all(r.matches(lab) for r in self.requirements)

    def equality_terms(self) -> list[tuple[str, str]]:
        """``(key, value)`` pairs every match must carry: what an index can narrow candidates with."""
        return [(r.key, next(iter(r.values))) for r in self.requirements
                if r.op in ("=", "in") and len(r.values) == 1]


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


# Fields each resource can be filtered on, with the value a missing field reads as. Every resource
# supports metadata.name and metadata.namespace.
_FIELDS: dict[str, dict[str, str]] = {
    "pods": {
        "spec.nodeName": "",
        "spec.restartPolicy": "",
        "spec.schedulerName": "",
        "spec.serviceAccountName": "",
        "spec.hostNetwork": "false",
        "status.phase": "",
        "status.podIP": "",
        "status.nominatedNodeName": "",
    },
    "nodes": {"spec.unschedulable": "false"},
    "events": {
        "involvedObject.kind": "",
        "involvedObject.namespace": "",
        "involvedObject.name": "",
        "involvedObject.uid": "",
        "involvedObject.apiVersion": "",
        "involvedObject.resourceVersion": "",
        "involvedObject.fieldPath": "",
        "reason": "",
        "reportingComponent": "",
        "source": "",
        "type": "",
    },
    "jobs": {"status.successful": "0"},
    "namespaces": {"status.phase": ""},
    "resourceslices": {"spec.nodeName": "", "spec.driver": ""},
}


@dataclass(frozen=True)
class FieldTerm:
    path: str
    negate: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of ``path=value`` / ``path!=value`` terms over an object."""

    plural: str
    terms: tuple[FieldTerm, ...] = ()

    @classmethod
    def parse(cls, plural: str, text: str | None) -> FieldSelector:
        """Parse ``spec.nodeName=x,status.phase!=Failed`` for resource ``plural``; raises ``SelectorError``."""
        if text is None or not text.strip():
            return cls(plural)
        allowed = _FIELDS.get(plural, {})
        terms: list[FieldTerm] = []
        for raw in text.split(","):
            term = raw.strip()
            if not term:
                continue
            m = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", term)
            if m is None:
                raise SelectorError(f"invalid field selector: {term!r}")
            path = m.group(1).strip()
            if path not in allowed and path not in ("metadata.name", "metadata.namespace"):
                raise SelectorError(f'field label not supported: {path}')
            terms.append(FieldTerm(path, m.group(2) == "!=", m.group(3).strip()))
        return cls(plural, tuple(terms))

    def value_of(self, obj: Mapping[str, Any], path: str) -> str:
        cur: Any = obj
        for part in path.split("."):
            if not isinstance(cur, Mapping) or part not in cur:
                return _FIELDS.get(self.plural, {}).get(path, "")
            cur = cur[part]
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((self.value_of(obj, t.path) == t.value) != t.negate for t in self.terms)

    def equals(self, path: str) -> str | None:
        """The value this selector requires ``path`` to equal, if it has such a term."""
        for t in self.terms:
            if t.path == path and not t.negate:
                return t.value
        return None
