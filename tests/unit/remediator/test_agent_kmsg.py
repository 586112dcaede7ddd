"""Kernel-log sources and watcher: kmsg records, plain dmesg/syslog lines, the device, the journal."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from remediator.agent.events import GpuDirectory, SpoolFull
from remediator.agent.journal import JournalSource, journal_line
from remediator.agent.kmsg import (
    KernelLogWatcher,
    KmsgDeviceSource,
    TextFileSource,
    open_kernel_source,
    parse_kmsg_record,
)
from remediator.agent.state import StateStore
from remediator.contracts import FaultEvent

BOOT = "0d5b9a3e-1111-2222-3333-444444444444"
NOW = datetime(2025, 1, 21, 4, 41, 44, tzinfo=UTC)
XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error"


class Sink:
    def __init__(self, full_times: int = 0) -> None:
        self.events: list[FaultEvent] = []
        self.full_times = full_times

    async def submit(self, events: Sequence[FaultEvent]) -> None:
        if self.full_times:
            self.full_times -= 1
            raise SpoolFull("full")
        self.events.extend(events)


def watcher(source: object, tmp: Path, sink: Sink | None = None, gpus: GpuDirectory | None = None
            ) -> KernelLogWatcher:
    return KernelLogWatcher(source, node="node-a", sink=sink or Sink(), gpus=gpus or GpuDirectory(),  # type: ignore[arg-type]
                            state=StateStore(tmp / "state"), clock=lambda: NOW, retry_s=0.01)


def test_parse_kmsg_record_with_escapes_and_continuation() -> None:
    rec = parse_kmsg_record(b"3,1042,219470994,-;NVRM: Xid (PCI:0000:3b:00): 79, x\\x3dy\n SUBSYSTEM=pci\n")
    assert rec is not None
    assert (rec.priority, rec.seq, rec.usec) == (3, 1042, 219470994)
    assert rec.message == "NVRM: Xid (PCI:0000:3b:00): 79, x=y"
    assert parse_kmsg_record(b"[  219.470994] NVRM: Xid") is None


def test_text_file_mixes_kmsg_records_and_plain_lines(tmp_path: Path) -> None:
    p = tmp_path / "kmsg"
    p.write_text(
        "6,0,100,-;NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-aaaa-bbbb-cccc-dddddddddddd\n"
        f"3,1,200,-;{XID_LINE}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
        f"[  219.470994] {XID_LINE}\n"
        f"Dec  2 11:38:47 worker4 kernel: {XID_LINE}\n"
    )
    src = TextFileSource(p, boot_id=lambda: BOOT)
    got = src.read()
    assert [g.key.split("|")[0] for g in got] == [BOOT, BOOT, "file", "file"]
    assert got[1].key == f"{BOOT}|1" and got[1].seq == 1
    assert got[1].dictionary == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert got[2].key.endswith("@" + str(len(p.read_bytes().split(b"[")[0])))
    assert src.read() == []


def test_watcher_maps_pci_to_uuid_from_identity_lines_and_publishes_unknown_gpus(tmp_path: Path) -> None:
    p = tmp_path / "kmsg"
    p.write_text(
        "6,0,100,-;NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-aaaa-bbbb-cccc-dddddddddddd\n"
        f"3,1,200,-;{XID_LINE}\n"
        "3,2,300,-;NVRM: Xid (PCI:0000:99:00): 13, pid=1234, name=python3, Graphics SM Warp Exception\n"
        "6,3,400,-;random unrelated kernel line\n"
    )
    gpus = GpuDirectory()
    gpus.learn("0000:3b:00.0", None, 2)
    w = watcher(TextFileSource(p, boot_id=lambda: BOOT), tmp_path, gpus=gpus)
    events = w.to_events(w.source.read())
    assert [(e.kind, e.code) for e in events] == [("xid", 48), ("xid", 13)]
    known, unknown = events
    assert known.id == f"agent|node-a|{BOOT}|1"
    assert known.gpu is not None
    assert (known.gpu.index, known.gpu.uuid, known.gpu.pci_bus_id) == (
        2, "GPU-509665ad-aaaa-bbbb-cccc-dddddddddddd", "0000:3b:00.0")
    assert unknown.gpu is not None
    assert (unknown.gpu.index, unknown.gpu.uuid, unknown.gpu.pci_bus_id) == (None, None, "0000:99:00.0")
    assert known.labels["kmsg_seq"] == "1" and known.source == "agent" and known.node == "node-a"


async def test_watcher_persists_position_and_retries_a_batch_while_the_spool_is_full(tmp_path: Path) -> None:
    p = tmp_path / "kmsg"
    p.write_text(f"3,7,200,-;{XID_LINE}\n")
    sink = Sink(full_times=2)
    w = watcher(TextFileSource(p, boot_id=lambda: BOOT, poll_interval_s=0.01), tmp_path, sink)
    task = asyncio.create_task(w.run())
    for _ in range(200):
        if sink.events:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [e.id for e in sink.events] == [f"agent|node-a|{BOOT}|7"]
    # a new watcher on the same state resumes after that line
    p.write_text(p.read_text() + f"3,8,300,-;{XID_LINE}\n")
    sink2 = Sink()
    w2 = watcher(TextFileSource(p, boot_id=lambda: BOOT), tmp_path, sink2)
    w2.restore()
    assert [e.id for e in w2.to_events(w2.source.read())] == [f"agent|node-a|{BOOT}|8"]


def _seqpacket() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


async def test_kmsg_device_reads_one_record_per_read_and_resumes_by_boot_and_sequence(tmp_path: Path) -> None:
    writer, reader = _seqpacket()
    for seq in range(5):
        writer.send(f"3,{seq},{seq * 10},-;{XID_LINE}\n SUBSYSTEM=pci\n".encode())
    src = KmsgDeviceSource(boot_id=lambda: BOOT, fd=os.dup(reader.fileno()))
    src.restore({"boot": BOOT, "seq": 2})
    got = src.read()
    assert [g.seq for g in got] == [3, 4]
    assert got[0].dictionary == {"SUBSYSTEM": "pci"}
    assert src.position() == {"boot": BOOT, "seq": 4}
    writer.send(f"3,5,60,-;{XID_LINE}\n".encode())
    await asyncio.wait_for(src.wait(), 2)
    assert [g.key for g in src.read()] == [f"{BOOT}|5"]
    await src.aclose()
    # a position from another boot: the buffer is read from its start
    for seq in range(2):
        writer.send(f"3,{seq},{seq},-;hello\n".encode())
    src2 = KmsgDeviceSource(boot_id=lambda: BOOT, fd=os.dup(reader.fileno()))
    src2.restore({"boot": "an-earlier-boot", "seq": 100})
    assert [g.seq for g in src2.read()] == [0, 1]
    await src2.aclose()
    writer.close()
    reader.close()


def test_open_kernel_source_picks_the_device_for_a_character_device(tmp_path: Path) -> None:
    assert isinstance(open_kernel_source(str(tmp_path / "missing"), boot_id=lambda: BOOT), TextFileSource)
    if os.path.exists("/dev/kmsg") and stat.S_ISCHR(os.stat("/dev/kmsg").st_mode) and os.access("/dev/kmsg",
                                                                                               os.R_OK):
        src = open_kernel_source("/dev/kmsg", boot_id=lambda: BOOT)
        assert isinstance(src, KmsgDeviceSource)
        first = src.read()
        assert all(line.seq is not None for line in first)
        asyncio.run(src.aclose())
    else:  # no readable device here: the null device is a character device too
        src = open_kernel_source("/dev/null", boot_id=lambda: BOOT)
        assert isinstance(src, KmsgDeviceSource)
        assert src.read() == []
        asyncio.run(src.aclose())


def test_journal_entry_to_line() -> None:
    entry = {"__CURSOR": "s=abc;i=1f", "_BOOT_ID": "b00t", "MESSAGE": list(XID_LINE.encode()),
             "_KERNEL_DEVICE": "+pci:0000:3b:00.0", "__REALTIME_TIMESTAMP": "1737434504283575"}
    line = journal_line(entry, "fallback")
    assert line is not None
    assert line.text == XID_LINE
    assert line.key.startswith("b00t|j:")
    assert line.dictionary == {"DEVICE": "+pci:0000:3b:00.0"}
    assert line.observed_at == datetime(2025, 1, 21, 4, 41, 44, 283575, tzinfo=UTC)
    assert journal_line({"MESSAGE": "x"}, "fallback") is None


async def test_journal_source_follows_journalctl_and_resumes_after_the_cursor(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "journalctl"
    entries = [{"__CURSOR": f"c{i}", "_BOOT_ID": BOOT, "MESSAGE": f"{XID_LINE} #{i}"} for i in range(3)]
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"entries = {json.dumps(entries)!r}\n"
        "after = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--after-cursor=')]\n"
        "items = json.loads(entries)\n"
        "if after:\n"
        "    items = items[[e['__CURSOR'] for e in items].index(after[0]) + 1:]\n"
        "for e in items:\n"
        "    print(json.dumps(e), flush=True)\n"
    )
    fake.chmod(0o755)
    src = JournalSource(boot_id=lambda: BOOT, command=[str(fake)], restart_delay_s=0.05, poll_interval_s=0.05)
    got = []
    for _ in range(100):
        await src.wait()
        got += src.read()
        if len(got) >= 3:
            break
    assert [g.text.rsplit("#", 1)[1] for g in got] == ["0", "1", "2"]
    assert src.position() == {"cursor": "c2"}
    await src.aclose()
    first = calls.read_text().splitlines()[0]
    assert "-k -o json --no-pager --follow --since=-7200s" in first
    src2 = JournalSource(boot_id=lambda: BOOT, command=[str(fake)], restart_delay_s=0.05)
    src2.restore({"cursor": "c1"})
    assert src2.argv()[-1] == "--after-cursor=c1"


def test_a_message_printed_over_several_lines_gets_the_pci_of_its_first_line(tmp_path: Path) -> None:
    p = tmp_path / "kmsg"
    p.write_text(
        "3,10,100,-;NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "3,11,101,-;NVRM: (PCI ID: 10de:2330) installed in this system has\n"
        "3,12,102,-;NVRM: fallen off the bus and is not responding to commands.\n"
        "3,13,103,-;NVRM: fallen off the bus and is not responding to commands.\n"
    )
    w = watcher(TextFileSource(p, boot_id=lambda: BOOT), tmp_path)
    first, second = w.to_events(w.source.read())
    assert (first.kind, first.id) == ("gpu_lost", f"agent|node-a|{BOOT}|12")
    assert first.gpu is not None and first.gpu.pci_bus_id == "0000:b3:00.0"
    assert "0000:b3:00.0" in first.message
    assert second.kind == "gpu_lost" and second.gpu is None  # no context left: published, GPU unknown
