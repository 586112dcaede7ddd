"""Durable spool: events the agent could not publish, kept on disk until NATS is back.

Where it sits: between the agent's watchers and the bus. While NATS is unreachable (or while older
events are still waiting), ``Publisher.submit`` appends events here (written and fsync'd before it
returns); ``Publisher.replay`` publishes them in order, with their original ``Nats-Msg-Id``, once the
connection is back, so a replay that repeats an event (a crash between the ack and the head update) is a
duplicate JetStream drops. The spool survives an agent restart.

Layout in the spool directory: ``spool.jsonl`` holds one event (its JSON) per line, appended;
``spool.head`` holds the byte offset of the first event not yet acked. When the head reaches the end both
are reset; when the file would pass ``max_bytes`` the acked prefix is compacted away first, and if it is
still too big ``append`` refuses (``SpoolFull``): the watchers then keep their batches and read positions
and retry, so nothing is dropped while the sources still hold the lines. A torn last line (a crash during
an append) is cut off at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from remediator.agent.events import SpoolFull
from remediator.agent.state import atomic_write, fsync_dir
from remediator.contracts import FaultEvent

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class Spool:
    """An append-only, fsync'd, size-bounded queue of ``FaultEvent``s in one directory."""

    def __init__(self, directory: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data_path = self.directory / "spool.jsonl"
        self.head_path = self.directory / "spool.head"
        self.max_bytes = max_bytes
        self.full_rejections = 0  # batches refused because the spool was full
        self.appended = 0
        self.replayed = 0
        self._full = False
        self._head = 0
        self._size = 0
        self._pending = 0
        self._recover()

    # --- state ---------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events waiting to be published."""
        return self._pending

    @property
    def size_bytes(self) -> int:
        return self._size

    def stats(self) -> dict[str, int]:
        return {"pending": self._pending, "bytes": self._size - self._head, "max_bytes": self.max_bytes,
                "appended": self.appended, "replayed": self.replayed, "full_rejections": self.full_rejections}

    def _recover(self) -> None:
        try:
            data = self.data_path.read_bytes()
        except FileNotFoundError:
            data = b""
        try:
            head = int(self.head_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            head = 0
        end = data.rfind(b"\n") + 1
        if end != len(data):
            log.warning("spool: cutting off a torn last record (%d bytes)", len(data) - end)
            with open(self.data_path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        head = min(max(head, 0), end)
        if head and data[head - 1:head] != b"\n":  # head must sit on a record boundary
            head = data.rfind(b"\n", 0, head) + 1
        self._head, self._size = head, end
        self._pending = data.count(b"\n", head, end)
        if self._pending:
            log.info("spool: %d event(s) from an earlier run wait to be published", self._pending)

    # --- writing -------------------------------------------------------------------------------------

    def append(self, events: Sequence[FaultEvent]) -> None:
        """Append ``events`` durably (fsync before return); ``SpoolFull`` when they do not fit."""
        if not events:
            return
        blob = b"".join(e.model_dump_json().encode() + b"\n" for e in events)
        if self._size + len(blob) > self.max_bytes and self._head:
            self._compact()
        if self._size + len(blob) > self.max_bytes:
            self.full_rejections += 1
            if not self._full:
                self._full = True
                log.error("spool full: %d pending event(s), %d bytes, limit %d bytes; holding new events "
                          "until NATS is reachable again (full_rejections=%d)", self._pending,
                          self._size - self._head, self.max_bytes, self.full_rejections)
            raise SpoolFull(f"spool full ({self._size} of {self.max_bytes} bytes)")
        fd = os.open(self.data_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            written = 0
            while written < len(blob):
                written += os.write(fd, blob[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._size == 0:
            fsync_dir(self.directory)
        self._size += len(blob)
        self._pending += len(events)
        self.appended += len(events)

    def _compact(self) -> None:
        with open(self.data_path, "rb") as f:
            f.seek(self._head)
            rest = f.read()
        atomic_write(self.data_path, rest)
        atomic_write(self.head_path, b"0")
        self._head, self._size = 0, len(rest)

    # --- reading -------------------------------------------------------------------------------------

    def peek(self, limit: int = 256) -> list[tuple[FaultEvent, int]]:
        """Up to ``limit`` oldest waiting events, each with the offset just after it (for ``advance``)."""
        if not self._pending:
            return []
        out: list[tuple[FaultEvent, int]] = []
        with open(self.data_path, "rb") as f:
            f.seek(self._head)
            pos = self._head
            for raw in f:
                pos += len(raw)
                try:
                    event = FaultEvent.model_validate_json(raw)
                except ValueError as e:
                    if out:  # publish what precedes it first; it is dropped on the next call
                        break
                    log.error("spool: dropping an unreadable record at offset %d: %s", pos - len(raw), e)
                    self.advance(pos, count=1)
                    self.replayed -= 1
                    if not self._pending:
                        break
                    continue
                out.append((event, pos))
                if len(out) >= limit:
                    break
        return out

    def advance(self, offset: int, *, count: int) -> None:
        """Mark everything before ``offset`` as published (``count`` events)."""
        self._pending = max(0, self._pending - count)
        self.replayed += count
        if offset >= self._size:
            self._reset()
            return
        self._head = offset
        atomic_write(self.head_path, str(offset).encode())

    def _reset(self) -> None:
        for p in (self.data_path, self.head_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        fsync_dir(self.directory)
        self._head = self._size = self._pending = 0
        if self._full:
            self._full = False
            log.info("spool drained; accepting events again (full_rejections=%d)", self.full_rejections)
