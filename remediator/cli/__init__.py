"""The ``remediator`` command line: the composition root.

Where it sits: on top of everything. Each subcommand lives in its own module under
``remediator.cli`` (or ``chaos``) and is imported only when invoked, so ``serve`` and ``agent`` on a
real node never load the chaos package. Conventions (DESIGN.md §10): with ``--json`` standard output is
exactly one JSON document; progress and tables go to standard error. A failure is one line on standard
error naming the fix, exit status 1 (``remediator.cli.edges``); ``--debug`` (before the command, or
``REMEDIATOR_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import click

# name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, str] = {
    "serve": "remediator.cli.serve:serve",
    "demo": "remediator.cli.demo:demo",
    "agent": "remediator.cli.agent:agent",
    "classify": "remediator.cli.classify:classify",
    "sim": "remediator.cli.sim:sim",
    "bus": "remediator.cli.bus:bus",
    "bench": "remediator.cli.bench:bench",
    "audit": "remediator.cli.audit:audit",
    "playbooks": "remediator.cli.playbooks:playbooks",
    "breaker": "remediator.cli.operator:breaker",
    "approve": "remediator.cli.operator:approve",
    "budget": "remediator.cli.budget:budget",
    "drill": "remediator.cli.drill:drill",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in _COMMANDS if self._available(n))

    @staticmethod
    def _available(name: str) -> bool:
        return importlib.util.find_spec(_COMMANDS[name].split(":")[0]) is not None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            from remediator.cli.edges import one_line

            raise click.ClickException(one_line(exc)) from exc

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None or not self._available(name):
            return None
        module, attr = target.split(":")
        cmd: Any = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        return cmd


@click.group(cls=_LazyGroup)
@click.version_option(package_name="gpu-remediator")
@click.option("--debug", is_flag=True, envvar="REMEDIATOR_DEBUG",
              help="Show the traceback of a failure instead of one line (env REMEDIATOR_DEBUG).")
def main(debug: bool) -> None:
    """gpu-remediator: heals GPU clusters on Kubernetes, behind safety rails, with an audit trail."""


if __name__ == "__main__":
    main()
