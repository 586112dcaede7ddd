"""Bound ServiceAccount tokens and the TokenReview API (authentication.k8s.io/v1) of the simulated cluster.

Where it sits: beside the Kubernetes API simulator (``chaos.sim.kube_api`` routes
``POST /apis/authentication.k8s.io/v1/tokenreviews`` here). The harness asks ``tokens_of(cluster).issue``
for a pod's projected token, as the kubelet would mount it for the agent DaemonSet's pods; the service
reviews it as on a real cluster. Never kinder than the real API server: a token is refused when unknown,
expired, issued for another audience, or when its bound pod is gone or is a new pod of the same name (uid);
an authenticated review carries what a bound token carries — the ServiceAccount username and groups, and in
``user.extra`` the pod name and uid, the node name and uid and the credential id.
"""

from __future__ import annotations

import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from chaos.sim.cluster import ClusterState

Obj = dict[str, Any]
EXTRA = "authentication.kubernetes.io/"


@dataclass(frozen=True)
class BoundToken:
    namespace: str
    service_account: str
    pod: str
    pod_uid: str
    node: str
    audiences: tuple[str, ...]
    expires_at: float
    jti: str


class ServiceAccountTokens:
    """The projected tokens one simulated cluster issued (opaque to their holders, as real ones are)."""

    def __init__(self, cluster: ClusterState, clock: Any = time.time) -> None:
        self._cluster = cluster
        self._clock = clock
        self._tokens: dict[str, BoundToken] = {}
        self._lock = threading.Lock()

    def issue(self, namespace: str, pod: str, *, audience: str, expiration_s: int = 3600) -> str:
        """A token bound to pod ``namespace/pod`` (its ServiceAccount, uid and node), for ``audience``."""
        obj = self._cluster.get("pods", pod, namespace)
        node = obj.get("spec", {}).get("nodeName")
        if not node:
            raise ValueError(f"pod {namespace}/{pod} is not scheduled: the kubelet mounts no token yet")
        token = "sim." + secrets.token_urlsafe(32)
        bound = BoundToken(namespace, obj["spec"].get("serviceAccountName") or "default", pod,
                           obj["metadata"]["uid"], node, (audience,), self._clock() + max(600, expiration_s),
                           secrets.token_hex(16))
        with self._lock:
            self._tokens[token] = bound
        return token

    def review(self, body: Any) -> Obj:
        """The TokenReview answer to ``body`` (``ValueError`` for a body that is not a TokenReview: 400)."""
        if not isinstance(body, dict) or body.get("kind") != "TokenReview" or \
                body.get("apiVersion") != "authentication.k8s.io/v1":
            raise ValueError("the body is not an authentication.k8s.io/v1 TokenReview")
        spec = body.get("spec") or {}
        token, wanted = spec.get("token"), list(spec.get("audiences") or [])
        answer: Obj = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                       "metadata": {"creationTimestamp": None}, "spec": spec}
        if not isinstance(token, str) or not token:
            raise ValueError("spec.token: Required value")
        with self._lock:
            bound = self._tokens.get(token)
        error = self._refusal(bound, wanted)
        if error is not None or bound is None:
            answer["status"] = {"authenticated": False, "error": error, "user": {}}
            return answer
        answer["status"] = {
            "authenticated": True,
            "audiences": wanted or list(bound.audiences),
            "user": {
                "username": f"system:serviceaccount:{bound.namespace}:{bound.service_account}",
                "uid": f"sa-{bound.namespace}-{bound.service_account}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{bound.namespace}",
                           "system:authenticated"],
                "extra": {EXTRA + "pod-name": [bound.pod], EXTRA + "pod-uid": [bound.pod_uid],
                          EXTRA + "node-name": [bound.node], EXTRA + "node-uid": [self._node_uid(bound.node)],
                          EXTRA + "credential-id": [f"JTI={bound.jti}"]},
            },
        }
        return answer

    def _refusal(self, bound: BoundToken | None, wanted: list[str]) -> str | None:
        if bound is None:
            return "[invalid bearer token, token lookup failed]"
        if self._clock() >= bound.expires_at:
            return "[invalid bearer token, service account token has expired]"
        if wanted and not set(wanted) & set(bound.audiences):
            return f"[invalid bearer token, token audiences {list(bound.audiences)} is invalid for the target " \
                   f"audiences {wanted}]"
        try:
            pod = self._cluster.get("pods", bound.pod, bound.namespace)
        except Exception:
            return f'[invalid bearer token, pod "{bound.pod}" not found]'
        if pod["metadata"].get("uid") != bound.pod_uid or pod["metadata"].get("deletionTimestamp"):
            return f'[invalid bearer token, pod "{bound.pod}" is not the pod the token was bound to]'
        return None

    def _node_uid(self, node: str) -> str:
        try:
            return str(self._cluster.get("nodes", node)["metadata"].get("uid", ""))
        except Exception:
            return ""


_BY_CLUSTER: weakref.WeakKeyDictionary[ClusterState, ServiceAccountTokens] = weakref.WeakKeyDictionary()


def tokens_of(cluster: ClusterState) -> ServiceAccountTokens:
    """The token authority of ``cluster`` (one per simulated cluster)."""
    found = _BY_CLUSTER.get(cluster)
    if found is None:
        found = _BY_CLUSTER[cluster] = ServiceAccountTokens(cluster)
    return found
