"""The node agent names a GPU's holders from the kubelet's PodResources socket, read over gRPC, and says so
when it cannot; ``agent --check`` reports what it can see (remediator.cli.agent, remediator.agent.check,
remediator.agent.holders).

Integration ring: a real nats-server, ``remediator agent`` as a process on a simulated node laid out as
``remediator sim --gpu-state DIR`` lays it out (``DIR/<node>/sim`` and ``DIR/<node>/pod-resources.sock``), the
simulated kubelet's gRPC server, signed commands as the executor sends them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.kubelet import mirror_pods
from chaos.sim import ClusterState, seed_cluster
from chaos.sim.gpu_node import SimFleet, SimGpuNode
from chaos.sim.podresources_server import SOCKET_NAME, PodResourcesServers
from remediator.agent.check import CHECK_KEYS
from remediator.contracts import AgentCommand, GpuRef
from remediator.natsd import EmbeddedNats

from .agent_support import REPO, TRUST, agent_cli, command, provisioned

pytestmark = pytest.mark.timeout(120)
NODE = "gpu-node-0"


@pytest.fixture
def gpu_state() -> Iterator[Path]:
    """``--gpu-state DIR`` in a short directory (socket addresses are limited to 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="gpu-state-") as d:
        yield Path(d)


def laid_out(gpu_state: Path, *, serve: bool = True) -> tuple[ClusterState, SimGpuNode, PodResourcesServers]:
    """What ``remediator sim --nodes 1 --gpu-state DIR`` lays out: the node, its pods, its kubelet socket."""
    cluster = seed_cluster(1, gpus_per_pod=2)
    sim = SimGpuNode(gpu_state / NODE / "sim", name=NODE, gpus=8)
    mirror_pods(cluster, {NODE: sim})
    servers = PodResourcesServers(cluster, {NODE: sim})
    if serve:
        servers.serve(NODE, gpu_state / NODE / SOCKET_NAME)
    return cluster, sim, servers


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from remediator.cli import main; main()", "agent", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


async def test_status_reports_the_holders_read_over_grpc(nats_server: EmbeddedNats, tmp_path: Path,
                                                         gpu_state: Path) -> None:
    cluster, _, servers = laid_out(gpu_state, serve=False)  # the kubelet's socket comes up after the agent
    nc, _ = await provisioned(nats_server.url)
    proc = agent_cli(["--node", NODE, "--nats", nats_server.url, "--sim-gpus", "8", "--state", str(gpu_state / NODE),
                      "--interval", "0.5", "--trust-key", TRUST[0]], log=tmp_path / "agent.log")
    try:
        status = None
        for _ in range(100):
            try:
                status = await command(nc, NODE, AgentCommand(id="s0", verb="status"), within=1)
                break
            except Exception:
                assert proc.poll() is None, (tmp_path / "agent.log").read_text()
                await asyncio.sleep(0.2)
        assert status is not None and status.after["holders_known"] is False and "does not exist" in status.detail
        assert "PodResources socket" in (tmp_path / "agent.log").read_text()  # said once at start
        servers.serve(NODE, gpu_state / NODE / SOCKET_NAME)
        for n in range(30):  # found within the client's reconnect backoff (at most 2 s)
            status = await command(nc, NODE, AgentCommand(id=f"s1-{n}", verb="status"))
            if status.after["holders_known"]:
                break
            await asyncio.sleep(0.2)
        assert status.ok and status.after["holders_known"] is True
        alloc = cluster.gpu_allocation(NODE)
        assert {g["index"]: [(h["namespace"], h["name"], h["uid"], h["container"]) for h in g["holders"]]
                for g in status.after["gpus"]} == {
            i: [(h.namespace, h.name, h.uid, h.container) for h in alloc.get(i, [])] for i in range(8)}
        assert all(h["uid"] for g in status.after["gpus"] for h in g["holders"])  # each UID found on the node

        before = servers.servers[NODE].calls
        held = min(alloc)
        one = await command(nc, NODE, AgentCommand(id="s2", verb="status", gpu=GpuRef(index=held)))
        assert [h["uid"] for h in one.after["holders"]] == [h.uid for h in alloc[held]]
        assert servers.servers[NODE].calls - before == 1  # one List for the reply's eight GPUs

        servers.stop()  # the kubelet goes away: the agent says it cannot tell, and why
        gone = await command(nc, NODE, AgentCommand(id="s3", verb="status", gpu=GpuRef(index=held)))
        assert gone.ok and gone.after["holders_known"] is False and gone.after["holders"] == []
        assert "pod-resources socket" in gone.detail and "does not exist" in gone.detail
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        servers.stop()
        await nc.close()


async def test_an_agent_without_a_socket_says_holders_are_unknown(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    nc, _ = await provisioned(nats_server.url)
    try:
        # a fleet never joined to a cluster: its sockets are never served
        async with SimFleet(tmp_path / "fleet", [NODE], nats_url=nats_server.url, gpus=2,
                            agent_options={"trust_keys": TRUST}) as fleet:
            await fleet.agents[NODE].link.up.wait()
            reply = await command(nc, NODE, AgentCommand(id="s1", verb="status"))
            assert reply.ok and reply.after["holders_known"] is False
            assert all(g["holders"] is None for g in reply.after["gpus"])
            assert "which pods hold the GPU is unknown" in reply.detail
            iso = await command(nc, NODE, AgentCommand(id="i1", verb="isolate_gpu", gpu=GpuRef(index=1)))
            assert iso.ok and iso.after["holders_known"] is False and iso.after["holders"] == []
    finally:  # a failure here must not leave a client for a later test's collector to find
        await nc.close()


def _provision(url: str) -> None:
    async def go() -> None:
        nc, _ = await provisioned(url)
        await nc.close()

    asyncio.run(go())


def test_check_reports_what_the_agent_sees_and_exits_0(nats_server: EmbeddedNats, gpu_state: Path) -> None:
    _provision(nats_server.url)
    cluster, sim, servers = laid_out(gpu_state)
    try:
        done = run_cli("--node", NODE, "--nats", nats_server.url, "--sim-gpus", "8", "--state",
                       str(gpu_state / NODE), "--check", "--json")
    finally:
        servers.stop()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert tuple(report) == CHECK_KEYS and report["ok"] is True and report["problems"] == []
    assert report["gpus"]["source"] == "sim" and report["gpus"]["count"] == 8
    assert [g["uuid"] for g in report["gpus"]["gpus"]] == sim.device_ids()
    pr = report["pod_resources"]
    assert pr["ok"] is True and pr["socket"] == str(gpu_state / NODE / SOCKET_NAME)
    assert pr["pods"] == len(cluster.pods_on(NODE))
    assert set(pr["holders"]) == {sim.identity(i).uuid for i in cluster.gpu_allocation(NODE)}
    assert report["kernel_log"]["ok"] is True and report["nats"]["ok"] is True
    assert "FAULTS stores faults.agent." in report["nats"]["detail"]
    assert report["kubelet_pods"]["ok"] is True and report["pod_logs"]["ok"] is True


def test_check_fails_on_a_bus_that_cannot_store_the_nodes_events(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Reachable NATS is not enough: with no FAULTS stream (``bus init`` never ran) the check says so, names the
    fix and exits 1, and stores nothing (the bus check publishes with an impossible expectation)."""
    done = run_cli("--node", NODE, "--nats", nats_server.url, "--kmsg", os.devnull, "--check", "--json")
    assert done.returncode == 1, done.stdout
    report = json.loads(done.stdout)
    assert report["nats"]["ok"] is False and "remediator bus init" in report["nats"]["detail"]
    assert any(p.startswith("nats:") and "cannot store this node's events" in p for p in report["problems"])


def test_check_names_each_missing_source_and_exits_1(gpu_state: Path, tmp_path: Path) -> None:
    done = run_cli("--node", NODE, "--nats", "nats://127.0.0.1:1", "--kmsg", str(tmp_path / "no-kmsg"),
                   "--pod-resources", str(gpu_state / "absent.sock"), "--kubelet-pods-dir", str(tmp_path / "none"),
                   "--check", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    problems = report["problems"]
    assert any(p.startswith("kernel_log: --kmsg") and "/dev/kmsg" in p for p in problems)
    assert any(p.startswith("pod_resources:") and "--pod-resources SOCKET" in p for p in problems)
    assert any(p.startswith("nats:") and "REMEDIATOR_NATS_URL" in p for p in problems)
    lines = [line for line in done.stderr.splitlines() if line.startswith("agent --check:")]
    assert len(lines) == len(problems) and "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--sim-gpus", "2", "--pod-resources", "/nonexistent/kubelet.sock"], "--pod-resources /nonexistent/kubelet.sock: "
                                                                           "no such socket"),
    (["--kmsg", "/nonexistent/kmsg"], "--kmsg /nonexistent/kmsg: no such file"),
    ([], "nothing to watch"),
], ids=["socket", "kmsg", "nothing"])
def test_a_bad_source_at_start_is_one_line(args: list[str], said: str) -> None:
    done = run_cli("--node", NODE, *args)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


def test_nvml_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    done = run_cli("--node", NODE, "--nvml", "--nvml-library", str(tmp_path / "libnvidia-ml.so.1"),
                   "--state", str(tmp_path / "state"), "--nats", "nats://127.0.0.1:1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "NVML cannot start" in x]
    assert "runtimeClassName: nvidia" in line


def test_check_on_nvml_joins_dra_devices_by_minor_number(tmp_path: Path, gpu_state: Path,
                                                         nats_server: EmbeddedNats) -> None:
    from chaos.sim.podresources_server import PodResourcesServer

    from .agent_support import build_nvml_stub

    lib = build_nvml_stub(tmp_path)
    state = tmp_path / "nvml.state"
    # the driver numbered the devices against NVML's (PCI) order: /dev/nvidia1 is NVML's GPU 0
    state.write_text("count=2\ndriver=570.86.15\ngpu0.uuid=GPU-aaaaaaaa-0000-0000-0000-000000000000\ngpu0.minor=1\n"
                     "gpu1.uuid=GPU-bbbbbbbb-0000-0000-0000-000000000000\ngpu1.minor=0\n")
    claim = {"claim_name": "c", "claim_namespace": "train", "claim_resources": [
        {"driver_name": "gpu.nvidia.com", "pool_name": NODE, "device_name": "gpu-1",
         "cdi_devices": [{"name": "k8s.gpu.nvidia.com/device=gpu-1"}]}]}
    server = PodResourcesServer(gpu_state / "kubelet.sock", lambda: [
        {"name": "dra-pod", "namespace": "train", "containers": [{"name": "main", "dynamic_resources": [claim]}]}]
    ).start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from remediator.cli import main; main()", "agent", "--node", NODE, "--nvml",
             "--nats", nats_server.url, "--pod-resources", str(gpu_state / "kubelet.sock"),
             "--kubelet-pods-dir", str(tmp_path), "--check", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
            env={**os.environ, "NVML_STUB_STATE": str(state), "REMEDIATOR_NVML_LIBRARY": str(lib)})
    finally:
        server.stop()
    report = json.loads(done.stdout)
    assert report["gpus"]["driver_version"] == "570.86.15"
    assert [(g["index"], g["minor"]) for g in report["gpus"]["gpus"]] == [(0, 1), (1, 0)]
    assert report["pod_resources"]["holders"] == {
        "GPU-aaaaaaaa-0000-0000-0000-000000000000": ["train/dra-pod (uid unknown)"]}
    # no container-log directory on this machine: the UID is unknown, and the check does not fail for it
    assert report["pod_resources"]["ok"] is True


def test_sim_lays_out_a_kubelet_socket_per_node(gpu_state: Path, tmp_path: Path) -> None:
    from remediator.adapters.podresources import PodResourcesClient

    argv = [sys.executable, "-c", "from remediator.cli import main; main()", "sim", "--nodes", "2",
            "--kubeconfig-out", str(tmp_path / "kubeconfig"), "--gpu-state", str(gpu_state), "--json"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["gpu_state"] == str(gpu_state)
        for node in ("gpu-node-0", "gpu-node-1"):
            with PodResourcesClient(gpu_state / node / SOCKET_NAME) as client:
                pods = client.list()
            held = {d for p in pods for c in p.containers for dev in c.devices for d in dev.device_ids}
            sim = SimGpuNode.attach(gpu_state / node / "sim")
            assert held and held <= set(sim.device_ids())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0
    assert not (gpu_state / "gpu-node-0" / SOCKET_NAME).exists()  # removed at exit


def test_sim_refuses_a_gpu_state_too_deep_for_a_socket_in_one_line(tmp_path: Path) -> None:
    deep = Path("/tmp") / ("d" * 100)
    done = subprocess.run([sys.executable, "-c", "from remediator.cli import main; main()", "sim", "--nodes", "1",
                           "--kubeconfig-out", str(tmp_path / "kubeconfig"), "--gpu-state", str(deep)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "107-byte limit" in done.stderr and "--gpu-state DIR" in done.stderr
    finally:
        import shutil

        shutil.rmtree(deep, ignore_errors=True)
