"""A replica lost mid-playbook, as real processes: two ``remediator serve`` processes share one nats-server and
the simulated Kubernetes API; the one running a drain (stalled on a PodDisruptionBudget) is SIGKILLed, and
the other finishes the run — every step done once, only the interrupted drain started again (resumed) —
within a bound of max(executor ack wait, lock TTL) plus the drain itself. The drill ``replica-loss`` plays the
same loss with in-process replicas; this test is the real-process check. The figures are printed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from chaos.sim import TRAINING_NAMESPACE, KubeApiServer, seed_cluster
from remediator import bus
from remediator.audit import iter_records
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats

from .nats_cluster import bus_init, cli_env, post_alert, start_serve, xid_alert

pytestmark = pytest.mark.timeout(180)

NODE = "gpu-node-2"
TTL_S = 5  # executor ack wait and node-lock TTL: the takeover bound


async def _records(url: str) -> list[AuditRecord]:
    nc, js = await bus.connect(url, name="test-audit")
    try:
        return [r async for r in iter_records(js, NODE)]
    finally:
        await nc.close()


def _step(r: AuditRecord) -> str:
    return str(r.after.get("step") or r.why.split(":")[0])


def test_a_sigkilled_replica_mid_drain_is_taken_over_by_the_other_process(tmp_path: Path) -> None:
    env = cli_env(REMEDIATOR_EXECUTOR_ACK_WAIT_S=str(TTL_S), REMEDIATOR_LOCK_TTL_S=str(TTL_S),
                  REMEDIATOR_KUBE_RETRY_BUDGET_S="5")
    with EmbeddedNats() as server:
        assert bus_init(server.url, env=env).returncode == 0
        cluster = seed_cluster(nodes=8)
        seeded = {p["metadata"]["uid"] for p in cluster.pods_on(NODE)
                  if p["metadata"]["namespace"] == TRAINING_NAMESPACE}
        cluster.block_pdb(TRAINING_NAMESPACE, "train-2-pdb", True)
        with KubeApiServer(cluster) as kube:
            kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
            replicas = {f"replica-{i}": start_serve(tmp_path, f"replica-{i}", server.url, kubeconfig, env=env)
                        for i in range(2)}
            try:
                for r in replicas.values():
                    r.wait_ready()
                assert post_alert(replicas["replica-0"], xid_alert(NODE, 0, 79, "fp-replica-loss")) == 200

                deadline = time.monotonic() + 60
                while True:  # the drain runs (stalled on the PDB): kill the replica running it
                    running = [r for r in asyncio.run(_records(server.url))
                               if r.what == "step_started" and _step(r) == "drain"]
                    if running:
                        break
                    assert time.monotonic() < deadline, "the drain never started"
                    time.sleep(0.2)
                time.sleep(0.5)
                victim = replicas[running[0].actor]
                survivor = next(r for name, r in replicas.items() if name != victim.name)
                victim.proc.kill()  # SIGKILL: no nak, no lock release, no in-progress acks any more
                victim.proc.wait(10)
                t_kill = time.monotonic()
                cluster.block_pdb(TRAINING_NAMESPACE, "train-2-pdb", False)

                resumed_at = finished_at = None
                while time.monotonic() - t_kill < 90:
                    records = asyncio.run(_records(server.url))
                    if resumed_at is None and any(r.actor == survivor.name and r.what == "step_started"
                                                  and _step(r) == "drain" for r in records):
                        resumed_at = time.monotonic() - t_kill
                    if any(r.what == "playbook_finished" for r in records):
                        finished_at = time.monotonic() - t_kill
                        break
                    time.sleep(0.2)
                assert finished_at is not None, survivor.log()[-3000:]
                print(f"\n{victim.name} SIGKILLed mid-drain; {survivor.name} resumed the drain after "
                      f"{resumed_at:.1f}s and finished the run after {finished_at:.1f}s (bound: {TTL_S}s "
                      "ack wait / lock TTL, then the drain)")
                assert resumed_at is not None and resumed_at <= TTL_S * 2 + 5

                records = asyncio.run(_records(server.url))
                started = [(_step(r), r.actor, "(resumed)" in r.why) for r in records if r.what == "step_started"]
                done = [_step(r) for r in records if r.what == "step_succeeded"]
                assert sorted(done) == sorted(set(done)) == sorted({"taint", "cordon", "drain", "escalate"}), done
                drains = [s for s in started if s[0] == "drain"]
                assert drains == [("drain", victim.name, False), ("drain", survivor.name, True)], started
                assert [s for s in started if s[0] != "drain"].count(("taint", victim.name, False)) == 1
                finished = [r for r in records if r.what == "playbook_finished"]
                assert len(finished) == 1 and finished[0].after.get("outcome") == "escalated"
                assert finished[0].actor == survivor.name
                left = {p["metadata"]["uid"] for p in cluster.pods_on(NODE)} & seeded
                assert not left, "the node was not drained"
            finally:
                for r in replicas.values():
                    if r.proc.poll() is None:
                        r.terminate()
