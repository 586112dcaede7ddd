"""The anchor prefilter: which lines of a block may hold a signal, found in one pass over the block.

Where it sits: the first step of ``handlers.signatures.LineScanner`` (and so of the agent's log scanners and
``remediator classify``), before framing and the family parsers. A block of log lines is reduced to its
*skeleton* -- lower-cased, every byte that is not an ASCII letter deleted, newlines kept (one
``bytes.translate``) -- so "Fallen off the bus", "fallen_off_the_bus" and "FallenOffTheBus" all read
``fallenoffthebus``. Every anchor (the built-in families' and the operator signatures' ``contains`` literals,
in skeleton form) is then looked for in that skeleton at once by one Aho-Corasick automaton (the
``ahocorasick-rs`` wheel: the Rust ``aho-corasick`` crate, a DFA), so the cost of the prefilter barely grows
with the number of anchors. A line holding no anchor is never decoded, split out or parsed.

``nccl`` immediately followed by ``info`` is no anchor (NCCL's INFO chatter, a large share of a training
job's log, is never a signal); such a line is looked at only when another anchor is on it.

Lines are then located in the raw block without splitting it (``line_offsets``): from one anchored line to the
next the scanner gallops with ``bytes.count`` over a guessed span and finishes with a few ``bytes.find``;
the block is never cut into a million small byte strings just to read thirty thousand of them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache
from typing import overload

import ahocorasick_rs

_LOWER = bytes(c + 32 if 65 <= c <= 90 else c for c in range(256))
_DELETE = bytes(c for c in range(256) if not (97 <= _LOWER[c] <= 122) and c != 10)
_NCCL = b"nccl"
_CHATTER = b"ncclinfo"  # looked for beside the anchors; leftmost-longest, it wins over "nccl" where both start


def skeleton(data: bytes) -> bytes:
    """``data`` lower-cased with every byte that is not an ASCII letter deleted (newlines kept)."""
    return data.translate(_LOWER, _DELETE)


def skeleton_anchor(literal: str) -> bytes:
    """The skeleton form of an anchor literal (what the prefilter looks for)."""
    return skeleton(literal.encode("utf-8", "replace")).replace(b"\n", b"")


class Prefilter:
    """One automaton over a set of skeleton anchors; ``lines`` says which lines of a skeleton hold one."""

    __slots__ = ("_ac", "_nccl", "_overlapping", "anchors")  # _nccl: the index of the chatter pattern, or -1

    def __init__(self, anchors: Sequence[bytes]) -> None:
        uniq = tuple(dict.fromkeys(a for a in anchors if a and a != _CHATTER))
        if not uniq:
            raise ValueError("a prefilter needs at least one non-empty anchor")
        self.anchors = uniq
        patterns = [*uniq, _CHATTER] if _NCCL in uniq else list(uniq)
        self._ac = ahocorasick_rs.BytesAhoCorasick(
            patterns, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest,
            implementation=ahocorasick_rs.Implementation.DFA)
        self._nccl = len(uniq) if _NCCL in uniq else -1
        # Anchors that can begin inside a chatter match ("cclinfo" ... "fo"): a chatter match would hide them, so
        # a line whose match is chatter is looked at again for these (none of the built-in anchors is one; an
        # operator's literal such as "INFO NET/IB" is).
        self._overlapping = tuple(a for a in uniq if _overlaps_chatter(a)) if self._nccl >= 0 else ()

    def lines(self, skel: bytes) -> tuple[list[int], int]:
        """``(anchored line numbers, ascending and 0-based; number of lines)`` of the skeleton ``skel``.

        Matches are leftmost-longest and do not overlap: a later anchor that overlaps an earlier match is
        not reported, which changes nothing since that line is anchored already -- except where the earlier
        match is NCCL INFO chatter, which anchors nothing: a line with chatter is searched again for the
        anchors that can begin inside it (``_overlapping``).
        """
        out: list[int] = []
        count, find, rfind = skel.count, skel.find, skel.rfind
        chatter, overlapping = self._nccl, self._overlapping
        line, pos, line_end = 0, 0, -1
        for index, start, _end in self._ac.find_matches_as_indexes(skel):
            if start < line_end:
                continue  # this line is anchored already
            if index == chatter:  # NCCL INFO chatter: no anchor, unless one it hides is on the line
                if not overlapping:
                    continue
                ls, le = rfind(b"\n", 0, start) + 1, find(b"\n", start)
                seg = skel[ls:] if le < 0 else skel[ls:le]
                if not any(a in seg for a in overlapping):
                    continue
            line += count(b"\n", pos, start)
            pos = start
            out.append(line)
            line_end = find(b"\n", start)
            if line_end < 0:
                line_end = len(skel)
        return out, line + count(b"\n", pos) + 1


def _overlaps_chatter(anchor: bytes) -> bool:
    """True when ``anchor`` can begin inside a match of ``ncclinfo`` (after its first and before its last letter)."""
    for k in range(1, len(_CHATTER) - 1):
        tail = _CHATTER[k:]
        n = min(len(tail), len(anchor))
        if tail[:n] == anchor[:n]:
            return True
    return False


@lru_cache(maxsize=32)
def prefilter(anchors: tuple[bytes, ...]) -> Prefilter:
    """The (cached) prefilter for ``anchors``: building a DFA costs far more than one scan of a block."""
    return Prefilter(anchors)


def line_offsets(block: bytes, targets: Sequence[int]) -> list[int]:
    """Start offsets in ``block`` of its 0-based lines ``targets`` (ascending, each < the line count)."""
    out: list[int] = []
    count, find, rfind = block.count, block.find, block.rfind
    n = len(block)
    pos, line = 0, 0
    for target in targets:
        d = target - line
        while d > 4:  # gallop: count the newlines in a span the average line length says is a bit short
            avg = pos // line if line > 16 else 96
            probe = min(n, pos + (d * avg * 3) // 4)
            c = count(b"\n", pos, probe)
            if c == 0 or c >= d:
                break
            pos = rfind(b"\n", pos, probe) + 1
            line += c
            d -= c
        while d > 0:
            pos = find(b"\n", pos) + 1
            d -= 1
        line = target
        out.append(pos)
    return out


class BlockLines(Sequence[str]):
    """The lines of a raw block as a sequence of ``str``, decoded only when read and never split up front.

    ``known`` gives the offsets of some lines (the anchored ones); any other line is reached from the nearest
    known one with ``find``/``rfind`` (framing reads only a line or two either side of an anchored line).
    """

    __slots__ = ("_block", "_known", "_n", "_sorted", "_text")

    def __init__(self, block: bytes, known: dict[int, int], n: int) -> None:
        self._text: dict[int, str] = {}
        self._block = block
        self._known = known
        self._sorted = sorted(known)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def raw(self, i: int) -> bytes:
        """Line ``i`` as bytes, without its newline."""
        start = self._start(i)
        end = self._block.find(b"\n", start)
        return self._block[start:] if end < 0 else self._block[start:end]

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        text = self._text.get(i)
        if text is None:
            if not 0 <= i < self._n:
                raise IndexError(i)
            text = self._text[i] = self.raw(i).decode("utf-8", "replace")
        return text

    def _start(self, i: int) -> int:
        known = self._known
        start = known.get(i)
        if start is not None:
            return start
        block = self._block
        k = bisect_left(self._sorted, i)
        after = self._sorted[k] if k < len(self._sorted) else None
        before = self._sorted[k - 1] if k > 0 else None
        if after is not None and (before is None or after - i < i - before):
            pos = known[after]
            for _ in range(after - i):
                pos = block.rfind(b"\n", 0, pos - 1) + 1
        else:
            line, pos = (before, known[before]) if before is not None else (0, 0)
            for _ in range(i - line):
                pos = block.find(b"\n", pos) + 1
        known[i] = pos
        return pos


__all__ = ["BlockLines", "Prefilter", "line_offsets", "prefilter", "skeleton", "skeleton_anchor"]
