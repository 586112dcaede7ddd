"""Fixtures for every test: the repository and the shared folder beside it (samples, reference data).

Integration fixtures (a real nats-server, ...) live in ``tests/integration/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared is missing next to the repository ({SHARED}); CI lays it there")
    return SHARED
