"""``remediator sim``: the simulated cluster alone, in the foreground.

Where it sits: a composition-root subcommand (DESIGN.md §10). It seeds a ``chaos.sim`` cluster of N GPU
nodes, serves its Kubernetes API on 127.0.0.1:PORT, writes a kubeconfig for it, and runs until SIGTERM or
SIGINT, then exits 0. The chaos package is imported inside the command, so loading the CLI never loads it.
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (url, kubeconfig, nodes) on stdout.")
def sim(nodes: int, port: int, kubeconfig_out: Path, gpus_per_node: int, pools: int, as_json: bool) -> None:
    """Serve a simulated GPU cluster's Kubernetes API until SIGTERM/SIGINT."""
    from chaos.sim import KubeApiServer, seed_cluster

    state = seed_cluster(nodes, gpus_per_node=gpus_per_node, pools=pools)
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
                       f"Kubernetes API at {server.url}, kubeconfig {path}", err=True)
            if as_json:
                click.echo(json.dumps({"url": server.url, "kubeconfig": str(path), "nodes": nodes}))
            sys.stdout.flush()
            while not stop.wait(0.5):
                pass
            click.echo("simulated cluster: stopping", err=True)
        finally:
            server.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
