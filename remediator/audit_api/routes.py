"""The read-only audit API: ``GET /v1/audit/…`` (DESIGN.md §5), JSON, paginated, behind the auditor scope.

Where it sits: mounted by ``serve`` next to ingest and by ``remediator audit serve`` on its own
(``create_audit_app``); reads only through ``AuditReader``. Every route is GET: any other method on an audit
path is answered 405 by the router, and nothing here publishes or writes KV.

Auth: the bearer token of ``REMEDIATOR_API_TOKENS`` (entries ``TOKEN`` — every scope — or ``SCOPE:TOKEN``);
the audit routes accept the ``auditor`` and ``admin`` scopes and unscoped tokens; ``alertmanager`` and
``events`` tokens get 403. The web view may send the token as the ``remediator_audit_token`` cookie, set by
its login page. No tokens configured: no authentication (``--insecure-no-auth`` only).

========================================  =====================================================================
route                                     answers
========================================  =====================================================================
``/v1/audit/incidents``                   ``{"incidents", "total", "next_cursor"}``; filters ``node gpu job
                                          fingerprint playbook outcome since until q``; ``limit`` ≤ 200,
                                          ``cursor``; newest first
``/v1/audit/incidents/{id}``              ``{"incident", "records", "story", "headline", "truncated",
                                          "approval", "chain"}``: every record, in stream order
``/v1/audit/nodes``                       ``{"nodes": [{"node", "records", "incidents", "last", "chain"}]}``
``/v1/audit/nodes/{node}``                ``{"node", "chain", "incidents", "records", "next_cursor"}``;
                                          records paginated by chain ``seq`` (``cursor`` = next seq)
``/v1/audit/chains``                      ``{"ok", "chains": [{"chain", "records", "ok", "problem"}]}``
``/v1/audit/approvals``                   ``{"pending": [{"incident", "node", "steps", "requested_at",
                                          "command"}]}``
``/v1/audit/fleet``                       ``{"breaker", "reservations", "handovers", "pools", "budget",
                                          "open_incidents", "pending_approvals", "chains_ok",
                                          "ledger_error"}`` (from KV; ``breaker`` null and
                                          ``ledger_error`` set when this identity may not
                                          read the ledger)
``/v1/audit/export``                      JSON Lines, filters ``node incident since until``
========================================  =====================================================================
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from remediator.audit_api.reader import (
    MAX_FILTER_LEN,
    MAX_LIMIT,
    MAX_TIMELINE,
    OPEN,
    PENDING_APPROVAL,
    AuditReader,
    IncidentFilter,
    IncidentSummary,
    StateUnreadable,
    page_incidents,
)
from remediator.audit_api.story import headline, tell
from remediator.safety.ledger import Ledger
from remediator.settings import Settings
from remediator.telemetry import http_app

__all__ = ["AUDIT_SCOPES", "COOKIE", "TokenCheck", "api_router", "create_audit_app", "fleet_state"]

AUDIT_SCOPES = frozenset({"auditor", "admin"})
COOKIE = "remediator_audit_token"
_KNOWN_SCOPES = frozenset({"alertmanager", "events", "auditor", "admin"})


class TokenCheck:
    """Bearer tokens and their scopes, compared as SHA-256 digests in constant time."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._tokens: list[tuple[bytes, str | None]] = []
        for entry in entries:
            scope, sep, token = entry.partition(":")
            if sep and scope in _KNOWN_SCOPES:
                self._tokens.append((hashlib.sha256(token.encode()).digest(), scope))
            else:
                self._tokens.append((hashlib.sha256(entry.encode()).digest(), None))

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def scope_of(self, token: str) -> str | bool | None:
        """The scope of ``token`` (None: every scope), or False when it is no token of ours."""
        given = hashlib.sha256(token.encode()).digest()
        found: str | bool | None = False
        for digest, scope in self._tokens:  # no early exit: the time taken does not say which one matched
            if hmac.compare_digest(given, digest):
                found = scope
        return found

    def require_auditor(self, request: Request) -> None:
        """Raise 401 without a valid token, 403 for a token whose scope may not read the audit."""
        if not self.enabled:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        token = token or request.cookies.get(COOKIE, "")
        if not token:
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        scope = self.scope_of(token[:512])
        if scope is False:
            raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})
        if scope is not None and scope not in AUDIT_SCOPES:
            raise HTTPException(403, f"a token of scope {scope!r} may not read the audit (auditor or admin)")


def _j(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


_Str = Annotated[str | None, Query(max_length=MAX_FILTER_LEN)]


def chain_of(reader: AuditReader, node: str) -> dict[str, Any]:
    """The verification of one node's chain: ``{"chain", "records", "ok", "problem"}``."""
    for rep in reader.chains():
        if rep.chain == node:
            return dict(rep.__dict__)
    return {"chain": node, "records": 0, "ok": True, "problem": ""}


def pending_approvals(reader: AuditReader) -> list[dict[str, Any]]:
    """Incidents whose ``approval_requested`` is still unanswered, oldest first, with the command."""
    out = []
    for s in sorted(reader.summaries().values(), key=lambda s: s.opened):
        if s.outcome == PENDING_APPROVAL:
            asked = [r for r in reader.timeline(s.id) if r.what == "approval_requested"]
            out.append({"incident": s.id, "node": s.node, "gpu": s.gpu, "playbook": s.playbook,
                        "steps": list(s.pending_approval),
                        "requested_at": asked[0].time.isoformat() if asked else None,
                        "command": f"remediator approve {s.id} --reason '…'"})
    return out


async def fleet_state(reader: AuditReader, settings: Settings) -> dict[str, Any]:
    """Breaker, budget reservations per pool against the limits, open incidents and pending approvals,
    from the state bucket (cluster-wide) and the audit trail."""
    try:
        ledger, ledger_error = await reader.ledger(), None
    except StateUnreadable as e:
        ledger, ledger_error = Ledger(), str(e)
    pools: dict[str, dict[str, int]] = {}
    for res in ledger.reservations.values():
        p = pools.setdefault(str(res.get("pool") or "default"), {"nodes": 0, "gpus": 0, "handed_over": 0})
        p["nodes" if res.get("kind") == "node" else "gpus"] += 1
    for h in ledger.handovers.values():
        p = pools.setdefault(str(h.get("pool") or "default"), {"nodes": 0, "gpus": 0, "handed_over": 0})
        p["handed_over"] += 1
    open_incidents = [s.to_json() for s in sorted(reader.summaries().values(), key=lambda s: s.opened, reverse=True)
                      if s.outcome in (OPEN, PENDING_APPROVAL)]
    b = ledger.breaker
    return {
        "breaker": None if ledger_error else {
            "open": b.open, "tripped_at": b.tripped_at.isoformat() if b.tripped_at else None, "reason": b.reason,
            "recent_quarantines": len(b.quarantines), "threshold": settings.breaker_threshold,
            "window_s": settings.breaker_window_s},
        "reservations": [{"key": k, **dict(v)} for k, v in sorted(ledger.reservations.items())],
        "handovers": [{"key": k, **dict(v)} for k, v in sorted(ledger.handovers.items())],
        "pools": pools,
        "budget": {"max_nodes": settings.budget_max_nodes, "max_node_fraction": settings.budget_max_node_fraction,
                   "max_gpus": settings.budget_max_gpus, "max_gpu_fraction": settings.budget_max_gpu_fraction},
        "open_incidents": open_incidents,
        "pending_approvals": pending_approvals(reader),
        "chains_ok": all(r.ok for r in reader.chains()),
        "ledger_error": ledger_error,
    }


def incident_doc(reader: AuditReader, s: IncidentSummary) -> dict[str, Any]:
    records = reader.timeline(s.id)
    story = tell(records)
    return {"incident": s.to_json(), "records": [r.model_dump(mode="json") for r in records[:MAX_TIMELINE]],
            "truncated": len(records) > MAX_TIMELINE, "story": [line.to_json() for line in story],
            "headline": headline(story), "chain": chain_of(reader, s.node)}


def api_router(reader: AuditReader, settings: Settings, tokens: TokenCheck) -> APIRouter:
    """The ``/v1/audit`` routes over ``reader``; each refreshes the read model first."""
    router = APIRouter(prefix="/v1/audit", tags=["audit"], dependencies=[Depends(tokens.require_auditor)])

    @router.get("/incidents", summary="Incidents, newest first, filtered and paginated")
    async def incidents(node: _Str = None, gpu: _Str = None, job: _Str = None, fingerprint: _Str = None,
                        playbook: _Str = None, outcome: _Str = None, since: datetime | None = None,
                        until: datetime | None = None, q: _Str = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
                        cursor: Annotated[str | None, Query(max_length=512)] = None) -> Response:
        """Incidents matching every given filter (``since``/``until``: the incident overlaps the range)."""
        await reader.refresh()
        try:
            flt = IncidentFilter(node=node, gpu=gpu, job=job, fingerprint=fingerprint, playbook=playbook,
                                 outcome=outcome, since=since, until=until, q=q)
            page = page_incidents(reader.summaries().values(), flt, limit, cursor)
        except ValueError as e:
            return _j({"error": str(e)}, 400)
        return _j({"incidents": [s.to_json() for s in page.items], "total": page.total,
                   "next_cursor": page.next_cursor})

    @router.get("/incidents/{incident}", summary="One incident's timeline: every record, the story")
    async def incident(incident: Annotated[str, Path(max_length=MAX_FILTER_LEN)]) -> Response:
        await reader.refresh()
        s = reader.summaries().get(incident[:MAX_FILTER_LEN])
        if s is None:
            return _j({"error": f"no audit records for incident {incident[:MAX_FILTER_LEN]}"}, 404)
        doc = incident_doc(reader, s)
        doc["approval"] = await reader.approval(s.id)
        return _j(doc)

    @router.get("/nodes", summary="Every node with an audit chain")
    async def nodes() -> Response:
        await reader.refresh()
        by_node: dict[str, dict[str, Any]] = {}
        for r in reader.records:
            n = by_node.setdefault(r.node, {"node": r.node, "records": 0, "incidents": 0, "last": None})
            n["records"] += 1
            n["last"] = r.time.isoformat()
        for s in reader.summaries().values():
            if s.node in by_node:
                by_node[s.node]["incidents"] += 1
        chains = {c.chain: dict(c.__dict__) for c in reader.chains()}
        return _j({"nodes": [{**v, "chain": chains.get(k)} for k, v in sorted(by_node.items())]})

    @router.get("/nodes/{node}", summary="One node's history: its incidents and its chain, paginated")
    async def node_history(node: Annotated[str, Path(max_length=MAX_FILTER_LEN)],
                           limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
                           cursor: Annotated[int, Query(ge=1)] = 1) -> Response:
        await reader.refresh()
        node = node[:MAX_FILTER_LEN]
        recs = [r for r in reader.node_records(node) if r.seq >= cursor]
        page = recs[:limit]
        incs = sorted((s for s in reader.summaries().values() if s.node == node), key=lambda s: s.opened)
        return _j({"node": node, "chain": chain_of(reader, node), "incidents": [s.to_json() for s in incs],
                   "records": [r.model_dump(mode="json") for r in page],
                   "next_cursor": page[-1].seq + 1 if len(recs) > limit else None})

    @router.get("/chains", summary="Verification of every chain")
    async def chains() -> Response:
        await reader.refresh()
        reps = reader.chains()
        return _j({"ok": all(r.ok for r in reps), "chains": [dict(r.__dict__) for r in reps]})

    @router.get("/approvals", summary="Pending approvals, with the command that approves each")
    async def approvals() -> Response:
        await reader.refresh()
        return _j({"pending": pending_approvals(reader)})

    @router.get("/fleet", summary="Breaker, budget and open incidents of the whole cluster (from the bus)")
    async def fleet() -> Response:
        await reader.refresh()
        return _j(await fleet_state(reader, settings))

    @router.get("/export", summary="Records as JSON Lines", response_class=StreamingResponse)
    async def export(node: _Str = None, incident: _Str = None, since: datetime | None = None,
                     until: datetime | None = None) -> StreamingResponse:
        await reader.refresh()
        recs = reader.timeline(incident) if incident else reader.records

        async def lines() -> AsyncIterator[bytes]:
            for r in recs:
                if ((node is None or r.node == node) and (since is None or r.time >= since)
                        and (until is None or r.time <= until)):
                    yield r.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return router


def create_audit_app(reader: AuditReader, settings: Settings) -> FastAPI:
    """The audit API and web view alone (``remediator audit serve``), read-only."""
    app = http_app(title="gpu-remediator audit", version="1",
                   description="Read-only audit API and web view over the AUDIT stream (DESIGN.md §5, §8).")
    mount(app, reader, settings)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app


def mount(app: FastAPI, reader: AuditReader, settings: Settings) -> None:
    """Add the audit API, the web view and its static files to ``app`` (``serve`` and ``audit serve``)."""
    from remediator.audit_api.views import static_app, view_router

    tokens = TokenCheck(settings.tokens)
    app.include_router(api_router(reader, settings, tokens))
    app.include_router(view_router(reader, settings, tokens))
    app.mount("/audit/static", static_app(), name="audit-static")
