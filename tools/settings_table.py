"""Regenerates the README's configuration table from ``remediator.settings.Settings`` (run from the repo root)."""

from __future__ import annotations

import re
from pathlib import Path

from remediator.settings import Settings


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "unset" if default is None else ("empty" if default == "" else f"`{default}`")
        rows.append(f"| `REMEDIATOR_{name.upper()}` | {shown} | {field.description or ''} |")
    return "\n".join(rows)


def main() -> None:
    readme = Path("README.md")
    text = readme.read_text()
    new = re.sub(r"(<!-- settings-table:begin -->\n).*?(<!-- settings-table:end -->)",
                 lambda m: m.group(1) + table() + "\n" + m.group(2), text, flags=re.S)
    readme.write_text(new)


if __name__ == "__main__":
    main()
