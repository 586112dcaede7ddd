"""The NVIDIA Xid catalog as data, and the map from each Xid to one of our playbooks.

Where it sits: ``handlers.xid`` looks every Xid event up here before it applies the co-occurrence rules of
gpu-faults.md §1.7; the ``remediator xid`` commands and the docs read it too. The rows are NVIDIA's
Xid-Catalog (172 codes), shipped as package data in ``handlers/data/xid_catalog.csv`` and loaded once with
``importlib.resources``, so the product never reads ``../shared``. ``handlers/data/SOURCES.md`` records
where the file comes from; its two ``#`` header lines carry the catalog's source and version.

How a code becomes a playbook (first rule that applies wins; gpu-faults.md §0 and §1.2):

1. Codes named in the decision table of §0 go to their playbook whatever their bucket:
   79 → ``gpu-lost``; 48, 95, 140 → ``gpu-memory-fatal``; 63 → ``row-remap-pending``;
   64 → ``memory-retirement-failure``; 74, 136, 144-150, 155 → ``nvlink``;
   46, 62, 109, 119, 120, 143, 158 → ``gsp-hang``.
2. NVIDIA's immediate action ("bucket") decides the rest: ``RESTART_BM`` and ``RESTART_VM`` (the VM is our
   node) → ``node-reboot``; ``RESET_GPU`` → ``gpu-reset``.
3. Application-class codes (``RESTART_APP``, and 43 and 45, which NVIDIA files under IGNORE and
   WORKFLOW_XID_45): no node action on a single sighting (``actionable=False``). Their playbook is the one the
   handler escalates to when the same GPU keeps faulting across different jobs: ``app-xid-hardware-suspect``
   (``escalates_on_repeat=True``).
4. Other ``IGNORE`` codes ("no action required"): recorded, never acted on (``actionable=False``,
   ``escalates_on_repeat=False``). 92 (high single-bit ECC rate) names ``ecc-correctable-rate``, the ECC
   handler's rate rule being the one that acts on it; the others name ``app-xid-hardware-suspect``.
5. Everything else: ``CONTACT_SUPPORT``, the Ampere-unused codes, ``CHECK_MECHANICALS``, ``UPDATE_SWFW``,
   ``CHECK_UVM`` (we cannot tell whether UVM is in use), an empty bucket (162-172 in this version), and any
   code not in the catalog → ``unknown-xid``, actionable: a person is told, nothing is silently dropped.
6. 154 (``XID_154``) summarises the recovery action of another Xid; its playbook here is ``unknown-xid``
   because the handler reads the action from the message text and escalates only when it cannot.

``is_fatal`` is true where NVIDIA's bucket says the GPU needs a reset or more (``RESET_GPU``, ``RESTART_BM``,
``RESTART_VM``, ``WORKFLOW_XID_48``, ``WORKFLOW_NVLINK_ERR``, ``WORKFLOW_NVLINK5_ERR``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

from remediator.contracts import PLAYBOOK_NAMES

CATALOG_RESOURCE = "data/xid_catalog.csv"

_NAMED: dict[int, str] = {
    79: "gpu-lost",
    48: "gpu-memory-fatal", 95: "gpu-memory-fatal", 140: "gpu-memory-fatal",
    63: "row-remap-pending",
    64: "memory-retirement-failure",
    74: "nvlink", 136: "nvlink", 155: "nvlink", **{c: "nvlink" for c in range(144, 151)},
    46: "gsp-hang", 62: "gsp-hang", 109: "gsp-hang", 119: "gsp-hang", 120: "gsp-hang", 143: "gsp-hang",
    158: "gsp-hang",
}
_APPLICATION_EXTRA = frozenset({43, 45})
_FATAL_BUCKETS = frozenset({"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                            "WORKFLOW_NVLINK5_ERR"})
UNKNOWN_PLAYBOOK = "unknown-xid"


@dataclass(frozen=True)
class XidInfo:
    """One catalog row plus our routing: the playbook, whether one sighting is enough to act."""

    code: int
    mnemonic: str
    description: str
    category: str
    immediate_action: str | None
    investigatory_action: str | None
    playbook: str
    is_fatal: bool
    applies_to: str
    actionable: bool = True
    escalates_on_repeat: bool = False
    xid154_linkage: str | None = None


def route(code: int, immediate_action: str | None) -> tuple[str, bool, bool]:
    """Return ``(playbook, actionable, escalates_on_repeat)`` for a code and its NVIDIA bucket."""
    if code in _NAMED:
        return _NAMED[code], True, False
    if immediate_action in ("RESTART_BM", "RESTART_VM"):
        return "node-reboot", True, False
    if immediate_action == "RESET_GPU":
        return "gpu-reset", True, False
    if immediate_action == "RESTART_APP" or code in _APPLICATION_EXTRA:
        return "app-xid-hardware-suspect", False, True
    if code == 92:
        return "ecc-correctable-rate", False, False
    if immediate_action == "IGNORE":
        return "app-xid-hardware-suspect", False, False
    return UNKNOWN_PLAYBOOK, True, False


def _cell(row: Mapping[str, str | None], name: str) -> str | None:
    value = (row.get(name) or "").strip()
    return value or None


def _info(row: Mapping[str, str | None]) -> XidInfo:
    code = int((row.get("xid") or "").strip())
    immediate = _cell(row, "immediate_action")
    playbook, actionable, escalates = route(code, immediate)
    return XidInfo(
        code=code,
        mnemonic=_cell(row, "mnemonic") or "",
        description=_cell(row, "description") or "",
        category=_cell(row, "category") or "",
        immediate_action=immediate,
        investigatory_action=_cell(row, "investigatory_action"),
        playbook=playbook,
        is_fatal=immediate in _FATAL_BUCKETS,
        applies_to=_cell(row, "applies_to") or "",
        actionable=actionable,
        escalates_on_repeat=escalates,
        xid154_linkage=_cell(row, "xid154_linkage"),
    )


class XidCatalog:
    """The Xid catalog, immutable once loaded; ``get`` returns None for a code NVIDIA does not list."""

    def __init__(self, infos: Mapping[int, XidInfo], version: str, source: str) -> None:
        for info in infos.values():
            if info.playbook not in PLAYBOOK_NAMES:
                raise ValueError(f"Xid {info.code}: playbook {info.playbook!r} is not in PLAYBOOK_NAMES")
        self._infos = dict(sorted(infos.items()))
        self.version = version
        self.source = source

    @classmethod
    def from_text(cls, text: str) -> XidCatalog:
        """Parse the CSV; leading ``# source:`` and ``# version:`` lines are read as metadata."""
        meta: dict[str, str] = {}
        body: list[str] = []
        for line in text.splitlines():
            if not body and line.startswith("#"):
                key, _, value = line[1:].partition(":")
                meta[key.strip()] = value.strip()
            else:
                body.append(line)
        infos: dict[int, XidInfo] = {}
        for row in csv.DictReader(io.StringIO("\n".join(body))):
            info = _info(row)
            if info.code in infos:
                raise ValueError(f"Xid {info.code} appears twice in the catalog")
            infos[info.code] = info
        return cls(infos, meta.get("version", "unversioned"), meta.get("source", "unknown"))

    @classmethod
    def load(cls) -> XidCatalog:
        """Load the catalog shipped as package data."""
        text = resources.files("handlers").joinpath(CATALOG_RESOURCE).read_text(encoding="utf-8")
        return cls.from_text(text)

    def get(self, code: int) -> XidInfo | None:
        return self._infos.get(code)

    def __len__(self) -> int:
        return len(self._infos)

    def __iter__(self) -> Iterator[XidInfo]:
        return iter(self._infos.values())

    def __contains__(self, code: object) -> bool:
        return code in self._infos


CATALOG = XidCatalog.load()


def playbook_for_xid(code: int) -> str:
    """Our playbook for ``code``; a code not in the catalog, or one without an action, is ``unknown-xid``."""
    info = CATALOG.get(code)
    return UNKNOWN_PLAYBOOK if info is None else info.playbook
