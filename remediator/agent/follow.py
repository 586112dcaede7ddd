"""Following a log file that grows, is rotated, truncated, or does not exist yet.

Where it sits: under the kernel-log watcher (``kmsg.py``, plain files) and the container-log scanner
(``podlogs.py``). A ``FileFollower`` returns complete lines (``Chunk``s of whole lines) with their byte
offsets, and a JSON-able position that the caller persists after it has handed the lines on, so a restarted
agent resumes exactly after the last line it handled.

A file is identified by device, inode and a fingerprint of its first line (at most 64 bytes), so that:

- rotation by rename (``syslog`` -> ``syslog.1``, kubelet's ``0.log`` -> ``0.log.<time>``): the old file
  is found again by inode in the same directory and read to its end (and for ``drain_grace_s`` more, for
  writers that have not reopened yet) before or while the new file is read from its start;
- truncation (``copytruncate``): the size drops below the offset, or the first line changes, and reading
  restarts at 0 (lines written between the last read and the truncation are gone: a limit of that
  rotation style);
- a file that does not exist yet: nothing is read until it appears, then it is read from its start;
- restart with a saved position: same inode and fingerprint -> resume at the offset; different content
  -> read from the start; the saved inode found under another name -> finish it, then the new file.

The identity of a line, ``<dev>:<inode>:<fingerprint>@<offset>``, is stable across restarts; the agent
builds event ids from it for sources that have no sequence number of their own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FINGERPRINT_BYTES = 64


@dataclass(frozen=True, slots=True)
class Chunk:
    """Whole lines read from one file: ``data`` ends with a newline and starts at byte ``start``."""

    data: bytes
    start: int
    file_id: str
    path: str

    def lines(self) -> list[tuple[int, bytes]]:
        """``(offset, line without newline)`` for each line in the chunk."""
        out: list[tuple[int, bytes]] = []
        pos = 0
        data = self.data
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                end = len(data)
            out.append((self.start + pos, data[pos:end]))
            pos = end + 1
        return out


@dataclass(slots=True)
class _Tail:
    path: str
    dev: int
    ino: int
    offset: int = 0
    fp: str | None = None
    size: int = -1
    quiet_since: float | None = None  # draining only: when it last stopped growing

    @property
    def file_id(self) -> str:
        return f"{self.dev}:{self.ino}:{self.fp or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "dev": self.dev, "ino": self.ino, "offset": self.offset, "fp": self.fp}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> _Tail:
        return cls(path=str(d["path"]), dev=int(d["dev"]), ino=int(d["ino"]), offset=int(d["offset"]),
                   fp=d.get("fp"))


def fingerprint(head: bytes) -> str | None:
    """Fingerprint of a file from its first bytes; None while the first line is incomplete and short."""
    nl = head.find(b"\n", 0, FINGERPRINT_BYTES)
    if nl >= 0:
        basis = head[: nl + 1]
    elif len(head) >= FINGERPRINT_BYTES:
        basis = head[:FINGERPRINT_BYTES]
    else:
        return None
    return hashlib.blake2b(basis, digest_size=6).hexdigest()


def _read_head(fd: int) -> bytes:
    return os.pread(fd, FINGERPRINT_BYTES, 0)


class FileFollower:
    """Reads the complete new lines of one path at each ``poll``; never blocks, never raises for I/O."""

    def __init__(self, path: Path | str, *, drain_grace_s: float = 5.0, max_read: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = str(path)
        self.drain_grace_s = drain_grace_s
        self.max_read = max_read
        self._clock = clock
        self._current: _Tail | None = None
        self._draining: list[_Tail] = []
        self._verify = False  # after restore: check the saved identity against the file on the next poll
        self.more = False  # the last poll stopped at max_read: poll again at once

    # --- position ------------------------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        return {
            "current": self._current.to_json() if self._current else None,
            "draining": [t.to_json() for t in self._draining],
        }

    def restore(self, pos: dict[str, Any]) -> None:
        """Continue from a position returned by ``position`` (in this or an earlier process)."""
        try:
            cur = pos.get("current")
            self._current = _Tail.from_json(cur) if cur else None
            self._draining = [_Tail.from_json(d) for d in pos.get("draining", [])]
        except (KeyError, TypeError, ValueError) as e:
            log.warning("ignoring unreadable position of %s (%s): reading it from the start", self.path, e)
            self._current, self._draining = None, []
        self._verify = self._current is not None

    # --- reading -------------------------------------------------------------------------------------

    def poll(self) -> list[Chunk]:
        """The complete lines added since the last poll, oldest first (rotated files before the new one)."""
        self.more = False
        chunks: list[Chunk] = []
        self._follow_identity()
        for tail in list(self._draining):
            chunks.extend(self._read_draining(tail))
        if self._current is not None:
            chunks.extend(self._read_current(self._current))
        return chunks

    def _follow_identity(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._current is not None:
                self._start_draining(self._current)
                self._current = None
            return
        except OSError as e:
            log.debug("stat %s: %s", self.path, e)
            return
        cur = self._current
        if cur is None:
            self._current = _Tail(self.path, st.st_dev, st.st_ino)
            self._verify = False
            return
        if (cur.dev, cur.ino) != (st.st_dev, st.st_ino):
            log.info("%s was rotated (inode %d -> %d)", self.path, cur.ino, st.st_ino)
            self._start_draining(cur)
            self._current = _Tail(self.path, st.st_dev, st.st_ino)
            self._verify = False

    def _start_draining(self, tail: _Tail) -> None:
        found = self._find_by_inode(tail)
        if found is None:
            if tail.size != tail.offset:
                log.warning("%s (inode %d) disappeared before it was read to the end", tail.path, tail.ino)
            return
        tail.path = found
        tail.quiet_since = None
        self._draining.append(tail)

    def _find_by_inode(self, tail: _Tail) -> str | None:
        parent = os.path.dirname(self.path) or "."
        try:
            with os.scandir(parent) as entries:
                for entry in entries:
                    try:
                        if entry.inode() == tail.ino and entry.stat(follow_symlinks=False).st_dev == tail.dev:
                            return entry.path
                    except OSError:
                        continue
        except OSError:
            return None
        return None

    def _open(self, tail: _Tail) -> tuple[int, os.stat_result] | None:
        try:
            fd = os.open(tail.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (tail.dev, tail.ino):
            os.close(fd)
            return None
        return fd, st

    def _read_current(self, tail: _Tail) -> list[Chunk]:
        if not self._verify and tail.size >= 0:
            # cheap idle path: nothing to do when the size did not change
            try:
                st = os.stat(tail.path)
            except OSError:
                return []
            if st.st_size == tail.size and (st.st_dev, st.st_ino) == (tail.dev, tail.ino):
                return []
        opened = self._open(tail)
        if opened is None:
            return []
        fd, st = opened
        try:
            head = _read_head(fd) if st.st_size else b""
            fp = fingerprint(head)
            if self._verify:
                self._verify = False
                if tail.fp is not None and fp != tail.fp:
                    log.info("%s holds other content than at the saved position: reading it from the start",
                             tail.path)
                    tail.offset, tail.fp = 0, None
            if st.st_size < tail.offset or (tail.fp is not None and fp is not None and fp != tail.fp):
                log.info("%s was truncated or replaced in place: reading it from the start", tail.path)
                tail.offset, tail.fp = 0, None
            if tail.fp is None:
                tail.fp = fp
            if tail.fp is None:  # first line still incomplete: nothing whole to read yet
                tail.size = st.st_size
                return []
            chunk = self._read_lines(fd, tail, st.st_size, final=False)
            tail.size = st.st_size if not self.more else -1
            return [chunk] if chunk else []
        finally:
            os.close(fd)

    def _read_draining(self, tail: _Tail) -> list[Chunk]:
        opened = self._open(tail)
        if opened is None:
            found = self._find_by_inode(tail)
            if found is None:
                log.warning("rotated %s (inode %d) is gone; %d byte(s) after offset %d were not read",
                            tail.path, tail.ino, max(0, tail.size - tail.offset), tail.offset)
                self._draining.remove(tail)
                return []
            tail.path = found
            opened = self._open(tail)
            if opened is None:
                return []
        fd, st = opened
        try:
            if tail.fp is None:
                tail.fp = fingerprint(_read_head(fd)) or "-"
            now = self._clock()
            grew = st.st_size != tail.size
            tail.size = st.st_size
            if grew:
                tail.quiet_since = now
            quiet = tail.quiet_since is not None and now - tail.quiet_since >= self.drain_grace_s
            chunk = self._read_lines(fd, tail, st.st_size, final=quiet)
            if quiet and tail.offset >= st.st_size:
                self._draining.remove(tail)
            elif tail.quiet_since is None:
                tail.quiet_since = now
            return [chunk] if chunk else []
        finally:
            os.close(fd)

    def _read_lines(self, fd: int, tail: _Tail, size: int, *, final: bool) -> Chunk | None:
        if size <= tail.offset:
            return None
        want = min(size - tail.offset, self.max_read)
        data = os.pread(fd, want, tail.offset)
        end = data.rfind(b"\n")
        if end >= 0:
            whole, consumed = data[: end + 1], end + 1
        elif final or len(data) >= self.max_read:
            # a rotated file's last line that will never end, or a line longer than max_read
            whole, consumed = data + b"\n", len(data)
        else:
            return None
        chunk = Chunk(whole, tail.offset, tail.file_id, tail.path)
        tail.offset += consumed
        if tail.offset < size and want == self.max_read:
            self.more = True
        return chunk
