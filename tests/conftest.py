"""Shared fixtures: a real nats-server per test (port 0 style, temporary store), paths to the samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from remediator.natsd import EmbeddedNats

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def nats_server() -> Iterator[EmbeddedNats]:
    """A fresh ``nats-server -js`` on a free port; fails loudly when the binary is missing."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared is missing next to the repository ({SHARED}); CI lays it there")
    return SHARED
