"""The audit API (``GET /v1/audit/…``) served by ``remediator audit serve --data-dir DIR`` over a demo's store:
the incident of the Xid 79 node and its timeline equal to ``remediator audit show <id> --json`` record for
record; filters, cursor pagination, bounded inputs, token scopes, the read-only guarantee, the fleet state
read from KV, chains, JSON Lines export and the OpenAPI document. Expectations are computed from the records
``remediator audit list --json`` read, never written down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from .audit_serve_support import (
    ADMIN_TOKEN,
    AUDITOR_TOKEN,
    EVENTS_TOKEN,
    DemoStore,
    Served,
    audit_serve,
    run_demo,
)

pytestmark = [pytest.mark.drill, pytest.mark.timeout(300)]

AUTH = {"Authorization": f"Bearer {AUDITOR_TOKEN}"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    return run_demo(tmp_path_factory.mktemp("audit-api") / "store")


@pytest.fixture(scope="module")
def served(demo: DemoStore) -> Iterator[Served]:
    with audit_serve(demo.path) as s:
        yield s


def get(served: Served, path: str, **params: Any) -> httpx.Response:
    return httpx.get(served.base + path, params=params, headers=AUTH, timeout=30)


def incident_ids(records: list[dict[str, Any]]) -> set[str]:
    return {r["incident"] for r in records if r["incident"]}


def incidents_where(demo: DemoStore, pred: Any) -> set[str]:
    """Incidents with at least one record for which ``pred(record)`` holds (from `audit list --json`)."""
    return {r["incident"] for r in demo.records if r["incident"] and pred(r)}


def all_pages(served: Served, limit: int, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        q = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        body = get(served, "/v1/audit/incidents", **q).json()
        assert len(body["incidents"]) <= limit
        out += body["incidents"]
        cursor = body["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("pagination did not end")


def test_the_xid79_node_filter_returns_its_incident_and_the_timeline_equals_audit_show(
        demo: DemoStore, served: Served) -> None:
    body = get(served, "/v1/audit/incidents", node=demo.xid79["node"]).json()
    ids = [i["id"] for i in body["incidents"]]
    assert demo.xid79_incident in ids
    assert all(i["node"] == demo.xid79["node"] for i in body["incidents"])
    summary = next(i for i in body["incidents"] if i["id"] == demo.xid79_incident)
    assert summary["playbook"] == demo.xid79["playbook"] and summary["outcome"] == demo.xid79["outcome"]
    assert summary["kind"] == "xid" and summary["code"] == 79

    timeline = get(served, f"/v1/audit/incidents/{demo.xid79_incident}").json()
    assert timeline["records"] == demo.xid79_show  # the same records, in the same order, field for field
    assert not timeline["truncated"]
    whats = [r["what"] for r in timeline["records"]]
    assert whats[-1] == "playbook_finished" and "event_accepted" in whats and "decision" in whats
    # first and last records of the chain of this incident are both there
    named = [r for r in demo.records if r["incident"] == demo.xid79_incident]
    assert timeline["records"][-1]["hash"] == named[-1]["hash"]
    assert any(r["hash"] == named[0]["hash"] for r in timeline["records"])
    assert timeline["chain"]["ok"] is True and timeline["chain"]["chain"] == demo.xid79["node"]
    # the story tells each step the playbook ran, and the outcome
    for action in demo.xid79["actions"]:
        assert action in timeline["headline"]
    assert timeline["headline"].endswith(f"outcome {demo.xid79['outcome']}")


@pytest.mark.parametrize("field", ["gpu", "job", "fingerprint"])
def test_record_field_filters_return_exactly_the_incidents_carrying_that_value(
        demo: DemoStore, served: Served, field: str) -> None:
    values = sorted({r[field] for r in demo.records if r["incident"] and r[field]})
    assert values, f"the demo left no incident with a {field}"
    for value in values[:4]:
        got = {i["id"] for i in all_pages(served, 200, **{field: value})}
        assert got == incidents_where(demo, lambda r, v=value: r[field] == v), (field, value)


def test_playbook_and_outcome_filters_match_the_decisions_and_finishes(demo: DemoStore, served: Served) -> None:
    for fault in demo.report["faults"]:
        if not fault["playbook"] or fault["playbook"] == "none":
            continue
        want = incidents_where(demo, lambda r, p=fault["playbook"]: r["what"] == "decision"
                               and r["after"].get("playbook") == p)
        assert {i["id"] for i in all_pages(served, 200, playbook=fault["playbook"])} == want
    outcomes = {r["after"]["outcome"] for r in demo.records if r["what"] == "playbook_finished"}
    assert {"completed", "escalated"} <= outcomes
    for outcome in outcomes:
        want = incidents_where(demo, lambda r, o=outcome: r["what"] == "playbook_finished"
                               and r["after"].get("outcome") == o)
        assert {i["id"] for i in all_pages(served, 200, outcome=outcome)} == want


def test_time_range_and_search(demo: DemoStore, served: Served) -> None:
    everything = all_pages(served, 200)
    assert {i["id"] for i in everything} == incident_ids(demo.records)
    first = min(everything, key=lambda i: i["opened"])
    just_before = (datetime.fromisoformat(first["opened"]) - timedelta(seconds=1)).isoformat()
    assert get(served, "/v1/audit/incidents", until=just_before).json()["total"] == 0
    assert get(served, "/v1/audit/incidents", since=just_before).json()["total"] == len(everything)
    assert {i["id"] for i in all_pages(served, 200, until=first["updated"])} >= {first["id"]}
    fp = next(r["fingerprint"] for r in demo.records if r["incident"] == demo.xid79_incident and r["fingerprint"])
    hits = {i["id"] for i in all_pages(served, 200, q=fp.upper())}
    assert demo.xid79_incident in hits


def test_pagination_walks_every_incident_once_newest_first(demo: DemoStore, served: Served) -> None:
    pages = all_pages(served, 2)
    ids = [i["id"] for i in pages]
    assert len(ids) == len(set(ids)) == len(incident_ids(demo.records))
    keys = [(i["opened"], i["id"]) for i in pages]
    assert keys == sorted(keys, reverse=True)
    body = get(served, "/v1/audit/incidents", limit=3).json()
    assert body["total"] == len(ids) and len(body["incidents"]) == 3 and body["next_cursor"]


@pytest.mark.parametrize(("params", "status"), [
    ({"limit": 0}, 422), ({"limit": 201}, 422), ({"node": "n" * 300}, 422), ({"q": "x" * 257}, 422),
    ({"cursor": "not-a-cursor"}, 400), ({"since": "yesterday"}, 422)], ids=str)
def test_inputs_are_bounded(served: Served, params: dict[str, Any], status: int) -> None:
    assert get(served, "/v1/audit/incidents", **params).status_code == status


def test_an_unknown_incident_is_404(served: Served) -> None:
    r = get(served, "/v1/audit/incidents/inc-does-not-exist")
    assert r.status_code == 404 and "inc-does-not-exist" in r.json()["error"]


def test_token_scopes(demo: DemoStore, served: Served) -> None:
    url = served.base + "/v1/audit/incidents"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {EVENTS_TOKEN}"}).status_code == 403
    assert httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    assert httpx.get(url, headers=AUTH).status_code == 200
    assert httpx.get(url, cookies={"remediator_audit_token": AUDITOR_TOKEN}).status_code == 200
    page = httpx.get(served.base + "/audit/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/audit/login")
    assert httpx.get(served.base + "/audit/", cookies={"remediator_audit_token": EVENTS_TOKEN}).status_code == 403
    html = httpx.get(served.base + "/audit/", cookies={"remediator_audit_token": AUDITOR_TOKEN})
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert demo.xid79_incident in html.text


def audit_paths(served: Served, demo: DemoStore) -> list[str]:
    spec = httpx.get(served.base + "/openapi.json").json()
    paths = [p.replace("{incident}", demo.xid79_incident).replace("{node}", demo.xid79["node"])
             for p in spec["paths"] if p.startswith("/v1/audit")]
    pages = ["/audit/", "/audit/fleet", "/audit/login", f"/audit/incidents/{demo.xid79_incident}",
             f"/audit/nodes/{demo.xid79['node']}", "/audit/static/audit.css"]
    return paths + pages


def test_openapi_documents_every_audit_route(served: Served) -> None:
    spec = httpx.get(served.base + "/openapi.json").json()
    for path in ("/v1/audit/incidents", "/v1/audit/incidents/{incident}", "/v1/audit/nodes",
                 "/v1/audit/nodes/{node}", "/v1/audit/chains", "/v1/audit/approvals", "/v1/audit/fleet",
                 "/v1/audit/export"):
        assert set(spec["paths"][path]) == {"get"}, path
        assert spec["paths"][path]["get"]["summary"]


def test_no_route_mutates(demo: DemoStore, served: Served) -> None:
    before = get(served, "/v1/audit/chains").json()
    paths = audit_paths(served, demo)
    assert len(paths) >= 14
    for path in paths:
        assert get(served, path).status_code == 200, path
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            r = httpx.request(method, served.base + path, headers=AUTH, content=b"{}", timeout=30)
            assert r.status_code == 405, (method, path, r.status_code)
    after = get(served, "/v1/audit/chains").json()
    assert after == before  # not one record more on any chain


def test_chains_export_and_nodes(demo: DemoStore, served: Served) -> None:
    chains = get(served, "/v1/audit/chains").json()
    assert chains["ok"] is True
    assert sum(c["records"] for c in chains["chains"]) == len(demo.records)
    lines = get(served, "/v1/audit/export").text.splitlines()
    assert [json.loads(x) for x in lines] == demo.records
    one = get(served, "/v1/audit/export", incident=demo.xid79_incident).text.splitlines()
    assert [json.loads(x) for x in one] == demo.xid79_show
    nodes = {n["node"]: n for n in get(served, "/v1/audit/nodes").json()["nodes"]}
    assert nodes[demo.xid79["node"]]["records"] == sum(1 for r in demo.records if r["node"] == demo.xid79["node"])
    hist = get(served, f"/v1/audit/nodes/{demo.xid79['node']}", limit=5).json()
    assert len(hist["records"]) == 5 and hist["next_cursor"] == hist["records"][-1]["seq"] + 1
    assert demo.xid79_incident in [i["id"] for i in hist["incidents"]]


def test_the_fleet_under_the_auditor_role_reads_the_ledger_from_the_bus(demo: DemoStore, served: Served) -> None:
    # audit serve --data-dir reads as the store's auditor role, which may read the safety ledger and the
    # approvals (direct get of those keys only): breaker and budget come from the bus, not from a replica
    fleet = get(served, "/v1/audit/fleet").json()
    assert fleet["ledger_error"] is None
    assert fleet["breaker"]["open"] is False and fleet["chains_ok"] is True
    # the demo's Xid 79 node was escalated for a power cycle and is still out: a handover in the ledger
    assert any(demo.xid79["node"] in json.dumps(h) for h in fleet["handovers"]), fleet["handovers"]
    assert get(served, "/v1/audit/approvals").json() == {"pending": fleet["pending_approvals"]}
    opened = {i["id"] for i in fleet["open_incidents"]}
    finished = incidents_where(demo, lambda r: r["what"] == "playbook_finished")
    assert opened == incident_ids(demo.records) - finished


def test_audit_serve_refuses_to_start_without_tokens(demo: DemoStore, tmp_path: Path) -> None:
    from .audit_serve_support import cli
    proc = cli("audit", "serve", "--data-dir", str(tmp_path), "--http", "127.0.0.1:1", timeout=30,
               env={"REMEDIATOR_API_TOKENS": ""})
    assert proc.returncode != 0 and "--insecure-no-auth" in proc.stderr
