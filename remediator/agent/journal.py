"""Kernel messages from the systemd journal: follows ``journalctl -k -o json``.

Where it sits: an alternative source for ``kmsg.KernelLogWatcher`` on nodes where the kernel log is read
through journald (``--journal``). The position is the journal cursor of the last entry handed on, so a
restarted agent continues with ``--after-cursor``; with no saved cursor it looks back ``lookback_s``
(default 2 h). The id of an entry is ``<_BOOT_ID>|j:<hash of its cursor>`` (journald does not expose the
kmsg sequence number; the cursor is just as stable). ``journalctl`` is restarted if it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from remediator.agent.kmsg import KernelLine

log = logging.getLogger(__name__)

DEFAULT_LOOKBACK_S = 2 * 3600


def journal_message(entry: dict[str, Any]) -> str | None:
    """``MESSAGE`` of a journal JSON entry (a string, or a byte array for non-UTF-8 text)."""
    msg = entry.get("MESSAGE")
    if isinstance(msg, str):
        return msg
    if isinstance(msg, list) and all(isinstance(b, int) for b in msg):
        return bytes(b & 0xFF for b in msg).decode("utf-8", errors="replace")
    return None


def journal_line(entry: dict[str, Any], fallback_boot: str, name: str = "journal") -> KernelLine | None:
    cursor = entry.get("__CURSOR")
    text = journal_message(entry)
    if not isinstance(cursor, str) or text is None:
        return None
    boot = entry.get("_BOOT_ID") if isinstance(entry.get("_BOOT_ID"), str) else fallback_boot
    digest = hashlib.blake2b(cursor.encode(), digest_size=10).hexdigest()
    dictionary = {}
    device = entry.get("_KERNEL_DEVICE")
    if isinstance(device, str):
        dictionary["DEVICE"] = device
    observed = None
    realtime = entry.get("__REALTIME_TIMESTAMP")
    if isinstance(realtime, str) and realtime.isdigit():
        observed = datetime.fromtimestamp(int(realtime) / 1e6, UTC)
    return KernelLine(text, f"{boot}|j:{digest}", name, dictionary=dictionary, observed_at=observed)


class JournalSource:
    """``journalctl -k -o json --follow`` as a ``KernelSource`` (the command is injectable for tests)."""

    def __init__(self, *, boot_id: Callable[[], str], command: Sequence[str] = ("journalctl",),
                 lookback_s: float = DEFAULT_LOOKBACK_S, restart_delay_s: float = 2.0,
                 poll_interval_s: float = 1.0, name: str = "journal") -> None:
        self.name = name
        self._boot_id = boot_id
        self._command = list(command)
        self._lookback_s = lookback_s
        self._restart_delay_s = restart_delay_s
        self._poll = poll_interval_s
        self._queue: deque[tuple[str, KernelLine]] = deque()
        self._wake = asyncio.Event()
        self._received_cursor: str | None = None
        self._committed_cursor: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.restarts = 0

    def restore(self, pos: dict[str, Any]) -> None:
        cursor = pos.get("cursor")
        if isinstance(cursor, str):
            self._received_cursor = self._committed_cursor = cursor

    def position(self) -> dict[str, Any]:
        return {"cursor": self._committed_cursor} if self._committed_cursor else {}

    def argv(self) -> list[str]:
        argv = [*self._command, "-k", "-o", "json", "--no-pager", "--follow"]
        if self._received_cursor:
            argv.append(f"--after-cursor={self._received_cursor}")
        else:
            argv.append(f"--since=-{int(self._lookback_s)}s")
        return argv

    def read(self) -> list[KernelLine]:
        self._ensure_started()
        out: list[KernelLine] = []
        while self._queue:
            cursor, line = self._queue.popleft()
            out.append(line)
            self._committed_cursor = cursor
        return out

    async def wait(self) -> None:
        self._ensure_started()
        if self._queue:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._poll)
        self._wake.clear()

    def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow(), name="journalctl")

    async def _follow(self) -> None:
        boot = self._boot_id()
        while True:
            argv = self.argv()
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                    limit=1 << 20)
            except OSError as e:
                log.error("cannot run %s: %s; retrying in %gs", argv[0], e, self._restart_delay_s)
                await asyncio.sleep(self._restart_delay_s)
                continue
            assert self._proc.stdout is not None
            try:
                while True:
                    raw = await self._proc.stdout.readline()
                    if not raw:
                        break
                    try:
                        entry = json.loads(raw)
                    except ValueError:
                        continue
                    if not isinstance(entry, dict):
                        continue
                    line = journal_line(entry, boot, self.name)
                    if line is None:
                        continue
                    self._received_cursor = entry["__CURSOR"]
                    self._queue.append((entry["__CURSOR"], line))
                    self._wake.set()
            finally:
                if self._proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        self._proc.kill()
                await self._proc.wait()
            self.restarts += 1
            log.warning("journalctl exited with %s; restarting in %gs", self._proc.returncode,
                        self._restart_delay_s)
            await asyncio.sleep(self._restart_delay_s)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
