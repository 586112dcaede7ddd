"""Kill-and-resume: an executor replica SIGKILLed in the middle of a drain is resumed by another replica,
which completes the playbook without repeating a completed step, and the two never run the node at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from chaos.sim.cluster import seed_cluster
from chaos.sim.kube_api import KubeApiServer
from remediator import bus
from remediator.audit import iter_records
from remediator.bus import EXECUTOR_CONSUMER
from remediator.natsd import EmbeddedNats
from remediator.subjects import REMEDIATIONS_STREAM, STATE_BUCKET, remediation_subject, run_key

from .executor_support import decision, fast_settings

REPO = Path(__file__).resolve().parents[2]
ACK_WAIT_S = 4.0


def spawn(actor: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tests.integration.executor_worker"], cwd=REPO,
                                env={**os.environ, **env, "REMEDIATOR_REPLICA_ID": actor},
                                stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_replica_killed_mid_drain_is_resumed_without_repeating_steps(
        nats_server: EmbeddedNats, tmp_path: Path) -> None:
    sim = seed_cluster(4)
    api = KubeApiServer(sim).start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    s = fast_settings(nats_server.url, kubeconfig=str(kubeconfig))
    nc, js = await bus.connect(nats_server.url)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await bus.provision(js, s)
        # A short ack wait so the killed replica's delivery comes back within the test.
        info = await js.consumer_info(REMEDIATIONS_STREAM, EXECUTOR_CONSUMER)
        cfg = info.config
        cfg.ack_wait = ACK_WAIT_S
        await js.add_consumer(REMEDIATIONS_STREAM, cfg)
        kv = await js.key_value(STATE_BUCKET)

        sim.block_pdb("training", "train-2-pdb")  # the drain stalls on the PodDisruptionBudget
        d = decision("gpu-node-2", "gpu-lost", gpu=0)
        await js.publish(remediation_subject(d.node), d.model_dump_json().encode(),
                         headers={"Nats-Msg-Id": f"decision|{d.incident_id}"})
        env = {"REMEDIATOR_NATS_URL": nats_server.url, "REMEDIATOR_KUBECONFIG": str(kubeconfig),
               "REMEDIATOR_LOCK_TTL_S": "5", "REMEDIATOR_LOCK_WAIT_S": "20", "REMEDIATOR_DRAIN_TIMEOUT_S": "60",
               "REMEDIATOR_DRAIN_GRACE_PERIOD_S": "0", "REMEDIATOR_NAK_DELAY_S": "0.5"}
        a = spawn("replica-a", env, tmp_path / "a.log")
        procs.append(a)

        async def run_doc() -> dict[str, object]:
            try:
                entry = await kv.get(run_key(d.incident_id))
            except KeyNotFoundError:
                return {}
            return dict(json.loads(entry.value or b"{}"))

        for _ in range(300):
            doc = await run_doc()
            recs = doc.get("records") or {}
            if isinstance(recs, dict) and recs.get("drain", {}).get("status") == "running":
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"replica A never got to the drain: {await run_doc()}")
        await asyncio.sleep(0.5)  # well inside the stalled drain
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        assert sim.is_cordoned("gpu-node-2")
        sim.block_pdb("training", "train-2-pdb", blocked=False)

        b = spawn("replica-b", env, tmp_path / "b.log")
        procs.append(b)
        for _ in range(600):
            doc = await run_doc()
            if doc.get("status") == "finished":
                break
            await asyncio.sleep(0.1)
        else:
            out = (tmp_path / "b.log").read_text()[-3000:]
            raise AssertionError(f"replica B did not finish the run: {await run_doc()}\n{out}")

        assert doc["outcome"] == "escalated"
        assert doc["owner"].startswith("replica-b|")  # type: ignore[union-attr]
        records = doc["records"]
        assert isinstance(records, dict)
        assert {k: v["status"] for k, v in records.items()} == {
            "taint": "succeeded", "cordon": "succeeded", "drain": "succeeded", "escalate": "succeeded"}
        assert [p for p in sim.pods_on("gpu-node-2") if p["metadata"]["namespace"] == "training"] == []

        trail = [r async for r in iter_records(js, "gpu-node-2") if r.incident == d.incident_id]
        started = [(r.actor, r.after.get("step")) for r in trail if r.what == "step_started"]
        assert started == [("replica-a", "taint"), ("replica-a", "cordon"), ("replica-a", "drain"),
                           ("replica-b", "drain"), ("replica-b", "escalate")]
        # No interleaving: every record of A comes before every record of B on the node's chain.
        actors = [r.actor for r in trail]
        assert actors == sorted(actors, key=lambda x: x != "replica-a")
        assert trail[-1].what == "playbook_finished"
        assert trail[-1].after["outcome"] == "escalated"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        await nc.drain()
        api.stop()
