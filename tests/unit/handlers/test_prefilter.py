"""The one-pass anchor prefilter (``handlers.signatures.prefilter``) and the scanner's shortcuts around it.

It must mark exactly the lines whose skeleton holds an anchor (NCCL INFO chatter excepted), locate any line
of a block without splitting it, and the lines the scanner judges "silent" without parsing must be lines the
parsers would have given nothing for and framing treats as whole records.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.bench.classify import _noise, _signal, bench_rules
from handlers.rules import parse_rules
from handlers.signatures import (
    _BANCHORS,
    LineScanner,
    _literals,
    _parse,
    _silent,
    _whole_record,
    classify_line,
    has_anchor,
)
from handlers.signatures.prefilter import BlockLines, Prefilter, line_offsets, prefilter, skeleton, skeleton_anchor


def _naive_lines(skel: bytes, anchors: tuple[bytes, ...]) -> list[int]:
    out = []
    for n, line in enumerate(skel.split(b"\n")):
        hits = [a for a in anchors if a in line]
        # "nccl" counts only where it is not followed by "info"
        if any(a != b"nccl" for a in hits) or line.replace(b"ncclinfo", b"").find(b"nccl") >= 0:
            out.append(n)
    return out


def _bench_block(n: int = 3000, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    lines = [(_signal(rng, i)[0] if i % 50 == 25 else _noise(rng, i)) for i in range(n)]
    return "\n".join(lines).encode()


def test_prefilter_marks_exactly_the_anchored_lines_of_a_realistic_block() -> None:
    block = _bench_block()
    skel = skeleton(block)
    got, n = prefilter(_BANCHORS).lines(skel)
    assert n == block.count(b"\n") + 1
    assert got == _naive_lines(skel, _BANCHORS)
    assert len(got) > 60  # the injected signals and the anchored noise


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["NCCL INFO cudaDev 0", "nccl info", "NCCLINFO", "NCCL WARN x", "Xid 79", "x id",
                                 "plain words", "", "fallen off the bus", "ncc l", "NCCL", "info NCCL", "\u00e9"]),
                max_size=12).map("\n".join))
def test_prefilter_agrees_with_a_naive_search(text: str) -> None:
    skel = skeleton(text.encode())
    assert prefilter(_BANCHORS).lines(skel)[0] == _naive_lines(skel, _BANCHORS)


def test_nccl_info_chatter_is_no_anchor_but_another_anchor_beside_it_is() -> None:
    assert not has_anchor("host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    assert has_anchor("host:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 8 cudaDev 0 busId 18000 - Init COMPLETE")
    assert has_anchor("host:1:2 [0] NCCL WARN NET/IB : Got completion from peer")


def test_skeleton_drops_everything_but_letters_and_newlines() -> None:
    assert skeleton(b"Fallen_off-the BUS!\n0x12 Xid") == b"fallenoffthebus\nxxid"
    assert skeleton_anchor("Link Down (port 1)") == b"linkdownport"


def test_a_prefilter_needs_an_anchor() -> None:
    with pytest.raises(ValueError, match="anchor"):
        Prefilter([b""])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab \t", max_size=300), min_size=1, max_size=400), st.data())
def test_line_offsets_find_every_line_start(lines: list[str], data: st.DataObject) -> None:
    block = "\n".join(lines).encode()
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line.encode()) + 1)
    targets = sorted(set(data.draw(st.lists(st.integers(0, len(lines) - 1), max_size=60))))
    assert line_offsets(block, targets) == [starts[t] for t in targets]


def test_block_lines_reach_any_line_from_the_known_ones() -> None:
    lines = [f"line {i} " + "x" * (i * 37 % 200) for i in range(500)]
    block = "\n".join(lines).encode()
    known_idx = [3, 250, 251, 499]
    view = BlockLines(block, dict(zip(known_idx, line_offsets(block, known_idx), strict=True)), len(lines))
    assert len(view) == 500
    for i in (0, 2, 3, 4, 100, 249, 250, 252, 400, 498, 499, -1):
        assert view[i] == lines[i]
    assert view[10:13] == lines[10:13]
    with pytest.raises(IndexError):
        view[500]


def test_silent_lines_are_lines_the_parsers_give_nothing_for_and_whole_records() -> None:
    block = _bench_block(20000, seed=11)
    lines = block.split(b"\n")
    silent = [raw for raw in lines if _silent(raw, None)]
    assert len(silent) > 200  # NCCL INFO chatter and driver banners are common
    for raw in silent:
        text = raw.decode()
        assert _parse(text) is None and _whole_record(text), text


@pytest.mark.parametrize("raw", [
    b"host:1:2 [0] NCCL INFO Call to connect returned Connection refused, retrying NCCL WARN",
    b'{"log": "host:1:2 [0] NCCL INFO NET/IB : Got completion from peer with status=12"}',
    b"host:1:2 [0] NCCL INFO Init COMPLETE\\nNCCL WARN Cuda failure 'out of memory'",
    b"[  12.000001] NVRM: GPU at PCI:0000:1a:00: GPU-509665ad-1d57-2e8f-6c2b-9f0e1a2b0003 Xid 79",
    b"[  12.000001] NVRM: GPU at 0000:1a:00.0 has fallen off the bus.",
])
def test_lines_that_may_say_more_are_never_silent(raw: bytes) -> None:
    assert not _silent(raw, None)


@pytest.mark.parametrize("raw", [
    b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1"} 79',  # a judged field with a value
    b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3"} 2',
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0",msg="a \\"quoted\\" label"} 0 DCGM_FI_DEV_XID_ERRORS{gpu="0"} 79',  # escapes
    b'# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.',
    b'level=error msg="DCGM_FI_DEV_XID_ERRORS{gpu=\\"0\\"} 79"',  # a mention, not a series line
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA H100 \u00e9"} 5 DCGM_FI_DEV_XID_ERRORS 79'.encode(),
])
def test_dcgm_series_that_may_say_more_are_never_silent(raw: bytes) -> None:
    assert not _silent(raw, None)


_SERIES_NAMES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_POWER_USAGE")


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(_SERIES_NAMES),
       labels=st.sampled_from(("", '{gpu="0"}', '{gpu="1",xid="79"}', '{gpu="2",err_code="48",Hostname="n"}',
                               '{gpu="3",UUID="GPU-1"}', "{}")),
       gap=st.sampled_from((" ", "  ", "\t", " \x0b", "\x1f ")),
       value=st.sampled_from(("0", "0.0", "-0", "1", "2", "79", "64", "NaN", "+Inf", "1e3", "x", "1_0")),
       tail=st.sampled_from(("", " 1733000000000", "\r", " # a comment")))
def test_a_silent_series_line_is_one_the_parsers_give_nothing_for(name: str, labels: str, gap: str, value: str,
                                                                   tail: str) -> None:
    raw = f"{name}{labels}{gap}{value}{tail}".encode()
    if _silent(raw, None):
        text = raw.decode()
        assert _parse(text) is None and _whole_record(text), text


def test_series_of_state_and_zeros_are_silent() -> None:
    for raw in (b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 97', b'DCGM_FI_DEV_XID_ERRORS{gpu="0"} 0',
                b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} 0', b"DCGM_FI_DEV_POWER_USAGE 312.5"):
        assert _silent(raw, None), raw


def test_a_line_holding_an_operator_anchor_is_never_silent() -> None:
    rules = bench_rules()
    lits = _literals(rules.anchors())
    chatter = b"host:1:2 [0] NCCL INFO Using network IB cudaDev 0"
    assert _silent(chatter, lits)
    assert not _silent(chatter + b" mlx5_0: Port 1 link down", lits)


# Constructed lines (not from a fleet): what the anchors added for the old NCCL format, Slurm and DeepSpeed also
# catch in ordinary output, and which the parsers must then let go.
@pytest.mark.parametrize("line", [
    "src/foo.c:12:3: warning: unused variable 'x' [-Wunused-variable]",
    "kernel.cu(42): warning #177-D: variable declared but never referenced",
    "include/config.h:7 WARNING: deprecated option",
    "UserWarning: TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only one",
    "Reason=gres/gpu count reported lower than configured (8 < 8)",
    "[2024-01-03 14:05:36,716] [INFO] [launch.py:347:main] Process 2726715 exits with return code = 0",
])
def test_lines_the_new_anchors_catch_but_that_are_no_fault(line: str) -> None:
    assert classify_line(line) is None


def test_an_operator_literal_that_begins_inside_nccl_info_chatter_is_still_found() -> None:
    rules = parse_rules("""\
version: 1
signatures:
  - {name: ib-port-down-info, pattern: 'NCCL INFO NET/IB : port (?P<port>\\d+) down', contains: 'INFO NET/IB : port',
     kind: nccl_error, code: ib_port_down}
""")
    text = ("host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
            "host:1:2 [0] NCCL INFO NET/IB : port 1 down\n")
    assert [(n, s.code) for n, s in LineScanner(rules=rules).scan_text(text)] == [(2, "ib_port_down")]
    assert list(LineScanner().scan_text(text)) == []  # the built-ins see chatter there
