"""Approvals that people see, against a real nats-server: a gated step writes ``approval_requested``, which the
audit API lists as pending with the command to approve; ``remediator approve`` refuses an unknown incident, an
incident already approved and a finished one with one line and exit 1, and records the identity the NATS
server authenticated."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from remediator.audit_api.reader import AuditReader
from remediator.audit_api.routes import create_audit_app
from remediator.bus import TemporaryError
from remediator.cli.operator import approve
from remediator.natsd import EmbeddedNats
from remediator.safety.ledger import LedgerStore
from remediator.settings import Settings
from remediator.subjects import STATE_BUCKET

from .executor_support import decision, rig
from .test_executor_operator import with_approval

pytestmark = pytest.mark.timeout(120)


async def approve_cli(*args: str) -> tuple[int, str, str]:
    out = await asyncio.to_thread(CliRunner().invoke, approve, list(args))
    return out.exit_code, out.stdout, out.stderr


async def test_a_pending_approval_is_listed_and_approve_refuses_what_it_cannot_approve(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    url = nats_server.url
    async with rig(url, tmp_path, approval_wait_s=0.0) as r:
        r.executor.playbooks = with_approval(r.executor.playbooks, "gpu-lost", "drain")
        d = decision("gpu-node-2", "gpu-lost", gpu=0)
        with pytest.raises(TemporaryError, match="approval"):
            await r.executor.execute(d)
        assert "approval_requested" in await r.whats("gpu-node-2", d.incident_id)

        app = create_audit_app(AuditReader(r.js, refresh_s=0.0), Settings(api_tokens=""))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://audit") as http:
            pending = (await http.get("/v1/audit/approvals")).json()["pending"]
            assert [(p["incident"], p["steps"]) for p in pending] == [(d.incident_id, ["drain"])]
            assert pending[0]["command"].startswith(f"remediator approve {d.incident_id}")
            fleet = (await http.get("/v1/audit/fleet")).json()
            assert fleet["pending_approvals"] == pending
            # breaker and budget are the safety ledger as stored on the bus, not this process's memory
            ledger = await LedgerStore(await r.js.key_value(STATE_BUCKET)).read()
            assert fleet["ledger_error"] is None and fleet["breaker"]["open"] == ledger.breaker.open
            assert fleet["breaker"]["recent_quarantines"] == len(ledger.breaker.quarantines) >= 1
            assert {x["key"] for x in fleet["reservations"]} == set(ledger.reservations) != set()
            assert {p: v["nodes"] + v["gpus"] for p, v in fleet["pools"].items()} == {
                pool: sum(1 for x in ledger.reservations.values() if x["pool"] == pool)
                for pool in {x["pool"] for x in ledger.reservations.values()}}
            page = (await http.get("/audit/fleet")).text
            assert d.incident_id in page and f"remediator approve {d.incident_id}" in page

            code, _, err = await approve_cli("inc-nobody-knows", "--nats", url)
            assert code == 1 and "unknown incident inc-nobody-knows" in err and len(err.strip().splitlines()) == 1
            code, out, err = await approve_cli(d.incident_id, "--nats", url, "--reason", "checked", "--json")
            assert code == 0, err
            assert json.loads(out)["by"].startswith("nats:")
            code, _, err = await approve_cli(d.incident_id, "--nats", url)
            assert code == 1 and "already approved by nats:" in err

            await r.executor.execute(d)  # the redelivery passes the gate and finishes
            records = await r.audit_records("gpu-node-2")
            approval = next(x for x in records if x.what == "approval")
            assert approval.actor.startswith("nats:") and approval.after["by"] == approval.actor
            assert (await http.get("/v1/audit/approvals")).json()["pending"] == []
        done = decision("gpu-node-3", "gpu-lost", gpu=0)
        r.executor.playbooks = with_approval(r.executor.playbooks, "gpu-lost", "no-such-step")
        await r.executor.execute(done)  # no gate: the run finishes
        code, _, err = await approve_cli(done.incident_id, "--nats", url)
        assert code == 1 and f"incident {done.incident_id} is already decided" in err
