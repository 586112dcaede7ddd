"""Support for tests that run ``remediator serve`` as a process: wait until it answers ready."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_ready(proc: subprocess.Popen[str], base: str, timeout_s: float = 30.0) -> None:
    """Poll ``base``/readyz until 200; fail with serve's stderr if it exits, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)
    raise AssertionError("serve did not become ready")
