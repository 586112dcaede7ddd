"""``remediator audit`` as an operator runs it: against a running bus (one URL or a comma-separated list) and
against a stopped store (``--data-dir``), with the timestamps the audit itself prints, failing in one line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from remediator import bus
from remediator.audit import AuditContext, AuditLog
from remediator.cli.audit import format_record, parse_time
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats, free_port
from remediator.settings import Settings

pytestmark = pytest.mark.timeout(90)

T0 = datetime(2026, 11, 30, 3, 12, 0, 123456, tzinfo=UTC)
FP = "3fa85f6457174562"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", "audit", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def records_of(out: subprocess.CompletedProcess[str]) -> list[AuditRecord]:
    assert out.returncode == 0, out.stderr
    return [AuditRecord.model_validate(x) for x in json.loads(out.stdout)]


def nats_children() -> list[int]:
    """nats-server processes that are children of this test process (an embedded one left running)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if comm == "nats-server" and int(rest[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


async def write_trail(url: str) -> list[AuditRecord]:
    """Two incidents' worth of records, one second apart, the first alert's carrying its fingerprint."""
    times = iter(T0 + timedelta(seconds=i) for i in range(100))
    nc, js = await bus.connect(url)
    try:
        await bus.provision(js, Settings(nats_url=url))
        audit = AuditLog(js, "test", clock=lambda: next(times))
        alert = audit.bind(AuditContext(node="gpu-node-1", gpu="GPU-1", event_id="alertmanager|fp|firing|t",
                                        fingerprint=FP, trace_id="0af7651916cd43dd8448eb211c80319c"))
        out = [await alert.append("event_accepted", "xid 79 from alertmanager")]
        incident = alert.for_incident("inc-a")
        out += [await incident.append("decision", "Xid 79", after={"playbook": "gpu-lost"}),
                await incident.append("playbook_finished", "gpu-lost: escalated", after={"outcome": "escalated"})]
        other = audit.bind(AuditContext(node="gpu-node-2", incident="inc-b", event_id="agent|gpu-node-2|b|1"))
        out.append(await other.append("decision", "Xid 48", after={"playbook": "gpu-memory-fatal"}))
        return out
    finally:
        await nc.close()


@pytest.fixture
def stopped_store(tmp_path: Path) -> tuple[Path, list[AuditRecord]]:
    """A JetStream store with an audit trail in it, its server stopped (as the demo leaves it)."""
    store = tmp_path / "store"
    with EmbeddedNats(data_dir=str(store)) as server:
        written = asyncio.run(write_trail(server.url))
    return store, written


def test_list_by_fingerprint_on_a_stopped_store(stopped_store: tuple[Path, list[AuditRecord]]) -> None:
    store, written = stopped_store
    got = records_of(cli("list", "--data-dir", str(store), "--fingerprint", FP, "--json"))
    assert [r.what for r in got] == ["event_accepted", "decision", "playbook_finished"]
    assert got == written[:3]
    assert nats_children() == []  # the embedded server is stopped again
    # and the store is free: every other verb opens it too
    assert records_of(cli("list", "--data-dir", str(store), "--json")) == written
    shown = cli("show", "inc-a", "--data-dir", str(store))
    assert shown.returncode == 0 and format_record(written[1]) in shown.stdout
    verified = cli("verify", "--data-dir", str(store), "--json")
    assert verified.returncode == 0 and {c["chain"]: c["records"] for c in json.loads(verified.stdout)} == {
        "gpu-node-1": 3, "gpu-node-2": 1}
    exported = cli("export", "--data-dir", str(store))
    assert [AuditRecord.model_validate_json(line) for line in exported.stdout.splitlines()] == written
    assert nats_children() == []


def test_a_failing_command_on_a_stopped_store_still_stops_the_server(
        stopped_store: tuple[Path, list[AuditRecord]]) -> None:
    store, _ = stopped_store
    out = cli("show", "inc-nope", "--data-dir", str(store))
    assert out.returncode == 1
    assert out.stderr.strip() == "Error: no audit records for incident inc-nope"
    assert nats_children() == []


@pytest.mark.parametrize("form", ["printed", "json", "json-utc-offset"])
def test_since_and_until_take_the_timestamps_the_audit_prints(
        stopped_store: tuple[Path, list[AuditRecord]], form: str) -> None:
    store, written = stopped_store
    second = written[1]
    stamp: dict[str, Any] = {
        "printed": format_record(second).split(" ", 1)[0],               # 2026-11-30T03:12:01.123Z
        "json": second.model_dump(mode="json")["time"],                   # ...01.123456Z
        "json-utc-offset": second.time.isoformat(),                       # ...01.123456+00:00
    }
    got = records_of(cli("list", "--data-dir", str(store), "--since", stamp[form], "--until", stamp[form],
                         "--json"))
    assert got == [second]


def test_a_comma_separated_url_is_a_list_of_servers(tmp_path: Path) -> None:
    with EmbeddedNats() as server:
        written = asyncio.run(write_trail(server.url))
        urls = f"nats://127.0.0.1:{free_port()}, {server.url}"  # the first one is down
        assert records_of(cli("list", "--nats", urls, "--node", "gpu-node-2", "--json")) == written[3:]
        assert records_of(cli("list", "--json", env={"REMEDIATOR_NATS_URL": urls})) == written


@pytest.mark.parametrize(("args", "code", "message"), [
    (["list", "--nats", "nats://127.0.0.1:{port}"], 1, "Error: cannot reach NATS at nats://127.0.0.1:{port}"),
    (["list", "--data-dir", "{empty}"], 1, "Error: {empty} holds no JetStream store"),
    (["verify", "--data-dir", "{empty}", "--nats", "nats://x:4222"], 2, "give either --data-dir or --nats"),
    (["list", "--since", "last tuesday", "--nats", "nats://x:4222"], 2, "is not an ISO 8601 time"),
], ids=["no-server", "no-store", "both", "bad-time"])
def test_failures_are_one_line_without_a_traceback(tmp_path: Path, args: list[str], code: int,
                                                   message: str) -> None:
    subst = {"port": str(free_port()), "empty": str(tmp_path)}
    out = cli(*(a.format(**subst) for a in args), env={"REMEDIATOR_NATS_URL": ""})
    assert out.returncode == code, out.stderr
    assert message.format(**subst) in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_no_stream_on_the_server_is_named(nats_server: EmbeddedNats) -> None:
    out = cli("list", "--nats", nats_server.url)
    assert out.returncode == 1 and "no AUDIT stream" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("text", "start", "end"), [
    ("2026-11-30T03:12:01.123Z", "2026-11-30T03:12:01.123000+00:00", "2026-11-30T03:12:01.123999+00:00"),
    ("2026-11-30T03:12:01.123456+00:00", "2026-11-30T03:12:01.123456+00:00", "2026-11-30T03:12:01.123456+00:00"),
    ("2026-11-30T03:12:01Z", "2026-11-30T03:12:01+00:00", "2026-11-30T03:12:01.999999+00:00"),
    ("2026-11-30T04:12:01+01:00", "2026-11-30T03:12:01+00:00", "2026-11-30T03:12:01.999999+00:00"),
    ("2026-11-30 03:12", "2026-11-30T03:12:00+00:00", "2026-11-30T03:12:59.999999+00:00"),
    ("2026-11-30", "2026-11-30T00:00:00+00:00", "2026-11-30T23:59:59.999999+00:00"),
], ids=["printed-ms", "json-us", "seconds", "other-zone", "minutes", "date"])
def test_parse_time(text: str, start: str, end: str) -> None:
    assert parse_time(text).isoformat() == start
    assert parse_time(text, end=True).isoformat() == end
