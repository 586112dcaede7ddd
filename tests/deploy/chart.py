"""Render ``deploy/chart`` offline with the Helm engine embedded in ``helm-python-sdk`` (no helm binary,
no cluster), and validate what comes out with ``kubernetes-validate``.

Shared by the tests under ``tests/deploy``. ``render`` returns every rendered object as a dict, in
template order, with the template it came from under ``_template``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart"
PRODUCTION_VALUES = CHART / "values-production.yaml"
RELEASE = "gpu-remediator"
NAMESPACE = "gpu-remediator"
# The Kubernetes version every rendered object is validated against (kubernetes-validate's newest schema).
KUBE_VERSION = "1.37.0"


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with a repeated key, as the API server's decoding does."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    repeated = {k for k in keys if keys.count(k) > 1}
    if repeated:
        raise yaml.constructor.ConstructorError(None, None, f"repeated keys {sorted(map(str, repeated))}",
                                                node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def production_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(PRODUCTION_VALUES.read_text())
    return values


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` deep-merged over a copy of ``base`` (as ``helm -f a -f b`` merges)."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def render(values: dict[str, Any] | None = None, *, release: str = RELEASE,
           namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (over the chart's values.yaml) at install time."""
    chart = helm_python.Chart.load(str(CHART))
    manifests = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.load_all(text, Loader=_StrictLoader):  # a SafeLoader subclass
            if doc:
                assert isinstance(doc, dict), f"{template}: a document that is not a mapping"
                objects.append({**doc, "_template": template})
    return objects


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "_template"}


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``), failing loudly when there are none or several."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, rendered {[o['metadata']['name'] for o in found]}"
    return found[0]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, Any]:
    """A container's env as ``name -> value`` (or the ``valueFrom`` mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}
