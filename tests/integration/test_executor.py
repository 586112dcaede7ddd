"""The executor against a real nats-server and the simulated Kubernetes API (via the real client)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from playbooks.catalog import PlaybookCatalog
from remediator.contracts import OPT_OUT_LABEL
from remediator.natsd import EmbeddedNats
from remediator.subjects import LEDGER_KEY, STATE_BUCKET, remediation_subject, run_key

from .executor_support import decision, rig


def training_pods(sim: object, node: str) -> list[dict[str, object]]:
    return [p for p in sim.pods_on(node) if p["metadata"]["namespace"] == "training"]  # type: ignore[attr-defined]


async def test_gpu_lost_taints_cordons_drains_and_escalates(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-2", "gpu-lost", gpu=3)
        result = await r.executor.execute(d)
        assert result.outcome == "escalated"
        assert result.done() == ["taint", "cordon", "drain", "escalate"]
        node = r.sim.node("gpu-node-2")
        assert node["spec"]["unschedulable"] is True
        assert any(t["key"] == r.settings.taint_key for t in node["spec"]["taints"])
        assert training_pods(r.sim, "gpu-node-2") == []  # drained; DaemonSet pods stay
        assert len(r.sim.pods_on("gpu-node-2")) == 2
        assert "gpu-remediator.io/escalated" in node["metadata"]["annotations"]
        whats = await r.whats("gpu-node-2", d.incident_id)
        assert whats[0] == "decision" and whats[-1] == "playbook_finished"
        assert whats.count("step_succeeded") == 4 and "escalated" in whats
        assert [w for w in whats if w == "guard_verdict"]
        # A repeat of the same decision is recognised as finished: nothing runs again.
        again = await r.executor.execute(d)
        assert again.actions == result.actions
        assert (await r.whats("gpu-node-2", d.incident_id)).count("step_started") == 4
        # The lock was released and the run record says finished.
        kv = await r.js.key_value(STATE_BUCKET)
        assert json.loads((await kv.get(run_key(d.incident_id))).value or b"")["status"] == "finished"


async def test_per_gpu_isolation_leaves_other_gpus_and_pods_alone(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        # Two pods per node would be ideal; the seeded node runs one 4-GPU pod on GPUs 0-3.
        victim = "gpu-node-3"
        before = {p["metadata"]["uid"] for p in r.sim.pods_on(victim)}
        d = decision(victim, "gpu-memory-fatal", gpu=6)  # a GPU no pod holds
        result = await r.executor.execute(d)
        assert result.outcome == "completed", result
        assert result.done() == ["isolate_gpu", "evict_gpu_pods", "reset_gpu", "health_check", "return_to_service"]
        assert {p["metadata"]["uid"] for p in r.sim.pods_on(victim)} == before  # nothing evicted
        assert r.sim.node(victim)["spec"].get("unschedulable") in (None, False)
        assert r.sim.unhealthy_gpus(victim) == set()  # returned after the health check

        d2 = decision(victim, "memory-retirement-failure", gpu=1)  # GPU 1 runs the training pod
        result = await r.executor.execute(d2)
        assert result.done() == ["isolate_gpu", "evict_gpu_pods", "escalate"]
        assert r.sim.unhealthy_gpus(victim) == {1}
        assert r.sim.node(victim)["spec"].get("unschedulable") in (None, False)
        assert not any(t["key"] == r.settings.taint_key for t in r.sim.node(victim)["spec"].get("taints") or [])
        assert r.sim.pods_on("gpu-node-2") and training_pods(r.sim, "gpu-node-2")  # other nodes untouched


async def test_restart_job_restarts_every_rank_of_a_pytorchjob(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        ranks = r.sim.job_pods("PyTorchJob", "training", "pytorch-0")
        assert len(ranks) == 2
        uids = {p["metadata"]["uid"] for p in ranks}
        d = decision("gpu-node-0", "nccl-timeout-no-suspect", job="training/pytorch-0")
        result = await r.executor.execute(d)
        assert result.outcome == "completed", result
        assert result.done() == ["restart_job"]
        after = r.sim.job_pods("PyTorchJob", "training", "pytorch-0")
        assert len(after) == 2
        assert not uids & {p["metadata"]["uid"] for p in after}  # every rank replaced
        assert all(p["status"]["phase"] == "Running" for p in after)  # and the job runs again
        assert r.sim.job_restarts("PyTorchJob", "training", "pytorch-0") >= 1
        assert r.sim.node("gpu-node-0")["spec"].get("unschedulable") in (None, False)  # no node touched


async def test_a_suspect_found_after_the_no_suspect_restart_is_not_held_back_by_its_cooldown(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """The NCCL handler decided "no suspect" on two ranks' reports and the job was restarted; the desync report
    then named the lagging rank's node and a superseding decision came: the restart it replaces is the same
    remediation, so the cooldown does not turn the suspect's quarantine into an escalation (the demo's
    ``nccl-timeout-suspect`` failed so once in CI, when the two ranks' reports were decided before the
    desync report arrived)."""
    async with rig(nats_server.url, tmp_path) as r:
        first = decision("gpu-node-1", "nccl-timeout-no-suspect", job="training/pytorch-0", incident="inc-nosus")
        assert (await r.executor.execute(first)).outcome == "completed"
        then = decision("gpu-node-1", "nccl-timeout-suspect", job="training/pytorch-0", incident="inc-sus",
                        labels={"supersedes": "inc-nosus"})
        result = await r.executor.execute(then)
        # the playbook's own ending (a person checks the node), not the cooldown's escalation before any step
        assert result.done() == ["taint", "restart_job", "escalate"], result.actions
        assert any(t["key"] == r.settings.taint_key for t in r.sim.node("gpu-node-1")["spec"]["taints"])


async def test_opt_out_and_dry_run_touch_nothing(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        r.sim.patch("nodes", "gpu-node-1", {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}})
        d = decision("gpu-node-1", "gpu-lost", gpu=0)
        result = await r.executor.execute(d)
        assert result.outcome == "blocked" and result.actions == ()
        assert result.verdicts[0].name == "opt_out" and not result.verdicts[0].allowed
        assert not r.sim.node("gpu-node-1")["spec"].get("unschedulable")

    async with rig(nats_server.url, tmp_path, dry_run=True) as r:
        d = decision("gpu-node-2", "gpu-lost", gpu=0, incident="inc-dry")
        result = await r.executor.execute(d)
        assert result.outcome == "dry-run"
        assert [a.status for a in result.actions] == ["skipped"] * 4
        assert all(a.detail.startswith("dry-run: would run") for a in result.actions)
        assert not r.sim.node("gpu-node-2")["spec"].get("unschedulable")
        assert training_pods(r.sim, "gpu-node-2")


async def test_breaker_trips_on_a_burst_and_blocks_until_reset(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, nodes=8, breaker_threshold=2, budget_max_nodes=50,
                   budget_max_node_fraction=1.0, budget_max_gpu_fraction=1.0) as r:
        outcomes = []
        for i in range(4):
            res = await r.executor.execute(decision(f"gpu-node-{i}", "gpu-lost", gpu=0))
            outcomes.append(res.outcome)
        assert outcomes == ["escalated", "escalated", "blocked", "blocked"]
        assert not r.sim.node("gpu-node-2")["spec"].get("unschedulable")
        kv = await r.js.key_value(STATE_BUCKET)
        ledger = json.loads((await kv.get(LEDGER_KEY)).value or b"")
        assert ledger["breaker"]["open"] is True
        cluster = [x.what for x in await r.audit_records("_cluster")]
        assert "breaker_trip" in cluster


async def test_budget_escalates_instead_of_taking_a_second_node_out(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, nodes=4, budget_max_node_fraction=0.25) as r:
        first = await r.executor.execute(decision("gpu-node-0", "gpu-lost", gpu=0))
        second = await r.executor.execute(decision("gpu-node-1", "gpu-lost", gpu=0))
        assert first.done()[:3] == ["taint", "cordon", "drain"]
        assert second.outcome == "escalated"
        assert [a.name for a in second.actions] == ["escalate"]
        assert not r.sim.node("gpu-node-1")["spec"].get("unschedulable")
        assert any(v.name == "budget" and not v.allowed for v in second.verdicts)


async def test_manual_uncordon_cancels_the_workflow(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        # A drain blocked by a PodDisruptionBudget gives a person time to uncordon the node.
        r.sim.block_pdb("training", "train-2-pdb")
        d = decision("gpu-node-2", "gpu-lost", gpu=0)
        task = asyncio.create_task(r.executor.execute(d))
        for _ in range(100):
            if r.sim.node("gpu-node-2")["spec"].get("unschedulable"):
                break
            await asyncio.sleep(0.05)
        r.sim.patch("nodes", "gpu-node-2", {"spec": {"unschedulable": False}})
        r.sim.block_pdb("training", "train-2-pdb", blocked=False)
        result = await asyncio.wait_for(task, 60)
        assert result.outcome == "cancelled", result
        assert "uncordoned" in result.detail
        assert "override" in await r.whats("gpu-node-2", d.incident_id)
        assert not r.sim.node("gpu-node-2")["spec"].get("unschedulable")  # we never re-cordon


async def test_consumer_loop_acks_after_the_playbook(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-3", "gpu-lost", gpu=1)
        await r.js.publish(remediation_subject(d.node), d.model_dump_json().encode(),
                           headers={"Nats-Msg-Id": f"decision|{d.incident_id}"})
        stop = asyncio.Event()
        task = asyncio.create_task(r.executor.run(stop))
        for _ in range(200):
            if r.executor.results:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 15)
        assert r.executor.results and r.executor.results[0].done()[:3] == ["taint", "cordon", "drain"]
        info = await r.js.stream_info("REMEDIATIONS")
        assert info.state.messages == 0  # acked (work queue)


async def test_return_to_service_removes_only_what_we_added(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    async with rig(nats_server.url, tmp_path, budget_max_node_fraction=1.0, budget_max_gpu_fraction=1.0) as r:
        # A person cordoned the node before us; our taint is ours to remove, their cordon is not.
        r.sim.patch("nodes", "gpu-node-3", {"spec": {"unschedulable": True}})
        d = decision("gpu-node-3", "node-reboot")
        result = await r.executor.execute(d)
        assert result.outcome == "completed", result
        assert result.done() == ["taint", "cordon", "drain", "reboot_node", "health_check", "return_to_service"]
        node = r.sim.node("gpu-node-3")
        assert node["spec"]["unschedulable"] is True  # their cordon stays
        assert not any(t["key"] == r.settings.taint_key for t in node["spec"].get("taints") or [])
        assert any(c.verb == "reboot_node" for c in r.agents.calls)

        # Without a passing health check nothing is returned: the node stays out.
        r.agents.healthy = False
        pb = r.executor.playbooks.get("node-reboot")
        quick = pb.model_copy(update={"steps": tuple(
            s.model_copy(update={"timeout_s": 1.0}) if s.name == "health_check" else s for s in pb.steps)})
        r.executor.playbooks = PlaybookCatalog({**r.executor.playbooks.playbooks, "node-reboot": quick})
        d2 = decision("gpu-node-1", "node-reboot", incident="inc-unhealthy")
        result = await r.executor.execute(d2)
        assert result.outcome == "escalated"
        statuses = {a.step: a.status for a in result.actions}
        assert statuses["verify-after-reboot"] == "failed" and statuses["replace"] == "succeeded"
        assert statuses["return_to_service"] == "skipped"
        assert r.sim.node("gpu-node-1")["spec"]["unschedulable"] is True


class _Delivery:
    """What the executor reads of a JetStream delivery: its headers, which delivery it is, in-progress."""

    def __init__(self, n: int) -> None:
        self.headers: dict[str, str] = {}
        self.metadata = SimpleNamespace(num_delivered=n)

    async def in_progress(self) -> None:
        return None


async def test_a_redelivery_after_a_start_that_failed_before_the_guards_says_so(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """The first delivery failed before the guards' outcome was stored (nothing acted): the redelivery's
    ``decision`` record names its delivery, and the drills do not count it as a second remediation."""
    from chaos.expectations import _runs

    async with rig(nats_server.url, tmp_path) as r:
        d = decision("gpu-node-1", "gpu-lost", gpu=1)
        real_guards = r.executor._guards

        async def bus_lost(*a: object, **kw: object) -> object:
            raise ConnectionError("the bus went away during the guards")

        r.executor._guards = bus_lost  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await r.executor.execute(d, _Delivery(1))  # type: ignore[arg-type]
        r.executor._guards = real_guards  # type: ignore[method-assign]
        result = await r.executor.execute(d, _Delivery(2))  # type: ignore[arg-type]
        assert result.outcome == "escalated"
        starts = [x for x in await r.audit_records("gpu-node-1")
                  if x.incident == d.incident_id and x.what == "decision"]
        assert [x.after.get("delivery") for x in starts] == [None, 2]
        assert "delivery 2: no earlier one got past the guards" in starts[1].why
        assert len(_runs(starts)) == 1
