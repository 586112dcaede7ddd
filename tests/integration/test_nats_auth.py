"""NATS decentralized auth against a real nats-server: ``remediator serve`` with its embedded defaults admits
no anonymous client, and one node's agent credentials speak for that node only (issue 9's "done when").

The service runs as an operator runs it (a subprocess against the Kubernetes API simulator, embedded
nats-server in operator mode on ``--nats-port`` with its store in ``--data-dir``); the agent credentials
come from ``remediator bus creds --role agent --node gpu-node-1 --data-dir DIR``, as a person would make them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from chaos.sim import KubeApiServer, seed_cluster
from chaos.sim.cluster import ClusterState
from remediator import bus
from remediator.audit import iter_records
from remediator.contracts import FaultEvent, GpuRef
from remediator.identity import creds
from remediator.natsd import free_port
from remediator.subjects import STATE_BUCKET, agent_key_key
from tests.integration.serve_support import wait_ready

TOKEN = "t0k3n"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", *args], env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ClusterState, str, Path]]:
    """``remediator serve --kubeconfig K --http H:P --data-dir DIR --nats-port NP``: (cluster, NATS URL, DIR)."""
    cluster = seed_cluster(nodes=3)
    with KubeApiServer(cluster) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        http_port, nats_port, data_dir = free_port(), free_port(), tmp_path / "data"
        proc = subprocess.Popen(
            [sys.executable, "-m", "remediator.cli", "serve", "--kubeconfig", str(kubeconfig),
             "--http", f"127.0.0.1:{http_port}", "--data-dir", str(data_dir), "--nats-port", str(nats_port)],
            env={**os.environ, "REMEDIATOR_API_TOKENS": TOKEN}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            wait_ready(proc, f"http://127.0.0.1:{http_port}", timeout_s=60)
            (data_dir / "http").write_text(f"http://127.0.0.1:{http_port}")
            yield cluster, f"nats://127.0.0.1:{nats_port}", data_dir
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]


def _http_base(data_dir: Path) -> str:
    return (data_dir / "http").read_text()


def _xid79(node: str, seq: int, *, body_node: str | None = None) -> FaultEvent:
    now = datetime.now(UTC)
    return FaultEvent(id=f"agent|{node}|boot-1|{seq}", source="agent", node=body_node or node,
                      gpu=GpuRef(index=1, pci_bus_id="0000:3b:00.0"), kind="xid", code=79, is_fatal=True,
                      message="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", observed_at=now,
                      received_at=now)


async def _refusal(url: str, **opts: object) -> str | None:
    """Why the server refuses a connection with ``opts`` (None: it admitted it); the client is closed
    either way (nats-py leaves a refused client's socket open otherwise)."""
    from nats.aio.client import Client

    nc = Client()
    try:
        await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **opts)
    except (nats.errors.Error, OSError) as e:  # a refusal, or the server cutting the connection off
        return str(e) or type(e).__name__
    finally:
        await nc.close()
    return None


async def _until(predicate: object, what: str, timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate() if callable(predicate) else predicate
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:g}s: {what}")


async def test_anonymous_refused_and_agent_creds_speak_for_their_node_only(
        served: tuple[ClusterState, str, Path], tmp_path: Path) -> None:
    cluster, url, data_dir = served

    assert "Authorization Violation" in (await _refusal(url) or "")

    out = tmp_path / "gpu-node-1.creds"
    made = _cli("bus", "creds", "--role", "agent", "--node", "gpu-node-1", "--out", str(out),
                "--data-dir", str(data_dir), "--json")
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    issued_key = creds.read_seed(out).public_key
    secret_seed = creds.read_seed(out).seed.decode()
    for text in (made.stdout, made.stderr):  # neither the seed nor the JWT is ever printed
        assert secret_seed not in text and creds.read_jwt(out) not in text
    doc = json.loads(made.stdout)
    assert doc["public_key"] == issued_key and doc["announced"] is True

    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc, js = await bus.connect(url, name="agent-gpu-node-1", credentials=bus.Credentials(creds_file=str(out)),
                               error_cb=on_error)
    admin_nc, admin_js = await bus.connect(url, name="test-admin", credentials=bus.Credentials(
        creds_file=str(data_dir / "identity" / "creds" / "admin.creds")))
    try:
        # the executor's trust anchor for this agent's replies is the key of the creds just issued
        entry = await (await admin_js.key_value(STATE_BUCKET)).get(agent_key_key("gpu-node-1"))
        assert entry.value is not None and json.loads(entry.value)["public_key"] == issued_key

        # its own node, but a body naming another: delivered, refused by dispatch and audited
        forged = _xid79("gpu-node-1", 1, body_node="gpu-node-2")
        await js.publish("faults.agent.gpu-node-1", forged.model_dump_json().encode(),
                         headers={"Nats-Msg-Id": forged.id})
        # another node's subject: refused by the server
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("faults.agent.gpu-node-2", _xid79("gpu-node-2", 2).model_dump_json().encode(),
                             timeout=1.0)
        # its own node: accepted, and the node is cordoned
        await bus.publish_event(js, _xid79("gpu-node-1", 3))
        await _until(lambda: cluster.is_cordoned("gpu-node-1"), "gpu-node-1 cordoned")

        async def mismatch_audited() -> bool:
            records = [r async for r in iter_records(admin_js)]
            return any(r.what == "event_ignored" and (r.after or {}).get("refused") == "subject_mismatch"
                       for r in records)

        await _until(mismatch_audited, "the body/subject mismatch audited as event_ignored")
        async with httpx.AsyncClient(timeout=5) as http:
            metrics = (await http.get(_http_base(data_dir) + "/metrics")).text
        assert 'remediator_events_refused_total{reason="subject_mismatch"} 1' in metrics, metrics
        assert not cluster.is_cordoned("gpu-node-2")
        assert not [t for t in cluster.taints("gpu-node-2") if t["key"].startswith("gpu-remediator")]

        # another node's commands, the KV and the audit trail are out of reach
        await nc.subscribe("agent.gpu-node-2.cmd")
        await nc.publish(f"$KV.{STATE_BUCKET}.node.gpu-node-2", b"{}")
        await nc.publish("audit.gpu-node-1", b"{}")
        await nc.flush()
        await _until(lambda: len(errors) >= 4, f"four permission violations, got {errors}")
        assert any('publish to "faults.agent.gpu-node-2"' in e for e in errors), errors
        assert any('subscription to "agent.gpu-node-2.cmd"' in e for e in errors), errors
        assert any(f'publish to "$kv.{STATE_BUCKET}.node.gpu-node-2"' in e.lower() for e in errors), errors
        assert any('publish to "audit.gpu-node-1"' in e for e in errors), errors
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.request("agent.gpu-node-2.cmd", b"{}", timeout=1.0)  # nor ask another node's agent
    finally:
        await nc.close()
        await admin_nc.close()


async def test_a_revoked_agent_is_refused_after_reload(tmp_path: Path) -> None:
    from remediator.natsd import EmbeddedNats

    with EmbeddedNats(data_dir=str(tmp_path / "data"), secure=True) as server:
        assert server.store is not None
        issued = server.store.issue("agent", node="gpu-node-1", now=datetime.now(UTC))
        path = creds.write(tmp_path / "a.creds", issued.jwt, issued.user)
        nc, _js = await bus.connect(server.url, name="agent", credentials=bus.Credentials(creds_file=str(path)))
        await nc.close()
        server.store.revoke(issued.user.public_key, now=datetime.now(UTC))
        server.reload()

        async def refused() -> bool:
            return await _refusal(server.url, user_credentials=str(path)) is not None

        await _until(refused, "the revoked agent refused")
        other = server.store.issue("agent", node="gpu-node-2", now=datetime.now(UTC))
        other_path = creds.write(tmp_path / "b.creds", other.jwt, other.user)
        assert await _refusal(server.url, user_credentials=str(other_path)) is None  # another agent is not affected


async def test_an_agent_pod_trades_its_serviceaccount_token_for_its_nodes_credentials(
        served: tuple[ClusterState, str, Path], tmp_path: Path) -> None:
    from chaos.sim.tokens import tokens_of

    cluster, url, data_dir = served
    base = _http_base(data_dir)
    authority = tokens_of(cluster)

    def pod_on(node: str, prefix: str) -> dict[str, object]:
        return next(p for p in cluster.pods_on(node) if p["metadata"]["name"].startswith(prefix))

    agent_pod = pod_on("gpu-node-1", "gpu-remediator-agent-")
    token = authority.issue("gpu-remediator", agent_pod["metadata"]["name"], audience="gpu-remediator")

    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        def ask(bearer: str | None, node: str) -> object:
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            return http.post("/v1/identity/agent", json={"node": node}, headers=headers)

        refused = {
            "no token": (await ask(None, "gpu-node-1")).status_code,
            "unknown token": (await ask("sim.forged", "gpu-node-1")).status_code,
            "another node": (await ask(token, "gpu-node-2")).status_code,
            "another audience": (await ask(authority.issue(
                "gpu-remediator", agent_pod["metadata"]["name"], audience="other"), "gpu-node-1")).status_code,
            "not the agent's pod": (await ask(authority.issue(
                "training", pod_on("gpu-node-1", "pytorch-")["metadata"]["name"], audience="gpu-remediator"),
                "gpu-node-1")).status_code,
        }
        assert refused == {"no token": 401, "unknown token": 401, "another node": 403, "another audience": 401,
                           "not the agent's pod": 403}
        metrics = (await http.get("/metrics")).text  # each refusal counted by its reason
        for line in ('remediator_identity_refusals_total{reason="no_token"} 1',
                     'remediator_identity_refusals_total{reason="not_authenticated"} 2',
                     'remediator_identity_refusals_total{reason="other_node"} 1',
                     'remediator_identity_refusals_total{reason="wrong_namespace"} 1'):
            assert line in metrics, metrics
        assert "remediator_identity_issued_total" not in metrics

        answer = await ask(token, "gpu-node-1")
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        assert "remediator_identity_issued_total 1" in (await http.get("/metrics")).text
        path = tmp_path / "issued.creds"
        path.write_text(doc["creds"])
        path.chmod(0o600)
        assert doc["public_key"] == creds.read_seed(path).public_key and doc["expires_at"]

        errors: list[str] = []

        async def on_error(e: Exception) -> None:
            errors.append(str(e))

        nc, js = await bus.connect(url, name="agent-issued", credentials=bus.Credentials(creds_file=str(path)),
                                   error_cb=on_error)
        admin_nc, admin_js = await bus.connect(url, name="test-admin", credentials=bus.Credentials(
            creds_file=str(data_dir / "identity" / "creds" / "admin.creds")))
        try:
            assert (await bus.publish_event(js, _xid79("gpu-node-1", 7))).stream == "FAULTS"
            await nc.publish("faults.agent.gpu-node-2", b"{}")
            await nc.flush()
            await _until(lambda: any('"faults.agent.gpu-node-2"' in e for e in errors), "node 2 refused")
            entry = await (await admin_js.key_value(STATE_BUCKET)).get(agent_key_key("gpu-node-1"))
            assert entry.value is not None and json.loads(entry.value)["public_key"] == doc["public_key"]
        finally:
            await nc.close()
            await admin_nc.close()

        cluster.delete("pods", agent_pod["metadata"]["name"], "gpu-remediator")  # the bound pod is gone
        assert (await ask(token, "gpu-node-1")).status_code == 401


async def test_the_agent_gets_its_credentials_from_the_service_and_reports_for_its_node(
        served: tuple[ClusterState, str, Path], tmp_path: Path) -> None:
    """``remediator agent --identity-url --identity-token-file``, as the chart's DaemonSet runs it: its key
    stays on the node, its JWT comes from the service, and a kernel Xid 79 it reads gets its node cordoned."""
    from chaos.sim.gpu_node import SimGpuNode
    from chaos.sim.tokens import tokens_of
    from remediator.identity import client

    cluster, url, data_dir = served
    agent_pod = next(p for p in cluster.pods_on("gpu-node-1")
                     if p["metadata"]["name"].startswith("gpu-remediator-agent-"))
    token_file = tmp_path / "token"
    token_file.write_text(tokens_of(cluster).issue("gpu-remediator", agent_pod["metadata"]["name"],
                                                   audience="gpu-remediator"))
    state = tmp_path / "agent"
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once; the loop never waits on it
        [sys.executable, "-m", "remediator.cli", "agent", "--node", "gpu-node-1", "--sim-gpus", "2", "--state",
         str(state), "--nats", url, "--identity-url", _http_base(data_dir), "--identity-token-file", str(token_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    admin_nc, admin_js = await bus.connect(url, name="test-admin", credentials=bus.Credentials(
        creds_file=str(data_dir / "identity" / "creds" / "admin.creds")))
    try:
        async def announced() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                entry = await (await admin_js.key_value(STATE_BUCKET)).get(agent_key_key("gpu-node-1"))
            except Exception:
                return False
            return entry.value is not None and json.loads(entry.value)["public_key"] == (
                client.agent_key(state).public_key)

        await _until(announced, "the agent's own key announced as gpu-node-1's")
        # the service announces the key as it issues the JWT; the agent writes its file once the answer is in
        creds_file = state / "identity" / "nats.creds"
        await _until(creds_file.exists, "the agent's credentials written")
        assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
        await _until(lambda: (state / "sim" / "state.json").exists(), "the simulated node written")
        SimGpuNode.attach(state / "sim").inject_xid(1, 79)
        await _until(lambda: cluster.is_cordoned("gpu-node-1"), "gpu-node-1 cordoned from the agent's report")
        assert not cluster.is_cordoned("gpu-node-2")
    finally:
        await admin_nc.close()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


async def test_a_user_jwt_without_permissions_can_do_nothing(tmp_path: Path) -> None:
    """A JWT the plain roles key signed without permissions or limits (a mistake, or a forged role) gets the
    account's deny-all defaults and zero limits: the server refuses it at connect or drops it at its first publish."""
    from remediator.identity import jwt, keys
    from remediator.natsd import EmbeddedNats

    with EmbeddedNats(data_dir=str(tmp_path / "data"), secure=True) as server:
        store = server.store
        assert store is not None
        user = keys.create("user")
        claims = jwt.user_claims(user.public_key, name="bare", iat=int(datetime.now(UTC).timestamp()), exp=None,
                                 issuer_account=store.account.public_key, permissions=None,
                                 tags=["role:agent", "node:gpu-node-1"])
        path = creds.write(tmp_path / "bare.creds", jwt.encode(claims, store.roles_key), user)
        refusal = await _refusal(server.url, user_credentials=str(path))
        if refusal is None:  # admitted at connect: dropped at its first publish instead
            from nats.aio.client import Client

            nc = Client()
            try:
                await nc.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2,
                                 user_credentials=str(path))
            except (nats.errors.Error, OSError) as e:  # or refused at this connect (the server's order varies)
                refusal = str(e) or type(e).__name__
                await nc.close()
        if refusal is None:
            try:
                await nc.publish("faults.agent.gpu-node-1", b"{}")
                with contextlib.suppress(nats.errors.Error, TimeoutError):  # no PONG comes back: dropped
                    await nc.flush(timeout=2)
                await _until(lambda: not nc.is_connected, "the connection dropped by the server")
            finally:
                await nc.close()
        log = store.root / "nats-server.log"
        # only this user ever connected to this server: every limit refusal in its log is this user's
        await _until(lambda: "maximum" in log.read_text() and "exceeded" in log.read_text(),
                     "the server's refusal logged")
