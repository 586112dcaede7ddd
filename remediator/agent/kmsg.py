"""Kernel-log watcher: Xid and other GPU lines from /dev/kmsg, a kmsg-format file, or dmesg/syslog text.

Where it sits: first stage of the agent's kernel path. A source (``KmsgDeviceSource`` for the character
device, ``TextFileSource`` for a file that grows; ``journal.JournalSource`` for ``journalctl``) yields
``KernelLine``s; ``KernelLogWatcher`` runs the shared scanner (``handlers.signatures.LineScanner``: prefilter,
framing of records split over lines, the family parsers and the operator's added signatures -- the path
``remediator classify`` takes) over each batch, learns PCI -> UUID from the driver's identity lines, turns
every signal into a ``FaultEvent`` and hands the batch to the publisher. It never groups or suppresses:
every kernel line carrying an Xid becomes one event of kind ``xid``, for a GPU the agent knows or not.

/dev/kmsg records are ``<priority>,<sequence>,<usec>,<flags>;<message>`` followed by continuation lines
that start with a space (the record's ``KEY=value`` dictionary). A file may hold such records or plain
``dmesg``/syslog lines, even mixed; each line is recognised on its own.

Position, persisted after each batch is handed on: the kmsg sequence number with the boot id for the
device (records of an earlier boot are read again from the start of the buffer, as the sequence restarted);
file offset + inode + first-line fingerprint for files (see ``follow.py``). With no saved position a source
is read from the start of what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import stat
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from handlers.rules import RuleSet
from handlers.signatures import LineScanner, Signal, classify_line, gpu_identity
from remediator.agent.events import (
    Clock,
    EventSink,
    GpuDirectory,
    detail_labels,
    make_event,
    submit_when_room,
)
from remediator.agent.follow import FileFollower
from remediator.agent.state import StateStore
from remediator.contracts import FaultEvent, utcnow

log = logging.getLogger(__name__)

_NO_DICT: Mapping[str, str] = MappingProxyType({})
_KMSG_RE = re.compile(rb"^(\d+),(\d+),(\d+),([^;]*);")
_HEX_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
_DICT_LINE_RE = re.compile(rb"^ [A-Z_][A-Z0-9_]*=")

# Signal detail keys worth carrying as labels of a kernel event.
_KERNEL_LABEL_KEYS = ("pid", "name", "channel", "caused_by_xid", "recovery_action", "gpu_instance",
                      "nvlink", "link", "unit", "severity", "sxid", "device")


@dataclass(frozen=True, slots=True)
class KernelLine:
    """One kernel message: its text, the id suffix that names it, and the kmsg facts when it had them."""

    text: str
    key: str
    source: str
    seq: int | None = None
    usec: int | None = None
    dictionary: Mapping[str, str] = field(default_factory=lambda: _NO_DICT)
    observed_at: datetime | None = None  # when the source says it was logged (journal); else read time


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int
    seq: int
    usec: int
    message: str


def parse_kmsg_record(raw: bytes) -> KmsgRecord | None:
    """A /dev/kmsg record header + message (continuation lines excluded), or None if ``raw`` is not one."""
    m = _KMSG_RE.match(raw)
    if m is None:
        return None
    body = raw[m.end():]
    nl = body.find(b"\n")
    if nl >= 0:
        body = body[:nl]
    text = body.decode("utf-8", errors="replace")
    if "\\x" in text:
        text = _HEX_ESCAPE_RE.sub(lambda h: chr(int(h.group(1), 16)), text)
    return KmsgRecord(int(m.group(1)), int(m.group(2)), int(m.group(3)), text)


def parse_dictionary(lines: Sequence[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in lines:
        k, sep, v = raw.decode("utf-8", errors="replace").strip().partition("=")
        if sep:
            out[k] = v
    return out


class KernelSource(Protocol):
    name: str

    def read(self) -> list[KernelLine]:
        """What is new, without blocking."""
        ...

    async def wait(self) -> None:
        """Until there may be something new (at most the poll interval)."""
        ...

    def position(self) -> dict[str, Any]: ...

    def restore(self, pos: dict[str, Any]) -> None: ...

    async def aclose(self) -> None: ...


class TextFileSource:
    """A file that grows: kmsg-format records (ids by boot id + sequence) or plain dmesg/syslog lines."""

    def __init__(self, path: Path | str, *, boot_id: Callable[[], str], poll_interval_s: float = 0.25,
                 name: str = "kmsg") -> None:
        self.name = name
        self.path = str(path)
        self._follower = FileFollower(path)
        self._boot_id = boot_id
        self._poll = poll_interval_s

    def read(self) -> list[KernelLine]:
        chunks = self._follower.poll()
        if not chunks:
            return []
        boot = self._boot_id()
        out: list[KernelLine] = []
        for chunk in chunks:
            lines = chunk.lines()
            i = 0
            while i < len(lines):
                offset, raw = lines[i]
                i += 1
                if not raw.strip():
                    continue
                rec = parse_kmsg_record(raw) if raw[:1].isdigit() else None
                if rec is None:
                    if _DICT_LINE_RE.match(raw):
                        continue  # a kmsg continuation line whose record came in the previous read
                    text = raw.decode("utf-8", errors="replace")
                    out.append(KernelLine(text, f"file|{chunk.file_id}@{offset}", self.name))
                    continue
                cont: list[bytes] = []
                while i < len(lines) and lines[i][1][:1] == b" ":
                    cont.append(lines[i][1])
                    i += 1
                out.append(KernelLine(rec.message, f"{boot}|{rec.seq}", self.name, rec.seq, rec.usec,
                                      parse_dictionary(cont) if cont else _NO_DICT))
        return out

    async def wait(self) -> None:
        if not self._follower.more:
            await asyncio.sleep(self._poll)

    def position(self) -> dict[str, Any]:
        return {"file": self._follower.position()}

    def restore(self, pos: dict[str, Any]) -> None:
        if isinstance(pos.get("file"), dict):
            self._follower.restore(pos["file"])

    async def aclose(self) -> None:
        pass


class KmsgDeviceSource:
    """``/dev/kmsg`` (or any descriptor that returns one record per read): resumes by boot id + sequence."""

    def __init__(self, path: str = "/dev/kmsg", *, boot_id: Callable[[], str], poll_interval_s: float = 1.0,
                 fd: int | None = None, name: str = "kmsg") -> None:
        self.name = name
        self.path = path
        self._fd = fd if fd is not None else os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if fd is not None:
            os.set_blocking(fd, False)
        self._boot = boot_id()
        self._skip_upto = -1
        self._last_seq: int | None = None
        self._poll = poll_interval_s
        self._wake = asyncio.Event()
        self._reader_added = False
        self.overwritten = 0

    def restore(self, pos: dict[str, Any]) -> None:
        if pos.get("boot") == self._boot and isinstance(pos.get("seq"), int):
            self._skip_upto = pos["seq"]
            self._last_seq = pos["seq"]
        elif pos:
            log.info("kmsg position is from boot %s, this is boot %s: reading the buffer from its start",
                     pos.get("boot"), self._boot)

    def position(self) -> dict[str, Any]:
        return {"boot": self._boot, "seq": self._last_seq} if self._last_seq is not None else {}

    def read(self) -> list[KernelLine]:
        out: list[KernelLine] = []
        for _ in range(4096):  # bounded per call so one busy buffer cannot starve the loop
            try:
                raw = os.read(self._fd, 16384)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records were overwritten before we read them
                    self.overwritten += 1
                    log.warning("kmsg: records were overwritten in the ring buffer before they were read")
                    continue
                if e.errno == errno.EINVAL:
                    break
                raise
            if not raw:
                break
            rec = parse_kmsg_record(raw)
            if rec is None or rec.seq <= self._skip_upto:
                continue
            cont = [ln for ln in raw.split(b"\n")[1:] if ln.startswith(b" ")]
            out.append(KernelLine(rec.message, f"{self._boot}|{rec.seq}", self.name, rec.seq, rec.usec,
                                  parse_dictionary(cont) if cont else _NO_DICT))
            self._last_seq = rec.seq
        return out

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._reader_added:
            try:
                loop.add_reader(self._fd, self._wake.set)
                self._reader_added = True
            except (OSError, ValueError, NotImplementedError):
                pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._poll)
        self._wake.clear()

    async def aclose(self) -> None:
        if self._reader_added:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._reader_added = False
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_kernel_source(path: str, *, boot_id: Callable[[], str], poll_interval_s: float = 0.25
                       ) -> KernelSource:
    """The right source for ``path``: the kmsg device when it is a character device, else a followed file."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode):
        return KmsgDeviceSource(path, boot_id=boot_id)
    return TextFileSource(path, boot_id=boot_id, poll_interval_s=poll_interval_s)


class KernelLogWatcher:
    """Classifies kernel lines and publishes one event per GPU signal, persisting the source position."""

    def __init__(self, source: KernelSource, *, node: str, sink: EventSink, gpus: GpuDirectory,
                 state: StateStore, clock: Clock = utcnow, state_name: str | None = None,
                 retry_s: float = 1.0, rules: Callable[[], RuleSet | None] = lambda: None) -> None:
        self.source = source
        self.rules = rules  # the operator rules in force (their added signatures are tried too)
        self.node = node
        self.sink = sink
        self.gpus = gpus
        self.state = state
        self.clock = clock
        self.state_name = state_name or f"position-{source.name}"
        self.retry_s = retry_s
        self.lines_read = 0
        self.events_published = 0
        # NVRM lines without a signal of their own: the start of a message the driver printed over several
        # lines ("The NVIDIA GPU 0000:b3:00.0" / "(PCI ID: ...) installed in this system has" / "fallen off
        # the bus ..."), whose PCI bus id the last line alone does not carry.
        self._context: deque[str] = deque(maxlen=3)

    def restore(self) -> None:
        pos = self.state.load(self.state_name)
        if pos.get("source"):
            self.source.restore(pos["source"])
        ids = pos.get("identities")
        if isinstance(ids, dict):
            self.gpus.load_json(ids)

    def save(self) -> None:
        self.state.save(self.state_name, {"source": self.source.position(), "identities": self.gpus.to_json()})

    def to_events(self, lines: Sequence[KernelLine]) -> list[FaultEvent]:
        """One event per record that carries a GPU signal; identity lines only teach the directory.

        The batch goes through the same scanner as ``remediator classify`` (``LineScanner.records``: anchors,
        framing, the family parsers and the operator's added signatures): a record split over lines is one
        event, named by its first line, with the record's lines as its message.
        """
        out: list[FaultEvent] = []
        texts = [line.text for line in lines]
        records = {r.start: r for r in LineScanner(rules=self.rules()).records(texts)}
        consumed = -1
        for i, line in enumerate(lines):
            text = line.text
            if "NVRM" in text:
                ident = gpu_identity(text)
                if ident is not None:
                    self.gpus.learn(ident[0], ident[1])
            if i <= consumed:
                continue  # a later line of a record already reported
            rec = records.get(i)
            if rec is None:
                if "NVRM" in text:
                    self._context.append(text)
                else:
                    self._context.clear()
                continue
            sig = rec.signal
            if rec.end > i:
                consumed = rec.end
                text = "\n".join(texts[i:rec.end + 1])
            if sig.pci_bus_id is None and sig.kind != "xid" and self._context:
                joined_text = "\n".join([*self._context, text])
                joined = classify_line(joined_text)
                if joined is not None and joined.pci_bus_id is not None:
                    sig, text = joined, joined_text
            self._context.clear()
            event = self._event(line, sig, text)
            if event is not None:
                out.append(event)
        return out

    def _event(self, line: KernelLine, sig: Signal, text: str) -> FaultEvent | None:
        if sig.kind == "xid":
            if sig.xid is None:
                return None
            code: int | str | None = sig.xid
        else:
            code = sig.code
        pci = sig.pci_bus_id
        if pci is None and line.dictionary.get("DEVICE", "").startswith("+pci:"):
            pci = line.dictionary["DEVICE"][5:]
        labels = {"source": line.source, **detail_labels(sig.detail, _KERNEL_LABEL_KEYS)}
        if line.seq is not None:
            labels["kmsg_seq"] = str(line.seq)
        if sig.playbook:
            labels["suggested_playbook"] = sig.playbook
        return make_event(
            event_id=f"agent|{self.node}|{line.key}", node=self.node, kind=sig.kind, code=code,
            gpu=self.gpus.ref(pci, sig.gpu_uuid, sig.gpu_index), message=text, labels=labels,
            clock=self.clock, is_fatal=sig.is_fatal, recommended_action=sig.action,
            observed_at=line.observed_at)

    async def run(self) -> None:
        """Read, classify, hand on, persist; forever (cancel to stop)."""
        self.restore()
        try:
            while True:
                lines = self.source.read()
                if not lines:
                    await self.source.wait()
                    continue
                self.lines_read += len(lines)
                events = self.to_events(lines)
                await submit_when_room(self.sink, events, self.retry_s)
                self.events_published += len(events)
                self.save()
        finally:
            await self.source.aclose()
