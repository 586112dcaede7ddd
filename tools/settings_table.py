"""Regenerates the README's configuration tables from ``remediator.settings.Settings`` (run from the repo root).

Where it sits: a maintainer's tool beside the code, checked by tests/unit/test_readme.py. One table per
section of ``remediator.settings.SECTIONS``, in that order, each row a ``REMEDIATOR_*`` variable with its
default and the field's description.
"""

from __future__ import annotations

import re
from pathlib import Path

from remediator.settings import SECTIONS, Settings, section_of


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if default == "":
        return "empty"
    return f"`{default}`"


def table() -> str:
    """The configuration tables, one per section, as Markdown."""
    parts: list[str] = []
    for section, title in SECTIONS:
        rows = [f"**{section}**: {title}.", "", "| variable | default | meaning |", "|---|---|---|"]
        for name, field in Settings.model_fields.items():
            if section_of(name) == section:
                rows.append(f"| `REMEDIATOR_{name.upper()}` | {_shown(field.default)} | {field.description or ''} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def main() -> None:
    readme = Path("README.md")
    text = readme.read_text()
    new = re.sub(r"(<!-- settings-table:begin -->\n).*?(<!-- settings-table:end -->)",
                 lambda m: m.group(1) + table() + "\n" + m.group(2), text, flags=re.S)
    readme.write_text(new)


if __name__ == "__main__":
    main()
