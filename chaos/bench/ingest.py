"""``remediator bench ingest``: Alertmanager ingest throughput and paced latency against the JetStream floor.

Where it sits: beside the service, never on its path. It measures the real ``/v1/alertmanager`` (token
auth, validation, ``FaultEvent`` construction, JetStream publish with ``Nats-Msg-Id`` dedup, answer after
the ack) against what the same stack can do with none of that.

Setup (embedded, the default): one ``nats-server -js`` (file store in a temporary directory), provisioned
with ``remediator bus init``'s layout plus a ``BENCH`` stream (``bench.>``) configured like FAULTS. Four
processes share the machine's cores, none pinned: nats-server, two HTTP servers (the floor and the real
app, each alone in its process and idle while the other is measured) and the load generator. Each HTTP
server runs uvicorn with uvloop and httptools, one worker, access log off, lifespan off, on loopback, and
settles its start-up heap as ``serve`` does (``remediator.heap.settle``). The load generator is a
minimal asyncio HTTP/1.1 client over raw keep-alive sockets (requests built from a pre-encoded template,
responses parsed from the status line and Content-Length) on uvloop, in its own process, so the client is
not what limits the figures. Every phase uses the same generator, the same ``concurrency`` (one connection
per worker) and one Alertmanager alert per POST (a dcgm-exporter Xid 79 alert in a full webhook payload of
about 1.6 kB), each with a unique fingerprint, so nothing is a duplicate.

Phases, all against the same NATS:

* ``raw_publish_per_s`` — nats-py JetStream publishes of one ``FaultEvent`` body (distinct ``Nats-Msg-Id``),
  each awaiting its ack, ``concurrency`` in flight, from the load-generator process: the bus alone.
* ``floor_alerts_per_s`` — a bare FastAPI route (registered like the real ones) on the same uvicorn
  configuration that publishes the request body to ``BENCH`` with a ``Nats-Msg-Id`` and answers after the
  ack: the cost of the stack itself.
* ``ingest_alerts_per_s`` — the real app from ``create_app`` with a bearer token configured, the tracer
  provider installed and an audit log made as ``serve`` makes its own (``AuditLog.for_replica``: signed,
  checkpointed); its events land on FAULTS, and ``ingest_persisted`` (events added to FAULTS) must equal
  ``ingest_acked`` (200 answers the generator got).
* ``paced`` — 1,000 alerts/s for 10 s, open loop (each request is due at its scheduled time and its
  latency counts from then, so queueing is not hidden), against the real endpoint.
* ``ratio`` = ingest ÷ floor.

The floor and ingest phases alternate for ``rounds`` rounds (default three rounds of 3 s, each after a one-second
warm-up) so a burst of load from elsewhere on the machine hits both alike; each figure is the best round,
as ``timeit`` takes the best repeat, and every round is reported (``*_samples_per_s``,
``ratio_per_round``) with the 1-minute load average before and after. With ``url`` (a running service's
base URL) the ingest and paced phases go there, with the first token of ``REMEDIATOR_API_TOKENS``; the raw
and floor phases then use ``REMEDIATOR_NATS_URL`` when set, else an embedded NATS, and the ratio compares
different setups. The synthetic alerts name nodes ``bench-node-00`` … ``bench-node-63``: never point
``url`` at a service that acts on a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request, Response

from remediator import heap, subjects
from remediator.contracts import FaultEvent, GpuRef, utcnow
from remediator.natsd import EmbeddedNats, free_port
from remediator.settings import Settings
from remediator.telemetry import http_app

__all__ = ["run"]

Progress = Callable[[str], None]

BENCH_STREAM = "BENCH"
BENCH_SUBJECT = "bench.floor"
RAW_SUBJECT = "bench.raw"
TOKEN = "bench-token-0123456789abcdef"
PACED_RATE = 1000
PACED_SECONDS = 10.0
WARMUP_S = 1.0
_FP = "FPFPFPFPFPFPFPFP"  # 16-character placeholders: every request body has the same length
_NODE = "NN"


def _payload_template() -> bytes:
    """One dcgm-exporter Xid alert as Alertmanager posts it, with fingerprint and node placeholders."""
    alert = {
        "status": "firing",
        "labels": {"alertname": "GPUXidError", "severity": "critical", "gpu": "0", "device": "nvidia0",
                   "UUID": "GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6", "pci_bus_id": "00000000:3B:00.0",
                   "modelName": "NVIDIA H100 80GB HBM3", "Hostname": f"bench-node-{_NODE}", "err_code": "79",
                   "err_msg": "GPU has fallen off the bus", "DCGM_FI_DRIVER_VERSION": "580.105.08",
                   "instance": "10.0.3.7:9400", "job": "dcgm-exporter", "namespace": "gpu-operator",
                   "pod": "nvidia-dcgm-exporter-x7k2p", "container": "nvidia-dcgm-exporter"},
        "annotations": {"summary": "Xid 79 on GPU 0", "description": "DCGM_FI_DEV_XID_ERRORS reported Xid 79"},
        "startsAt": "2024-05-01T03:12:00.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus-k8s-0:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0&g0.tab=1",
        "fingerprint": _FP,
    }
    payload = {
        "receiver": "gpu-remediator", "status": "firing", "alerts": [alert],
        "groupLabels": {"alertname": "GPUXidError"}, "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"], "externalURL": "http://alertmanager-main-0:9093",
        "version": "4", "groupKey": '{}/{severity="critical"}:{alertname="GPUXidError"}',
        "truncatedAlerts": 0,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _event_body() -> bytes:
    """A FaultEvent like the one ingest publishes for the template alert: the raw phase's message."""
    now = utcnow()
    return FaultEvent(
        id="alertmanager|0123456789abcdef|firing|2024-05-01T03:12:00.123456Z", source="alertmanager",
        node="bench-node-00",
        gpu=GpuRef(index=0, uuid="GPU-5a9e0ff4-1b2c-3d4e-5f60-718293a4b5c6", pci_bus_id="0000:3b:00.0"),
        kind="xid", code=79, is_fatal=True, message="Xid 79 on GPU 0 | DCGM_FI_DEV_XID_ERRORS reported Xid 79",
        observed_at=now, received_at=now, labels={"alertname": "GPUXidError", "Hostname": "bench-node-00"},
        recommended_action="RESTART_BM",
    ).model_dump_json().encode()


# --- the HTTP server under test (a child process) ---------------------------------------------------


def _floor_app(js: Any) -> FastAPI:
    """The floor: the same FastAPI/uvicorn stack (the app made as the real one is), publishing the body to
    JetStream and answering 200."""
    app = http_app()
    counter = iter(range(1 << 62))
    prefix = f"floor|{os.getpid()}|"

    async def floor(request: Request) -> Response:
        body = await request.body()
        await js.publish(BENCH_SUBJECT, body, timeout=5.0, stream=BENCH_STREAM,
                         headers={"Nats-Msg-Id": prefix + str(next(counter))})
        return Response(b'{"accepted":1}', media_type="application/json")

    app.add_api_route("/v1/alertmanager", floor, methods=["POST"], response_class=Response)
    return app


def _serve_main(kind: str, nats_url: str, port: int) -> None:
    """Child process: uvicorn (uvloop + httptools, one worker, no access log) serving ``kind``.

    Prints ``ready`` on standard output once it listens; SIGTERM stops it.
    """
    import uvicorn
    import uvloop

    async def main() -> None:
        from remediator import bus, telemetry
        from remediator.audit import AuditLog
        from remediator.ingest.app import create_app
        from remediator.metrics import ServiceMetrics
        from remediator.signing import Signer, generate_seed

        telemetry.setup()  # as ``serve`` does: a tracer provider installed, spans exported nowhere

        nc, js = await bus.connect(nats_url, name=f"bench-{kind}",
                                   credentials=bus.Credentials.from_settings(Settings()))
        if kind == "floor":
            app = _floor_app(js)
        else:
            settings = Settings(api_tokens=TOKEN, nats_url=nats_url)
            audit = AuditLog.for_replica(js, settings, "bench-ingest", Signer(generate_seed()),
                                         observers=[ServiceMetrics().observe])  # serve's: signed, checkpointed
            app = create_app(settings=settings, nc=nc, js=js, audit=audit)
        config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", loop="none",
                                lifespan="off", access_log=False, log_level="warning", workers=1)
        server = uvicorn.Server(config)
        # What serve does after start-up (both servers alike): move the import-time heap out of the
        # collector's way, so full collections do not rescan ~70k long-lived objects every few hundred
        # requests, and collect less often.
        heap.settle()
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await task
        await nc.close()

    uvloop.run(main())


# --- the load generator (a child process) -----------------------------------------------------------


class _HttpConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: write a pre-encoded request, read status and Content-Length."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None]) if at >= 0 else 0
        total = end + 4 + length
        if len(self.buf) < total:
            return
        del self.buf[:total]
        waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def request(self, data: bytes) -> int:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


def _request_factory(host: str, port: int, path: str, token: str | None) -> Callable[[int], bytes]:
    template = _payload_template()
    head_fp, tail_fp = template.split(_FP.encode())
    node_at = head_fp.find(f"bench-node-{_NODE}".encode())
    pre_node, post_node = head_fp[:node_at + 11], head_fp[node_at + 11 + len(_NODE):]
    headers = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: remediator-bench\r\n"
               f"Content-Type: application/json\r\n"
               + (f"Authorization: Bearer {token}\r\n" if token else "")
               + f"Content-Length: {len(template)}\r\n\r\n").encode()
    salt = os.urandom(3).hex()  # a rerun against the same NATS store is not a duplicate either

    def build(i: int) -> bytes:
        fp = f"{salt}{i & 0xFF_FFFF_FFFF:010x}".encode()  # 16 hex digits, always
        return b"".join((headers, pre_node, b"%02d" % (i % 64), post_node, fp, tail_fp))

    return build


async def _closed_loop(ops: list[Callable[[int], Awaitable[bool]]], seconds: float, start: int) -> dict[str, Any]:
    """Each op is one worker's request; run them back to back for warm-up + ``seconds`` and count."""
    state = {"counting": False, "stop": False, "ok": 0, "errors": 0, "ok_total": 0}
    latencies: list[float] = []
    counter = iter(range(start, 1 << 62))

    async def worker(op: Callable[[int], Awaitable[bool]]) -> None:
        while not state["stop"]:
            t = time.perf_counter()
            try:
                ok = await op(next(counter))
            except (TimeoutError, ConnectionError, OSError):
                ok = False
            state["ok_total"] += ok
            if state["counting"]:
                state["ok" if ok else "errors"] += 1
                latencies.append(time.perf_counter() - t)

    tasks = [asyncio.create_task(worker(op)) for op in ops]
    await asyncio.sleep(WARMUP_S)
    state["counting"] = True
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    state["counting"] = False
    elapsed = time.perf_counter() - t0
    state["stop"] = True
    await asyncio.wait(tasks, timeout=15)
    latencies.sort()
    return {"per_s": state["ok"] / elapsed, "ok": state["ok"], "errors": state["errors"], "elapsed_s": elapsed,
            "ok_total": state["ok_total"],
            **_percentiles(latencies)}


def _percentiles(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    def pick(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 3)
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": round(latencies[-1] * 1000, 3)}


async def _open_connections(host: str, port: int, n: int) -> list[_HttpConn]:
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(n):
        _t, proto = await loop.create_connection(_HttpConn, host, port)
        conns.append(proto)
    return conns


async def _paced(host: str, port: int, build: Callable[[int], bytes], concurrency: int, rate: int,
                 seconds: float, start: int) -> dict[str, Any]:
    """Open loop: request i is due at t0 + i/rate on the next free connection; latency counts from due time."""
    idle: asyncio.Queue[_HttpConn] = asyncio.Queue()
    for c in await _open_connections(host, port, concurrency):
        idle.put_nowait(c)
    total = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    failed = 0  # requests that got no answer at all
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        nonlocal errors, failed
        conn = await idle.get()
        try:
            status = await asyncio.wait_for(conn.request(build(start + i)), 10)
        except (TimeoutError, ConnectionError, OSError):
            failed += 1
            with contextlib.suppress(OSError):  # replace the broken connection
                (conn,) = await _open_connections(host, port, 1)
                idle.put_nowait(conn)
            return
        latencies.append(time.perf_counter() - due)
        if status != 200:
            errors += 1
        idle.put_nowait(conn)

    t0 = time.perf_counter() + 0.05
    for i in range(total):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    sent_s = time.perf_counter() - t0
    if pending:
        await asyncio.wait(pending, timeout=15)
    errors += total - len(latencies)  # no answer at all (failed, or still pending after 15 s)
    latencies.sort()
    return {"rate": round(total / sent_s, 1), "target_rate": rate, "requests": total, "errors": errors,
            "ok_total": total - errors,
            **_percentiles(latencies)}


def _load_main(spec: dict[str, Any]) -> None:
    """Child process: run one phase of load and print its figures as one JSON line."""
    import uvloop

    async def main() -> dict[str, Any]:
        mode = spec["mode"]
        if mode == "nats":
            from remediator import bus

            nc, js = await bus.connect(spec["nats_url"], name="bench-raw",
                                       credentials=bus.Credentials.from_settings(Settings()))
            body = _event_body()
            prefix = f"raw|{os.urandom(3).hex()}|"

            async def publish(i: int) -> bool:
                await js.publish(RAW_SUBJECT, body, timeout=5.0, stream=BENCH_STREAM,
                                 headers={"Nats-Msg-Id": prefix + str(i)})
                return True

            try:
                return await _closed_loop([publish] * spec["concurrency"], spec["seconds"], 0)
            finally:
                await nc.close()
        host, port = spec["host"], spec["port"]
        build = _request_factory(host, port, spec["path"], spec.get("token"))
        if mode == "paced":
            return await _paced(host, port, build, spec["concurrency"], spec["rate"], spec["seconds"],
                                spec["start"])
        conns = await _open_connections(host, port, spec["concurrency"])

        def op_for(conn: _HttpConn) -> Callable[[int], Awaitable[bool]]:
            held = [conn]

            async def op(i: int) -> bool:
                try:
                    return await held[0].request(build(i)) == 200
                except ConnectionError:  # the server closed it (after an error answer): count, reconnect
                    (held[0],) = await _open_connections(host, port, 1)
                    return False
            return op

        return await _closed_loop([op_for(c) for c in conns], spec["seconds"], spec["start"])

    try:
        result = uvloop.run(main())
    except Exception as e:
        result = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result), flush=True)


def _child_main() -> None:
    """Entry point of the child processes: ``serve KIND NATS_URL PORT`` or ``load SPEC_JSON``."""
    role = sys.argv[1]
    if role == "serve":
        _serve_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        _load_main(json.loads(sys.argv[2]))


# --- orchestration (the calling process: idle while a phase runs) -----------------------------------


_CHILD_CREDS: dict[str, str] = {}  # child kind → the .creds file it connects with (embedded server: by role)


async def _spawn(*args: str, creds: str | None = None) -> asyncio.subprocess.Process:
    """A fresh interpreter running ``_child_main`` (no fork of this process, no re-import of ``__main__``);
    ``creds``: the NATS identity it connects as (``REMEDIATOR_NATS_CREDS_FILE``)."""
    env = {**os.environ, "REMEDIATOR_NATS_CREDS_FILE": creds} if creds else None
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from chaos.bench.ingest import _child_main; _child_main()", *args,
        stdout=asyncio.subprocess.PIPE, env=env)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _load(spec: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """Run one load phase in its own process and return its figures."""
    proc = await _spawn("load", json.dumps(spec), creds=_CHILD_CREDS.get("load"))
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), wait_s)
    finally:
        await _stop(proc)
    if not line:
        raise RuntimeError(f"load generator ({spec['mode']}) exited with {proc.returncode} before answering")
    result: dict[str, Any] = json.loads(line)
    if "error" in result:
        raise RuntimeError(f"load generator ({spec['mode']}) failed: {result['error']}")
    return result


@contextlib.asynccontextmanager
async def _server(kind: str, nats_url: str) -> AsyncIterator[int]:
    """The HTTP server under test in its own process, listening on the yielded port."""
    port = free_port()
    proc = await _spawn("serve", kind, nats_url, str(port), creds=_CHILD_CREDS.get(kind))
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if line.strip() != b"ready":
            raise RuntimeError(f"{kind} server did not start (exit code {proc.returncode})")
        yield port
    finally:
        await _stop(proc)


async def _provision_bench(js: Any, settings: Settings) -> None:
    from nats.js import api

    from remediator import bus

    await bus.provision(js, settings)
    faults = (await js.stream_info(subjects.FAULTS_STREAM)).config
    with contextlib.suppress(Exception):
        await js.delete_stream(BENCH_STREAM)
    await js.add_stream(api.StreamConfig(
        name=BENCH_STREAM, subjects=["bench.>"], retention=faults.retention, storage=faults.storage,
        duplicate_window=faults.duplicate_window, max_age=faults.max_age, discard=faults.discard,
        num_replicas=faults.num_replicas))
    # The same durable consumer as FAULTS has (nobody pulls during the run): the server tracks its pending
    # count for every message on both streams, so the floor pays what the real endpoint pays there.
    dispatch = await js.consumer_info(subjects.FAULTS_STREAM, bus.DISPATCH_CONSUMER)
    await js.add_consumer(BENCH_STREAM, dispatch.config)


async def run(url: str | None = None, concurrency: int = 32, progress: Progress | None = None, *,
              seconds: float = 3.0, rounds: int = 3, paced_rate: int = PACED_RATE,
              paced_seconds: float = PACED_SECONDS) -> dict[str, Any]:
    """Run the phases and return their figures (top-level keys; see the module docstring).

    ``url`` is the base URL of a running service (default: start everything locally on an embedded NATS).
    The floor and ingest phases alternate for ``rounds`` rounds of ``seconds`` each, so a burst of load from
    elsewhere on the machine hits both alike; each figure is the best round (as ``timeit`` takes the best
    repeat) and the per-round samples are reported too. ``paced_rate``/``paced_seconds`` shape the paced
    phase (1,000/s for 10 s by default).
    """
    from remediator import bus

    say = progress or (lambda _msg: None)
    env = Settings()
    embedded: EmbeddedNats | None = None
    nats_url = env.nats_url
    if url is not None:
        say(f"bench ingest: posting synthetic bench-node-* alerts to {url}: never a service that acts on a "
            "real cluster")
    if nats_url is None:
        embedded = EmbeddedNats(secure=True)  # with auth, as serve runs it: each part connects as its role
        await asyncio.to_thread(embedded.start)
        _CHILD_CREDS.update(load=embedded.creds("bench"), floor=embedded.creds("bench"),
                            ingest=embedded.creds("service"))
        nats_url = embedded.url
        say(f"bench ingest: embedded nats-server on {nats_url} (store {embedded.data_dir})")
    load_before = os.getloadavg()[0]
    nc, js = await bus.connect(nats_url, name="bench-orchestrator", credentials=(
        bus.Credentials(creds_file=embedded.creds("admin")) if embedded is not None
        else bus.Credentials.from_settings(env)))
    result: dict[str, Any] = {}
    try:
        await _provision_bench(js, env)
        common = {"concurrency": concurrency, "seconds": seconds}

        say(f"bench ingest: raw JetStream publish, {concurrency} in flight, {seconds:g}s")
        raw = await _load({"mode": "nats", "nats_url": nats_url, **common}, 60 + seconds)
        say(f"  raw: {raw['per_s']:.0f}/s")

        before = (await js.stream_info(subjects.FAULTS_STREAM)).state.messages
        async with contextlib.AsyncExitStack() as stack:
            floor_port = await stack.enter_async_context(_server("floor", nats_url))
            floor_target = {"host": "127.0.0.1", "port": floor_port, "path": "/v1/alertmanager", "token": TOKEN}
            token: str | None = TOKEN
            host = "127.0.0.1"
            if url is None:
                port = await stack.enter_async_context(_server("ingest", nats_url))
            else:
                parts = urlsplit(url)
                host, port = parts.hostname or host, parts.port or 80
                token = next(iter(sorted(env.tokens)), None)
            target = {"host": host, "port": port, "path": "/v1/alertmanager", "token": token}
            floors: list[dict[str, Any]] = []
            ingests: list[dict[str, Any]] = []
            for r in range(rounds):
                say(f"bench ingest: round {r + 1}/{rounds}: floor (bare FastAPI route + publish), then the real "
                    f"/v1/alertmanager (token, validation, dedup, audit); {concurrency} connections, {seconds:g}s each")
                floors.append(await _load({"mode": "http", "start": r << 32, **floor_target, **common},
                                           60 + seconds))
                ingests.append(await _load({"mode": "http", "start": (1 << 36) + (r << 32), **target, **common},
                                           60 + seconds))
                say(f"  floor {floors[-1]['per_s']:.0f}/s, ingest {ingests[-1]['per_s']:.0f}/s")
            say(f"bench ingest: paced {paced_rate}/s for {paced_seconds:g}s against /v1/alertmanager")
            paced = await _load({"mode": "paced", "start": 1 << 38, "rate": paced_rate, **target,
                                 "concurrency": concurrency, "seconds": paced_seconds}, 60 + paced_seconds)
            say(f"  paced: p50 {paced['p50_ms']} ms, p99 {paced['p99_ms']} ms, {paced['errors']} errors")
        persisted = (await js.stream_info(subjects.FAULTS_STREAM)).state.messages - before
        floor = max(floors, key=lambda x: x["per_s"])
        ingest = max(ingests, key=lambda x: x["per_s"])
        acked = sum(x["ok_total"] for x in ingests) + paced["ok_total"]
        result = {
            "raw_publish_per_s": round(raw["per_s"], 1),
            "floor_alerts_per_s": round(floor["per_s"], 1),
            "ingest_alerts_per_s": round(ingest["per_s"], 1),
            "ratio": round(ingest["per_s"] / floor["per_s"], 3) if floor["per_s"] else None,
            "paced": {k: paced[k] for k in ("rate", "p50_ms", "p99_ms", "errors", "max_ms", "target_rate",
                                            "requests")},
            "floor_samples_per_s": [round(x["per_s"]) for x in floors],
            "ingest_samples_per_s": [round(x["per_s"]) for x in ingests],
            "ratio_per_round": [round(i["per_s"] / f["per_s"], 3) if f["per_s"] else None
                                for f, i in zip(floors, ingests, strict=True)],
            "ingest_p50_ms": ingest["p50_ms"],
            "ingest_p99_ms": ingest["p99_ms"],
            "floor_p50_ms": floor["p50_ms"],
            "floor_p99_ms": floor["p99_ms"],
            "errors": {"raw": raw["errors"], "floor": sum(x["errors"] for x in floors),
                       "ingest": sum(x["errors"] for x in ingests)},
            # every 200 from the real endpoint is an event on FAULTS: the two counts must match
            "ingest_acked": acked,
            "ingest_persisted": persisted if url is None else None,
            "concurrency": concurrency,
            "seconds": seconds,
            "rounds": rounds,
            "cpus": os.cpu_count(),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "setup": ("embedded nats-server; uvicorn+uvloop+httptools, 1 worker, each server in its own process; "
                      "raw-socket keep-alive HTTP/1.1 load generator in another process"
                      if url is None else f"service at {url}; raw/floor on {nats_url}"),
        }
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(BENCH_STREAM)
        await nc.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.close)
    return result
