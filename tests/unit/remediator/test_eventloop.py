"""``remediator.eventloop``: the one loop ``serve`` and the benchmarks that measure it run on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner

from remediator import eventloop


async def _which() -> str:
    await asyncio.sleep(0)
    return eventloop.current()


def test_run_runs_on_uvloop_where_it_is_installed() -> None:
    import uvloop  # noqa: F401 - a dependency (uvicorn[standard]): its absence fails here, loudly

    assert eventloop.NAME == "uvloop"
    assert eventloop.run(_which()) == "uvloop"
    assert asyncio.run(_which()) == "asyncio"  # what the benchmarks ran on before: another loop


def test_serve_runs_on_that_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from remediator.cli import serve as serve_cli

    ran: list[Any] = []

    def fake_run(main: Any) -> None:
        ran.append(main.cr_code.co_name)
        main.close()  # never started: nothing to stop

    monkeypatch.setattr(serve_cli.eventloop, "run", fake_run)
    result = CliRunner().invoke(serve_cli.serve, ["--insecure-no-auth"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ran == ["_serve"]


def test_an_import_error_inside_the_service_is_not_a_second_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` once ran the whole service again on asyncio's loop when an ``ImportError`` escaped it (the
    uvloop import and the run shared one ``try``): a service that fails to import a part fails once."""
    from remediator.cli import serve as serve_cli

    runs: list[str] = []

    def failing_run(main: Any) -> None:
        runs.append(main.cr_code.co_name)
        main.close()
        raise ImportError("a part of the service could not be imported")

    monkeypatch.setattr(serve_cli.eventloop, "run", failing_run)
    monkeypatch.setattr(asyncio, "run", failing_run)  # a fallback to asyncio's loop would land here
    with pytest.raises(ImportError):
        CliRunner().invoke(serve_cli.serve, ["--insecure-no-auth"], catch_exceptions=False)
    assert runs == ["_serve"]
