"""The client library's credential hook, throttled by the adapter: a rotated token still reaches the wire.

The library runs ``refresh_api_key_hook`` before every request, and the loaders' hooks re-apply the whole
configuration each time (its host setter re-reads every environment variable): about a fifth of the CPU of
a ``GET node``. The adapter runs the hook at most once per ``CREDENTIAL_HOOK_EVERY_S``. Checked with the
real loader (an ``exec`` credential plugin, as EKS or GKE configure one) and what a real HTTP server is
sent in ``Authorization``.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from remediator.adapters.kube import CREDENTIAL_HOOK_EVERY_S, KubeAdapter

# An exec credential plugin: a new token on every run, with an expiry inside the loader's five minutes of
# skew, so every run of the hook that the adapter lets through fetches a new one.
PLUGIN = """
import datetime, json, pathlib, sys
runs = pathlib.Path(sys.argv[1])
n = int(runs.read_text() or 0) + 1 if runs.exists() else 1
runs.write_text(str(n))
expiry = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": f"tok-{n}", "expirationTimestamp": expiry}}))
"""


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server answering ``GET /version``; the ``Authorization`` of each request, in order."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps({"major": "1", "minor": "31"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _exec_kubeconfig(tmp_path: Path, url: str) -> tuple[Path, Path]:
    plugin, runs = tmp_path / "plugin.py", tmp_path / "runs"
    plugin.write_text(PLUGIN)
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
            "args": [str(plugin), str(runs)], "interactiveMode": "Never"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, runs


def test_the_credential_hook_runs_once_per_interval_and_a_new_token_is_sent_after_it(
        tmp_path: Path, api_server: tuple[str, list[str]]) -> None:
    url, seen = api_server
    kubeconfig, runs = _exec_kubeconfig(tmp_path, url)
    now = [1000.0]
    adapter = KubeAdapter(str(kubeconfig), clock=lambda: now[0])
    try:
        assert runs.read_text() == "1"  # the loader's own run
        for _ in range(5):
            adapter.ping()
        # the first request runs the hook (a new token: the first one is within the skew); the next four do not
        assert seen == ["Bearer tok-2"] * 5, seen
        now[0] += CREDENTIAL_HOOK_EVERY_S
        adapter.ping()
        adapter.ping()
        assert seen[5:] == ["Bearer tok-3"] * 2, seen
        assert runs.read_text() == "3"
    finally:
        adapter.close()
