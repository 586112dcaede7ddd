"""The drill catalog: where drill files are, loading one, and refusing a bad one with the field's path.

Where it sits: between the drill files (``chaos/drills/*.yaml``, the shipped drills ``remediator drill
list|run --all`` runs; ``chaos/demo.yaml``, the demo ``remediator demo`` runs, which is not one of them)
and the runner (``chaos.runner``); the schema they are validated against is ``chaos.schema``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError

from chaos.schema import Drill

DRILLS_DIR = Path(__file__).resolve().parent / "drills"
# The demo's faults, as a drill file beside the shipped drills (not among them: ``drill run --all`` runs the
# drills, and the demo is ``remediator demo``'s).
DEMO_DRILL = Path(__file__).resolve().parent / "demo.yaml"


class DrillError(ValueError):
    """A drill that cannot be loaded: the message names the file and the field."""


def _where(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc)


def parse_drill(text: str, source: str = "<drill>", *, stem: str | None = None) -> Drill:
    """Validate one drill's YAML; raises ``DrillError`` naming ``source`` and the failing field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DrillError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise DrillError(f"{source}: a drill is a YAML mapping (name, description, cluster, settings, timeline, "
                         "expect)")
    try:
        drill = Drill.model_validate(raw)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            msg = str(err["msg"]).removeprefix("Value error, ")
            where = _where(err["loc"])
            msgs.append(f"{where}: {msg}" if where else msg)
        raise DrillError(f"{source}: " + "; ".join(msgs)) from None
    if stem is not None and drill.name != stem:
        raise DrillError(f"{source}: name: {drill.name!r} must be the file name without .yaml ({stem!r})")
    return drill


def load_drill(path: Path) -> Drill:
    """One drill file; its ``name`` must be the file's stem."""
    return parse_drill(path.read_text(), str(path), stem=path.stem)


def drill_paths(directory: Path = DRILLS_DIR) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def list_drills(directory: Path = DRILLS_DIR) -> list[Drill]:
    return [load_drill(p) for p in drill_paths(directory)]


def get_drill(name: str, directory: Path = DRILLS_DIR) -> Drill:
    """A shipped drill by name, or any drill file by its path (``NAME|FILE`` of ``remediator drill run``)."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return load_drill(Path(name))
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in drill_paths(directory))
        raise DrillError(f"no drill named {name!r} (known: {known})")
    return load_drill(path)


def demo_drill() -> Drill:
    """The demo's drill (``chaos/demo.yaml``)."""
    return load_drill(DEMO_DRILL)


def describe(drill: Drill) -> str:
    """The description's first sentence, on one line."""
    text = " ".join(drill.description.split())
    return text.split(". ")[0].rstrip(".") + "."
