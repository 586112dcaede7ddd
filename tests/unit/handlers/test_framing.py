"""The framing layer (``handlers.signatures.framing``): a record split over lines is one signal at the line where
it starts, and a line that is its own record is never swallowed by its neighbour.

The texts are verbatim lines of the real-world tables (sources there), split the way terminals, shippers and
tools split them: the split points are the only thing made here.
"""

# ruff: noqa: E501

from __future__ import annotations

import io
import json

from handlers.signatures import LineScanner
from handlers.signatures.framing import continues, is_table_continuation

STUCK = "[rank1]:[E1111 17:10:53] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress"
XID = "[10900.272611] NVRM: Xid (PCI:0000:0b:00): 109, pid=11263, name=Renderer, Ch 00000020, errorString CTX SWITCH TIMEOUT, Info 0xac00d"
IDENTITY = "[10900.272607] NVRM: GPU at PCI:0000:0b:00: GPU-aaaba90e-a327-1a65-9c8d-fd28b59b8057"


def _found(text: str) -> list[tuple[int, str, object]]:
    return [(n, s.kind, s.code) for n, s in LineScanner().scan_text(text)]


def test_terminal_wrap_at_a_word_is_one_signal() -> None:
    head, tail = STUCK.split(" watchdog ", 1)
    assert _found(head + "\nwatchdog " + tail) == [(1, "nccl_timeout", "watchdog_stuck")]


def test_hard_wrap_inside_a_word_is_one_signal() -> None:
    cut = STUCK.index("watchdog") + 6
    assert _found(STUCK[:cut] + "\n" + STUCK[cut:]) == [(1, "nccl_timeout", "watchdog_stuck")]


def test_cri_partial_lines_are_joined() -> None:
    head, tail = STUCK.split(" watchdog ", 1)
    text = (f"2025-03-01T12:00:00.000000001Z stderr P {head} \n"
            f"2025-03-01T12:00:00.000000002Z stderr F watchdog {tail}")
    assert _found(text) == [(1, "nccl_timeout", "watchdog_stuck")]


def test_json_escaped_newlines_in_a_shipper_payload_are_one_record() -> None:
    head, tail = STUCK.split(" watchdog ", 1)
    line = json.dumps({"log": head + "\nwatchdog " + tail + "\n", "stream": "stderr"})
    assert _found(line) == [(1, "nccl_timeout", "watchdog_stuck")]


def test_a_line_that_is_its_own_record_is_not_swallowed() -> None:
    # an identity line (anchored, no signal) before an Xid line: the Xid stays on its own line
    assert _found(IDENTITY + "\n" + XID) == [(2, "xid", 109)]
    # two records back to back stay two
    assert _found(STUCK + "\n" + STUCK) == [(1, "nccl_timeout", "watchdog_stuck"), (2, "nccl_timeout", "watchdog_stuck")]


def test_unrelated_neighbours_are_not_joined_into_a_fault() -> None:
    text = "\n".join([
        "2023-02-05 10:33:42.061163: I tensorflow/stream_executor/platform/default/dso_loader.cc:44] Successfully opened dynamic library cublas64_100.dll",
        "of the run: loss 2.31",
        IDENTITY,
        "  out of the box settings",
    ])
    assert _found(text) == []


def test_scan_stream_frames_within_blocks_and_numbers_lines_across_them() -> None:
    head, tail = STUCK.split(" watchdog ", 1)
    record = head + "\nwatchdog " + tail + "\n"
    data = ("noise line\n" * 50 + record) * 20
    found = [(n, s.code) for n, s in LineScanner().scan_stream(io.BytesIO(data.encode()), block=4096)]
    assert len(found) >= 19  # a record cut by a block boundary is judged line by line
    assert all(code == "watchdog_stuck" for _, code in found)
    assert all((n - 51) % 52 == 0 for n, _ in found)


def test_continuation_rules() -> None:
    assert continues("Resource exhausted: Out ", "of memory while trying to allocate 5520758552 bytes.")
    assert continues("ProcessGroupNCCL's", "watchdog got stuck")
    assert continues("Watchdog caught collective operation timeout:", "WorkNCCL(SeqNum=1)")
    assert not continues("NVRM: Xid (PCI:0000:0b:00): 109, pid=1.", "[10900.3] NVRM: Xid (PCI:0000:0b:00): 109")
    assert is_table_continuation("|                           | Fail - GPU: 0                                  |")
    assert not is_table_continuation("| GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |")
