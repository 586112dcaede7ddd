"""``remediator budget list`` and ``remediator budget release`` against a real nats-server: what the ledger
holds, and a release by hand that is audited with the operator's identity and is harmless twice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from remediator.cli.budget import budget
from remediator.natsd import EmbeddedNats
from remediator.safety import LedgerStore, reservation_key
from remediator.subjects import STATE_BUCKET

from .executor_support import T0, decision, rig

pytestmark = pytest.mark.timeout(90)


async def invoke(args: list[str]) -> dict[str, object]:
    out = await asyncio.to_thread(CliRunner().invoke, budget, args)
    assert out.exit_code == 0, out.output
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


async def test_budget_list_and_release_by_hand(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        kv = await r.js.key_value(STATE_BUCKET)
        store = LedgerStore(kv)
        stuck = decision("gpu-node-3", "gpu-lost", incident="inc-stuck")  # a reservation nobody will release
        await store.docs.update("safety.ledger", lambda led: (led.reserved(stuck, "default", "node", T0), None))
        escalated = await r.executor.execute(decision("gpu-node-0", "gpu-lost", incident="inc-esc"))
        assert escalated.outcome == "escalated"

        doc = await invoke(["list", "--nats", nats_server.url, "--json"])
        assert [(x["key"], x["incident"], x["run"]) for x in doc["reservations"]] == [  # type: ignore[index,union-attr]
            (reservation_key(stuck), "inc-stuck", None)]
        assert [x["incident"] for x in doc["handovers"]] == ["inc-esc"]  # type: ignore[index,union-attr]

        args = ["release", reservation_key(stuck), "--nats", nats_server.url, "--reason", "node replaced",
                "--actor", "human:alice", "--json"]
        done = await invoke(args)
        assert [x["incident"] for x in done["released"]] == ["inc-stuck"]  # type: ignore[index,union-attr]
        assert (await store.read()).reservations == {}
        again = await invoke(args)
        assert again["released"] == []  # already released: nothing changes, nothing audited twice
        trail = [x for x in await r.audit_records("gpu-node-3") if x.what == "settled"]
        assert len(trail) == 1 and trail[0].actor == "human:alice" and trail[0].incident == "inc-stuck"
        assert trail[0].after["reason"] == "node replaced" and trail[0].after["by"] == "operator"

        # A handover can be released by incident id too.
        await invoke(["release", "inc-esc", "--nats", nats_server.url, "--reason", "ticket 42", "--json"])
        assert (await store.read()).handovers == {}
