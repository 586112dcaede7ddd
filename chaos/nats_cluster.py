"""A real three-server NATS cluster on loopback: the production bus shape, for tests and drills.

Where it sits: beside ``remediator.natsd.EmbeddedNats`` (one server), under the integration tests
(``tests/integration/conftest.py``'s ``nats_cluster``) and the drill world (``chaos.world.environment``
with ``nats_servers=3``). Each server is a real ``nats-server`` process with JetStream and its own store,
routed to the other two over loopback ports, in one named cluster, so R3 streams and KV buckets are
replicated by NATS itself (Raft), not emulated. ``kill(i)`` takes one server away (SIGKILL, as a node
loss does), ``restart(i)`` brings it back on the same ports and store.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType

from nats.aio.client import Client as NATS

from remediator.natsd import find_nats_server, free_port

__all__ = ["NatsCluster"]


class NatsCluster:
    """``size`` clustered ``nats-server -js`` processes on free loopback ports; ``url`` names them all."""

    def __init__(self, size: int = 3, *, name: str = "remediator-test", root: str | None = None,
                 config: str | None = None) -> None:
        self.binary = find_nats_server()
        self.size = size
        self.name = name
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="remediator-nats-cluster-")
            root = self._tmp.name
        self.root = Path(root)
        self.ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self.config = config  # a nats-server configuration every server loads (operator mode), or None
        # how the readiness probe connects (operator mode: with credentials); default: anonymously
        self.probe_connect: Callable[[], Awaitable[NATS]] | None = None

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    @property
    def url(self) -> str:
        """Every server, comma-separated (what ``--nats`` takes)."""
        return ",".join(self.urls)

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def _argv(self, i: int) -> list[str]:
        routes = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
        store = self.root / f"n{i}"
        store.mkdir(parents=True, exist_ok=True)
        return [self.binary, *(["-c", self.config] if self.config else []), "-js", "-a", "127.0.0.1",
                "-p", str(self.ports[i]), "-sd", str(store),
                "-n", f"{self.name}-{i}", "--cluster_name", self.name,
                "--cluster", f"nats://127.0.0.1:{self.route_ports[i]}", "--routes", routes, "--http_port", "0"]

    def start_server(self, i: int, timeout: float = 15.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"n{i}.log").open("ab")
        self.procs[i] = subprocess.Popen(self._argv(i), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[i]
            assert proc is not None
            if proc.poll() is not None:
                raise RuntimeError(f"nats-server {i} exited with {proc.returncode}; see {self.root / f'n{i}.log'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.ports[i]), 0.2) as s:
                if s.recv(4096).startswith(b"INFO"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server {i} did not listen on {self.ports[i]} within {timeout}s")

    def start(self, timeout: float = 30.0, attempts: int = 3) -> None:
        """Start every server, then wait until JetStream has a meta leader (R3 assets can be created).

        A port found free a moment ago can be taken meanwhile (outgoing connections draw from the same
        ephemeral range), and nats-server then exits with "address already in use": every server is stopped
        and the cluster started again on fresh ports, up to ``attempts`` times. Any other exit is an error."""
        for attempt in range(attempts):
            try:
                for i in range(self.size):
                    self.start_server(i)
                break
            except RuntimeError:
                taken = self._port_was_taken()
                self.stop()
                if not taken or attempt == attempts - 1:
                    raise
                for i in range(self.size):  # kept for reading, out of the way of the next attempt's check
                    with contextlib.suppress(FileNotFoundError):
                        (self.root / f"n{i}.log").rename(self.root / f"n{i}.attempt{attempt + 1}.log")
                self.ports = [free_port() for _ in range(self.size)]
                self.route_ports = [free_port() for _ in range(self.size)]
        self.wait_for_jetstream(timeout)

    def _port_was_taken(self) -> bool:
        logs = (self.root / f"n{i}.log" for i in range(self.size))
        return any("address already in use" in log.read_text(errors="replace") for log in logs if log.exists())

    def wait_for_jetstream(self, timeout: float = 30.0) -> None:
        """Until an R``size`` stream can be created and deleted (the meta group has a leader, every server
        takes part)."""
        import asyncio

        import nats

        last: list[str] = []

        async def probe(attempt: int) -> bool:
            try:
                nc = await (self.probe_connect() if self.probe_connect is not None else nats.connect(
                    self.urls, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0))
            except Exception as e:
                last[:] = [f"connecting: {type(e).__name__}: {e}"]
                return False
            # a name of its own per attempt: an earlier attempt's stream may still be being created or deleted
            name = f"CLUSTER_PROBE_{attempt}"
            try:
                js = nc.jetstream(timeout=2)
                await js.add_stream(name=name, subjects=[f"cluster-probe.{attempt}"], storage="memory",
                                    num_replicas=self.size)
                with contextlib.suppress(Exception):
                    await js.delete_stream(name)
                return True
            except Exception as e:
                last[:] = [f"creating an R{self.size} stream: {type(e).__name__}: {e}"]
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + timeout
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            # on a thread of its own: the caller may be inside an event loop (the drill world)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                if pool.submit(asyncio.run, probe(attempt)).result():
                    return
            time.sleep(0.25)
        raise RuntimeError(f"the NATS cluster elected no JetStream leader within {timeout}s "
                           f"({attempt} probes; last: {last[0] if last else 'none'}; logs in {self.root})")

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (a node lost: no goodbye to its routes or clients)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self.procs[i] = None

    def restart(self, i: int) -> None:
        """Start server ``i`` again on the same ports and store."""
        self.kill(i)
        self.start_server(i)

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.procs[i] = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NatsCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
