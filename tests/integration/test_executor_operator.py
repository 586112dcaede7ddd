"""Operator controls against a real nats-server: the approval gate and the breaker reset, through the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from playbooks.catalog import PlaybookCatalog
from playbooks.schema import Playbook
from remediator.bus import TemporaryError
from remediator.cli.operator import approve, breaker
from remediator.natsd import EmbeddedNats

from .executor_support import decision, rig


def with_approval(catalog: PlaybookCatalog, name: str, step: str) -> PlaybookCatalog:
    pb = catalog.get(name)
    steps = [s.model_copy(update={"requires_approval": True}) if s.key == step else s for s in pb.steps]
    return PlaybookCatalog({**catalog.playbooks, name: Playbook.model_validate(
        {**pb.model_dump(), "steps": [s.model_dump() for s in steps]})})


async def invoke(cmd: object, args: list[str]) -> dict[str, object]:
    out = await asyncio.to_thread(CliRunner().invoke, cmd, args)  # type: ignore[arg-type]
    assert out.exit_code == 0, out.output
    parsed: dict[str, object] = json.loads(out.stdout)
    return parsed


async def test_a_step_marked_requires_approval_waits_for_remediator_approve(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        r.executor.playbooks = with_approval(r.executor.playbooks, "gpu-lost", "drain")
        d = decision("gpu-node-2", "gpu-lost", gpu=0)
        with pytest.raises(TemporaryError, match="approval"):
            await r.executor.execute(d)
        node = r.sim.node("gpu-node-2")
        assert node["spec"]["unschedulable"] is True  # the steps before the gate ran
        assert [p for p in r.sim.pods_on("gpu-node-2") if p["metadata"]["namespace"] == "training"]  # not drained

        doc = await invoke(approve, [d.incident_id, "--nats", nats_server.url, "--reason", "checked", "--json"])
        assert str(doc["by"]).startswith("nats:") and doc["already"] is False  # the identity NATS authenticated
        result = await r.executor.execute(d)  # the redelivery resumes at the gate
        assert result.done() == ["taint", "cordon", "drain", "escalate"]
        whats = await r.whats("gpu-node-2", d.incident_id)
        assert whats.count("step_succeeded") == 4  # taint and cordon did not run twice
        assert "approval" in whats


async def test_breaker_reset_closes_it_with_an_audited_reason(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, nodes=6, breaker_threshold=1, budget_max_node_fraction=1.0,
                   budget_max_gpu_fraction=1.0) as r:
        assert (await r.executor.execute(decision("gpu-node-0", "gpu-lost", gpu=0))).outcome == "escalated"
        assert (await r.executor.execute(decision("gpu-node-1", "gpu-lost", gpu=0))).outcome == "blocked"
        status = await invoke(breaker, ["status", "--nats", nats_server.url, "--json"])
        assert status["open"] is True
        doc = await invoke(breaker, ["reset", "--nats", nats_server.url, "--reason", "storm over",
                                     "--actor", "human:bob", "--json"])
        assert doc["was_open"] is True
        assert (await invoke(breaker, ["status", "--nats", nats_server.url, "--json"]))["open"] is False
        res = await r.executor.execute(decision("gpu-node-2", "gpu-lost", gpu=0))
        assert res.outcome == "escalated" and res.done()[:2] == ["taint", "cordon"]
        cluster = [(x.what, x.actor, x.why) for x in await r.audit_records("_cluster")]
        assert ("breaker_reset", "human:bob", "storm over") in cluster
