"""Each benchmark command touched by the fleet-scale work runs at a tiny size and prints its figures as
top-level JSON keys (no figure is asserted: benchmarks print numbers, tests never time anything)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(240)


def _bench(*args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "remediator.cli", "bench", *args, "--json"], capture_output=True,
                          text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # stdout is exactly one JSON document
    assert isinstance(doc, dict)
    return doc


def test_bench_dispatch_prints_its_keys() -> None:
    doc = _bench("dispatch", "--events", "300", "--nodes", "30", "--replicas", "2")
    for key in ("events_per_s", "cpu_ms_per_event", "nats_cpu_ms_per_event", "replicas"):
        assert key in doc, doc
    assert doc["replicas"] == 2 and doc["events"] == 300
    assert sum(doc["handled_by_replica"]) >= 300  # type: ignore[arg-type]
    assert doc["event_loop"] == ["uvloop"]  # serve's loop, in every replica (remediator.eventloop)
    # whether the cores or the replicas are the limit: CPU of replicas and server over the drain, and lost races
    assert doc["cpus"] == os.cpu_count() and 0 < doc["cores_busy"] <= 1.5 * doc["cpus"], doc  # type: ignore[operator]
    assert isinstance(doc["cas_lost"], int) and 0 <= doc["cas_lost"] <= 300, doc
    records = doc["audit_records"]  # a record or two per event, some re-linked after the other replica's
    assert isinstance(records, dict) and 300 <= records["appended"] <= 900, doc
    assert records["relinked"] <= records["appended"], doc
    assert doc["audit"] == "full", doc


def test_bench_dispatch_measures_the_audit_trail_by_leaving_parts_of_it_out() -> None:
    """``--audit unsigned`` writes the same records unsigned; ``--audit off`` writes none and still handles
    every event: what the difference in CPU per event measures is the audit trail alone."""
    unsigned = _bench("dispatch", "--events", "200", "--nodes", "20", "--audit", "unsigned")
    assert unsigned["audit"] == "unsigned" and 200 <= unsigned["audit_records"]["appended"] <= 600, unsigned
    off = _bench("dispatch", "--events", "200", "--nodes", "20", "--audit", "off")
    assert off["audit"] == "off" and off["audit_records"] == {"appended": 0, "relinked": 0}, off
    assert off["handled_by_replica"] == [200] and off["decisions"] == unsigned["decisions"], (off, unsigned)


def test_bench_storm_measures_the_audit_trail_by_leaving_it_out() -> None:
    """``--audit off``: the same storm, every node cordoned and every run finished, with no record written."""
    doc = _bench("storm", "--nodes", "8", "--failing", "3", "--burst", "--no-breaker-run", "--wait", "60",
                 "--audit", "off")
    assert doc["audit"] == "off" and doc["cordoned"] == 3 and doc["finished"] == 3 and doc["unfinished"] == [], doc
    assert doc["audit_records"]["written"] == 0 and doc["audit_records"]["checkpoints"] == 0, doc


def test_bench_storm_prints_its_keys() -> None:
    doc = _bench("storm", "--nodes", "12", "--failing", "4", "--burst", "--no-breaker-run", "--wait", "60")
    for key in ("all_cordoned_s", "cordons_per_s", "p50_cordon_latency_s", "p99_cordon_latency_s",
                "cpu_ms_per_incident", "api_requests_per_incident", "rss_mb"):
        assert key in doc, doc
    assert set(doc["rss_mb"]) == {"service", "simulator", "nats_server"}  # type: ignore[arg-type]
    pauses = doc["gc_pauses"]
    assert isinstance(pauses, dict) and set(pauses) == {"service", "simulator"}
    for part in pauses.values():
        assert set(part) == {"passes", "full", "total_ms", "max_ms"}, part
    assert doc["cordoned"] == 4 and doc["finished"] == 4 and doc["unfinished"] == []
    assert doc["audit"] == "full" and doc["audit_records"]["written"] == doc["audit_records"]["signed"] > 0, doc
    assert doc["event_loop"] == "uvloop"  # serve's loop (remediator.eventloop)
    # the pipeline writes its audit as serve does (AuditLog.for_replica): every record signed
    records = doc["audit_records"]
    assert isinstance(records, dict) and records["written"] >= 4 * 8 and records["signed"] == records["written"]
    # and anchors each chain it wrote as serve does at stop: the 4 nodes' chains (and the cluster's, when written)
    flush = doc["audit_flush"]
    assert isinstance(flush, dict) and 4 <= flush["chains"] <= 5 and flush["s"] >= 0, flush
    assert records["checkpoints"] >= flush["chains"], records


def test_bench_webhook_cordons_every_alerted_node_one_at_a_time() -> None:
    doc = _bench("webhook", "--nodes", "12", "--alerts", "3")
    for key in ("p50_cordon_ms", "p99_cordon_ms", "max_cordon_ms", "p50_answer_ms", "p99_answer_ms",
                "api_requests_per_incident", "load_average"):
        assert key in doc, doc
    assert doc["answers"] == {"200": 3} and doc["cordoned"] == 3  # every POST accepted, every node cordoned
    # What the replica sends before the cordon: the event, the dispatcher's 3 KV requests, its remediation and
    # audit (chain head, 2 records), the executor's lock, run read, attempts read and compare-and-set,
    # decision and 4 verdicts, one run write, 2 step_started: 20. Each request taken out of that path
    # (ARCHITECTURE "Fewer round trips before a run acts") lowers it; one put back raises it past the bound.
    assert 10 <= doc["nats_messages_before_cordon"] <= 21, doc  # type: ignore[operator]
    # every alert's latency cut at the replica's spans (tests/unit/chaos/test_webhook_hops.py holds the cut)
    hops = doc["hops_ms"]
    assert list(hops) == ["post_to_dispatch", "dispatch_to_run", "run_to_quarantine", "quarantine"], doc
    for hop in hops.values():
        assert hop["alerts"] == 3 and 0 <= hop["p50"] <= hop["max"] <= doc["max_cordon_ms"], doc
    assert set(doc["gc_pauses"]) == {"passes", "full", "total_ms", "max_ms"}, doc
    assert doc["event_loop"] == "uvloop"  # serve's loop (remediator.eventloop)


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc (each process's parent is field 4 of its stat)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_benchmark_stopped_by_sigterm_stops_what_it_started() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "remediator.cli", "bench", "storm", "--nodes", "12", "--failing",
                             "4", "--no-breaker-run", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the events are being published over 30 s: everything is running
            if "report Xid 79" in line:
                break
        children = _descendants(proc.pid)
        assert len(children) >= 2, children  # at least nats-server and the simulated cluster
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0 and "stopped by SIGTERM" in err, err[-2000:]
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in children if _alive(p)]  # none outlives the benchmark
    finally:
        if proc.poll() is None:
            proc.kill()





def test_a_simulated_cluster_that_died_ends_the_benchmark_at_once_naming_how() -> None:
    """A simulated cluster killed (out of memory, a person's kill) while a benchmark uses it cancels the
    benchmark at once, and the context ends with ``SimulatorDied`` saying how it died. The storm once waited
    out its runs against the dead API server (three minutes), printed a result of nothing and started its next
    run; before that, stopping the child with a multiprocessing Event hung for good. Run in a thread of its
    own, so a hang is a failure here rather than a stuck test run."""
    import asyncio
    import multiprocessing
    import tempfile
    import threading

    from chaos.bench.storm import SimulatorDied, simulated_cluster

    info: dict[str, object] = {}
    errors: list[BaseException] = []
    reached: list[str] = []

    async def run(tmp: str) -> None:
        async with simulated_cluster(4, f"{tmp}/kubeconfig", info) as cluster:
            sims = [p for p in multiprocessing.active_children() if not p.name.startswith("SyncManager")]
            assert len(sims) == 1, sims
            assert sims[0].pid is not None
            os.kill(sims[0].pid, signal.SIGKILL)
            await asyncio.sleep(600)  # a benchmark waiting for its runs: the child's death cancels it
            reached.append(f"slept through the death (died={cluster.died})")

    def body() -> None:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                asyncio.run(run(tmp))
        except BaseException as e:  # reported below
            errors.append(e)

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "a simulated cluster that died hung the benchmark"
    assert reached == []
    assert len(errors) == 1 and isinstance(errors[0], SimulatorDied), errors
    assert "died (killed by SIGKILL; out of memory?" in str(errors[0])
    assert "seed_s" in info  # what the child had written before it died is kept
