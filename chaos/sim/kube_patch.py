"""The three PATCH dialects of the Kubernetes API: JSON merge patch, strategic merge patch, JSON patch.

Where it sits: chaos/sim, under the simulated cluster. ``kube_api`` hands the PATCH body and its
``Content-Type`` to ``cluster.ClusterState.patch``, which applies it here and then restores the fields a
client may not change (name, uid, creation time) before committing.

Merge patches are applied without touching their input: the result shares unchanged sub-objects with the
stored object, which the cluster treats as immutable. That keeps a node PATCH cheap at 1500 nodes.

Strategic merge patch knows the merge keys of the built-in fields this project touches (node conditions
and addresses by ``type``, containers, volumes and env by ``name``, owner references by ``uid``,
``finalizers`` as a set); every other list is replaced, which is what Kubernetes does for ``spec.taints``
and ``spec.tolerations``. Directives ``$patch`` (replace/delete/merge), ``$retainKeys``,
``$deleteFromPrimitiveList/<field>`` and ``$setElementOrder/<field>`` are understood.
"""

from __future__ import annotations

import copy
import json
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)

# field name -> merge key, for lists of objects a strategic merge patch merges element by element
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "addresses": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "volumesAttached": "name",
    "hostAliases": "ip",
}
# lists of scalars a strategic merge patch treats as sets
MERGE_SETS = frozenset({"finalizers"})


class PatchError(ValueError):
    """A patch that cannot be applied: ``code`` 400 for a malformed body, 422 for a failed operation."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def apply_patch(target: dict[str, Any], body: bytes | str | Any, content_type: str) -> dict[str, Any]:
    """Apply ``body`` (raw bytes or already-decoded JSON) of ``content_type`` to ``target``.

    Returns a new object; ``target`` is not modified. Raises ``PatchError`` (400/415/422).
    """
    media = content_type.split(";")[0].strip().lower()
    if isinstance(body, bytes | str):
        try:
            patch = json.loads(body or b"null")
        except ValueError as exc:
            raise PatchError(400, f"error decoding patch: {exc}") from exc
    else:
        patch = body
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        return _as_object(json_patch(target, patch))
    if media in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise PatchError(400, "patch body must be a JSON object")
        fn = json_merge_patch if media == MERGE_PATCH else strategic_merge_patch
        return _as_object(fn(target, patch))
    raise PatchError(415, f"the body of the request was in an unknown format - accepted media types include: "
                          f"{', '.join(PATCH_TYPES)}")


def _as_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PatchError(422, "the patch turned the object into something that is not a JSON object")
    return value


# --- RFC 7386 ----------------------------------------------------------------------------------------


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


# --- strategic merge patch ---------------------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge patch for the built-in fields in ``MERGE_KEYS``/``MERGE_SETS``."""
    if not isinstance(patch, dict):
        return patch
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip_directives(patch)
    base: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(base.get(field), list) and isinstance(value, list):
                base[field] = [v for v in base[field] if v not in value]
            continue
        if value is None:
            base.pop(key, None)
            continue
        current = base.get(key)
        if isinstance(value, dict):
            merged = strategic_merge_patch(current, value)
            if merged is None:
                base.pop(key, None)
            else:
                base[key] = merged
        elif isinstance(value, list):
            base[key] = _merge_list(key, current, value)
        else:
            base[key] = value
    if isinstance(retain, list):
        keep = set(retain) | {k for k in patch if not k.startswith("$")}
        base = {k: v for k, v in base.items() if k in keep}
    return base


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [_strip_directives(e) for e in patch if not (isinstance(e, dict) and "$patch" in e)]
    if field in MERGE_SETS and isinstance(current, list):
        return current + [v for v in patch if v not in current]
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None or not isinstance(current, list) or not all(isinstance(e, dict) for e in patch):
        return [_strip_directives(e) for e in patch]
    result = list(current)
    for element in patch:
        key_value = element.get(merge_key)
        idx = next((i for i, e in enumerate(result) if isinstance(e, dict) and e.get(merge_key) == key_value),
                   None)
        if element.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
            continue
        if idx is None:
            result.append(_strip_directives(element))
        else:
            result[idx] = strategic_merge_patch(result[idx], element)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


# --- RFC 6902 ----------------------------------------------------------------------------------------


def json_patch(target: Any, operations: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) over a deep copy of ``target``."""
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"invalid JSON patch operation: {op!r}")
        kind = op["op"]
        path = _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(_value(op)))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            doc, _ = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(_value(op)))
        elif kind == "move":
            doc, moved = _remove(doc, _pointer(op.get("from", "")))
            doc = _add(doc, path, moved)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, _pointer(op.get("from", "")))))
        elif kind == "test":
            if _get(doc, path) != _value(op):
                raise PatchError(422, f"testing value {op['path']} failed")
        else:
            raise PatchError(400, f"unknown JSON patch operation {kind!r}")
    return doc


def _value(op: dict[str, Any]) -> Any:
    if "value" not in op:
        raise PatchError(400, f"JSON patch operation {op['op']!r} needs a value")
    return op["value"]


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text.split("/")[1:]] if text else []


def _parent(doc: Any, path: list[str]) -> Any:
    cur = doc
    for part in path[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise PatchError(422, f"path /{'/'.join(path)} does not exist")
    return cur


def _get(doc: Any, path: list[str]) -> Any:
    if not path:
        return doc
    parent = _parent(doc, path)
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(422, f"path /{'/'.join(path)} does not exist")


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _parent(doc, path)
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(422, f"index {last} out of range")
    else:
        raise PatchError(422, f"path /{'/'.join(path)} does not name a container")
    return doc


def _remove(doc: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise PatchError(422, "cannot remove the whole document")
    parent = _parent(doc, path)
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise PatchError(422, f"path /{'/'.join(path)} does not exist")
