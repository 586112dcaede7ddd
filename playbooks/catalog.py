"""The playbook catalog: every YAML file in ``playbooks/``, loaded and validated together.

Where it sits: loaded once by the composition root (``serve``, ``demo``, ``playbooks validate``) and handed
to the executor, which looks a decision's playbook up by name. Loading fails loudly, naming the file and
the field, when a file does not fit the schema, names a step the step library lacks, or when a name of the
shared vocabulary (``contracts.PLAYBOOK_NAMES``) has no file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from playbooks.schema import Playbook
from playbooks.steps import REGISTRY, StepRegistry
from remediator.contracts import PLAYBOOK_NAMES

PLAYBOOK_DIR = Path(__file__).resolve().parent


class PlaybookError(ValueError):
    """A playbook file is invalid; the message names the file and what is wrong."""


def load_file(path: Path, registry: StepRegistry = REGISTRY) -> Playbook:
    """Parse and validate one playbook file, including the step names against ``registry``."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise PlaybookError(f"{path.name}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise PlaybookError(f"{path.name}: expected a mapping at the top level")
    try:
        pb = Playbook.model_validate(raw)
    except ValidationError as err:
        raise PlaybookError(f"{path.name}: {err}") from err
    if pb.name != path.stem:
        raise PlaybookError(f"{path.name}: name {pb.name!r} differs from the file name")
    for s in (*pb.steps, *pb.rollback):
        if s.name not in registry:
            raise PlaybookError(f"{path.name}: step {s.key!r} names {s.name!r}, which the step library lacks "
                                f"(known: {', '.join(sorted(registry.names()))})")
        problem = registry.get(s.name).check_params(s.params)
        if problem:
            raise PlaybookError(f"{path.name}: step {s.key!r}: {problem}")
    return pb


@dataclass(frozen=True)
class PlaybookCatalog:
    """The validated playbooks by name."""

    playbooks: dict[str, Playbook] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path | None = None, *, required: Iterable[str] = PLAYBOOK_NAMES,
             registry: StepRegistry = REGISTRY) -> PlaybookCatalog:
        """Load every ``*.yaml`` of ``directory`` (default: the packaged playbooks) and check coverage."""
        directory = directory or PLAYBOOK_DIR
        found: dict[str, Playbook] = {}
        for path in sorted(directory.glob("*.yaml")):
            pb = load_file(path, registry)
            found[pb.name] = pb
        missing = sorted(set(required) - set(found))
        if missing:
            raise PlaybookError(f"no playbook file for {', '.join(missing)} in {directory}")
        return cls(found)

    def get(self, name: str) -> Playbook:
        try:
            return self.playbooks[name]
        except KeyError:
            raise KeyError(f"no playbook named {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self.playbooks)

    def __contains__(self, name: object) -> bool:
        return name in self.playbooks
