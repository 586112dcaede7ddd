"""The chart's RBAC is exactly what the Kubernetes adapter calls: nothing missing, nothing extra.

``remediator/adapters/kube.py`` is the only module that talks to the Kubernetes API, and every request
goes through ``KubeAdapter._request(METHOD, PATH, ...)`` (or ``_list(PATH, ...)``, a paged GET). This test
reads the module's syntax tree, resolves each call's method and path (string literals, f-strings whose
placeholders are module constants or arbitrary names, local variables, ``_object_path`` over the
controller table), maps each to ``(apiGroup, resource, verb)`` the way the API server authorizes it, and
compares the result with the rendered ClusterRole (and the Role for calls whose namespace is a constant).
A path-like string the resolver cannot place fails the test: a new kind of call cannot slip past it.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

import remediator.adapters.kube as kube
from tests.deploy.chart import RELEASE, of_kind, only, production_values, render

ANY = "{}"  # a placeholder in a path template
HELPERS = {"_request": (0, 1), "_list": (None, 0)}  # name -> (method arg index or None for GET, path arg index)
# The client library's own request builder, called directly where a response is streamed (watches); inside
# ``_request`` its method and path are ``_request``'s parameters, resolved at each ``_request`` call instead.
RAW = "param_serialize"


# Non-resource URLs every authenticated user may GET (system:public-info-viewer, system:discovery).
PUBLIC_NON_RESOURCE = frozenset({"/version", "/healthz", "/livez", "/readyz"})


@dataclass(frozen=True, order=True)
class Access:
    group: str
    resource: str
    verb: str
    namespace: str | None = None  # a constant namespace (a Role there); None: cluster-wide


def _constants() -> dict[str, Any]:
    return {k: v for k, v in vars(kube).items() if isinstance(v, str)}


def _template(node: ast.expr, fn: ast.FunctionDef, consts: dict[str, Any]) -> list[str]:
    """Every path a path expression can take, placeholders as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                out += str(part.value)
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) \
                    and part.value.id in consts:
                out += consts[part.value.id]
            else:
                out += ANY
        return [out]
    if isinstance(node, ast.Name):
        values = _assigned(node, fn)
        if values:
            return [p for v in values for p in _template(v, fn, consts)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_object_path":
        return [f"/apis/{gv}/namespaces/{ANY}/{plural}/{ANY}" for gv, plural in kube._CONTROLLERS.values()]
    raise AssertionError(f"kube.py line {node.lineno}: cannot resolve the API path {ast.unparse(node)!r}")


def _assigned(name: ast.Name, fn: ast.FunctionDef) -> list[ast.expr]:
    """The values assigned to ``name`` in ``fn`` (each marked as resolved for the stray-path check)."""
    values = [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
              for t in a.targets if isinstance(t, ast.Name) and t.id == name.id]
    _RESOLVED.update(id(n) for v in values for n in ast.walk(v))
    return values


_RESOLVED: set[int] = set()


def _is_watch(query: ast.expr | None, fn: ast.FunctionDef) -> bool:
    """True when a request's query (a dict, or a list of pairs, literal or through a local) sets ``watch``."""
    if isinstance(query, ast.Name):
        return any(_is_watch(v, fn) for v in _assigned(query, fn))
    if isinstance(query, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "watch" for k in query.keys)
    if isinstance(query, ast.List | ast.Tuple):
        return any(isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)
                   and e.elts[0].value == "watch" for e in query.elts)
    return False


def _access(method: str, path: str, query: ast.expr | None, watch: bool = False) -> Access | None:
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    elif "/" + "/".join(parts) in PUBLIC_NON_RESOURCE:
        return None
    else:
        raise AssertionError(f"{path}: a non-resource URL no default role grants; add it to the ClusterRole "
                             "(nonResourceURLs) and teach this test")
    if not rest:
        return None  # discovery: granted to every authenticated user by system:discovery
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace = None if rest[1] == ANY else rest[1]
        rest = rest[2:]
    resource, named, sub = rest[0], len(rest) >= 2, rest[2] if len(rest) >= 3 else None
    watch = watch or (isinstance(query, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "watch"
                                                          for k in query.keys))
    verb = {
        "GET": ("watch" if watch else "get") if named else ("watch" if watch else "list"),
        "POST": "create", "PUT": "update", "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    if sub is not None:
        resource = f"{resource}/{sub}"
    return Access(group, resource, verb, namespace)


def adapter_accesses() -> set[Access]:
    """Every ``(group, resource, verb[, namespace])`` the adapter's requests need."""
    source = inspect.getsource(kube)
    tree = ast.parse(source)
    consts = _constants()
    found: set[Access] = set()
    placed: set[int] = set()  # ids of the path nodes resolved
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    _RESOLVED.clear()
    inside_request = {id(n) for f in functions if f.name == "_request" for n in ast.walk(f)}
    for fn in functions:
        for call in ast.walk(fn):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == RAW
                    and id(call) not in inside_request):
                kw = {k.arg: k.value for k in call.keywords}
                m = kw.get("method")
                assert isinstance(m, ast.Constant), f"line {call.lineno}: {RAW} with a non-literal method"
                for path in _template(kw["resource_path"], fn, consts):
                    access = _access(str(m.value), path, None, _is_watch(kw.get("query_params"), fn))
                    if access is not None:
                        found.add(access)
                placed.add(id(kw["resource_path"]))
                continue
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in HELPERS and fn.name not in HELPERS):
                continue
            method_at, path_at = HELPERS[call.func.attr]
            if method_at is None:
                method = "GET"
            else:
                m = call.args[method_at]
                assert isinstance(m, ast.Constant), f"line {call.lineno}: the HTTP method must be a literal"
                method = str(m.value)
            path_node = call.args[path_at] if len(call.args) > path_at else next(
                k.value for k in call.keywords if k.arg == "path")
            query = next((k.value for k in call.keywords if k.arg == "query"), None)
            if query is None and call.func.attr == "_list" and len(call.args) > 1:
                query = call.args[1]
            for path in _template(path_node, fn, consts):
                access = _access(method, path, query, _is_watch(query, fn))
                if access is not None:
                    found.add(access)
            placed.add(id(path_node))
    # Every path-like literal must belong to a call resolved above (or to _object_path, expanded there).
    object_path = next(f for f in functions if f.name == "_object_path")
    exempt = {id(n) for n in ast.walk(object_path)}
    resolved_names = set(_RESOLVED)
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else (
            node.values[0].value if isinstance(node, ast.JoinedStr) and node.values
            and isinstance(node.values[0], ast.Constant) else None)
        if isinstance(text, str) and text.startswith(("/api/", "/apis/", "/api", "/apis")) and \
                " " not in text and id(node) not in exempt | resolved_names | placed:
            parents = [p for p in ast.walk(tree) if any(c is node for c in ast.iter_child_nodes(p))]
            if not any(id(p) in placed for p in parents):
                raise AssertionError(f"kube.py line {getattr(node, 'lineno', '?')}: API path {text!r} is used outside "
                                     "_request/_list/param_serialize: teach this test the new call")
    return found


def chart_accesses(objects: list[dict[str, Any]]) -> set[Access]:
    out: set[Access] = set()
    for kind in ("ClusterRole", "Role"):
        for role in of_kind(objects, kind):
            ns = role["metadata"].get("namespace") if kind == "Role" else None
            for rule in role["rules"]:
                assert "nonResourceURLs" not in rule and "resourceNames" not in rule
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            assert "*" not in (g, r, v), f"{kind} {role['metadata']['name']}: a wildcard"
                            out.add(Access(g, r, v, ns))
    return out


def test_the_resolver_sees_the_calls_we_know_of() -> None:
    accesses = adapter_accesses()
    # a few the adapter is documented to make (drain, restart, events): the resolver must find them
    assert Access("", "pods/eviction", "create") in accesses
    assert Access("", "pods", "deletecollection") in accesses
    assert Access("", "nodes", "patch") in accesses
    assert Access("", "events", "create", kube.EVENT_NAMESPACE) in accesses
    assert Access("", "nodes", "watch") in accesses  # wait_node_change streams through param_serialize


@pytest.mark.parametrize("values", [{}, production_values()], ids=["defaults", "production"])
def test_rbac_is_exactly_what_the_adapter_calls(values: dict[str, Any]) -> None:
    needed = adapter_accesses()
    granted = chart_accesses(render(values))
    missing = sorted(needed - granted)
    extra = sorted(granted - needed)
    assert not missing, f"the adapter calls these and the chart does not grant them: {missing}"
    assert not extra, f"the chart grants these and the adapter never calls them: {extra}"


def test_only_the_service_account_is_bound() -> None:
    objects = render({})
    subjects = {(s["kind"], s["name"]) for b in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding")
                for s in b["subjects"]}
    assert subjects == {("ServiceAccount", RELEASE)}
    role = only(objects, "Role")
    assert role["metadata"]["namespace"] == kube.EVENT_NAMESPACE


@pytest.mark.parametrize(("method", "path", "expected"), [
    ("GET", "/api/v1/nodes/{}", Access("", "nodes", "get")),
    ("GET", "/api/v1/pods", Access("", "pods", "list")),
    ("DELETE", "/api/v1/namespaces/{}/pods", Access("", "pods", "deletecollection")),
    ("POST", "/api/v1/namespaces/{}/pods/{}/eviction", Access("", "pods/eviction", "create")),
    ("POST", "/apis/authentication.k8s.io/v1/tokenreviews", Access("authentication.k8s.io", "tokenreviews", "create")),
    ("DELETE", "/apis/resource.k8s.io/v1/devicetaintrules/{}", Access("resource.k8s.io", "devicetaintrules", "delete")),
    ("GET", "/apis/resource.k8s.io", None),
])
def test_path_to_access(method: str, path: str, expected: Access | None) -> None:
    assert _access(method, path, None) == expected


def test_a_path_outside_the_request_helpers_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    real = inspect.getsource(kube)
    smuggled = real + '\n\ndef _sneaky(api):\n    return api.call_api("/api/v1/secrets")\n'
    monkeypatch.setattr(inspect, "getsource", lambda _m: smuggled)
    with pytest.raises(AssertionError, match="is used outside _request"):
        adapter_accesses()


def documented_accesses() -> set[Access]:
    """The RBAC table of ARCHITECTURE.md ("Deploying"), read as accesses (the events row is the Role)."""
    from tests.deploy.chart import ROOT

    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text[text.index("| apiGroup | resource | verbs | why (adapter call) |"):]
    out: set[Access] = set()
    for row in table.splitlines()[2:]:
        if not row.startswith("|"):
            break
        group, resources, verbs = (c.strip() for c in row.strip("|").split("|")[:3])
        group = "" if group == '`""`' else group
        ns = kube.EVENT_NAMESPACE if "(Role in" in resources else None
        for r in resources.split("(")[0].split(","):
            for v in verbs.split(","):
                out.add(Access(group, r.strip(), v.strip(), ns))
    return out


def test_the_rbac_table_in_architecture_is_what_the_chart_grants() -> None:
    documented, granted = documented_accesses(), chart_accesses(render({}))
    assert documented == granted, (f"in ARCHITECTURE.md only: {sorted(documented - granted)}; "
                                   f"granted only: {sorted(granted - documented)}")
