"""FileFollower: growth, partial lines, rotation, truncation, late files, restart from a saved position."""

from __future__ import annotations

import os
from pathlib import Path

from remediator.agent.follow import FileFollower


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def lines(f: FileFollower) -> list[bytes]:
    return [line for chunk in f.poll() for _, line in chunk.lines()]


def append(p: Path, data: bytes) -> None:
    with open(p, "ab") as fh:
        fh.write(data)


def test_reads_whole_lines_only_and_keeps_offsets(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"one\ntw")
    f = FileFollower(p)
    chunks = f.poll()
    assert [(o, line) for c in chunks for o, line in c.lines()] == [(0, b"one")]
    assert lines(f) == []
    append(p, b"o\nthree\n")
    chunks = f.poll()
    assert [(o, line) for c in chunks for o, line in c.lines()] == [(4, b"two"), (8, b"three")]
    assert chunks[0].file_id.count(":") == 2


def test_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    p = tmp_path / "later.log"
    f = FileFollower(p)
    assert f.poll() == []
    p.write_bytes(b"hello\n")
    assert lines(f) == [b"hello"]


def test_rotation_by_rename_drains_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    clock = Clock()
    p = tmp_path / "syslog"
    p.write_bytes(b"a\n")
    f = FileFollower(p, drain_grace_s=5.0, clock=clock)
    assert lines(f) == [b"a"]
    append(p, b"b\n")
    os.rename(p, tmp_path / "syslog.1")
    append(tmp_path / "syslog.1", b"c\n")  # the writer has not reopened yet
    p.write_bytes(b"d\n")
    assert lines(f) == [b"b", b"c", b"d"]
    append(tmp_path / "syslog.1", b"e\n")  # still within the grace period
    clock.t = 1.0
    assert lines(f) == [b"e"]
    clock.t = 10.0
    assert lines(f) == []
    assert f.position()["draining"] == []


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"first line\nsecond line\n")
    f = FileFollower(p)
    assert len(lines(f)) == 2
    with open(p, "r+b") as fh:
        fh.truncate(0)
    assert lines(f) == []
    append(p, b"new\n")
    assert lines(f) == [b"new"]


def test_copytruncate_then_regrowth_past_the_offset_is_seen_by_the_fingerprint(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"old-1\n")
    f = FileFollower(p)
    assert lines(f) == [b"old-1"]
    with open(p, "r+b") as fh:
        fh.truncate(0)
        fh.write(b"fresh-1 longer than before\nfresh-2\n")
    assert lines(f) == [b"fresh-1 longer than before", b"fresh-2"]


def test_restart_resumes_exactly_after_the_saved_position(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"1\n2\n")
    f = FileFollower(p)
    assert lines(f) == [b"1", b"2"]
    saved = f.position()
    append(p, b"3\n")
    g = FileFollower(p)
    g.restore(saved)
    assert lines(g) == [b"3"]


def test_restart_after_rotation_while_down_finishes_the_old_file_first(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"1\n")
    f = FileFollower(p)
    assert lines(f) == [b"1"]
    saved = f.position()
    append(p, b"2\n")
    os.rename(p, tmp_path / "log.1")
    p.write_bytes(b"3\n")
    g = FileFollower(p, drain_grace_s=0.0)
    g.restore(saved)
    assert lines(g) == [b"2", b"3"]


def test_restart_onto_other_content_reads_from_the_start(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"aaaa\nbbbb\n")
    f = FileFollower(p)
    lines(f)
    saved = f.position()
    with open(p, "r+b") as fh:  # same inode, other content, longer than the old offset
        fh.truncate(0)
        fh.write(b"cccc\ndddd\neeee\n")
    g = FileFollower(p)
    g.restore(saved)
    assert lines(g) == [b"cccc", b"dddd", b"eeee"]


def test_max_read_splits_big_backlogs(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"".join(b"line %04d\n" % i for i in range(100)))
    f = FileFollower(p, max_read=100)
    got: list[bytes] = []
    for _ in range(50):
        got += lines(f)
        if not f.more:
            break
    assert got == [b"line %04d" % i for i in range(100)]
