"""Record framing: a fault record split over several lines is judged as one, at the line where it starts.

Where it sits: inside ``handlers.signatures.LineScanner``, between the anchor prefilter and the family parsers,
for every source alike (kernel log, container logs, tool output). Lines are judged alone first, as
``classify_line`` does; the framing layer looks further only around a line that holds an anchor and still gave
no signal, and around a continuation row that did:

* **continuation lines** -- the next line continues this one when it starts with whitespace or a lower-case
  letter, or this one ends in whitespace or ``:`` ``,`` ``(`` ``[`` ``\\``: kernel ``pr_cont`` continuations, the
  indented tail of a Python exception message, terminal output wrapped at a word ("ProcessGroupNCCL's" /
  "watchdog got stuck for 480 seconds", "Resource exhausted: Out " / "of memory while trying to allocate");
  up to three lines are joined, forwards from the anchored line and back to the line before it;
* **table continuation rows** -- a row whose first cell is empty (``|      | Fail - GPU: 0 |``, ``dcgmi diag``)
  belongs to the row above, which names the test; a row that is a signal already takes the continuation rows
  below it (``| Error | GPU 3 has uncorrectable memory errors and row |`` / ``|   |  remappings are pending |``),
  unless one of them is a signal of its own; the rows are joined with their newline;
* **words cut by a hard wrap** -- when a joined record gives nothing and the break falls inside a word
  ("watchd" / "og got stuck"), the lines are tried again without a separator. (The record is found when one
  of its lines holds an anchor; an anchor cut in two by the wrap is not looked for across the break, which
  would cost a second pass over every block.)

JSON-escaped newlines inside a shipper's payload are already one line here (``unwrap_line`` turns ``\\n`` back
into a newline and the families accept it). A join is kept only when it gives a signal that the later line does
not give alone, so a line that is its own record is never swallowed by the line before it, and the lines a
record consumed are not reported again. Records that span two blocks of ``LineScanner.scan_stream`` (1 MiB
apart) are judged line by line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet

from handlers.signatures.model import Signal, unwrap_line

Parse = Callable[[str], "Signal | None"]

_OPENERS = (":", ",", "(", "[", "\\", "-")
MAX_LINES = 3
# A CRI container-log line the runtime split because it was too long: "<time> stdout P <first part>".
_CRI_PARTIAL_RE = re.compile(r"^\s*\d{4}-\d\d-\d\dT\S+\s+(?:stdout|stderr)\s+P\s")


# A line that opens a record of its own: a timestamp or bracket, or a "Tag: " prefix ("NVRM: ", "kernel: ",
# "RuntimeError: ", "[rank0]: ") -- never the tail of the line before it.
_RECORD_START_RE = re.compile(r"^(?:[\[\d`{]|[A-Za-z_][\w.\-]*(?:\[\d+\])?:\s)")


def continues(first: str, second: str) -> bool:
    """True when ``second`` reads as the continuation of ``first`` (see the module docstring)."""
    if not second or not first:
        return False
    head = second[:1]
    if head in " \t":
        return True
    if _RECORD_START_RE.match(second):
        return False
    return head.islower() or first[-1:] in " \t" or first.rstrip().endswith(_OPENERS)


def is_table_continuation(line: str) -> bool:
    """A table row whose first cell is empty: ``|      | Fail - GPU: 0 |``."""
    s = line.lstrip()
    if not s.startswith("|"):
        return False
    cut = s.find("|", 1)
    return cut > 0 and not s[1:cut].strip()


def join(parts: Sequence[str], glue: str | None = None) -> str:
    """``parts`` as one record: table rows keep their newline, wrapped prose is joined with one space."""
    if glue is not None:
        return glue.join(parts)
    out = parts[0]
    for p in parts[1:]:
        if is_table_continuation(p) or out.lstrip().startswith("|"):
            out += "\n" + p
        elif out[-1:] in " \t" or p[:1] in " \t":
            out += p
        else:
            out += " " + p
    return out


def frame(lines: Sequence[str], anchored: Sequence[int], parse: Parse,
          split: frozenset[int] = frozenset(),
          complete: Callable[[str], bool] | None = None,
          silent: AbstractSet[int] = frozenset()) -> Iterator[tuple[int, Signal]]:
    """``(0-based index, Signal)`` for the records among ``lines``, in order (``frame_records`` without ends)."""
    for start, _end, sig in frame_records(lines, anchored, parse, split, complete, silent):
        yield start, sig


def frame_records(lines: Sequence[str], anchored: Sequence[int], parse: Parse,
                  split: frozenset[int] = frozenset(),
                  complete: Callable[[str], bool] | None = None,
                  silent: AbstractSet[int] = frozenset()) -> Iterator[tuple[int, int, Signal]]:
    """``(first index, last index, Signal)`` for the records among ``lines``, in order (0-based, inclusive).

    ``anchored`` are the indices of the lines holding an anchor (ascending); ``split`` the indices of lines
    to join to the next without a separator (a caller that knows where a word was cut); ``parse`` judges one
    (possibly joined) record; ``complete`` says of a raw line that it is a whole record by its format (NCCL
    INFO chatter, a metric series, a GPU identity line), so no join is tried around it; ``silent`` are anchored
    lines the caller already knows to give no signal and to be such whole records (judged as if ``parse``
    had said None and ``complete`` True, without calling either).
    """
    n = len(lines)
    cache: dict[int, Signal | None] = dict.fromkeys(silent)
    messages: dict[int, str] = {}

    def msg(i: int) -> str:
        if i not in messages:
            messages[i] = unwrap_line(lines[i])
        return messages[i]

    def alone(i: int) -> Signal | None:
        if i not in cache:
            cache[i] = parse(lines[i])
        return cache[i]

    anchored_set = set(anchored)
    consumed = -1  # the last index a reported record used
    todo = sorted(anchored_set | split)
    for i in todo:
        if i <= consumed or i in silent:
            continue
        sig = alone(i) if i in anchored_set else None
        if sig is not None:
            if i > consumed + 1 and i > 0 and is_table_continuation(msg(i)):
                joined = parse(join((msg(i - 1), msg(i))))
                if joined is not None and (joined.kind, joined.code) == (sig.kind, sig.code):
                    consumed = i
                    yield i - 1, i, joined
                    continue
            end = _table_tail(msg, i, n, anchored_set, alone)
            if end > i:  # a table row whose cell goes on in the continuation rows below it
                joined = parse(join([msg(k) for k in range(i, end + 1)]))
                if joined is not None and joined.kind == sig.kind:
                    consumed = end
                    yield i, end, joined
                    continue
            consumed = i
            yield i, i, sig
            continue
        if complete is not None and complete(lines[i]):
            continue
        found = _forward(lines, msg, i, n, split, anchored_set, alone, parse)
        if found is not None:
            end, s = found
            consumed = end
            if i > 0 and i - 1 not in anchored_set and _continues_at(lines, msg, i):
                whole = parse(join([msg(k) for k in range(i - 1, end + 1)]))
                if whole is not None and (whole.kind, whole.code) == (s.kind, s.code):
                    yield i - 1, end, whole  # the record started on the line before the anchor
                    continue
            yield i, end, s
            continue
        if i > consumed + 1 and i - 1 not in anchored_set and _continues_at(lines, msg, i):
            back = parse(join((msg(i - 1), msg(i))))
            if back is not None:
                consumed = i
                yield i - 1, i, back


def _continues_at(lines: Sequence[str], msg: Callable[[int], str], k: int) -> bool:
    """Line ``k`` continues line ``k - 1``: a CRI partial line before it, or its message reads on."""
    return bool(_CRI_PARTIAL_RE.match(lines[k - 1])) or continues(msg(k - 1), msg(k)) \
        or is_table_continuation(msg(k))


def _forward(lines: Sequence[str], msg: Callable[[int], str], i: int, n: int, split: frozenset[int],
             anchored: set[int], alone: Callable[[int], Signal | None], parse: Parse) -> tuple[int, Signal] | None:
    """The record starting at line ``i`` and continuing on the next one or two lines, if any."""
    parts = [msg(i)]
    glue_empty = i in split
    for k in range(i + 1, min(n, i + MAX_LINES)):
        if k in anchored and alone(k) is not None:
            return None  # the next line is a record of its own
        if not (glue_empty or _continues_at(lines, msg, k)):
            return None
        parts.append(msg(k))
        text = "".join(parts) if glue_empty else join(parts)
        sig = parse(text)
        if sig is None and not glue_empty and parts[-2][-1:].isalnum() and parts[-1][:1].isalnum():
            sig = parse("".join(parts))  # a hard wrap inside a word: "watchd" / "og got stuck"
        if sig is not None:
            return k, sig
        glue_empty = k in split
    return None


def _table_tail(msg: Callable[[int], str], i: int, n: int, anchored: set[int],
                alone: Callable[[int], Signal | None]) -> int:
    """The last continuation row of the table row ``i`` (``i`` itself when it has none or is no table row).

    A continuation row that is a signal of its own ("|   | Fail - GPU: 1 |") ends the record before it.
    """
    if not msg(i).lstrip().startswith("|"):
        return i
    end = i
    for k in range(i + 1, min(n, i + MAX_LINES)):
        if not is_table_continuation(msg(k)) or (k in anchored and alone(k) is not None):
            break
        end = k
    return end
