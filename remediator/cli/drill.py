"""``remediator drill list`` / ``remediator drill run NAME|FILE… | --all [--json]``: the chaos drills.

Where it sits: a thin CLI over the drill catalog (``chaos.catalog``) and runner (``chaos.runner``),
imported only when a drill command runs, so the service's path never loads the chaos package. ``run`` takes
shipped drills by name (``--all``: every one of ``chaos/drills/*.yaml``) or any drill file by its path
(``chaos/demo.yaml``, the demo's, is not among the shipped ones). Each drill starts its own embedded NATS,
simulated cluster, agents and service, plays its timeline and judges its expectations; with
``--kubeconfig FILE`` it runs against that cluster instead (``chaos.remote``: faults as Alertmanager
payloads, checks through the Kubernetes API, confirmed nodes only, simulator-only drills refused). Progress and each
expectation's verdict go to standard error; with ``--json`` standard output is exactly one document
``{"passed", "drills": [{"name", "passed", "seconds", "expectations": [{"what", "passed", "detail"}]}]}``.
Exit 0 only when every drill passed; 2 for an unknown or invalid drill.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

_SIMULATED_ONLY = ("Drills run against the built-in simulated cluster (embedded NATS, a simulated Kubernetes "
                   "API and GPU nodes, real agents and service), or with --kubeconfig FILE against the cluster it "
                   "names: faults as Alertmanager payloads to the drill's own service, checks through the "
                   "Kubernetes API, on nodes labelled gpu-remediator.io/drills=allowed only; drills that need the "
                   "simulator's internals are refused.")


@click.group(help=f"Chaos drills: faults plus broken machinery, with expected outcomes. {_SIMULATED_ONLY}")
def drill() -> None:
    pass


@drill.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print [{name, description}] as one JSON document.")
def list_cmd(as_json: bool) -> None:
    """List the shipped drills (chaos/drills/*.yaml)."""
    from chaos import catalog as drills

    try:
        found = drills.list_drills()
    except drills.DrillError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        doc = [{"name": d.name, "description": " ".join(d.description.split())} for d in found]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    width = max((len(d.name) for d in found), default=0)
    for d in found:
        click.echo(f"{d.name:<{width}}  {drills.describe(d)}")


@drill.command("run", help="Run the named drills or drill files (or --all), one after the other: progress and "
               "every expectation's verdict on stderr; exit 0 only when all passed, 1 when one failed, 2 for an "
               f"unknown or invalid drill. {_SIMULATED_ONLY}")
@click.argument("names", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Run every shipped drill.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document on stdout.")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Run against the cluster this kubeconfig names (its drill nodes must be labelled "
                   "gpu-remediator.io/drills=allowed) instead of the simulated one.")
def run_cmd(names: tuple[str, ...], run_all: bool, as_json: bool, kubeconfig: Path | None) -> None:
    from chaos import catalog as drills
    from chaos.runner import run_drill

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if run_all == bool(names):
        click.echo("error: name one or more drills, or pass --all (see `remediator drill list`)", err=True)
        sys.exit(2)
    try:
        chosen = drills.list_drills() if run_all else [drills.get_drill(n) for n in names]
    except drills.DrillError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    def progress(msg: str) -> None:
        click.echo(f"  {msg}", err=True)

    if kubeconfig is not None:
        from chaos.remote import refusals

        refused = [(d.name, why) for d in chosen for why in refusals(d)]
        if refused:
            for name, why in refused:
                click.echo(f"error: drill {name} cannot run against a real cluster: {why}", err=True)
            sys.exit(2)
    reports = []
    for d in chosen:
        click.echo(f"== drill {d.name}: {drills.describe(d)}", err=True)
        report = (_run_remote(d, kubeconfig, progress) if kubeconfig is not None
                  else asyncio.run(run_drill(d, progress)))
        reports.append(report)
        click.echo(f"[{'PASS' if report.passed else 'FAIL'}] {d.name} in {report.seconds:.1f}s", err=True)
        for v in report.expectations:
            click.echo(f"   {'✓' if v.passed else '✗'} {v.what}" + (f" — {v.detail}" if v.detail else ""), err=True)
        for res in report.results:
            if not res.passed:
                for r in res.timeline:
                    click.echo(f"       {r.time:%H:%M:%S.%f}"[:-3] + f" #{r.seq:<3} {r.what:<17} {r.why[:110]}",
                               err=True)
        click.echo("", err=True)
    passed = all(r.passed for r in reports)
    failed = [r.name for r in reports if not r.passed]
    click.echo(f"drills: {len(reports) - len(failed)} of {len(reports)} passed"
               + (f"; failed: {', '.join(failed)}" if failed else ""), err=True)
    if as_json:
        sys.stdout.write(json.dumps({"passed": passed, "drills": [r.to_json() for r in reports]}, indent=2) + "\n")
    sys.exit(0 if passed else 1)


def _run_remote(d: Any, kubeconfig: Path, progress: Any) -> Any:
    """One drill against the cluster of ``kubeconfig`` (``chaos.remote``); a refusal is exit 2, one line each."""
    from chaos.remote import DrillRefused, run_remote

    with tempfile.TemporaryDirectory(prefix="remediator-drill-") as root:
        try:
            return asyncio.run(run_remote(d, kubeconfig, progress, Path(root)))
        except DrillRefused as e:
            for why in e.reasons:
                click.echo(f"error: drill {d.name}: {why}", err=True)
            sys.exit(2)
