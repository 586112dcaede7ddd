"""The production bus shape: three clustered nats-servers, ``bus init --replicas 3``, two ``serve`` replicas.

Every stream and bucket stays R3 after the replicas start (they verify, never provision); with the server
that leads FAULTS killed, ingest keeps answering and an Xid 79 is remediated exactly once. The figures
(time to ready, to the first 200 after the kill, to the node's quarantine) are printed for the report.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from chaos.nats_cluster import NatsCluster
from chaos.sim import KubeApiServer, seed_cluster
from remediator import bus, subjects
from remediator.audit import iter_records
from remediator.errors import TemporaryError
from remediator.settings import Settings

from .nats_cluster import bus_init, cli_env, post_alert, start_serve, xid_alert

STREAMS = (subjects.FAULTS_STREAM, subjects.REMEDIATIONS_STREAM, subjects.AUDIT_STREAM,
           subjects.DEAD_LETTER_STREAM, f"KV_{subjects.STATE_BUCKET}", f"KV_{subjects.LOCKS_BUCKET}")


async def _replicas(url: str) -> dict[str, int]:
    nc, js = await bus.connect(url, name="test-replicas")
    try:
        return {s: int((await js.stream_info(s)).config.num_replicas or 1) for s in STREAMS}
    finally:
        await nc.close()


async def _leader(url: str, stream: str) -> str:
    nc, js = await bus.connect(url, name="test-leader")
    try:
        info = await js.stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await nc.close()


async def _records(url: str, node: str) -> list[tuple[str, str, dict[str, object]]]:
    nc, js = await bus.connect(url, name="test-audit")
    try:
        return [(r.what, r.why, dict(r.after)) async for r in iter_records(js, node)]
    finally:
        await nc.close()


def test_bus_init_r3_then_two_replicas_keep_r3_and_survive_a_server_loss(nats_cluster: NatsCluster,
                                                                          tmp_path: Path) -> None:
    env = cli_env(REMEDIATOR_BUS_REPLICAS="3", REMEDIATOR_EXECUTOR_ACK_WAIT_S="10", REMEDIATOR_LOCK_TTL_S="10")
    init = bus_init(nats_cluster.url, "--replicas", "3", env=env)
    assert init.returncode == 0, init.stderr
    assert asyncio.run(_replicas(nats_cluster.url)) == dict.fromkeys(STREAMS, 3)

    cluster = seed_cluster(nodes=4)
    with KubeApiServer(cluster) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        replicas = [start_serve(tmp_path, f"replica-{i}", nats_cluster.url, kubeconfig, env=env) for i in range(2)]
        try:
            ready_s = [r.wait_ready() for r in replicas]
            print(f"\nboth replicas ready in {max(ready_s):.1f}s")
            # the replicas verified the bus and changed nothing: still R3, no "updated stream" line
            assert asyncio.run(_replicas(nats_cluster.url)) == dict.fromkeys(STREAMS, 3)
            for r in replicas:
                assert "updated stream" not in r.log() and "num_replicas" not in r.log(), r.log()[-2000:]

            leader = asyncio.run(_leader(nats_cluster.url, subjects.FAULTS_STREAM))
            victim = int(leader.rsplit("-", 1)[1])
            t_kill = time.monotonic()
            nats_cluster.kill(victim)
            node = "gpu-node-1"
            payload = xid_alert(node, 3, 79, "fp-cluster-79")
            first_200: float | None = None
            answers = []
            while time.monotonic() - t_kill < 60:
                status = post_alert(replicas[0], payload)
                answers.append(status)
                if status == 200:
                    first_200 = time.monotonic() - t_kill
                    break
                time.sleep(0.2)
            assert first_200 is not None, answers
            # Alertmanager's retry of the very same notification, to the other replica: a duplicate
            assert post_alert(replicas[1], payload, timeout=10) == 200
            print(f"FAULTS leader {leader} killed: first 200 after {first_200:.1f}s ({len(answers)} tries: "
                  f"{answers})")

            t0 = time.monotonic()
            while time.monotonic() - t0 < 90:
                if cluster.is_cordoned(node) and any(
                        t["key"] == Settings().taint_key for t in cluster.taints(node)):
                    break
                time.sleep(0.25)
            else:
                raise AssertionError(f"{node} not quarantined:\n{replicas[0].log()[-3000:]}\n"
                                     f"{replicas[1].log()[-3000:]}")
            print(f"{node} tainted and cordoned {time.monotonic() - t_kill:.1f}s after the kill")
            # settle, then count: one decision, every step once
            time.sleep(3)
            records = asyncio.run(_records(nats_cluster.url, node))
            decisions = [r for r in records if r[0] == "decision" and "handler" in r[2]]
            assert len(decisions) == 1, (decisions, [(r[0], r[1][:80]) for r in records])
            started = [str(r[2].get("step")) for r in records if r[0] == "step_started"]
            assert started and len(started) == len(set(started)), started
            assert asyncio.run(_replicas(nats_cluster.url)) == dict.fromkeys(STREAMS, 3)
        finally:
            stops = [r.terminate() for r in replicas]
            print(f"replicas stopped {', '.join(f'{s:.1f}s' for s in stops)} after SIGTERM")
    assert all(r.proc.returncode == 0 for r in replicas), [r.log()[-2000:] for r in replicas]


@pytest.mark.parametrize("lower", [False, True], ids=["kept", "lowered-when-asked"])
def test_bus_init_never_lowers_replicas_or_resets_a_tuned_consumer(nats_cluster: NatsCluster, lower: bool) -> None:
    assert bus_init(nats_cluster.url, "--replicas", "3").returncode == 0

    async def tune() -> None:
        nc, js = await bus.connect(nats_cluster.url, name="test-tune")
        try:
            info = await js.consumer_info(subjects.REMEDIATIONS_STREAM, bus.EXECUTOR_CONSUMER)
            info.config.ack_wait = 30
            await js.add_consumer(subjects.REMEDIATIONS_STREAM, info.config)
        finally:
            await nc.close()

    asyncio.run(tune())
    again = bus_init(nats_cluster.url, "--replicas", "1", *(["--allow-lower-replicas"] if lower else []))
    assert again.returncode == 0, again.stderr
    assert "drift: consumer REMEDIATIONS/executor kept" in again.stderr
    want = 1 if lower else 3
    assert asyncio.run(_replicas(nats_cluster.url)) == dict.fromkeys(STREAMS, want)

    async def ack_wait() -> float:
        nc, js = await bus.connect(nats_cluster.url, name="test-tune")
        try:
            return float((await js.consumer_info(subjects.REMEDIATIONS_STREAM, bus.EXECUTOR_CONSUMER)).config.ack_wait
                         or 0)
        finally:
            await nc.close()

    assert asyncio.run(ack_wait()) == 30


def test_a_port_taken_between_its_choice_and_the_start_moves_the_cluster_to_fresh_ports() -> None:
    """A client connection may draw the very port ``free_port`` chose; nats-server then exits with "address
    already in use" (the CI error this test stands for). The cluster starts again on fresh ports."""
    import socket

    with socket.socket() as squatter:
        cluster = NatsCluster(3)
        squatter.bind(("127.0.0.1", cluster.route_ports[2]))
        squatter.listen()
        taken = cluster.route_ports[2]
        with cluster:  # starts it
            assert taken not in cluster.route_ports and all(cluster.alive(i) for i in range(3))
            assert (cluster.root / "n2.attempt1.log").read_text().count("address already in use") == 1


def test_an_embedded_server_whose_chosen_port_was_taken_moves_but_a_given_port_does_not() -> None:
    import socket

    from remediator.natsd import EmbeddedNats

    with socket.socket() as squatter:
        server = EmbeddedNats()
        squatter.bind(("127.0.0.1", server.port))
        squatter.listen()
        taken = server.port
        with server:  # starts it
            assert server.port != taken and server.proc is not None and server.proc.poll() is None
        given = EmbeddedNats(port=taken)  # a port the user named is theirs to fix: one clear error
        try:
            with pytest.raises(RuntimeError, match=f"port {taken}"):
                given.start()
        finally:
            given.close()


async def test_provisioning_returns_once_every_stream_has_a_leader_and_names_those_that_have_none(
        nats_cluster: NatsCluster) -> None:
    """``bus init`` returns when what it declared is usable (right after creation an R3 group may still be
    electing, and the first ``serve`` timed out verifying it in CI); without a quorum it says which."""
    settings = Settings(bus_replicas=3)
    nc, js = await bus.connect(nats_cluster.url, name="test-provision")
    try:
        await bus.provision(js, settings)
        for s in STREAMS:  # every one answers at once, with a leader
            info = await js.stream_info(s)
            assert info.cluster is not None and info.cluster.leader
    finally:
        await nc.close()
    await asyncio.to_thread(nats_cluster.kill, 1)
    await asyncio.to_thread(nats_cluster.kill, 2)  # one of three left: no group has a quorum
    nc, js = await bus.connect(nats_cluster.urls[0], name="test-provision-alone")
    try:
        # the survivor may lead FAULTS until it notices it lost its quorum (nats-server's lost-quorum check)
        deadline = time.monotonic() + 40
        while True:
            try:
                await bus.await_leaders(js, [subjects.FAULTS_STREAM], [], timeout_s=3)
            except TemporaryError as e:
                assert "no Raft leader within 3s for FAULTS;" in str(e) and "bus init" in str(e)
                break
            assert time.monotonic() < deadline, "the lone server kept a leader for FAULTS for 40 s"
            await asyncio.sleep(1)
    finally:
        await nc.close()
