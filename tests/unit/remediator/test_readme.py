"""The README stays true: its settings table matches Settings, and .ci/run runs its test command verbatim."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tools.settings_table import table


def test_settings_table_is_current() -> None:
    readme = (REPO / "README.md").read_text()
    assert table() in readme, "README configuration table is stale: run `python tools/settings_table.py`"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    test_cmd = next(b for b in blocks if "pytest" in b)
    ci = (REPO / ".ci" / "run").read_text()
    assert test_cmd.strip() in ci.splitlines()
    assert any("remediator demo" in b for b in blocks)
