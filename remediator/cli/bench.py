"""``remediator bench ingest|classify|storm|webhook|dispatch|agent``: benchmarks that print figures (DESIGN.md §10).

Where it sits: a thin CLI over the benchmarks beside the chaos harness; each lives in ``chaos.bench.<name>``
and is imported only when run, so loading the CLI never loads the chaos package. With ``--json`` standard
output is exactly one JSON document whose top-level keys are the figures the issues name; progress goes to
standard error.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from remediator import eventloop

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _arun(coro: Coroutine[Any, Any, T]) -> T:
    """``eventloop.run(coro)`` (``serve``'s loop), where SIGTERM cancels it as Ctrl-C does: its context managers
    stop the nats-server, the simulated cluster and the replicas it started, which would otherwise outlive a killed
    benchmark. A cancellation the event loop loses (asyncio's ``wait_for`` can swallow one) lets the run end
    on its own, and its context managers clean up just the same; either way it exits non-zero."""
    stopped = False

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        return await coro

    try:
        result = eventloop.run(main())  # serve's loop: what the benchmarks measure is what it runs
    except asyncio.CancelledError:
        stopped = True
    if stopped:
        raise click.ClickException("stopped by SIGTERM; what it had started was stopped")
    return result


def _progress(msg: str) -> None:
    click.echo(msg, err=True)


def _json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity (a percentile of nothing: no node was cordoned) as null, which
    JSON has; ``json.dumps`` would write ``NaN``, which no JSON parser but Python's reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(_json_safe(result), indent=2, sort_keys=False, allow_nan=False) + "\n")
        return
    for key, value in result.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k}={v}" for k, v in value.items())
            click.echo(f"{key:>24}: {inner}", err=True)
        else:
            click.echo(f"{key:>24}: {value}", err=True)


@click.group()
def bench() -> None:
    """Benchmarks that print measured figures."""


@bench.command("ingest")
@click.option("--url", default=None, help="Base URL of a running service (default: start one on embedded NATS).")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(1, 1024))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def ingest(url: str | None, concurrency: int, as_json: bool) -> None:
    """Alertmanager ingest throughput and paced latency against the JetStream floor."""
    from chaos.bench import ingest as mod

    _emit(_arun(mod.run(url=url, concurrency=concurrency, progress=_progress)), as_json)


@bench.command("classify")
@click.option("--lines", default=1_000_000, show_default=True, type=click.IntRange(1000))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def classify(lines: int, as_json: bool) -> None:
    """Classifier throughput over realistic mixed logs, one process, one core."""
    from chaos.bench import classify as mod

    _emit(mod.run(lines=lines, progress=_progress), as_json)


def _audit_option(per: str) -> Callable[[F], F]:
    """``--audit full|unsigned|off`` (``chaos.bench.audit_modes``, not imported here: the CLI starts lean)."""
    return click.option(
        "--audit", "audit", default="full", show_default=True, type=click.Choice(["full", "unsigned", "off"]),
        help="The service's audit trail: as serve writes it, without signatures (and so checkpoints), or not "
             f"written. A measurement of what the audit trail costs {per}; serve has no such switch.")


@bench.command("storm")
@click.option("--nodes", default=1500, show_default=True, type=click.IntRange(2, 200_000))
@click.option("--failing", default=750, show_default=True, type=click.IntRange(1, 200_000))
@click.option("--burst", is_flag=True, help="Every failing node reports at once (default: spread over 30 s).")
@click.option("--default-limits", is_flag=True,
              help="The shipped client rate limit and every guard but breaker and budget (default: limit raised).")
@click.option("--no-breaker-run", "skip_breaker", is_flag=True, help="Skip the second run with the default guards.")
@click.option("--wait", "wait_s", default=120.0, show_default=True, type=click.FloatRange(1, 7200),
              help="How long to wait for the runs to finish after the last event.")
@_audit_option("per incident")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def storm(nodes: int, failing: int, burst: bool, default_limits: bool, skip_breaker: bool, wait_s: float,
          audit: str, as_json: bool) -> None:
    """Fatal-Xid storm through the real pipeline, without and with the circuit breaker."""
    if failing > nodes:
        raise click.BadParameter("--failing cannot exceed --nodes")
    from chaos.bench import storm as mod

    _emit(_arun(mod.run(nodes=nodes, failing=failing, progress=_progress, burst=burst,
                              default_limits=default_limits, breaker_run=not skip_breaker, wait_s=wait_s,
                              audit=audit)), as_json)


@bench.command("webhook")
@click.option("--nodes", default=1500, show_default=True, type=click.IntRange(2, 200_000))
@click.option("--alerts", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def webhook(nodes: int, alerts: int, as_json: bool) -> None:
    """Alertmanager POST to cordon, one alert at a time, through the real webhook and pipeline."""
    if alerts > nodes:
        raise click.BadParameter("--alerts cannot exceed --nodes")
    from chaos.bench import storm as mod

    _emit(_arun(mod.webhook(nodes=nodes, alerts=alerts, progress=_progress)), as_json)


@bench.command("dispatch")
@click.option("--events", default=20_000, show_default=True, type=click.IntRange(1, 2_000_000))
@click.option("--nodes", default=2000, show_default=True, type=click.IntRange(1, 200_000))
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Dispatcher replicas, each in its own process, sharing the durable consumer.")
@_audit_option("per event")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def dispatch(events: int, nodes: int, replicas: int, audit: str, as_json: bool) -> None:
    """Dispatch throughput: a backlog of mixed agent events on FAULTS drained by K replicas."""
    from chaos.bench import dispatch as mod

    _emit(_arun(mod.run(events=events, nodes=nodes, replicas=replicas, progress=_progress, audit=audit)), as_json)


@bench.command("agent")
@click.option("--seconds", default=20.0, show_default=True, type=click.FloatRange(1), help="Idle measuring time.")
@click.option("--log-lines", default=200_000, show_default=True, type=click.IntRange(1000),
              help="Lines of a verbose NCCL job log to scan.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def agent(seconds: float, log_lines: int, as_json: bool) -> None:
    """The node agent's own cost: RSS and CPU at idle with 8 simulated GPUs, and container-log scan cost."""
    from chaos.bench import agent_idle, agent_logscan

    idle = agent_idle.run(seconds, progress=_progress)
    scan = agent_logscan.run(log_lines, seconds, progress=_progress)
    _emit({"idle": idle, "logscan": scan}, as_json)
