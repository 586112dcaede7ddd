"""The chart's bundled NATS in operator mode, against a real nats-server: what ``remediator bus operator``
writes, laid out as the chart mounts it and included the way ``deploy/chart/values.yaml`` tells the
official NATS chart to include it, makes a server that admits the service's and admin's credentials, runs
the bus (``bus init``), and holds an agent issued with ``bus creds --signing-key`` (the production path) to
its own node.

The official chart is not vendored (no registry this project reaches serves it), so its ``nats.conf`` is
not rendered here; ``chart_like_config`` writes the parts our values set — the ``NN$include`` keys of
``nats.config.merge`` as include directives relative to ``/etc/nats-config`` (as that chart documents),
``nats.config.resolver.merge`` as the resolver block, JetStream on — and the Secret's file at the path of
the volume mount ``nats.container.patch`` adds.
"""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml

from remediator import bus
from remediator.cli.bus import CHART_SECRETS
from remediator.identity import creds
from remediator.natsd import find_nats_server, free_port

ROOT = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((ROOT / "deploy" / "chart" / "values.yaml").read_text())["nats"]
CONFIG_DIR = "/etc/nats-config"  # where the official chart mounts its ConfigMap (nats.conf)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def _auth_mount() -> tuple[str, str]:
    """(mount path, Secret name) of the auth Secret the values patch into the NATS pods."""
    (mount,) = [p["value"] for p in VALUES["container"]["patch"] if p["path"] == "/volumeMounts/-"]
    (volume,) = [p["value"] for p in VALUES["podTemplate"]["patch"] if p["path"] == "/spec/volumes/-"]
    assert mount["name"] == volume["name"]
    return mount["mountPath"], volume["secret"]["secretName"]


def chart_like_config(root: Path, auth_conf: Path, port: int) -> Path:
    """A ``nats.conf`` under ``root`` + CONFIG_DIR with what our values make the official chart render, and
    ``auth_conf`` copied where the Secret is mounted (``root`` stands for the container's ``/``)."""
    mount, _secret = _auth_mount()
    (root / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / mount.lstrip("/") / "auth.conf").write_text(auth_conf.read_text())
    lines = [f"include {v};" for k, v in sorted(VALUES["config"]["merge"].items()) if k.endswith("$include")]
    resolver = {**VALUES["config"]["resolver"]["merge"], "dir": str(root / "data" / "resolver")}
    lines += [f"port: {port}", "host: 127.0.0.1",
              f"jetstream: {{store_dir: {json.dumps(str(root / 'data' / 'js'))}}}",
              "resolver: {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in resolver.items()) + "}"]
    config = root / CONFIG_DIR.lstrip("/") / "nats.conf"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join(lines) + "\n")
    return config


@pytest.fixture
def operator_bus(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(URL, ``bus operator --json`` document) of a nats-server running the chart-like configuration."""
    made = _cli("bus", "operator", "--data-dir", str(tmp_path / "op"), "--json")
    assert made.returncode == 0, made.stderr
    doc = {**json.loads(made.stdout), "data_dir": str(tmp_path / "op")}
    port = free_port()
    config = chart_like_config(tmp_path / "root", Path(doc["secrets"]["gpu-remediator-nats-auth"]["file"]), port)
    proc = subprocess.Popen([find_nats_server(), "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not listen within 15 s"
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}", doc
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_the_include_path_reaches_the_mounted_secret() -> None:
    mount, secret = _auth_mount()
    (include,) = [v for k, v in VALUES["config"]["merge"].items() if k.endswith("$include")]
    assert posixpath.normpath(posixpath.join(CONFIG_DIR, include)) == f"{mount}/auth.conf"
    assert CHART_SECRETS[secret][0] == "auth.conf"  # the key `bus operator` names for that Secret
    for name in VALUES["credentials"].values():  # every Secret the chart reads is one bus operator writes
        assert name in CHART_SECRETS, name


async def _refusal(url: str, **opts: Any) -> str | None:
    from nats.aio.client import Client

    nc = Client()
    try:
        await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **opts)
    except (nats.errors.Error, OSError) as e:
        return str(e) or type(e).__name__
    finally:
        await nc.close()
    return None


async def test_the_bundled_nats_runs_the_services_accounts_and_holds_an_agent_to_its_node(
        operator_bus: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, doc = operator_bus
    files = {name: s["file"] for name, s in doc["secrets"].items()}
    admin = files["gpu-remediator-nats-admin"]
    assert "Authorization Violation" in (await _refusal(url) or "")  # no anonymous client

    init = _cli("bus", "init", "--nats", url, env={"REMEDIATOR_NATS_CREDS_FILE": admin})
    assert init.returncode == 0, init.stderr
    nc, js = await bus.connect(url, name="service", credentials=bus.Credentials(
        creds_file=files["gpu-remediator-nats-service"]))
    try:
        assert (await js.stream_info("FAULTS")).config.name == "FAULTS"
    finally:
        await nc.close()

    # the production issuance: the agents' scoped signing key and the account's public key
    agent = tmp_path / "gpu-node-1.creds"
    made = _cli("bus", "creds", "--role", "agent", "--node", "gpu-node-1", "--out", str(agent),
                "--signing-key", files["gpu-remediator-nats-agent-signer"], "--account", doc["account"],
                "--ttl", "3600", "--nats", url, "--json", env={"REMEDIATOR_NATS_CREDS_FILE": admin})
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["announced"] is True
    seed = creds.read_seed(agent).seed.decode()
    assert seed not in made.stdout + made.stderr

    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc, js = await bus.connect(url, name="agent", credentials=bus.Credentials(creds_file=str(agent)),
                               error_cb=on_error)
    try:
        ack = await js.publish("faults.agent.gpu-node-1", b"{}", headers={"Nats-Msg-Id": "op-1"})
        assert ack.stream == "FAULTS"
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("faults.agent.gpu-node-2", b"{}", timeout=1.0)
        await nc.subscribe("agent.gpu-node-2.cmd")
        await nc.publish("audit.gpu-node-1", b"{}")
        await nc.flush()
        deadline = time.monotonic() + 10
        while len(errors) < 3:
            assert time.monotonic() < deadline, errors
            await asyncio.sleep(0.1)
        assert any('publish to "faults.agent.gpu-node-2"' in e for e in errors), errors
        assert any('subscription to "agent.gpu-node-2.cmd"' in e for e in errors), errors
        assert any('publish to "audit.gpu-node-1"' in e for e in errors), errors
    finally:
        await nc.close()

    # revocation on the running servers, no restart: the account JWT pushed to their full resolver
    assert await _refusal(url, user_credentials=str(agent)) is None
    agent_key = creds.read_seed(agent).public_key
    revoked = _cli("bus", "operator", "--data-dir", doc["data_dir"], "--revoke", agent_key, "--push", url, "--json")
    assert revoked.returncode == 0, revoked.stderr
    assert agent_key in json.loads(revoked.stdout)["revoked"]
    deadline = time.monotonic() + 10
    while await _refusal(url, user_credentials=str(agent)) is None:
        assert time.monotonic() < deadline, "the revoked agent is still admitted"
        await asyncio.sleep(0.2)
    assert await _refusal(url, user_credentials=files["gpu-remediator-nats-service"]) is None  # others unaffected

    # the scoped key mints agents only: a service role it signed is refused by the servers
    forged = tmp_path / "forged-service.creds"
    made = _cli("bus", "creds", "--role", "service", "--out", str(forged), "--signing-key",
                files["gpu-remediator-nats-agent-signer"], "--account", doc["account"])
    assert made.returncode == 0, made.stderr
    assert await _refusal(url, user_credentials=str(forged)) is not None


def test_bus_operator_is_stable_across_runs_and_prints_no_secret(tmp_path: Path) -> None:
    first = _cli("bus", "operator", "--data-dir", str(tmp_path / "op"), "--json")
    again = _cli("bus", "operator", "--data-dir", str(tmp_path / "op"), "--json")
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    for key in ("operator", "system_account", "account", "agents_signing_key", "service_key"):
        assert one[key] == two[key], key  # what was issued from it stays valid
    out = Path(one["out"])
    assert (out.stat().st_mode & 0o777) == 0o700
    secrets = [creds.read_seed(out / "service" / "user.creds").seed.decode(),
               creds.read_seed(out / "admin" / "user.creds").seed.decode(),
               (out / "agent-signer" / "seed").read_text().strip(), (out / "signing" / "seed").read_text().strip()]
    for run in (first, again):
        for seed in secrets:
            assert seed and seed not in run.stdout + run.stderr
    for s in one["secrets"].values():
        assert (Path(s["file"]).stat().st_mode & 0o777) == 0o600
    assert "kubectl -n NAMESPACE create secret generic gpu-remediator-nats-auth" in first.stderr
