"""``remediator agent``: the node agent (DESIGN.md §10).

Where it sits: the composition root of one node's agent. It builds the host interfaces — NVML
(``--nvml``, ``remediator.adapters.nvml``), ``nvidia-smi`` and hooks as subprocesses, ``/proc`` and the
kubelet's pod directories — or, with ``--sim-gpus N``, a simulated node from ``chaos.sim.gpu_node`` (the
only case in which this command loads ``chaos``), and runs ``remediator.agent.main.Agent`` until SIGTERM
or SIGINT. Logs go to standard error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from handlers.rules import RulesError, load_rules

DEFAULT_STATE_DIR = "/var/lib/gpu-remediator/agent"
AGENT_STOP_S = 15.0  # after SIGTERM/SIGINT the agent exits within this, stopped cleanly or not


@click.command("agent")
@click.option("--node", required=True, help="Kubernetes node name this agent speaks for.")
@click.option("--nats", "nats_url", envvar="REMEDIATOR_NATS_URL", default="nats://127.0.0.1:4222",
              show_default=True, metavar="URL", help="NATS server URL(s), comma-separated.")
@click.option("--creds", "creds_file", envvar="REMEDIATOR_NATS_CREDS_FILE", default=None, metavar="FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="This node's NATS .creds file (`remediator bus creds --role agent --node NAME`); its key also "
                   "signs replies unless --signing-seed names another.")
@click.option("--identity-url", envvar="REMEDIATOR_IDENTITY_URL", default=None, metavar="URL",
              help="The service's base URL: get this node's NATS credentials there (POST /v1/identity/agent) with "
                   "the projected ServiceAccount token of --identity-token-file, and renew them before they expire.")
@click.option("--identity-token-file", envvar="REMEDIATOR_IDENTITY_TOKEN_FILE", default=None, metavar="FILE",
              help="The projected ServiceAccount token (audience of the service's identity_audience).")
@click.option("--kmsg", "kmsg_path", default=None, metavar="PATH",
              help="Kernel log: /dev/kmsg, a kmsg-format file, or a dmesg/syslog text file that grows.")
@click.option("--journal", is_flag=True, help="Follow `journalctl -k -o json` (look-back 2 h without a cursor).")
@click.option("--nvml", is_flag=True, help="Poll the GPUs through NVML (libnvidia-ml).")
@click.option("--sim-gpus", type=click.IntRange(1, 64), default=None, metavar="N",
              help="Run on a simulated node with N GPUs (under --state, else a temporary directory).")
@click.option("--pod-logs", "pod_logs", default=None, metavar="DIR",
              help="Container logs to scan (/var/log/pods on a node).")
@click.option("--pod-resources", "pod_resources", default=None, metavar="SOCKET",
              help="The kubelet's PodResources gRPC socket: which pods hold which GPU (default: "
                   "/var/lib/kubelet/pod-resources/kubelet.sock; with --sim-gpus, <state>/pod-resources.sock).")
@click.option("--check", "check", is_flag=True,
              help="Print what the agent can see (GPUs, kernel log, pod-resources socket, pod directories, NATS) "
                   "and exit: 0 when everything it needs is there, 1 with one line per missing source.")
@click.option("--json", "as_json", is_flag=True, help="With --check: one JSON document on stdout.")
@click.option("--spool", "spool_dir", default=None, metavar="DIR",
              help="Durable spool for events while NATS is unreachable (default: <state>/spool).")
@click.option("--state", "state_dir", default=None, metavar="DIR",
              help=f"Positions, baselines and command replies (default: {DEFAULT_STATE_DIR}).")
@click.option("--interval", "interval_s", type=click.FloatRange(0.05), default=5.0, show_default=True,
              help="Seconds between GPU polls.")
@click.option("--memtrend-interval", "memtrend_interval_s", type=click.FloatRange(0.05), default=30.0,
              show_default=True, help="Seconds between memory-trend samples (per-process GPU memory, framebuffer).")
@click.option("--memtrend-window", "memtrend_window_s", type=click.FloatRange(0.1), default=1200.0,
              show_default=True, help="Seconds a process must stay over its baseline x factor to be reported.")
@click.option("--memtrend-warmup", "memtrend_warmup_s", type=click.FloatRange(0.0), default=120.0,
              show_default=True, help="Seconds a new process runs before its use becomes its baseline.")
@click.option("--memtrend-factor", type=click.FloatRange(1.0, min_open=True), default=1.3, show_default=True,
              help="Use over a process's baseline that is growth (the knowledge base's x 1.3).")
@click.option("--memtrend-max-processes", type=click.IntRange(1, 100_000), default=1024, show_default=True,
              help="Most processes the memory-trend watch follows (and container baselines it keeps).")
@click.option("--spool-max-bytes", type=click.IntRange(4096), default=64 * 1024 * 1024, show_default=True,
              help="Spool size limit; when it is full the watchers hold their lines (log line + counter).")
@click.option("--reboot-command", default=None, metavar="CMD",
              help="Hook run by the reboot_node command (refused when unset), e.g. 'systemctl reboot'.")
@click.option("--health-command", default=None, metavar="CMD",
              help="Extra check run by the health_check command, e.g. 'dcgmi diag -r 1'.")
@click.option("--bug-report-command", default="nvidia-bug-report.sh", show_default=True, metavar="CMD",
              help="Run by collect_bug_report after a failed GPU reset (output tail kept); '' turns it off.")
@click.option("--nvml-xid-events/--no-nvml-xid-events", default=None,
              help="Publish Xids from NVML event sets (default: only when no kernel log is followed).")
@click.option("--nvml-library", envvar="REMEDIATOR_NVML_LIBRARY", default=None, hidden=True,
              help="Load this libnvidia-ml.so instead of the system one (tests).")
@click.option("--boot-id-path", default="/proc/sys/kernel/random/boot_id", hidden=True)
@click.option("--proc-root", default="/proc", hidden=True)
@click.option("--kubelet-pods-dir", default="/var/lib/kubelet/pods", hidden=True)
@click.option("--trust-key", "trust_keys", multiple=True, envvar="REMEDIATOR_TRUST_KEYS", metavar="PUBKEY",
              help="Public nkey of the service whose signed commands this agent runs (repeatable; env: "
                   "comma- or space-separated). Without one every command is refused.")
@click.option("--signing-seed", "signing_seed_file", default=None, metavar="FILE",
              type=click.Path(dir_okay=False, exists=True),
              help="Seed or .creds file of the key replies are signed with (default: <state>/identity/agent.nk, "
                   "made once).")
@click.option("--rules", "rules_file", envvar="REMEDIATOR_RULES_FILE", default=None, metavar="FILE",
              help="Operator rules YAML: its added signatures run in the log scanners (reloaded on change).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def agent(node: str, nats_url: str, creds_file: str | None, identity_url: str | None,
          identity_token_file: str | None, kmsg_path: str | None, journal: bool, nvml: bool,
          sim_gpus: int | None, pod_logs: str | None, spool_dir: str | None, state_dir: str | None, interval_s: float,
          spool_max_bytes: int, reboot_command: str | None, health_command: str | None,
          bug_report_command: str, nvml_xid_events: bool | None, nvml_library: str | None, boot_id_path: str,
          proc_root: str,
          kubelet_pods_dir: str, trust_keys: tuple[str, ...], signing_seed_file: str | None,
          log_level: str, pod_resources: str | None = None, check: bool = False, as_json: bool = False,
          rules_file: str | None = None, **memtrend: Any) -> None:
    """The node agent: kernel-log Xid watcher, NVML poller, container-log scanner, orphan check and
    command responder for one node, publishing to faults.agent.<node> (spooling while NATS is down)."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _skip_websocket_transport(nats_url)
    if nvml and sim_gpus:
        raise click.UsageError("--nvml and --sim-gpus exclude each other")
    if kmsg_path is not None and not check and not Path(kmsg_path).exists():
        raise click.UsageError(f"--kmsg {kmsg_path}: no such file (the kernel log is /dev/kmsg on a node)")
    if pod_logs is not None and not check and not Path(pod_logs).is_dir():
        raise click.UsageError(f"--pod-logs {pod_logs}: no such directory (container logs are /var/log/pods)")
    if pod_resources is not None and not check:
        _usable_socket(pod_resources)
    if rules_file is not None:
        try:
            load_rules(rules_file)
        except RulesError as exc:
            click.echo(f"remediator agent: {exc}", err=True)
            sys.exit(2)
    if not (kmsg_path or journal or nvml or sim_gpus or pod_logs) and not check:
        raise click.UsageError("nothing to watch: pass --kmsg PATH, --journal, --nvml, --pod-logs DIR "
                               "or --sim-gpus N")
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if state_dir is None:
        if sim_gpus:
            tmp = tempfile.TemporaryDirectory(prefix=f"remediator-agent-{node}-")
            state_dir = tmp.name
        else:
            state_dir = DEFAULT_STATE_DIR
    options: dict[str, Any] = {
        "node": node, "state_dir": state_dir, "nats_url": nats_url, "spool_dir": spool_dir,
        "kmsg_path": kmsg_path, "journal": journal, "pod_logs_dir": pod_logs, "boot_id_path": boot_id_path,
        "nvml_interval_s": interval_s, "nvml_xid_events": nvml_xid_events, "spool_max_bytes": spool_max_bytes,
        "signing_seed_file": signing_seed_file or creds_file, "creds_file": creds_file,
        "trust_keys": tuple(k for entry in trust_keys for k in entry.replace(",", " ").split()),
        "pod_resources_socket": _pod_resources_socket(pod_resources, state_dir if sim_gpus else None),
        "rules_file": rules_file,
        "kubelet_pods_dir": kubelet_pods_dir,
    }
    options.update({k: v for k, v in memtrend.items() if k.startswith("memtrend_")})
    if identity_url and (creds_file or not identity_token_file):
        raise click.UsageError("--identity-url needs --identity-token-file and excludes --creds")
    identity = (identity_url, identity_token_file) if identity_url and identity_token_file else None
    if check:
        try:
            code = asyncio.run(_check(options, explicit=pod_resources is not None, nvml=nvml, sim_gpus=sim_gpus,
                                      nvml_library=nvml_library, as_json=as_json))
        finally:
            if tmp is not None:
                tmp.cleanup()
        sys.exit(code)
    try:
        asyncio.run(_run(options, identity=identity, nvml=nvml, sim_gpus=sim_gpus, nvml_library=nvml_library,
                         reboot_command=reboot_command, health_command=health_command,
                         bug_report_command=bug_report_command, proc_root=proc_root,
                         kubelet_pods_dir=kubelet_pods_dir))
    finally:
        if tmp is not None:
            tmp.cleanup()


def _usable_socket(path: str) -> None:
    """A ``--pod-resources`` given explicitly must be a socket this agent may connect to: else a usage error."""
    from remediator.adapters.podresources import check_socket_path
    from remediator.errors import PermanentError

    try:
        check_socket_path(path)
    except PermanentError as e:
        raise click.UsageError(f"--pod-resources: {e}") from None
    p = Path(path)
    if not p.is_socket():
        what = "no such socket" if not p.exists() else "not a socket"
        raise click.UsageError(f"--pod-resources {path}: {what} (the kubelet's is "
                               "/var/lib/kubelet/pod-resources/kubelet.sock; mount that directory into the agent)")
    if not os.access(path, os.R_OK | os.W_OK):
        raise click.UsageError(f"--pod-resources {path}: permission denied (connecting needs write access to the "
                               "socket: run the agent as root or mount the directory read-write)")


def _pod_resources_socket(given: str | None, sim_state: str | None) -> str:
    """The socket the agent reads holders from: the one given; with --sim-gpus the simulated kubelet's beside
    the state (``<state>/pod-resources.sock``); else the kubelet's default. A socket that is not there (yet)
    makes each reply say the holders are unknown and why, until it appears (a kubelet that restarts)."""
    from remediator.adapters.podresources import DEFAULT_SOCKET

    if given is not None:
        return given
    if sim_state is not None:
        return str(Path(sim_state) / "pod-resources.sock")
    return DEFAULT_SOCKET


def _gpu_backend(nvml: bool, sim_gpus: int | None, state_dir: str, node: str,
                 nvml_library: str | None) -> tuple[Any, str | None, str | None]:
    """(backend, source, error): NVML, a simulated node, or none; an NVML that cannot start is an error line."""
    if sim_gpus:
        from chaos.sim.gpu_node import SimGpuNode

        root = Path(state_dir) / "sim"
        sim = SimGpuNode.attach(root) if (root / "state.json").exists() else SimGpuNode(root, name=node,
                                                                                      gpus=sim_gpus)
        return sim, "sim", None
    if not nvml:
        return None, None, None
    from remediator.adapters.nvml import NvmlBackend

    try:
        return NvmlBackend(nvml_library), "nvml", None
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission, ...
        return None, "nvml", (f"NVML cannot start ({type(e).__name__}: {e}); run the agent with the NVIDIA "
                              "runtime class (runtimeClassName: nvidia) or NVIDIA_VISIBLE_DEVICES=all, or drop --nvml")


async def _check(options: dict[str, Any], *, explicit: bool, nvml: bool, sim_gpus: int | None,
                 nvml_library: str | None, as_json: bool) -> int:
    import json

    from remediator.agent.check import check_sources, render

    gpus, source, error = _gpu_backend(nvml, sim_gpus, options["state_dir"], options["node"], nvml_library)
    kmsg, logs, kubelet_pods = options["kmsg_path"], options["pod_logs_dir"], options["kubelet_pods_dir"]
    if source == "sim":
        kmsg, logs, kubelet_pods = kmsg or str(gpus.kmsg_path), logs or str(gpus.pod_logs_dir), str(
            gpus.kubelet_pods_dir)
    try:
        report = await check_sources(
            node=options["node"], gpus=gpus, gpu_source=source, gpu_error=error, kmsg_path=kmsg,
            journal=options["journal"], pod_resources_socket=options["pod_resources_socket"],
            pod_resources_explicit=explicit, pod_logs_dir=logs, pod_log_root="/var/log/pods",
            kubelet_pods_dir=kubelet_pods, nats_url=options["nats_url"], creds_file=options["creds_file"])
    finally:
        if gpus is not None:
            gpus.close()
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(render(report))
    for line in report["problems"]:
        click.echo(f"agent --check: {line}", err=True)
    return 0 if report["ok"] else 1


def _skip_websocket_transport(url: str) -> None:
    """Keep nats-py from importing aiohttp, which it needs only for ws:// URLs (about 11 MB resident in a
    daemon that runs on every GPU node; nats-py treats a missing aiohttp as "no WebSocket transport")."""
    if "aiohttp" in sys.modules or "nats" in sys.modules:
        return
    if any(u.strip().lower().startswith(("ws://", "wss://")) for u in url.split(",")):
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]


async def _identity(options: dict[str, Any], url: str, token_file: str) -> Any:
    """This node's credentials from the service (retried until it answers); the creds file and the key
    that signs replies go into ``options``. Returns the expiry for ``keep_fresh``."""
    from remediator.identity import client

    log = logging.getLogger("remediator.agent")
    wait = 2.0
    while True:
        try:
            path, expires = await client.fetch(url, token_file, options["node"], options["state_dir"])
        except Exception as e:  # the service is not up yet, or refuses: say why, keep trying
            log.warning("agent credentials from %s: %s; retrying in %gs", url, e, wait)
            await asyncio.sleep(wait)
            wait = min(60.0, wait * 2)
            continue
        options["creds_file"] = str(path)
        options["signing_seed_file"] = options.get("signing_seed_file") or str(
            Path(options["state_dir"]) / "identity" / client.KEY_FILE)
        log.info("agent credentials for %s issued until %s", options["node"], expires)
        return expires


async def _run(options: dict[str, Any], *, identity: tuple[str, str] | None = None, nvml: bool,
               sim_gpus: int | None, nvml_library: str | None,
               reboot_command: str | None, health_command: str | None, proc_root: str,
               bug_report_command: str = "nvidia-bug-report.sh",
               kubelet_pods_dir: str) -> None:
    from remediator.agent.host import ProcPodView, SubprocessHostRunner
    from remediator.agent.main import Agent, AgentConfig
    from remediator.errors import SetupError

    log = logging.getLogger("remediator.agent")
    expires = await _identity(options, *identity) if identity is not None else None
    agent_obj: Agent
    if sim_gpus:
        from chaos.sim.gpu_node import SimGpuNode, sim_agent_config

        root = Path(options["state_dir"]) / "sim"
        if (root / "state.json").exists():
            sim = SimGpuNode.attach(root)
        else:
            sim = SimGpuNode(root, name=options["node"], gpus=sim_gpus)
        overrides = {k: v for k, v in options.items()
                     if v is not None and k not in ("node", "nats_url", "kubelet_pods_dir")}
        overrides["boot_id_path"] = str(sim.boot_id_path)
        config = sim_agent_config(sim, nats_url=options["nats_url"], **overrides)
        agent_obj = Agent(config, gpus=sim, host=sim, pods=sim)
        log.info("simulated node %s with %d GPU(s) at %s", sim.name, sim.gpu_count(), sim.root)
    else:
        gpus, _, error = _gpu_backend(nvml, None, options["state_dir"], options["node"], nvml_library)
        if error is not None:
            raise SetupError(error)
        host = SubprocessHostRunner(reboot_command=shlex.split(reboot_command) if reboot_command else None,
                                    health_command=shlex.split(health_command) if health_command else None,
                                    bug_report_command=shlex.split(bug_report_command) or None)
        pods = ProcPodView(proc_root, kubelet_pods_dir=kubelet_pods_dir) if gpus is not None else None
        config = AgentConfig(**options)
        agent_obj = Agent(config, gpus=gpus, host=host, pods=pods)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    signalled: list[float] = []

    def on_signal() -> None:  # during start too (NATS away): the first signal stops, a second exits now
        if signalled:
            os._exit(1)
        signalled.append(time.monotonic())
        loop.call_later(AGENT_STOP_S, os._exit, 1)
        stop.set()
        if not started:
            main_task.cancel()

    started = False
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    renew: asyncio.Task[None] | None = None
    if identity is not None:
        from remediator.identity import client

        renew = asyncio.create_task(client.keep_fresh(identity[0], identity[1], options["node"],
                                                      options["state_dir"], expires, stop))
    try:
        await agent_obj.start()
        started = True
        log.info("agent %s running (pid %d); SIGTERM or SIGINT stops it", options["node"], os.getpid())
        await stop.wait()
    except asyncio.CancelledError:
        if not signalled:
            raise
    finally:
        log.info("agent %s stopping", options["node"])
        if renew is not None:
            renew.cancel()
        await agent_obj.stop()
