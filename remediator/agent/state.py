"""Small durable state of the node agent: read positions, change baselines, command replies.

Where it sits: under every agent watcher. Each piece of state is one JSON file in the ``--state``
directory, replaced atomically (write to a temporary file, fsync, rename, fsync the directory), so a crash
leaves either the old or the new version, never a torn one. The boot id (whose change tells the agent
that kmsg sequence numbers restarted) is read here too, from an injectable path.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class StateStore:
    """Named JSON documents in one directory, each written atomically."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> dict[str, Any]:
        """The document ``name``, or ``{}`` when it does not exist or cannot be parsed (logged)."""
        p = self.path(name)
        try:
            data = json.loads(p.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("agent state %s unreadable (%s); starting it afresh", p, e)
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, name: str, data: dict[str, Any]) -> None:
        """Replace the document ``name`` with ``data``, durably."""
        atomic_write(self.path(name), json.dumps(data, separators=(",", ":"), sort_keys=True).encode())


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def read_boot_id(path: Path | str = DEFAULT_BOOT_ID_PATH) -> str:
    """The kernel's boot id (a UUID that changes at every boot); ``unknown-boot`` if it cannot be read."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return "unknown-boot"
    return text or "unknown-boot"
