"""The read-only web view at ``/audit/``: server-rendered HTML over the same read model as the API.

Where it sits: beside ``routes`` (the JSON API), mounted with it by ``serve`` and ``remediator audit serve``.
Pages: the incident list with filters and search (``/audit/``), an incident told as a story with every
record below it (``/audit/incidents/<id>``), a node's faults and actions over time with an SVG timeline
(``/audit/nodes/<node>``), and the fleet (``/audit/fleet``: open incidents, budget per pool, breaker, pending
approvals with the command to approve). Every page carries the chain-integrity badge. No CDN, no framework:
one stylesheet and one small script (the login page's) served by the same process; semantic HTML (landmarks,
tables with headers, a skip link, visible focus), usable with the keyboard alone.

With tokens configured, pages read the token from the ``remediator_audit_token`` cookie that the login page
sets in the browser (or an ``Authorization`` header); no page takes a token in its URL, and every route is GET.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from remediator.audit_api.reader import (
    MAX_FILTER_LEN,
    MAX_LIMIT,
    AuditReader,
    IncidentFilter,
    IncidentSummary,
    page_incidents,
)
from remediator.audit_api.routes import TokenCheck, chain_of, fleet_state
from remediator.audit_api.story import headline, tell
from remediator.contracts import AuditRecord
from remediator.settings import Settings

__all__ = ["static_app", "view_router"]

_e = html.escape
_CURRENT = ' aria-current="page"'


def static_app() -> StaticFiles:
    return StaticFiles(directory=str(resources.files("remediator.audit_api") / "static"))


def _t(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") + f".{t.microsecond // 1000:03d}Z"


def _inc_link(i: str) -> str:
    return f'<a href="/audit/incidents/{quote(i, safe="")}">{_e(i)}</a>'


def _node_link(n: str) -> str:
    return f'<a href="/audit/nodes/{quote(n, safe="")}">{_e(n)}</a>'


def _badge(ok: bool, text: str) -> str:
    cls = "badge ok" if ok else "badge broken"
    mark = "✔" if ok else "✖"
    return f'<span class="{cls}" role="status" data-chain-ok="{str(ok).lower()}">{mark} {_e(text)}</span>'


def _page(title: str, body: str, reader: AuditReader, current: str = "") -> HTMLResponse:
    chains = reader.chains()
    broken = [c for c in chains if not c.ok]
    badge = _badge(not broken, f"{len(chains) - len(broken)}/{len(chains)} audit chains verified" if not broken
                   else "chain broken: " + ", ".join(c.chain for c in broken))
    nav = "".join(
        f'<li><a href="{href}"{_CURRENT if current == key else ""}>{label}</a></li>'
        for key, href, label in (("incidents", "/audit/", "Incidents"), ("fleet", "/audit/fleet", "Fleet")))
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)} · gpu-remediator audit</title><link rel="stylesheet" href="/audit/static/audit.css"></head>
<body><a class="skip" href="#main">Skip to content</a>
<header><span class="brand">gpu-remediator audit</span><nav aria-label="Main"><ul>{nav}</ul></nav>
<span id="chain-badge">{badge}</span></header>
<main id="main" tabindex="-1"><h1>{_e(title)}</h1>{body}</main>
<footer>Read-only view of the AUDIT stream. JSON: <a href="/v1/audit/incidents">/v1/audit</a> ·
<a href="/docs">API docs</a></footer></body></html>"""
    return HTMLResponse(doc)


def _summary_rows(items: Iterable[IncidentSummary]) -> str:
    rows = []
    for s in items:
        what = f"{s.kind or ''} {s.code if s.code is not None else ''}".strip()
        rows.append(
            f'<tr data-incident="{_e(s.id)}"><td>{_t(s.opened)}</td><td>{_inc_link(s.id)}</td>'
            f"<td>{_node_link(s.node)}</td><td class=\"mono\">{_e(s.gpu or '')}</td><td>{_e(what)}</td>"
            f"<td>{_e(s.playbook or '—')}</td><td><span class=\"outcome o-{_e(s.outcome)}\">{_e(s.outcome)}</span>"
            f"</td><td class=\"mono\">{_e(s.fingerprint or '')}</td><td>{_e(s.job or '')}</td></tr>")
    if not rows:
        return '<p class="empty">No incident matches.</p>'
    return ('<table class="list"><caption class="sr">Incidents, newest first</caption><thead><tr>'
            '<th scope="col">Opened (UTC)</th><th scope="col">Incident</th><th scope="col">Node</th>'
            '<th scope="col">GPU</th><th scope="col">Fault</th><th scope="col">Playbook</th>'
            '<th scope="col">Outcome</th><th scope="col">Alert fingerprint</th><th scope="col">Job</th></tr>'
            "</thead><tbody>" + "".join(rows) + "</tbody></table>")


_FILTERS = (("q", "Search", "id, node, GPU, job, fingerprint"), ("node", "Node", ""), ("gpu", "GPU UUID", ""),
            ("job", "Job", ""), ("fingerprint", "Alert fingerprint", ""), ("playbook", "Playbook", ""),
            ("outcome", "Outcome", "completed, escalated, open…"), ("since", "Since (UTC)", "2026-11-30T03:00"),
            ("until", "Until (UTC)", ""))


def _kv_table(data: dict[str, Any]) -> str:
    return "<pre>" + _e(json.dumps(data, indent=2, sort_keys=True)) + "</pre>"


def _record_rows(records: Iterable[AuditRecord]) -> str:
    rows = []
    for r in records:
        details = ""
        for label, data in (("before", r.before), ("after", r.after)):
            if data:
                details += f"<details><summary>{label}</summary>{_kv_table(data)}</details>"
        rows.append(
            f'<tr id="r-{_e(r.node)}-{r.seq}" data-seq="{r.seq}" data-what="{_e(r.what)}" data-node="{_e(r.node)}">'
            f"<td class=\"mono\">{_e(r.node)}#{r.seq}</td><td>{_t(r.time)}</td><td><code>{_e(r.what)}</code></td>"
            f"<td>{_e(r.actor)}</td><td class=\"why\">{_e(r.why)}{details}</td></tr>")
    return ('<table class="records"><caption class="sr">Every audit record, in order</caption><thead><tr>'
            '<th scope="col">Chain#seq</th><th scope="col">Time (UTC)</th><th scope="col">Record</th>'
            '<th scope="col">Actor</th><th scope="col">Why, before and after</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def _plot(records: list[AuditRecord]) -> str:
    """An SVG timeline of one node's records: faults, decisions, steps and outcomes as marks over time."""
    if not records:
        return ""
    lanes = (("faults", ("event_accepted", "duplicate_ignored", "event_ignored")), ("decisions", ("decision",)),
             ("guards", ("guard_verdict",)), ("steps", ("step_started", "step_succeeded", "step_failed",
                                                        "step_skipped")),
             ("outcomes", ("playbook_finished", "escalated", "approval", "approval_requested", "dead_letter")))
    t0, t1 = records[0].time, max(r.time for r in records)
    span = max((t1 - t0).total_seconds(), 1.0)
    w, lane_h, left = 900, 28, 90
    marks = []
    for li, (label, kinds) in enumerate(lanes):
        y = 20 + li * lane_h
        marks.append(f'<text x="4" y="{y + 4}" class="lane">{label}</text>'
                     f'<line x1="{left}" y1="{y}" x2="{w - 10}" y2="{y}" class="axis"/>')
        for r in records:
            if r.what in kinds:
                x = left + (w - left - 20) * (r.time - t0).total_seconds() / span
                bad = r.what in ("step_failed", "escalated", "dead_letter") or r.after.get("allowed") is False
                marks.append(f'<circle cx="{x:.1f}" cy="{y}" r="5" class="{"bad" if bad else r.what}">'
                             f"<title>{_e(_t(r.time))} {_e(r.what)}: {_e(r.why[:200])}</title></circle>")
    h = 20 + len(lanes) * lane_h + 16
    marks.append(f'<text x="{left}" y="{h - 2}" class="tick">{_e(_t(t0))}</text>'
                 f'<text x="{w - 10}" y="{h - 2}" class="tick" text-anchor="end">{_e(_t(t1))}</text>')
    return (f'<figure><svg viewBox="0 0 {w} {h}" role="img" aria-labelledby="plot-title" class="plot">'
            f'<title id="plot-title">Faults and actions on this node over time</title>{"".join(marks)}</svg>'
            "<figcaption>Each mark is one audit record; hover a mark for its text.</figcaption></figure>")


def view_router(reader: AuditReader, settings: Settings, tokens: TokenCheck) -> APIRouter:
    """The ``/audit`` pages over ``reader``."""
    router = APIRouter(prefix="/audit", include_in_schema=False)

    def guard(request: Request) -> Response | None:
        try:
            tokens.require_auditor(request)
        except HTTPException as e:
            if e.status_code == 401:
                return RedirectResponse("/audit/login?next=" + quote(request.url.path, safe="/"), status_code=303)
            return HTMLResponse(f"<!doctype html><title>Forbidden</title><p>{_e(str(e.detail))}</p>", 403)
        return None

    @router.get("/login")
    async def login(next: Annotated[str, Query(max_length=512)] = "/audit/") -> HTMLResponse:
        target = next if next.startswith("/audit") else "/audit/"
        body = f"""<p>This view reads the audit with an <code>auditor</code> (or <code>admin</code>) bearer token.
The token is kept in this browser only (a cookie for this site) and never put in a URL.</p>
<form id="login" data-next="{_e(target)}"><label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="off" required maxlength="512">
<button type="submit">Open the audit</button></form><script src="/audit/static/audit.js"></script>"""
        doc = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Sign in · gpu-remediator audit</title><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/audit/static/audit.css"></head><body><main id="main"><h1>gpu-remediator audit</h1>
{body}</main></body></html>"""
        return HTMLResponse(doc)

    @router.get("/")
    async def incidents(request: Request, cursor: Annotated[str | None, Query(max_length=512)] = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        await reader.refresh()
        given = {k: request.query_params.get(k, "")[:MAX_FILTER_LEN] for k, _, _ in _FILTERS}
        error = ""
        try:
            since = datetime.fromisoformat(given["since"]) if given["since"] else None
            until = datetime.fromisoformat(given["until"]) if given["until"] else None
            since = since.replace(tzinfo=UTC) if since and not since.tzinfo else since
            until = until.replace(tzinfo=UTC) if until and not until.tzinfo else until
            flt = IncidentFilter(node=given["node"], gpu=given["gpu"], job=given["job"],
                                 fingerprint=given["fingerprint"], playbook=given["playbook"],
                                 outcome=given["outcome"], since=since, until=until, q=given["q"])
            page = page_incidents(reader.summaries().values(), flt, limit, cursor)
        except ValueError as e:
            error = f'<p class="error" role="alert">{_e(str(e))}</p>'
            page = page_incidents((), IncidentFilter(), limit)
        fields = "".join(
            f'<div class="field"><label for="f-{k}">{label}</label><input id="f-{k}" name="{k}" '
            f'value="{_e(given[k])}" maxlength="{MAX_FILTER_LEN}" placeholder="{_e(hint)}"></div>'
            for k, label, hint in _FILTERS)
        form = (f'<form class="filters" method="get" action="/audit/" role="search" aria-label="Filter incidents">'
                f'{fields}<div class="field buttons"><button type="submit">Filter</button> '
                f'<a href="/audit/">Clear</a></div></form>')
        more = ""
        if page.next_cursor:
            q = urlencode({**{k: v for k, v in given.items() if v}, "cursor": page.next_cursor, "limit": limit})
            more = f'<p><a rel="next" href="/audit/?{_e(q)}">Older incidents →</a></p>'
        shown = f"<p>{len(page.items)} of {page.total} matching incident(s).</p>"
        return _page("Incidents", form + error + shown + _summary_rows(page.items) + more, reader, "incidents")

    @router.get("/incidents/{incident}")
    async def incident(request: Request, incident: Annotated[str, Path(max_length=MAX_FILTER_LEN)]) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        await reader.refresh()
        s = reader.summaries().get(incident)
        if s is None:
            return _page("No such incident", f"<p>No audit records for incident {_e(incident)}.</p>", reader)
        records = reader.timeline(s.id)
        story = tell(records)
        chain = chain_of(reader, s.node)
        facts = [("Node", _node_link(s.node)), ("GPU", f'<span class="mono">{_e(s.gpu or "—")}</span>'),
                 ("Fault", _e(f"{s.kind or '?'} {s.code if s.code is not None else ''}")),
                 ("Playbook", _e(s.playbook or "—")), ("Outcome", f'<span class="outcome o-{_e(s.outcome)}">'
                                                                   f"{_e(s.outcome)}</span>"),
                 ("Job", _e(s.job or "—")), ("Alert fingerprint", f'<span class="mono">{_e(s.fingerprint or "—")}'
                                                                   "</span>"),
                 ("Trace id", f'<span class="mono">{_e(s.trace_id or "—")}</span>'),
                 ("Event", f'<span class="mono">{_e(s.event_id or "—")}</span>'),
                 ("Opened, last record", f"{_t(s.opened)} to {_t(s.updated)}"),
                 ("Node chain", _badge(bool(chain["ok"]), f"{chain['chain']}: {chain['records']} records "
                                       + ("verified" if chain["ok"] else f"BROKEN ({chain['problem']})")))]
        dl = '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
        approve = ""
        if s.pending_approval:
            approve = (f'<p class="pending" role="alert">Waiting for approval of {_e(", ".join(s.pending_approval))}'
                       f": <code>remediator approve {_e(s.id)} --reason '…'</code></p>")
        lines = "".join(
            f'<li class="k-{_e(line.kind)}{" problem" if line.problem else ""}" data-kind="{_e(line.kind)}">'
            f'<time datetime="{line.time.isoformat()}">{line.time:%H:%M:%S}</time> {_e(line.text)}</li>'
            for line in story)
        body = (f'<p class="headline" id="headline">{_e(headline(story))}</p>{approve}{dl}'
                f'<section aria-labelledby="story-h"><h2 id="story-h">What happened</h2><ol class="story">{lines}'
                f'</ol></section><section aria-labelledby="rec-h"><h2 id="rec-h">Every record ({len(records)})</h2>'
                f'{_record_rows(records)}</section>')
        return _page(f"Incident {s.id}", body, reader)

    @router.get("/nodes/{node}")
    async def node(request: Request, node: Annotated[str, Path(max_length=MAX_FILTER_LEN)]) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        await reader.refresh()
        recs = reader.node_records(node)
        incs = sorted((s for s in reader.summaries().values() if s.node == node), key=lambda s: s.opened,
                      reverse=True)
        chain = chain_of(reader, node)
        badge = _badge(bool(chain["ok"]), f"chain of {node}: {chain['records']} records "
                       + ("verified" if chain["ok"] else f"BROKEN ({chain['problem']})"))
        body = (f"<p>{badge}</p>{_plot(recs)}<h2>Incidents on {_e(node)} ({len(incs)})</h2>{_summary_rows(incs)}"
                f"<h2>The node's chain (last {min(len(recs), 200)} of {len(recs)} records)</h2>"
                f"{_record_rows(recs[-200:])}")
        return _page(f"Node {node}", body, reader)

    @router.get("/fleet")
    async def fleet(request: Request) -> Response:
        if (denied := guard(request)) is not None:
            return denied
        await reader.refresh()
        f = await fleet_state(reader, settings)
        b = f["breaker"]
        if b is None:
            breaker = (f'<p class="error" role="alert" id="breaker">Circuit breaker and budget: unknown. '
                       f'{_e(f["ledger_error"])} (this process\'s NATS identity may not read the state bucket; '
                       "the service's own view, or `remediator breaker status`, shows them).</p>")
        else:
            breaker = (f'<p class="{"error" if b["open"] else "okline"}" id="breaker">Circuit breaker '
                       f'<strong>{"OPEN" if b["open"] else "closed"}</strong>'
                       + (f" since {_e(b['tripped_at'])}: {_e(b['reason'])}" if b["open"] else "")
                       + f" — {b['recent_quarantines']} recent quarantine(s) in the shared ledger; trips at "
                         f"{b['threshold']} within {b['window_s']:g}s (the thresholds this process is configured "
                         "with).</p>")
        budget = f["budget"]
        pool_rows = "".join(
            f"<tr><th scope=\"row\">{_e(p)}</th><td>{v['nodes']} / {budget['max_nodes']} "
            f"(≤ {budget['max_node_fraction']:.0%} of the pool)</td><td>{v['gpus']} / {budget['max_gpus']} "
            f"(≤ {budget['max_gpu_fraction']:.0%})</td><td>{v['handed_over']}</td></tr>"
            for p, v in sorted(f["pools"].items()))
        pools = ('<table class="list" id="pools"><caption>Out of service per pool (budget reservations of '
                 'running playbooks) against the budget</caption><thead><tr><th scope="col">Pool</th>'
                 '<th scope="col">Nodes reserved</th><th scope="col">GPUs reserved</th>'
                 '<th scope="col">Handed over to a person</th></tr></thead><tbody>'
                 + (pool_rows or '<tr><td colspan="4">No reservation: nothing is out of service by us.</td></tr>')
                 + "</tbody></table>")
        pend = "".join(f"<li>{_inc_link(p['incident'])} on {_node_link(p['node'])}: steps "
                       f"{_e(', '.join(p['steps']))} — <code>{_e(p['command'])}</code></li>"
                       for p in f["pending_approvals"])
        pending = f'<ul id="pending">{pend}</ul>' if pend else '<p id="pending">No approval is pending.</p>'
        opened = [IncidentSummary(**{**o, "opened": datetime.fromisoformat(o["opened"]),
                                     "updated": datetime.fromisoformat(o["updated"]),
                                     "pending_approval": tuple(o["pending_approval"])})
                  for o in f["open_incidents"]]
        pools = pools if b is not None else ""
        body = (f"{breaker}<h2>Pending approvals</h2>{pending}<h2>Budget</h2>{pools}"
                f"<h2>Open incidents ({len(opened)})</h2>"
                + (_summary_rows(opened) if opened else "<p>No open incident: every run has finished.</p>"))
        return _page("Fleet", body, reader, "fleet")

    return router
