"""The round trips of one run before it acts, against a real nats-server and the simulated API server.

What a gpu-lost run does before its quarantine PATCH: the node's lock first and the run record read once,
under it (a held lock is waited for only after the record said the run is not finished); the run record
written once (the guards' outcome rides on the first step's ``running`` write); the attempts document read
once (the gate's compare-and-set is on that read); the ``decision`` record written while the guards read
their facts but before every verdict on the node's chain. And where no step write follows at once (an
approval gate on the first step), the guards' outcome is stored before the run waits, so a redelivery does
not judge it again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from remediator.bus import TemporaryError
from remediator.kv import Documents
from remediator.natsd import EmbeddedNats
from remediator.run import RunLog, StoredRun

from .executor_support import decision, rig
from .test_executor_operator import invoke, with_approval

pytestmark = pytest.mark.timeout(60)


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every KV document read from now on, in order."""
    reads: list[str] = []
    real_get = Documents.get

    async def get(self: Documents[Any], key: str, *, fresh: bool = False) -> Any:
        reads.append(key)
        return await real_get(self, key, fresh=fresh)

    monkeypatch.setattr(Documents, "get", get)
    return reads


async def test_a_run_writes_its_record_once_before_it_acts_and_reads_the_attempts_once(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saves: list[tuple[bool, dict[str, str]]] = []
    real_save = StoredRun.save

    async def save(self: StoredRun) -> None:
        saves.append((self.run.guards_passed, {k: r.status for k, r in self.run.records.items()}))
        await real_save(self)

    monkeypatch.setattr(StoredRun, "save", save)
    reads = counted_reads(monkeypatch)
    async with rig(nats_server.url, tmp_path, guards_enabled="opt_out,dry_run,cooldown,lock,budget,breaker") as r:
        d = decision("gpu-node-1", "gpu-lost", gpu=2)
        result = await r.executor.execute(d)
        assert result.done()[:2] == ["taint", "cordon"]
        # the first write of the run record already says the guards passed and the quarantine is under way
        assert saves[0] == (True, {"taint": "running", "cordon": "running"})
        assert [key for key in reads if key.startswith("attempts.")] == ["attempts.gpu-node-1"]
        whats = await r.whats("gpu-node-1", d.incident_id)
        # the executor's decision record precedes every verdict on the chain, the verdicts every step
        first_verdict = whats.index("guard_verdict")
        assert "decision" in whats[:first_verdict]
        assert first_verdict < whats.index("step_started")
        stored, _ = await RunLog(await r.js.key_value("remediator-state")).get(d.incident_id)
        assert stored is not None and stored.finished and stored.guards_passed


async def test_a_gate_on_the_first_step_stores_the_guards_outcome_before_the_run_waits(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        r.executor.playbooks = with_approval(r.executor.playbooks, "gpu-lost", "taint")
        d = decision("gpu-node-3", "gpu-lost", gpu=0)
        runs = RunLog(await r.js.key_value("remediator-state"))
        waiting = asyncio.create_task(r.executor.execute(d))
        while "approval_requested" not in await r.whats("gpu-node-3", d.incident_id):
            assert not waiting.done(), waiting
            await asyncio.sleep(0.02)
        # while it waits (a replica killed now leaves this), the guards' outcome is stored: judged, nothing ran
        stored, _ = await runs.get(d.incident_id)
        assert stored is not None and stored.guards_passed and not stored.records
        with pytest.raises(TemporaryError, match="approval"):
            await waiting
        assert r.sim.node("gpu-node-3")["spec"].get("unschedulable") is not True

        await invoke(approve_cmd(), [d.incident_id, "--nats", nats_server.url, "--reason", "checked", "--json"])
        result = await r.executor.execute(d)  # the redelivery starts at the gate, not at the guards
        assert result.done()[:2] == ["taint", "cordon"]
        names = [rec.after["guard"] for rec in await r.audit_records("gpu-node-3")
                 if rec.incident == d.incident_id and rec.what == "guard_verdict" and rec.after["guard"] != "approval"]
        assert names and len(names) == len(set(names)), names  # each guard judged the run once


def approve_cmd() -> object:
    from remediator.cli.operator import approve

    return approve


async def test_a_free_node_is_locked_first_and_the_run_record_read_once(
        nats_server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = counted_reads(monkeypatch)
    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-0", "gpu-lost", gpu=1)
        assert (await r.executor.execute(d)).outcome == "escalated"
        assert reads.count(f"run.{d.incident_id}") == 1


async def test_a_finished_runs_redelivery_does_not_wait_for_another_runs_lock(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, lock_wait_s=30.0) as r:
        d = decision("gpu-node-1", "gpu-lost", gpu=0)
        first = await r.executor.execute(d)
        locks, _, _ = await r.executor._kv()
        other = await locks.try_take("gpu-node-1", "another-replica|inc-other|1", "inc-other")
        assert not isinstance(other, str)  # another incident's run now holds the node
        before = await r.whats("gpu-node-1", d.incident_id)
        again = await asyncio.wait_for(r.executor.execute(d), 5)  # not the 30 s lock wait
        assert again.outcome == first.outcome and again.done() == first.done()
        assert await r.whats("gpu-node-1", d.incident_id) == before  # nothing new: no lock verdict, no decision


async def test_a_decision_naming_no_known_playbook_is_permanent_and_leaves_the_node_free(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    from remediator.errors import PermanentError

    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-2", "no-such-playbook", gpu=0)
        with pytest.raises(PermanentError, match="no playbook named 'no-such-playbook'"):
            await r.executor.execute(d)
        locks, _, _ = await r.executor._kv()
        lease = await locks.try_take("gpu-node-2", "probe|inc-probe|1", "inc-probe")
        assert not isinstance(lease, str)  # the lock taken for the check was released
        assert await r.whats("gpu-node-2", d.incident_id) == []  # nothing judged, nothing recorded
