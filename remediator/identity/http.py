"""The agent-identity endpoint: ``POST /v1/identity/agent`` — a node's agent trades its projected
ServiceAccount token for short-lived NATS credentials that name its node only.

Where it sits: mounted on the service's HTTP app (``remediator.service``) when the service holds the
account's scoped agents signing key (embedded: the store's; production: ``nats_agent_signing_key``). No
secret is baked per node. The checks, in order, each refusal one line and logged without the token:

1. the body is ``{"node": NAME}`` or ``{"node": NAME, "public_key": "U…"}`` (bounded) and the header
   ``Authorization: Bearer <token>`` (bounded);
2. the Kubernetes API's TokenReview (``authentication.k8s.io/v1``) authenticates the token for the
   configured audience (401 otherwise);
3. the token belongs to a ServiceAccount of the agent's namespace and is bound to a pod
   (``user.extra["authentication.kubernetes.io/pod-name"/"pod-uid"]``) whose node
   (``…/node-name``) is the node asked for (403 otherwise);
4. that pod, read from the API, still has that uid, runs on that node (``spec.nodeName``) and is owned by
   the agent DaemonSet (403 otherwise);

then a user JWT for ``node`` from the agents key (``identity_ttl_s``), its public key announced as the node's
agent key (``agentkey.<node>``), and returned: with ``public_key`` (the agent keeps its seed on the node,
``remediator.identity.client``) only the JWT (``{"node", "jwt", "public_key", "expires_at"}``), else the
whole ``.creds`` text (``"creds"``); the response is never logged. A TokenReview that cannot be made is 503.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from nats.js.client import JetStreamContext

from remediator.identity import agents, creds
from remediator.identity.issuer import Issuer
from remediator.identity.keys import IdentityError

log = logging.getLogger(__name__)

PATH = "/v1/identity/agent"
MAX_BODY = 4096
MAX_TOKEN = 16 * 1024
EXTRA = "authentication.kubernetes.io/"


class TokenReviewer(Protocol):
    async def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]: ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]: ...


class Refused(Exception):
    """A refusal: the HTTP status, the one-line reason, and ``code``, a short fixed name for metrics
    (``remediator_identity_refusals_total{reason=…}``: never derived from the request's own values)."""

    def __init__(self, status: int, reason: str, code: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


REFUSAL_CODES = ("no_token", "body_too_large", "bad_body", "review_unavailable", "not_authenticated",
                 "wrong_namespace", "not_pod_bound", "other_node", "pod_unreadable", "pod_mismatch",
                 "not_agent_daemonset", "bad_key")


@dataclass
class AgentIdentity:
    """Issues agent credentials to the agent DaemonSet's pods, one node each."""

    kube: TokenReviewer
    issuer: Issuer
    js: JetStreamContext
    audience: str
    namespace: str
    daemonset: str
    ttl: timedelta
    clock: Callable[[], datetime]
    # called once per request with "issued" or the refusal's code (the service's metrics)
    observe: Callable[[str], None] | None = None

    async def issue(self, token: str, node: str, public_key: str | None = None) -> dict[str, Any]:
        try:
            status = await self.kube.review_token(token, [self.audience])
        except Exception as e:  # the API is away or refuses the review itself: the agent retries
            raise Refused(503, f"TokenReview failed: {type(e).__name__}", "review_unavailable") from None
        if status.get("authenticated") is not True:
            raise Refused(401, "the ServiceAccount token was not authenticated by the Kubernetes API",
                          "not_authenticated")
        user = status.get("user") or {}
        username = str(user.get("username", ""))
        prefix = f"system:serviceaccount:{self.namespace}:"
        if not username.startswith(prefix):
            raise Refused(403, f"the token is not a ServiceAccount of namespace {self.namespace}", "wrong_namespace")
        extra = user.get("extra") or {}

        def one(key: str) -> str:
            values = extra.get(EXTRA + key) or []
            return str(values[0]) if isinstance(values, list) and len(values) == 1 else ""

        pod_name, pod_uid, token_node = one("pod-name"), one("pod-uid"), one("node-name")
        if not pod_name or not pod_uid:
            raise Refused(403, "the token is not bound to a pod (use a projected ServiceAccount token)",
                          "not_pod_bound")
        if token_node != node:
            raise Refused(403, f"the token's pod runs on {token_node or 'no node'}, not on {node}", "other_node")
        try:
            pod = await self.kube.read_pod(self.namespace, pod_name)
        except Exception:
            raise Refused(403, f"pod {self.namespace}/{pod_name} cannot be read", "pod_unreadable") from None
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != pod_uid or spec.get("nodeName") != node:
            raise Refused(403, f"pod {self.namespace}/{pod_name} is not the token's pod on {node}", "pod_mismatch")
        owners = meta.get("ownerReferences") or []
        if not any(o.get("kind") == "DaemonSet" and o.get("name") == self.daemonset and o.get("controller")
                   for o in owners):
            raise Refused(403, f"pod {self.namespace}/{pod_name} is not a pod of DaemonSet {self.daemonset}",
                          "not_agent_daemonset")
        try:
            issued = self.issuer.issue("agent", node=node, now=self.clock(), ttl=self.ttl, public_key=public_key)
        except IdentityError as e:
            raise Refused(400, str(e), "bad_key") from None
        await agents.announce(self.js, issued)
        log.info("issued agent credentials for node %s to pod %s/%s (user %s, until %s)", node, self.namespace,
                 pod_name, issued.public_key, issued.expires_at)
        answer: dict[str, Any] = {"node": node, "public_key": issued.public_key,
                                  "expires_at": issued.expires_at.isoformat() if issued.expires_at else None}
        if issued.user is not None:  # the key was made here: hand over the whole .creds
            answer["creds"] = creds.render(issued.jwt, issued.user)
        else:  # the agent keeps its seed; it writes the .creds itself (remediator.identity.client)
            answer["jwt"] = issued.jwt
        return answer


def router(identity: AgentIdentity) -> APIRouter:
    """The ``POST /v1/identity/agent`` route over ``identity``."""
    api = APIRouter()

    @api.post(PATH, include_in_schema=True, summary="Trade an agent pod's ServiceAccount token for its node's "
                                                      "NATS credentials")
    async def agent_credentials(request: Request) -> Response:
        try:
            token, node, public_key = await _read(request)
            answer = await identity.issue(token, node, public_key)
        except Refused as e:
            log.warning("agent credentials refused: %s", e.reason)
            if identity.observe is not None:
                identity.observe(e.code)
            return JSONResponse({"error": e.reason}, status_code=e.status,
                                headers={"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
        if identity.observe is not None:
            identity.observe("issued")
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})

    return api


async def _read(request: Request) -> tuple[str, str, str | None]:
    header = request.headers.get("authorization", "")
    if len(header) > MAX_TOKEN or not header.lower().startswith("bearer ") or not header[7:].strip():
        raise Refused(401, "Authorization: Bearer <projected ServiceAccount token> is required", "no_token")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise Refused(413, f"body larger than {MAX_BODY} bytes", "body_too_large")
    try:
        doc = json.loads(body)
    except ValueError:
        raise Refused(400, 'the body must be JSON {"node": NAME}', "bad_body") from None
    node = doc.get("node") if isinstance(doc, dict) else None
    if not isinstance(node, str) or not node:
        raise Refused(400, 'the body must be JSON {"node": NAME}', "bad_body")
    public_key = doc.get("public_key")
    if public_key is not None and not isinstance(public_key, str):
        raise Refused(400, "public_key must be a user nkey (U…)", "bad_key")
    return header[7:].strip(), node, public_key


