"""KV documents are written with orjson and read back as json.dumps(default=str) would have them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from remediator.kv import _dumps


@pytest.mark.parametrize("doc", [
    pytest.param({"order": ["taint", "cordon"], "guards_passed": True, "reserved": None, "n": 3, "f": 0.25},
                 id="plain"),
    pytest.param({"at": datetime(2026, 12, 1, 3, 12, 0, 250000, tzinfo=UTC)}, id="datetime-through-str"),
    pytest.param({"by_gpu": {0: "lost", 7: "ok"}}, id="keys-that-are-not-strings"),
    pytest.param({"detail": "GPU perdu · 显卡"}, id="text-outside-ascii"),
    pytest.param({"huge": 2**70, "large_float": 2e16}, id="past-64-bits"),
])
def test_a_document_reads_back_as_json_dumps_would_have_written_it(doc: dict[str, Any]) -> None:
    legacy = json.dumps(doc, separators=(",", ":"), default=str)
    assert json.loads(_dumps(doc)) == json.loads(legacy)


def test_an_ascii_document_is_byte_for_byte_what_json_dumps_wrote() -> None:
    doc = {"incident": "inc-1", "records": {"taint": {"status": "succeeded", "after": {"unschedulable": True}}},
           "at": datetime(2026, 12, 1, tzinfo=UTC), "attempts": [1, 2]}
    assert _dumps(doc) == json.dumps(doc, separators=(",", ":"), default=str).encode()
