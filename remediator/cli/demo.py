"""``remediator demo [--json] [--data-dir DIR] [--nats-port PORT]``: the newcomer's first run.

Where it sits: a thin CLI over ``chaos.demo.run``, which plays the demo's drill file (``chaos/demo.yaml``;
see ``chaos.demo``). The chaos package is imported inside the command, so loading the CLI never loads it.
Progress and each fault's decision, actions, outcome and audit timeline go to standard error; ``--json``
prints exactly the report document of DESIGN.md §10 on standard output. ``--data-dir`` keeps the embedded
nats-server's JetStream store (the audit trail included) in DIR, for ``remediator audit list --data-dir
DIR`` afterwards; ``--nats-port`` is that server's port. Exit 0 only when every fault was handled as
expected; 2 when DIR already holds a store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document on stdout.")
@click.option("--timeout", "timeout_s", default=75.0, show_default=True, help="Seconds to wait for the faults.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the embedded nats-server's JetStream store (and so the audit trail) in this new or empty "
                   "directory, for `remediator audit list --data-dir DIR` afterwards.")
@click.option("--nats-port", type=click.IntRange(1, 65535), default=None,
              help="Port of the embedded nats-server (default: a free one).")
def demo(as_json: bool, timeout_s: float, data_dir: Path | None, nats_port: int | None) -> None:
    """Embedded NATS, a simulated 8-node GPU cluster with agents, the service, and the standard faults."""
    from chaos import demo as scenario

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if data_dir is not None and (data_dir / "jetstream").exists():
        click.echo(f"error: {data_dir} already holds a JetStream store; give the demo a new or empty directory",
                   err=True)
        sys.exit(2)

    def progress(msg: str) -> None:
        click.echo(msg, err=True)

    report = asyncio.run(scenario.run(progress, timeout_s=timeout_s, data_dir=data_dir, nats_port=nats_port))
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
    for v in report.other_verdicts():
        click.echo(f"[{'PASS' if v.passed else 'FAIL'}] {v.what}" + (f" — {v.detail}" if v.detail else ""), err=True)
    verdict = "every fault was handled as expected" if report.passed else "some faults were NOT handled as expected"
    click.echo(f"\ndemo {'passed' if report.passed else 'FAILED'} in {report.seconds:.1f}s: {verdict}", err=True)
    if data_dir is not None:
        click.echo(f"the audit trail is kept in {data_dir}: remediator audit list --data-dir {data_dir}", err=True)
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    sys.exit(0 if report.passed else 1)
