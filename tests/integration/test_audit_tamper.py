"""The audit trail proves what it holds: each tampering a hostile client with bus access can do is found by
``remediator audit verify`` (the CLI, against a real nats-server), and garbage on an audit subject stops
neither the readers nor the writer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nats.js.client import JetStreamContext

from remediator import bus
from remediator.audit import AuditGarbage, AuditLog, AuditQuery, iter_checkpoints, query
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats
from remediator.settings import Settings
from remediator.signing import Signer, generate_seed
from remediator.subjects import AUDIT_CHECKPOINT_STREAM, AUDIT_STREAM, audit_subject

pytestmark = pytest.mark.timeout(120)

T0 = datetime(2026, 11, 30, 3, 12, tzinfo=UTC)
KEY = Signer(generate_seed())  # the replica's key: the trust set holds it
NODE = "gpu-node-1"


def audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediator.cli", "audit", *args], capture_output=True, text=True,
                          timeout=60)


def verify_cli(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return audit_cli("verify", "--nats", url, "--trust-key", KEY.public_key, *extra)


def broken(out: subprocess.CompletedProcess[str]) -> str:
    """The first broken link ``verify`` named (it must have failed)."""
    assert out.returncode == 1, (out.stdout, out.stderr)
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("first broken link: "))
    return line.removeprefix("first broken link: ")


async def trail(url: str, records: int = 8, checkpoint_every: int = 100) -> tuple[Any, JetStreamContext, AuditLog]:
    """``records`` records on NODE's chain and three on the cluster chain, signed by KEY, anchored at the end."""
    times = iter(T0 + timedelta(seconds=i) for i in range(10_000))
    nc, js = await bus.connect(url)
    await bus.provision(js, Settings(nats_url=url))
    log = AuditLog(js, "replica-a", clock=lambda: next(times), signer=KEY, checkpoint_every=checkpoint_every)
    for i in range(records):
        await log.append(NODE, "step_succeeded", f"step {i}", incident="inc-1", after={"step": f"s{i}"})
    for i in range(3):
        await log.append(None, "breaker_reset", f"reset {i}")
    await log.flush()
    return nc, js, log


@pytest.fixture
async def bus_url(nats_server: EmbeddedNats) -> AsyncIterator[str]:
    yield nats_server.url


async def _seqs_of(js: JetStreamContext, subject: str) -> list[int]:
    """Stream sequences of the messages on ``subject``, oldest first."""
    info = await js.stream_info(AUDIT_STREAM)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(AUDIT_STREAM, seq)
        except Exception:
            continue
        if msg.subject == subject:
            out.append(seq)
    return out


async def _record(js: JetStreamContext, seq: int) -> dict[str, Any]:
    msg = await js.get_msg(AUDIT_STREAM, seq)
    return dict(json.loads(msg.data or b""))


async def test_an_intact_trail_verifies(bus_url: str) -> None:
    nc, _, log = await trail(bus_url)
    await nc.close()
    out = verify_cli(bus_url, "--json")
    assert out.returncode == 0, out.stderr
    reports = {r["chain"]: r for r in json.loads(out.stdout)}
    assert reports[NODE]["ok"] and reports[NODE]["records"] == 8 and reports[NODE]["anchored_seq"] == 8
    assert reports["_cluster"]["ok"] and reports["_cluster"]["checkpoints"] == 1
    assert log.checkpoints_written == 2


async def _append_forged(js: JetStreamContext, signer: Signer | None) -> None:
    """A record linked correctly to the head, hashed correctly, signed by ``signer`` (None: unsigned)."""
    seqs = await _seqs_of(js, audit_subject(NODE))
    head = await _record(js, seqs[-1])
    fields = {**head, "seq": head["seq"] + 1, "why": "forged: drained by an operator", "prev_hash": head["hash"],
              "signer": signer.public_key if signer else None, "sig": None}
    fields["hash"] = AuditRecord.digest(fields)
    if signer is not None:
        fields["sig"] = signer.sign(fields["hash"].encode())
    if signer is None:
        fields.pop("signer")
    await js.publish(audit_subject(NODE), json.dumps(fields).encode(), stream=AUDIT_STREAM)


@pytest.mark.parametrize("forger", [pytest.param(None, id="unsigned"),
                                    pytest.param(Signer(generate_seed()), id="another-key")])
async def test_a_forged_record_is_detected(bus_url: str, forger: Signer | None) -> None:
    nc, js, _ = await trail(bus_url)
    await _append_forged(js, forger)
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: record 9: ") and "forged" in problem


async def test_rewritten_records_are_detected(bus_url: str) -> None:
    """The last three records deleted and written again, re-linked and re-hashed, signed by another key."""
    nc, js, _ = await trail(bus_url)
    seqs = await _seqs_of(js, audit_subject(NODE))
    originals = [await _record(js, s) for s in seqs[-3:]]
    for s in seqs[-3:]:
        await js.delete_msg(AUDIT_STREAM, s)
    other = Signer(generate_seed())
    prev = (await _record(js, seqs[-4]))["hash"]
    for rec in originals:
        fields = {**rec, "why": "rewritten", "prev_hash": prev, "signer": other.public_key, "sig": None}
        fields["hash"] = AuditRecord.digest(fields)
        fields["sig"] = other.sign(fields["hash"].encode())
        prev = fields["hash"]
        await js.publish(audit_subject(NODE), json.dumps(fields).encode(), stream=AUDIT_STREAM)
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: record 6: ") and "not in the trust set" in problem


async def test_a_record_rewritten_with_the_trusted_key_is_caught_by_its_checkpoint(bus_url: str) -> None:
    """Even a writer holding the key cannot rewrite what a checkpoint anchored."""
    nc, js, _ = await trail(bus_url)
    seqs = await _seqs_of(js, audit_subject(NODE))
    last = await _record(js, seqs[-1])
    await js.delete_msg(AUDIT_STREAM, seqs[-1])
    fields = {**last, "why": "nothing happened here", "sig": None}
    fields["hash"] = AuditRecord.digest(fields)
    fields["sig"] = KEY.sign(fields["hash"].encode())
    await js.publish(audit_subject(NODE), json.dumps(fields).encode(), stream=AUDIT_STREAM)
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: record 8: rewritten")


async def test_a_removed_tail_is_detected(bus_url: str) -> None:
    nc, js, _ = await trail(bus_url)
    for s in (await _seqs_of(js, audit_subject(NODE)))[-2:]:
        await js.delete_msg(AUDIT_STREAM, s)
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: tail removed") and "anchors record 8" in problem and "ends at record 6" \
        in problem


async def test_a_purged_chain_is_detected(bus_url: str) -> None:
    nc, js, _ = await trail(bus_url)
    await js.purge_stream(AUDIT_STREAM, subject=audit_subject(NODE))
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: chain purged")


async def test_a_purged_stream_is_detected(bus_url: str) -> None:
    nc, js, _ = await trail(bus_url)
    await js.purge_stream(AUDIT_STREAM)
    await nc.close()
    out = verify_cli(bus_url, "--json")
    problem = broken(out)
    assert "chain purged" in problem
    streams = next(r for r in json.loads(out.stdout) if r["chain"] == "(streams)")
    assert streams["problem"].startswith("AUDIT purged")


@pytest.mark.parametrize("how", ["purge", "delete"])
async def test_purged_or_deleted_checkpoints_are_detected(bus_url: str, how: str) -> None:
    nc, js, _ = await trail(bus_url)
    if how == "purge":
        await js.purge_stream(AUDIT_CHECKPOINT_STREAM)
    else:
        await js.delete_stream(AUDIT_CHECKPOINT_STREAM)
    await nc.close()
    problem = broken(verify_cli(bus_url))
    assert problem.startswith("(streams): " + ("AUDITCP purged" if how == "purge" else "no checkpoint stream"))


async def test_verify_starts_from_the_oldest_retained_record_after_retention(bus_url: str) -> None:
    """Records and checkpoints that aged out (a stream whose first message is gone) are no tampering: the
    chain verifies from its oldest retained record against the checkpoints retained."""
    nc, js, _ = await trail(bus_url, records=30, checkpoint_every=5)
    first = min(await _seqs_of(js, audit_subject(NODE)))
    for s in range(first, first + 12):  # what max_age would have removed: the oldest, in stream order
        await js.delete_msg(AUDIT_STREAM, s)
    await nc.close()
    out = verify_cli(bus_url, "--json")
    assert out.returncode == 0, out.stderr
    node = next(r for r in json.loads(out.stdout) if r["chain"] == NODE)
    assert node["first_seq"] == 13 and node["last_seq"] == 30 and node["anchored_seq"] == 30


async def test_garbage_on_an_audit_subject_is_reported_and_skipped(bus_url: str) -> None:
    nc, js, _ = await trail(bus_url)
    await js.publish(audit_subject(NODE), b"\x00 not json", stream=AUDIT_STREAM)
    # readers skip it: list, show and export keep working
    records = await query(js, AuditQuery(node=NODE))
    assert [r.seq for r in records] == list(range(1, 9))
    # a fresh writer (the service after a restart) still appends, linked to the last valid record
    writer = AuditLog(js, "replica-b", signer=KEY)
    rec = await writer.append(NODE, "step_started", "after the garbage")
    assert rec.seq == 9 and rec.prev_hash == records[-1].hash
    cps = [c async for c in iter_checkpoints(js, NODE)]
    assert cps and not any(isinstance(c, AuditGarbage) for c in cps)
    await nc.close()
    for args in (("list", "--node", NODE, "--json"), ("export", "--node", NODE), ("show", "inc-1")):
        out = audit_cli(*args, "--nats", bus_url)
        assert out.returncode == 0, out.stderr
    problem = broken(verify_cli(bus_url))
    assert problem.startswith(f"{NODE}: message ") and "is not an audit record" in problem


async def test_without_trust_keys_verify_says_what_it_cannot_check(bus_url: str) -> None:
    nc, _, _ = await trail(bus_url)
    await nc.close()
    out = audit_cli("verify", "--nats", bus_url)
    assert out.returncode == 0 and "no trust keys" in out.stderr

