"""``remediator playbooks list [--json]`` and ``remediator playbooks validate``: the playbook catalog.

Where it sits: a leaf of the CLI (``remediator.cli`` loads it lazily). It loads the catalog exactly as the
executor does (``playbooks.catalog.PlaybookCatalog.load``), so ``validate`` passing means ``serve`` will load
the same files. With ``--json`` standard output is one JSON document; everything else goes to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from playbooks.catalog import PlaybookCatalog, PlaybookError


def _load(directory: Path | None) -> PlaybookCatalog:
    try:
        return PlaybookCatalog.load(directory)
    except PlaybookError as err:
        click.echo(f"invalid playbook: {err}", err=True)
        sys.exit(1)


@click.group()
def playbooks() -> None:
    """The playbook catalog: list the playbooks, validate their files."""


@playbooks.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: [{name, description, serves}].")
@click.option("--dir", "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of playbook YAML files (default: the packaged playbooks).")
def list_playbooks(as_json: bool, directory: Path | None) -> None:
    """List every playbook with what it serves."""
    catalog = _load(directory)
    rows: list[dict[str, Any]] = [
        {"name": pb.name, "description": pb.description, "serves": pb.serves.model_dump(mode="json")}
        for pb in (catalog.get(n) for n in catalog.names())
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        summary = r["serves"].get("summary") or ""
        click.echo(f"{r['name']:<{width}}  {summary}")


@playbooks.command("validate")
@click.option("--dir", "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory of playbook YAML files (default: the packaged playbooks).")
def validate(directory: Path | None) -> None:
    """Check every playbook file against the schema and the step library; exit 1 on the first problem."""
    catalog = _load(directory)
    for name in catalog.names():
        pb = catalog.get(name)
        click.echo(f"ok  {name}: {len(pb.steps)} steps" + (" (dry-run)" if pb.dry_run else ""), err=True)
    click.echo(f"{len(catalog.names())} playbooks valid", err=True)
