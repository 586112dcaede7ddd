"""``remediator sim``: the simulated cluster alone, in the foreground.

Where it sits: a composition-root subcommand (DESIGN.md §10). It seeds a ``chaos.sim`` cluster of N GPU
nodes, serves its Kubernetes API on 127.0.0.1:PORT, writes a kubeconfig for it, lays out one simulated GPU
node per Kubernetes node under ``--gpu-state`` (its pods and their GPU processes mirrored from the cluster)
with that node's kubelet PodResources gRPC socket beside it (``<gpu-state>/<node>/pod-resources.sock``,
``chaos.sim.podresources_server``), and runs until SIGTERM or SIGINT, then exits 0. Point a real agent at
a simulated node with ``remediator agent --node gpu-node-0 --sim-gpus 8 --state <gpu-state>/gpu-node-0``
(which finds the socket there by itself), and inject faults into it from Python with
``SimGpuNode.attach(<gpu-state>/gpu-node-0/sim)``. ``--gpu-allocation dra`` seeds the cluster as NVIDIA's DRA
driver runs it (ResourceSlices, claims, DeviceTaintRules; ``chaos.sim.dra``), ``--gpu-pods-per-node M`` seeds M
single-pod training Jobs per node. The chaos package is imported inside the command, so loading the CLI never
loads it.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click


@click.command("sim")
@click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True, help="GPU nodes to seed.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="Port of the Kubernetes API on 127.0.0.1 (0: a free port).")
@click.option("--kubeconfig-out", type=click.Path(dir_okay=False, path_type=Path), default=Path("sim.kubeconfig"),
              show_default=True, help="Where to write the kubeconfig for the simulated cluster.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--pools", type=click.IntRange(min=1), default=1, show_default=True,
              help="Split the nodes into this many pools (pool-a, pool-b, ...).")
@click.option("--gpu-state", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of the simulated GPU nodes (default: gpu-nodes/ beside the kubeconfig).")
@click.option("--gpu-allocation", type=click.Choice(["device-plugin", "dra"]), default="device-plugin",
              show_default=True,
              help="How the nodes hand out GPUs: the NVIDIA device plugin (nvidia.com/gpu) or NVIDIA's DRA driver "
                   "(ResourceSlices, ResourceClaims, DeviceTaintRules at resource.k8s.io).")
@click.option("--gpu-pods-per-node", type=click.IntRange(min=1), default=None,
              help="Seed M training pods per node instead of the default layout, each its own single-pod Job "
                   "holding gpus-per-node / M GPUs (M must divide it).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document (url, kubeconfig, nodes, gpu_state) on stdout.")
def sim(nodes: int, port: int, kubeconfig_out: Path, gpus_per_node: int, pools: int, gpu_state: Path | None,
        gpu_allocation: str, gpu_pods_per_node: int | None, as_json: bool) -> None:
    """Serve a simulated GPU cluster (Kubernetes API and GPU nodes) until SIGTERM/SIGINT."""
    from chaos.kubelet import mirror_pods
    from chaos.sim import KubeApiServer, freeze_heap, seed_cluster
    from chaos.sim.gpu_node import SimGpuNode
    from chaos.sim.podresources_server import SOCKET_NAME, PodResourcesServers
    from remediator.errors import PermanentError

    if gpu_pods_per_node is not None and gpus_per_node % gpu_pods_per_node:
        raise click.BadParameter(f"{gpu_pods_per_node} does not divide --gpus-per-node {gpus_per_node}",
                                 param_hint="--gpu-pods-per-node")
    state = seed_cluster(nodes, gpus_per_node=gpus_per_node, pools=pools, gpu_allocation=gpu_allocation,
                         gpu_pods_per_node=gpu_pods_per_node)
    gpu_root = gpu_state or kubeconfig_out.resolve().parent / "gpu-nodes"
    gpu_nodes = {n: SimGpuNode(gpu_root / n / "sim", name=n, gpus=gpus_per_node) for n in state.node_names()}
    mirror_pods(state, gpu_nodes)
    freeze_heap()  # a long-running API server: the seeded cluster out of the collector's passes
    kubelets = PodResourcesServers(state, gpu_nodes)  # each node's kubelet PodResources socket, beside its state
    try:
        for n in gpu_nodes:
            kubelets.serve(n, (gpu_root / n / SOCKET_NAME).absolute())
    except (PermanentError, OSError) as exc:
        kubelets.stop()
        raise click.ClickException(f"{exc} (--gpu-state DIR)") from exc
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            server = KubeApiServer(state, port=port).start()
        except OSError as exc:
            raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {exc}") from exc
        try:
            path = server.write_kubeconfig(kubeconfig_out)
            click.echo(f"simulated cluster: {nodes} GPU nodes (gpu-node-0 … gpu-node-{nodes - 1}), "
                       f"Kubernetes API at {server.url}, kubeconfig {path}, GPU nodes under {gpu_root} "
                       f"(remediator agent --node gpu-node-0 --sim-gpus {gpus_per_node} --state "
                       f"{gpu_root / 'gpu-node-0'})", err=True)
            if as_json:
                click.echo(json.dumps({"url": server.url, "kubeconfig": str(path), "nodes": nodes,
                                       "gpu_state": str(gpu_root), "gpu_allocation": gpu_allocation}))
            sys.stdout.flush()
            while not stop.wait(0.5):
                pass
            click.echo("simulated cluster: stopping", err=True)
        finally:
            server.stop()
    finally:
        kubelets.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
