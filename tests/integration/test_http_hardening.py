"""HTTP hardening (issue 9, DESIGN.md §5), against the ingest app on a real nats-server and, for the
connection limits, under uvicorn with the service's limits: scoped tokens, a token list that parses to
nothing, the producers' id spaces, Content-Type, slow clients, the OpenAPI document and ``serve``'s refusal
to run an open API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from remediator import bus
from remediator.ingest.app import INSECURE_NO_AUTH, create_app
from remediator.ingest.auth import ApiTokens, TokenConfigError
from remediator.ingest.server import uvicorn_limits
from remediator.natsd import EmbeddedNats, free_port
from remediator.settings import Settings

pytestmark = pytest.mark.timeout(90)

JSON = {"Content-Type": "application/json"}
ALERT = {"version": "4", "status": "firing", "alerts": [{
    "status": "firing", "labels": {"alertname": "GpuXid", "Hostname": "gpu-node-1", "gpu": "0", "xid": "79"},
    "startsAt": "2026-11-30T03:12:00Z", "fingerprint": "3fa85f6457174562"}]}


def event(**over: Any) -> dict[str, Any]:
    return {"id": "api|ev-1", "node": "gpu-node-1", "kind": "xid", "code": 79, **over}


@contextlib.asynccontextmanager
async def ingest(url: str, **settings: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    nc, js = await bus.connect(url)
    s = Settings(nats_url=url, **settings)
    await bus.provision(js, s)
    app = create_app(settings=s, nc=nc, js=js)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingest") as client:
        yield app, client
    await nc.close()


class _QuietServer(uvicorn.Server):
    """uvicorn inside the test's loop: signals stay the test runner's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def served(app: Any, header_s: float) -> AsyncIterator[int]:
    """``app`` under uvicorn with the service's connection limits."""
    port = free_port()
    server = _QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                         lifespan="off", **uvicorn_limits(header_s, 5.0)))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("tokens", [" , ", ",", "  "], ids=["comma-space", "comma", "blank"])
def test_a_token_list_that_parses_to_nothing_is_an_error(tokens: str) -> None:
    if tokens.strip():
        with pytest.raises(TokenConfigError, match="holds no token"):
            ApiTokens.from_settings(tokens)
    else:  # unset (only blanks) is no list at all: authentication off, which serve refuses (below)
        assert not ApiTokens.from_settings(tokens)


def test_unknown_scopes_and_empty_token_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenConfigError, match="unknown token scope 'writer'"):
        ApiTokens.from_settings("writer:abc")
    empty = tmp_path / "tokens"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(TokenConfigError, match="holds no token"):
        ApiTokens.from_settings("", str(empty))
    with pytest.raises(TokenConfigError, match="cannot read"):
        ApiTokens.from_settings("", str(tmp_path / "missing"))


async def test_scoped_tokens_reach_only_their_endpoints(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alertmanager:am-secret\nevents:ev-secret  # the NCCL watcher\nadmin:root-secret\n")
    async with ingest(nats_server.url, api_tokens="bare-secret", api_tokens_file=str(tokens)) as (_, client):
        async def post(path: str, token: str, body: Any) -> int:
            r = await client.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
            return r.status_code

        assert await post("/v1/alertmanager", "am-secret", ALERT) == 200
        assert await post("/v1/events", "am-secret", [event()]) == 403
        assert await post("/v1/events", "ev-secret", [event()]) == 200
        assert await post("/v1/alertmanager", "ev-secret", ALERT) == 403
        assert await post("/v1/events", "root-secret", [event(id="api|ev-2")]) == 200
        assert await post("/v1/alertmanager", "bare-secret", ALERT) == 200  # bare TOKEN: every scope
        assert await post("/v1/events", "bare-secret", [event(id="api|ev-3")]) == 200
        assert await post("/v1/events", "guess", [event()]) == 401
        denied = await client.post("/v1/events", json=[event()], headers={"Authorization": "Bearer am-secret"})
        assert 'error="insufficient_scope"' in denied.headers["WWW-Authenticate"]


@pytest.mark.parametrize(("over", "field"), [
    pytest.param({"source": "alertmanager"}, "events[0].source", id="alertmanager-source"),
    pytest.param({"source": "agent"}, "events[0].source", id="agent-source"),
    pytest.param({"id": "alertmanager|3fa85f6457174562|firing|2026-11-30T03:12:00+00:00"}, "events[0].id",
                 id="alertmanager-id"),
    pytest.param({"id": "agent|gpu-node-1|boot|17"}, "events[0].id", id="agent-id"),
])
async def test_events_may_not_claim_another_producers_source_or_ids(nats_server: EmbeddedNats, over: dict[str, Any],
                                                                    field: str) -> None:
    async with ingest(nats_server.url, api_tokens="t") as (_, client):
        r = await client.post("/v1/events", json=[event(**over)], headers={"Authorization": "Bearer t"})
        assert r.status_code == 422 and r.json()["field"] == field
        # and so the real alert is not pre-empted as a duplicate
        real = await client.post("/v1/alertmanager", json=ALERT, headers={"Authorization": "Bearer t"})
        assert real.status_code == 200 and real.json()["accepted"] == 1


async def test_content_type_is_checked(nats_server: EmbeddedNats) -> None:
    async with ingest(nats_server.url, api_tokens="t") as (_, client):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Authorization": "Bearer t", **({"Content-Type": ctype} if ctype else {})}
            r = await client.post("/v1/alertmanager", content=b"{}", headers=headers)
            assert r.status_code == 415 and r.json()["field"] == "Content-Type"
        ok = await client.post("/v1/events", content=b"[]",
                               headers={"Authorization": "Bearer t", "Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200


async def test_insecure_mode_says_so_in_readyz(nats_server: EmbeddedNats) -> None:
    async with ingest(nats_server.url, insecure_no_auth=True) as (_, client):
        body = (await client.get("/readyz")).json()
        assert body["auth"] == INSECURE_NO_AUTH
    async with ingest(nats_server.url, api_tokens="t") as (_, client):
        assert "auth" not in (await client.get("/readyz")).json()


async def test_the_openapi_document_declares_bodies_bearer_and_errors(nats_server: EmbeddedNats) -> None:
    async with ingest(nats_server.url, api_tokens="t") as (_, client):
        doc = (await client.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["bearer"] == {**doc["components"]["securitySchemes"]["bearer"],
                                                               "type": "http", "scheme": "bearer"}
    for path, schema in (("/v1/alertmanager", "AlertmanagerPayload"), ("/v1/events", "InboundEvents")):
        op = doc["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{schema}" and schema in doc["components"]["schemas"]
        assert op["security"] == [{"bearer": []}]
        assert {"400", "401", "403", "408", "413", "415", "422", "503"} <= set(op["responses"])
    assert "alerts" in doc["components"]["schemas"]["AlertmanagerPayload"]["properties"]


def _closed_within(sock: socket.socket, bound_s: float) -> bytes:
    """What the server sent before it closed ``sock`` (the read fails if it is still open after ``bound_s``)."""
    sock.settimeout(bound_s)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


async def test_slow_clients_are_closed_in_bounded_time(nats_server: EmbeddedNats) -> None:
    async with ingest(nats_server.url, api_tokens="t", http_body_timeout_s=0.5) as (app, _), \
            served(app, header_s=0.5) as port:
        # 200 clients that open a connection and dribble a request head that never ends
        slow = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/alertmanager HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(s)
        silent = socket.create_connection(("127.0.0.1", port))  # and one that sends nothing at all
        results = await asyncio.gather(*(asyncio.to_thread(_closed_within, s, 10.0) for s in [*slow, silent]))
        assert all(r == b"" for r in results)  # closed by the server, no answer owed
        for s in [*slow, silent]:
            s.close()
        # a body that stops arriving is answered 408 and the connection closed
        body = socket.create_connection(("127.0.0.1", port))
        body.sendall(b"POST /v1/alertmanager HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"version\":")
        answer = await asyncio.to_thread(_closed_within, body, 10.0)
        body.close()
        assert answer.startswith(b"HTTP/1.1 408 ")
        # the server still serves
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATOR_")}
    return subprocess.run([sys.executable, "-m", "remediator.cli", "serve", "--kubeconfig",
                           str(tmp_path / "kubeconfig"), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("env", "says"), [
    pytest.param({}, "no API tokens", id="no-tokens"),
    pytest.param({"REMEDIATOR_API_TOKENS": " , "}, "holds no token", id="parses-to-nothing"),
    pytest.param({"REMEDIATOR_API_TOKENS": "reader:x"}, "unknown token scope", id="unknown-scope"),
])
def test_serve_refuses_to_start_without_usable_tokens(tmp_path: Path, env: dict[str, str], says: str) -> None:
    done = _serve(tmp_path, "--nats", f"nats://127.0.0.1:{free_port()}", **env)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
