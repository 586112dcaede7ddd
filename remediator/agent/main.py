"""The node agent, composed: kernel-log watcher, NVML poller, orphan check, memory-trend watch,
container-log scanner, command responder, all publishing through one spool-backed connection.

Where it sits: one per GPU node (a DaemonSet on a real cluster, one per simulated node in the demo), on
the producing side of the bus: events go to ``faults.agent.<node>``, commands come in on
``agent.<node>.cmd``. ``remediator agent`` builds an ``Agent`` from its options with the real host
(``NvmlBackend``, ``SubprocessHostRunner``, ``ProcPodView``) or a simulated node; ``chaos.sim.gpu_node``
runs several in one process. Nothing here imports ``chaos``.

Usage::

    agent = Agent(AgentConfig(node="gpu-node-0", nats_url=url, state_dir=path, kmsg_path="/dev/kmsg"),
                  gpus=NvmlBackend(), host=SubprocessHostRunner(), pods=ProcPodView())
    async with agent:           # start(): connects in the background, starts every watcher
        await agent.wait()      # until stop() or cancellation
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from handlers.rules import RulesSource
from remediator.agent.commands import CommandResponder
from remediator.agent.events import Clock, GpuDirectory, submit_when_room
from remediator.agent.host import GpuBackend, GpuSnapshot, HostRunner, PodResourcesView, PodView, RunResult
from remediator.agent.journal import DEFAULT_LOOKBACK_S, JournalSource
from remediator.agent.kmsg import KernelLogWatcher, KernelSource, open_kernel_source
from remediator.agent.memtrend import MemoryTrend, TrendPolicy
from remediator.agent.nvml_poller import NvmlPoller, XidEventWatcher
from remediator.agent.orphans import OrphanDetector
from remediator.agent.podlogs import PodLogScanner
from remediator.agent.publisher import BusLink, Publisher
from remediator.agent.refusals import RefusalReporter
from remediator.agent.spool import DEFAULT_MAX_BYTES, Spool
from remediator.agent.state import DEFAULT_BOOT_ID_PATH, StateStore, read_boot_id
from remediator.bus import Credentials, verify_capture
from remediator.contracts import FaultEvent, utcnow
from remediator.rules_watch import watch_rules
from remediator.signing import TrustSet, load_signer, local_signer
from remediator.subjects import FAULTS_STREAM, faults_subject

log = logging.getLogger(__name__)

BUS_CHECK_S = 300.0  # how often the agent re-verifies that FAULTS stores its events
BUS_RECHECK_S = 10.0  # ... while it does not

AGENT_KEY_FILE = "agent.nk"


@dataclass(frozen=True)
class AgentConfig:
    """Everything an agent needs besides its host interfaces. Paths may be strings or ``Path``s."""

    node: str
    state_dir: Path | str
    nats_url: str = "nats://127.0.0.1:4222"
    creds_file: Path | str | None = None  # this node's agent .creds (remediator bus creds --role agent --node)
    spool_dir: Path | str | None = None  # default: <state_dir>/spool
    kmsg_path: str | None = None  # /dev/kmsg, a kmsg-format file, or a dmesg/syslog text file
    journal: bool = False
    journal_command: Sequence[str] = ("journalctl",)
    journal_lookback_s: float = DEFAULT_LOOKBACK_S
    pod_logs_dir: Path | str | None = None
    # the kubelet's PodResources socket (which pods hold which GPU); None: no holder source
    pod_resources_socket: Path | str | None = None
    pod_resources_timeout_s: float = 5.0
    # where the kubelet keeps pod log and pod data directories (a holder's UID; see remediator.agent.holders)
    pod_log_root: Path | str = "/var/log/pods"
    kubelet_pods_dir: Path | str = "/var/lib/kubelet/pods"
    boot_id_path: str = DEFAULT_BOOT_ID_PATH
    nvml_interval_s: float = 5.0
    nvml_xid_events: bool | None = None  # None: only when no kernel log is followed
    file_poll_interval_s: float = 0.25
    podlog_poll_interval_s: float = 0.5
    podlog_rescan_s: float = 5.0
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    publish_timeout_s: float = 2.0
    reconnect_wait_s: float = 0.5
    orphan_confirmations: int = 2
    # memory-trend watch (remediator.agent.memtrend): a sample every interval, growth past baseline x factor
    # held for the window, a baseline after the warm-up, at most max_processes processes followed
    memtrend_interval_s: float = 30.0
    memtrend_window_s: float = 1200.0
    memtrend_warmup_s: float = 120.0
    memtrend_factor: float = 1.3
    memtrend_max_processes: int = 1024
    temperature_limit_c: int = 90
    # The key replies are signed with: the seed in this file (the agent's NATS ``.creds``, or a seed file);
    # None: <state_dir>/identity/agent.nk, made once. Its public key is what the executor must find in KV.
    signing_seed_file: Path | str | None = None
    trust_keys: tuple[str, ...] = ()  # the service's public keys whose commands this agent runs
    # The operator rules YAML (handlers.rules): its added signatures run in the log scanners, reloaded while
    # the agent runs (the same file and setting, REMEDIATOR_RULES_FILE, that serve reads).
    rules_file: Path | str | None = None
    rules_poll_s: float = 5.0


class _NoHost:
    """``HostRunner`` of an agent without GPUs: every action is refused."""

    async def _no(self) -> RunResult:
        return RunResult(False, "this agent has no GPU backend")

    async def isolate_gpu(self, gpu: Any) -> RunResult:
        return await self._no()

    async def release_gpu(self, gpu: Any) -> RunResult:
        return await self._no()

    async def reset_gpu(self, gpu: Any) -> RunResult:
        return await self._no()

    async def kill_process(self, pid: int) -> RunResult:
        return await self._no()

    async def reboot_node(self) -> RunResult | None:
        return None

    async def health_command(self) -> RunResult | None:
        return None

    async def bug_report(self) -> RunResult | None:
        return None


class Agent:
    """One node's agent. ``start``/``stop`` (or ``async with``); ``stats()`` for status and benchmarks."""

    def __init__(self, config: AgentConfig, *, gpus: GpuBackend | None = None, host: HostRunner | None = None,
                 pods: PodView | None = None, pod_resources: PodResourcesView | None = None,
                 clock: Clock = utcnow) -> None:
        self.config = config
        self.node = config.node
        self.gpus = gpus
        self.host: HostRunner = host or _NoHost()
        self.pods = pods
        self.clock = clock
        self.state = StateStore(config.state_dir)
        self.spool = Spool(config.spool_dir or Path(config.state_dir) / "spool", max_bytes=config.spool_max_bytes)
        self.link = BusLink(config.nats_url, name=f"remediator-agent-{config.node}",
                            reconnect_wait_s=config.reconnect_wait_s,
                            credentials=Credentials(creds_file=str(config.creds_file)) if config.creds_file else None)
        self.publisher = Publisher(self.link, self.spool, publish_timeout_s=config.publish_timeout_s)
        self.directory = GpuDirectory()
        self.signer = (load_signer(config.signing_seed_file) if config.signing_seed_file
                       else local_signer(Path(config.state_dir) / "identity" / AGENT_KEY_FILE))
        self._pod_resources_client: Any = None
        if pod_resources is None and config.pod_resources_socket is not None:
            pod_resources = self._kubelet_holders(config)
        self.pod_resources = pod_resources
        socket = config.pod_resources_socket
        self._socket_absent = socket is not None and not Path(socket).exists()  # for the warning at start
        self.responder = CommandResponder(node=config.node, gpus=gpus, host=self.host, pods=pods,
                                          pod_resources=pod_resources,
                                          state=self.state, status_extra=self.stats,
                                          temperature_limit_c=config.temperature_limit_c, signer=self.signer,
                                          trust=TrustSet(config.trust_keys))
        self.refusals = RefusalReporter(config.node, self.signer)
        self.bus_problem: str | None = ""  # "": not verified yet; None: FAULTS stores this node's events
        self.responder.on_refused = self.refusals.refused
        self.link.on_connect(self._subscribe_commands)
        self.kernel_watchers: list[KernelLogWatcher] = []
        self.poller: NvmlPoller | None = None
        self.orphans: OrphanDetector | None = None
        self.memtrend: MemoryTrend | None = None
        self.podlogs: PodLogScanner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.rules = RulesSource(config.rules_file)
        self._started = False

    def boot_id(self) -> str:
        return read_boot_id(self.config.boot_id_path)

    def _kubelet_holders(self, config: AgentConfig) -> PodResourcesView:
        """The holder view over the kubelet's PodResources socket, joined with this agent's GPUs."""
        from remediator.adapters.podresources import PodResourcesClient
        from remediator.agent.holders import KubeletHolders, PodUids

        assert config.pod_resources_socket is not None
        client = PodResourcesClient(config.pod_resources_socket, timeout_s=config.pod_resources_timeout_s)
        self._pod_resources_client = client
        backend = self.gpus
        minor = getattr(backend, "minor_number", None)

        def identities() -> list[Any]:
            return [] if backend is None else [backend.snapshot(i).identity for i in range(backend.gpu_count())]

        return KubeletHolders(client, identities,
                              uids=PodUids(config.pod_logs_dir or config.pod_log_root, config.kubelet_pods_dir),
                              minor=(lambda g: minor(g.index)) if callable(minor) else (lambda g: None))

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every configured watcher and the connection (which may come up later)."""
        if self._started:
            return
        self._started = True
        cfg = self.config
        if self.gpus is not None:
            snaps = await asyncio.to_thread(self._snapshots)
            self._learn(snaps)
            self.poller = NvmlPoller(self.gpus, node=self.node, state=self.state, boot_id=self.boot_id,
                                     clock=self.clock, interval_s=cfg.nvml_interval_s)
            if self.pods is not None:
                self.orphans = OrphanDetector(self.pods, node=self.node, boot_id=self.boot_id, clock=self.clock,
                                              confirmations=cfg.orphan_confirmations)
            self.memtrend = MemoryTrend(
                node=self.node, state=self.state, boot_id=self.boot_id, pods=self.pods,
                pod_resources=self.responder.pod_resources, interval_s=cfg.memtrend_interval_s, clock=self.clock,
                policy=TrendPolicy(factor=cfg.memtrend_factor, window=timedelta(seconds=cfg.memtrend_window_s),
                                   warmup=timedelta(seconds=cfg.memtrend_warmup_s),
                                   repeat=timedelta(seconds=min(60.0, cfg.memtrend_window_s)),
                                   max_processes=cfg.memtrend_max_processes))
            self.responder.memory_check = self.memtrend.check
        if cfg.rules_file:
            self.rules.load()  # RulesError (every FILE:LINE problem) stops the start, as it stops serve's
            self._spawn("rules", lambda: watch_rules(self.rules, self._stopped, cfg.rules_poll_s))
        sources: list[KernelSource] = []
        if cfg.kmsg_path:
            sources.append(open_kernel_source(cfg.kmsg_path, boot_id=self.boot_id,
                                              poll_interval_s=cfg.file_poll_interval_s))
        if cfg.journal:
            sources.append(JournalSource(boot_id=self.boot_id, command=cfg.journal_command,
                                         lookback_s=cfg.journal_lookback_s))
        for source in sources:
            self.kernel_watchers.append(KernelLogWatcher(source, node=self.node, sink=self.publisher,
                                                         gpus=self.directory, state=self.state,
                                                         clock=self.clock, rules=self.rules.current))
        if cfg.pod_logs_dir:
            self.podlogs = PodLogScanner(cfg.pod_logs_dir, node=self.node, sink=self.publisher, state=self.state,
                                         clock=self.clock, poll_interval_s=cfg.podlog_poll_interval_s,
                                         rescan_interval_s=cfg.podlog_rescan_s, rules=self.rules.current)
        self._spawn("bus", self.link.run)
        self._spawn("replay", self.publisher.replay)
        self._spawn("refusal-reports", lambda: self.refusals.run(self.link))
        self._spawn("bus-check", self._check_bus)
        for w in self.kernel_watchers:
            self._spawn(f"kernel-{w.source.name}", w.run)
        if self.poller is not None:
            self._spawn("gpu-poll", self._gpu_loop)
            xid_events = cfg.nvml_xid_events if cfg.nvml_xid_events is not None else not sources
            if xid_events and self.gpus is not None:
                watcher = XidEventWatcher(self.gpus, node=self.node, state=self.state, boot_id=self.boot_id,
                                          identities=lambda: self.poller.latest if self.poller else [],
                                          clock=self.clock)
                self._spawn("nvml-xid", lambda: watcher.run(self.submit))
        if self.podlogs is not None:
            self._spawn("pod-logs", self.podlogs.run)
        if not self.responder.trust:
            log.warning("agent for node %s trusts no service key (--trust-key): every command will be refused",
                        self.node)
        socket = cfg.pod_resources_socket
        if self.gpus is not None and (self.pod_resources is None or self._socket_absent):
            log.warning("agent for node %s: %s; until there is one, which pods hold a GPU is unknown and per-GPU "
                        "eviction is refused", self.node, f"the kubelet's PodResources socket {socket} does not "
                        "exist (yet)" if socket else "no kubelet PodResources socket (--pod-resources SOCKET)")
        log.info("agent for node %s started (key %s, kernel: %s, gpus: %s, pod logs: %s, pod resources: %s, "
                 "nats: %s)", self.node, self.signer.public_key,
                 ", ".join(s.name for s in sources) or "none",
                 type(self.gpus).__name__ if self.gpus is not None else "none", cfg.pod_logs_dir or "none",
                 cfg.pod_resources_socket or "none", cfg.nats_url)

    async def _check_bus(self) -> None:
        """Verify, once connected and then every ``BUS_CHECK_S`` (``BUS_RECHECK_S`` while wrong), that FAULTS
        stores this node's events (``bus.verify_capture``: nothing stored, no right beyond the agent's own).
        The agent never provisions and does not exit on a missing stream (its events stay spooled, nothing
        is lost, and a DaemonSet must not crash-loop while the bus-init hook has not run yet): each new
        problem is one ERROR line naming the fix, its end one INFO line, and ``stats()["bus"]`` says it."""
        subject = faults_subject("agent", self.node)
        last: str | None = ""
        while True:
            await self.link.up.wait()
            js = self.link.js
            problem = await verify_capture(js, subject, FAULTS_STREAM) if js is not None else "not connected"
            self.bus_problem = problem
            if problem != last:
                if problem:
                    log.error("the bus cannot store this node's events: %s (they stay spooled)", problem)
                elif last:
                    log.info("the bus stores this node's events again (FAULTS captures %s)", subject)
                last = problem
            await asyncio.sleep(BUS_RECHECK_S if problem else BUS_CHECK_S)

    def _spawn(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        async def supervised() -> None:
            while True:
                try:
                    await factory()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("agent task %s failed; restarting it in 1 s", name)
                    await asyncio.sleep(1.0)

        self._tasks.append(asyncio.get_running_loop().create_task(supervised(), name=f"agent-{self.node}-{name}"))

    async def stop(self) -> None:
        """Stop every task and close the connection; the state on disk is what a restart resumes from."""
        tasks, self._tasks = self._tasks, []
        pending: set[asyncio.Task[None]] = set(tasks)
        rounds = 0
        while pending:
            # cancel again until each task is done: a library may swallow one cancellation
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
            rounds += 1
            if pending and rounds == 3:
                log.warning("agent tasks still stopping: %s", ", ".join(
                    f"{t.get_name()} at {t.get_stack(limit=3)}" for t in pending))
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                log.warning("agent task %s ended with %r", t.get_name(), t.exception())
        await self.link.close()
        if self._pod_resources_client is not None:
            self._pod_resources_client.close()
        if self.gpus is not None:
            await asyncio.to_thread(self.gpus.close)
        self._stopped.set()

    async def wait(self) -> None:
        await self._stopped.wait()

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # --- work ----------------------------------------------------------------------------------------

    async def submit(self, events: Sequence[FaultEvent]) -> None:
        """Hand ``events`` to the publisher, waiting while the spool is full."""
        await submit_when_room(self.publisher, events, 1.0)

    def _snapshots(self) -> list[GpuSnapshot]:
        assert self.gpus is not None
        return [self.gpus.snapshot(i) for i in range(self.gpus.gpu_count())]

    def _learn(self, snaps: Sequence[GpuSnapshot]) -> None:
        for s in snaps:
            self.directory.learn(s.identity.pci_bus_id, s.identity.uuid, s.identity.index)

    async def _gpu_loop(self) -> None:
        assert self.poller is not None
        while True:
            snaps = await asyncio.to_thread(self.poller.take_snapshots)
            self._learn(snaps)
            events = self.poller.diff(snaps)
            if self.orphans is not None:
                events += self.orphans.check(snaps)
            if self.memtrend is not None:
                events += await asyncio.to_thread(self.memtrend.sample, snaps)
            await self.submit(events)
            self.poller.commit()
            if self.orphans is not None:
                self.orphans.commit()
            if self.memtrend is not None:
                self.memtrend.commit()
            await asyncio.sleep(self.config.nvml_interval_s)

    async def _subscribe_commands(self, nc: Any) -> None:
        await self.responder.subscribe(nc)

    def stats(self) -> dict[str, Any]:
        """Counters for ``status`` replies and benchmarks."""
        out: dict[str, Any] = {
            "connected": self.link.connected,
            "boot_id": self.boot_id(),
            "publisher": self.publisher.stats(),
            "refused_commands": dict(self.responder.refusals),
            "bus": "unverified" if self.bus_problem == "" else self.bus_problem or "ok",
            "refusal_reports": {"sent": self.refusals.reports_sent, "pending": self.refusals.pending,
                                "failures": self.refusals.publish_failures},
            "public_key": self.signer.public_key,
            "kernel": {w.source.name: {"lines": w.lines_read, "events": w.events_published}
                       for w in self.kernel_watchers},
        }
        if self.podlogs is not None:
            out["pod_logs"] = {"files": self.podlogs.files_followed, "bytes": self.podlogs.lines_scanned_bytes,
                               "events": self.podlogs.events_published}
        if self.poller is not None:
            out["gpu_polls"] = self.poller.polls
        if self.memtrend is not None:
            st = self.memtrend.state
            out["memory_trend"] = {"samples": self.memtrend.samples, "processes": len(st.processes),
                                   "containers": len(st.containers), "untracked": st.untracked}
        return out
