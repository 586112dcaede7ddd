"""``remediator demo [--json]``: the newcomer's first run (see ``chaos.demo`` for what it does).

Where it sits: a thin CLI over ``chaos.demo.run``; progress and the audit timelines go to standard error,
``--json`` prints exactly the report document of DESIGN.md §10 on standard output. Exit 0 only when every
fault was handled as expected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document on stdout.")
@click.option("--timeout", "timeout_s", default=75.0, show_default=True, help="Seconds to wait for the faults.")
def demo(as_json: bool, timeout_s: float) -> None:
    """Embedded NATS, a simulated 8-node GPU cluster with agents, the service, and the standard faults."""
    from chaos import demo as scenario

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)

    def progress(msg: str) -> None:
        click.echo(msg, err=True)

    report = asyncio.run(scenario.run(progress, timeout_s=timeout_s))
    click.echo("", err=True)
    for res in report.results:
        f = res.fault
        mark = "PASS" if res.passed else "FAIL"
        where = f"{f.node}" + (f" GPU {f.gpu}" if f.gpu is not None else "")
        click.echo(f"[{mark}] {f.name}: {f.kind} {f.code} on {where} via {f.via}", err=True)
        click.echo(f"       decision: {res.playbook or 'none'}  outcome: {res.outcome}"
                   + (f"  incident: {res.incident}" if res.incident else ""), err=True)
        if res.actions:
            click.echo(f"       actions: {', '.join(res.actions)}", err=True)
        for problem in res.problems:
            click.echo(f"       problem: {problem}", err=True)
        for r in res.timeline:
            click.echo(f"         {r.time:%H:%M:%S.%f}"[:-3] + f" #{r.seq:<3} {r.what:<17} {r.why[:110]}", err=True)
    verdict = "every fault was handled as expected" if report.passed else "some faults were NOT handled as expected"
    click.echo(f"\ndemo {'passed' if report.passed else 'FAILED'} in {report.seconds:.1f}s: {verdict}", err=True)
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    sys.exit(0 if report.passed else 1)
